"""The Index Service's state in Redis or Redis Cluster (decision D7), shared by any number of IS processes.

Key layout (``P`` is the configured ``key_prefix``, ``kvsp:`` by default; ``{K}`` is the Block Key in hex,
a hash tag, so every key of one Block Key lives in one cluster slot and the keys of a prompt spread
uniformly over the slots, spec section 8):

- ``P is:{K}:FIELD``: one string per replica, the record as stored (TTL capped) in its canonical JSON
  (`record_json`, equal to ``to_bytes()``), with ``PX ttl_ms``.  Its Redis TTL *is* the replica's
  expiry: Redis 7.0 has no per-field hash TTL, so each replica is its own key.  ``FIELD`` is the
  holder-id, or ``holder-id/producer`` when the producer is another (records served through a relay);
  never empty, so no record key is the index key.
- ``P is:{K}:``: a hash, FIELD -> scope_id ‖ compat_id (48 octets): which replicas of K exist and what
  they match.  It lives as long as its longest record (PEXPIRE), and a PUT drops the fields whose
  record has expired, so it never holds more than the live replicas plus those expired since.
- ``P is:{count}``: expiry bucket -> number of records expiring in it, for ``max_replicas`` (below).
- ``P is:{status}:s`` / ``P is:{status}:e``: the instance status board: instance -> "expiry_ms JSON",
  and instance -> highest epoch seen (kept after the status expires, section 6.3).

Operations, each one script (``control.index.redis_scripts``) so that checks and writes are atomic:

- PUT: one script on K's node (create or refresh, prune, cap check), then one on the counter's node.
- DELETE: one script on K's node withdraws exactly the fields of the producers the caller may
  withdraw, so an authorization decision cannot race a replacement; then the counter.
- lookup: standalone Redis, one script call for the whole prompt, stopping at the first key without a
  match, and answering with the records' JSON text (nothing is parsed, `Matches`).  Redis Cluster:
  one script call per node that serves some of the prompt's keys, the nodes in parallel; each node
  stops at its first miss and the prefix is cut here.  Should a node refuse (a slot in migration),
  one script per key in one pipeline, which redis-py routes and redirects.
- max_replicas: the count is approximate by design.  Records expiring in each bucket of
  ``ttl_ms_max / 32`` are counted; passed buckets drop out, so records that expire stop counting at
  most one bucket later and nothing drifts.  An IS checks the count it last saw (refreshed by every
  PUT and every ``sweep_interval_s``, and re-read before it refuses), so IS processes creating at
  once may overshoot the cap by their concurrent creates; a count lost with a killed IS heals when
  its bucket passes.

Clock: every expiry is decided by Redis's clock (``PX``, ``TIME`` in the scripts), never the IS's; the
IS's injected clock only paces its retries.  Each Redis call is bounded by ``timeout_ms``; after three
failures in a row the back-end answers `BackendUnavailable` at once for ``cooldown_s`` (then tries
again, and the background step probes), so an outage costs callers no waiting beyond three timeouts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError

from control.backend import RedisConfig
from control.index.backend import DEFAULT_COOLDOWN_S, BackendUnavailable, Matches
from control.index.encode import record_json
from control.index.redis_scripts import SCRIPTS
from control.index.store import Stored
from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.records import InstanceStatus, ReplicaRecord

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import ClusterNode

log = logging.getLogger("kvsp.is.redis")
T = TypeVar("T")
Arg = bytes | str | int | float  # what a Redis command argument may be
# EVALSHA names a script by the SHA-1 of its text (Redis's choice, not a security use)
SHAS: Final = {name: hashlib.sha1(text.encode()).hexdigest() for name, text in SCRIPTS.items()}
BUCKETS_PER_TTL: Final = 32
MIN_BUCKET_MS: Final = 100
FAILURES: Final = (RedisError, RedisClusterException, OSError, TimeoutError)
CLOSE_TIMEOUT_S = 2.0  # closing the client at shutdown


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """The Redis key names of the IS under one ``key_prefix`` (see the module docstring)."""

    prefix: str = "kvsp:"

    def index(self, block_key: bytes) -> str:
        return f"{self.prefix}is:{{{block_key.hex()}}}:"

    def record(self, block_key: bytes, field: str) -> str:
        """The index key followed by the field: the scripts build record keys by one concatenation."""
        return f"{self.prefix}is:{{{block_key.hex()}}}:{field}"

    @property
    def count(self) -> str:
        return f"{self.prefix}is:{{count}}"

    @property
    def statuses(self) -> str:
        return f"{self.prefix}is:{{status}}:s"

    @property
    def epochs(self) -> str:
        return f"{self.prefix}is:{{status}}:e"


def field_of(holder_id: str, producer: str) -> str:
    """The hash field of a replica: its holder-id, and its producer's when that is another (holder-ids
    are base64url, so ``/`` cannot occur in one).  Short fields keep small index hashes compact."""
    return holder_id if producer == holder_id else f"{holder_id}/{producer}"


def producer_of(record: ReplicaRecord, holder_id: str) -> str:
    """`ReplicaRecord.producer_id`, given the holder-id the caller has checked (no hashing)."""
    namespace = record.moqt_namespace
    return namespace.holder_id if namespace is not None else holder_id


@dataclass(slots=True)
class Breaker:
    """Whether to send work to Redis now (sans-I/O, ``now`` passed in).

    After ``threshold`` failures in a row, nothing for ``cooldown_s``, then one try per cool-down
    until one succeeds.  A single slow call (a loaded machine) costs only its own request; an outage
    costs callers no more than ``threshold`` timeouts before they are answered at once.
    """

    cooldown_s: float
    threshold: int = 3
    failures: int = 0  # in a row
    down_since: float | None = None  # when it opened
    retry_at: float = 0.0
    error: str | None = None

    def allow(self, now: float) -> bool:
        if self.down_since is None:
            return True
        if now < self.retry_at:
            return False
        self.retry_at = now + self.cooldown_s  # one try per cool-down; the others still fail fast
        return True

    def failed(self, now: float, error: str) -> None:
        self.failures += 1
        self.error = error
        if self.failures >= self.threshold:
            if self.down_since is None:
                self.down_since = now
            self.retry_at = now + self.cooldown_s

    def succeeded(self) -> None:
        self.failures = 0
        self.down_since = None
        self.error = None


class RedisIndex:
    """`IndexBackend` on Redis or Redis Cluster; see the module docstring for layout, costs and clocks."""

    kind = "redis"

    def __init__(self, client: Redis | RedisCluster, config: RedisConfig, *, ttl_ms_max: int,
                 capacity: int | None = None, clock: Callable[[], float] = time.monotonic,
                 cooldown_s: float = DEFAULT_COOLDOWN_S) -> None:
        if ttl_ms_max <= 0:
            raise ValueError("ttl_ms_max must be positive")
        self.client = client
        self._cluster = client if isinstance(client, RedisCluster) else None
        self.cluster = self._cluster is not None
        self.keys = KeyLayout(config.key_prefix)
        self.ttl_ms_max = ttl_ms_max
        self.capacity = capacity
        self.timeout_s = config.timeout_ms / 1000
        self.bucket_ms = max(MIN_BUCKET_MS, ttl_ms_max // BUCKETS_PER_TTL)
        self.clock = clock
        self.breaker = Breaker(cooldown_s)
        self.replicas = 0  # the count last read from Redis (see `count`)

    # -- replicas ---------------------------------------------------------------------------------
    async def put(self, record: ReplicaRecord, holder_id: str) -> Stored:
        if record.ttl_ms > self.ttl_ms_max:
            record = dataclasses.replace(record, ttl_ms=self.ttl_ms_max)
        block_key = record.block_key
        field = field_of(holder_id, producer_of(record, holder_id))
        keys = [self.keys.index(block_key), self.keys.record(block_key, field)]
        args: list[Arg] = [field, record.scope_id + record.compat_id, record_json(record), record.ttl_ms]
        created, old, now = await self._run("publish", lambda: self._eval("put", keys, [*args, self._may_create()]))
        if created == -1:  # the cached count said full: read it again before refusing
            if await self._run("publish", self._count) < (self.capacity or 0):
                created, old, now = await self._run("publish", lambda: self._eval("put", keys, [*args, 1]))
            if created == -1:
                raise ProblemError(Problem.generic(507, "Insufficient Storage",
                                                   f"the index holds its maximum of {self.capacity} replicas"))
        expires = int(now) + record.ttl_ms
        before = int(now) + int(old) if int(old) >= 0 else None
        if before is None or before // self.bucket_ms != expires // self.bucket_ms:
            await self._run("publish", lambda: self._count(add=expires, remove=() if before is None else (before,)))
        return Stored(record, created=bool(created))

    async def get(self, holder_id: str, block_key: bytes, producer: str | None = None) -> ReplicaRecord | None:
        key = self.keys.record(block_key, field_of(holder_id, holder_id if producer is None else producer))
        data = await self._run("get", lambda: self.client.execute_command("GET", key))
        return None if data is None else ReplicaRecord.from_bytes(data)

    async def records(self, holder_id: str, block_key: bytes) -> list[ReplicaRecord]:
        found = await self._run("get", lambda: self._eval("records", [self.keys.index(block_key)], [holder_id]))
        return [ReplicaRecord.from_bytes(data) for data in found]

    async def delete(self, holder_id: str, block_key: bytes, producer: str | None = None) -> bool:
        return await self.withdraw(holder_id, block_key, frozenset({holder_id if producer is None else producer})) > 0

    async def withdraw(self, holder_id: str, block_key: bytes, producers: frozenset[str]) -> int:
        if not producers:
            return 0
        fields = [field_of(holder_id, p) for p in sorted(producers)]
        now, *left = await self._run("withdraw", lambda: self._eval("withdraw", [self.keys.index(block_key)], fields))
        if left:
            expiries = tuple(int(now) + int(ms) for ms in left)
            await self._run("withdraw", lambda: self._count(remove=expiries))
        return len(left)

    async def lookup(self, scope_id: bytes, compat_id: bytes, keys: Sequence[bytes]) -> Matches:
        if not keys:
            return Matches.of_text(0, "")
        index_keys = [self.keys.index(k) for k in keys]
        match = scope_id + compat_id
        cluster = self._cluster
        if cluster is None:
            text = (await self._run("lookup", lambda: self._eval("lookup", [], self._lookup_args(match, index_keys))))
            return _matches(text.decode())
        groups = await self._run("lookup", lambda: self._cluster_lookup(cluster, keys, index_keys, match))
        return Matches.of_text(len(groups), "\n".join(groups))

    async def count(self) -> int:
        """Live records, approximately (see the module docstring); also refreshes the cached count."""
        return await self._run("count", self._count)

    # -- instance statuses ------------------------------------------------------------------------
    async def put_status(self, status: InstanceStatus) -> InstanceStatus:
        keys = [self.keys.statuses, self.keys.epochs]
        accepted, seen = await self._run("status", lambda: self._eval(
            "put_status", keys, [status.instance, status.epoch, status.ttl_ms, status.to_bytes()]))
        if not accepted:
            raise ProblemError.of(ProblemType.STALE_EPOCH,
                                  f"epoch {status.epoch} is lower than {int(seen)}, already seen for this instance")
        return status

    async def statuses(self, instances: Sequence[str]) -> dict[str, InstanceStatus]:
        if not instances:
            return {}
        names = list(dict.fromkeys(instances))
        found = await self._run("status", lambda: self._eval("get_statuses", [self.keys.statuses], names))
        return {name: InstanceStatus.from_bytes(data) for name, data in zip(names, found, strict=True) if data}

    # -- background, health -----------------------------------------------------------------------
    async def maintain(self) -> None:
        """Re-read the count and drop expired statuses; also the probe that ends an outage without traffic."""
        await self._run("maintain", self._count, probe=True)
        await self._run("maintain", lambda: self._eval("sweep_statuses", [self.keys.statuses], []), probe=True)

    def facts(self) -> dict[str, object]:
        down = self.breaker.down_since
        return {"backend": "redis", "cluster": self.cluster, "state": "up" if down is None else "down",
                "down_for_s": None if down is None else round(self.clock() - down, 3),
                "failures": self.breaker.failures, "error": self.breaker.error, "replicas": self.replicas}

    async def close(self) -> None:
        """Bounded: a shutdown must not wait on a Redis that vanished (its sockets may never answer)."""
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.client.aclose()
        except (TimeoutError, RedisError, OSError) as exc:
            log.info("closing the Redis client gave up: %s", exc or type(exc).__name__)

    # -- internals --------------------------------------------------------------------------------
    def _may_create(self) -> int:
        return 1 if self.capacity is None or self.replicas < self.capacity else 0

    async def _count(self, add: int | None = None, remove: Sequence[int] = ()) -> int:
        total = int(await self._eval("count", [self.keys.count], [self.bucket_ms, "" if add is None else add, *remove]))
        self.replicas = total
        return total

    async def _run(self, operation: str, work: Callable[[], Awaitable[T]], *, probe: bool = False) -> T:
        """``work`` within ``timeout_s``, its failures mapped once to `BackendUnavailable`."""
        if not probe and not self.breaker.allow(self.clock()):
            raise BackendUnavailable(operation, f"Redis failed recently ({self.breaker.error}); retrying shortly")
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await work()
        except FAILURES as exc:
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if self.breaker.down_since is None:  # one line per outage, not one per request
                log.warning("Redis %s failed: %s", operation, detail)
            self.breaker.failed(self.clock(), detail)
            raise BackendUnavailable(operation, detail) from exc
        self.breaker.succeeded()
        return result

    async def _eval(self, name: str, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """EVALSHA, loading the scripts when the server does not know them (a restarted Redis forgets them)."""
        try:
            return await self.client.execute_command("EVALSHA", SHAS[name], len(keys), *keys, *args)
        except NoScriptError:
            await self._load(name)
            return await self.client.execute_command("EVALSHA", SHAS[name], len(keys), *keys, *args)

    async def _cluster_lookup(self, client: RedisCluster, keys: Sequence[bytes], index_keys: Sequence[str],
                              match: bytes) -> list[str]:
        """The groups of the prompt's prefix, from one script call per node holding some of its keys.

        Each node answers for its own keys, in prompt order, up to its first miss; the prefix ends at
        the first position whose node stopped before it.  If a node refuses (a slot is migrating, so
        a key is not where redis-py thinks), the per-key pipeline, which follows redirections, answers.
        """
        await client.initialize()  # once: the slot map (later calls return at once)
        # The slot of an index key is its hash tag's, the Block Key's hex: computed here directly
        # (redis-py's get_node_from_key would encode and search each name for its tag again).
        slots = client.nodes_manager
        by_node: dict[str, tuple[ClusterNode, list[int]]] = {}
        for position, block_key in enumerate(keys):
            node = slots.get_node_from_slot(key_slot(block_key.hex().encode()))
            by_node.setdefault(node.name, (node, []))[1].append(position)
        try:
            answers = await asyncio.gather(*(
                self._eval_at(node, "lookup", self._lookup_args(match, [index_keys[p] for p in positions]))
                for node, positions in by_node.values()))
        except ResponseError as exc:
            log.info("per-node lookup refused (%s): looking up key by key", exc)
            groups: list[str] = []
            for text in await self._per_key("lookup_one", index_keys, [match]):
                if not text:
                    break
                groups.append(text.decode())
            return groups
        found: dict[int, str] = {}
        for (_, positions), text in zip(by_node.values(), answers, strict=True):
            found.update(zip(positions, text.decode().split("\n") if text else (), strict=False))
        groups = []
        for position in range(len(index_keys)):
            group = found.get(position)
            if group is None:
                break  # Block Keys are chained: the first key without a replica ends the prefix
            groups.append(group)
        return groups

    @staticmethod
    def _lookup_args(match: bytes, index_keys: Sequence[str]) -> list[Arg]:
        """LOOKUP's arguments: the keys in one string (their names all have one length; see the script)."""
        return [match, len(index_keys[0]), "".join(index_keys)]

    async def _eval_at(self, node: ClusterNode, name: str, args: Sequence[Arg]) -> Any:
        """EVALSHA of a script that declares no keys, at one cluster node."""
        try:
            return await self.client.execute_command("EVALSHA", SHAS[name], 0, *args, target_nodes=node)
        except NoScriptError:
            await self._load(name)
            return await self.client.execute_command("EVALSHA", SHAS[name], 0, *args, target_nodes=node)

    async def _per_key(self, name: str, keys: Sequence[str], args: Sequence[Arg]) -> list[Any]:
        """One script call per key in one cluster pipeline: redis-py groups the calls by node and sends
        each node its batch at once, the nodes in parallel (one round trip per node)."""
        results = await self._pipeline(name, keys, args)
        if any(isinstance(r, NoScriptError) for r in results):
            await self._load(name)
            results = await self._pipeline(name, keys, args)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            raise failed
        return results

    async def _pipeline(self, name: str, keys: Sequence[str], args: Sequence[Arg]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            # execute_command: redis-py's cluster pipeline refuses its own evalsha method, not the command
            pipe.execute_command("EVALSHA", SHAS[name], 1, key, *args)
        results: list[Any] = await pipe.execute(raise_on_error=False)
        return results

    async def _load(self, name: str) -> None:
        """SCRIPT LOAD one script, on first use or after a restart (redis-py sends it to every primary)."""
        await self.client.execute_command("SCRIPT LOAD", SCRIPTS[name])


def _matches(text: str) -> Matches:
    """The answer to a lookup from LOOKUP's text: one group per matched key, LF between groups."""
    return Matches.of_text(text.count("\n") + 1 if text else 0, text)
