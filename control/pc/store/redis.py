"""`PcStore` on Redis or Redis Cluster (``[pc] backend = "redis"``, decision D7).

Key layout, every key under ``{key_prefix}{pc}:`` (the hash tag puts them all in one cluster slot):

    lease                 string  "TOKEN NONCE BASE_URI", PX = lease ttl: the leader lease
    fence                 string  the fencing-token counter, INCR on every acquire
    sessions              set     session ids
    s:<session>           hash    epoch, owner, offset, checkpoint (JSON, its epoch is the hash's),
                                  scope, compat, stranded, closed, max_tokens, prompt (JSON), last_owner,
                                  moving
    instances             hash    instance base URI -> InstanceRecord JSON
    instance-epochs       hash    instance base URI -> highest epoch seen
    maps                  hash    map id -> MapRecord JSON
    map-versions          hash    map id -> authoritative version
    directives            hash    directive id -> DirectiveRecord JSON
    directive-expiry      zset    directive id scored by its expiry (ms, the server's clock)

Every write is one EVALSHA of a script in `control.pc.store.scripts` (fence and rule in one atomic
step); reads happen only in `load` (a new leader) and `leader` (a standby naming the leader).  Each
operation is bounded (twice ``timeout_ms``, redis-py's own retries included); anything that does not
complete in time is `StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar, cast

from redis.exceptions import RedisError

from control.backend import RedisConfig, connect
from control.pc.core.durable import (
    DirectiveRecord,
    InstanceRecord,
    MapRecord,
    Refusal,
    Refused,
    SessionRecord,
    Snapshot,
    WriteRefused,
)
from control.pc.store import scripts
from control.pc.store.base import Fence, LeaseView, StoreUnavailable, parse_lease
from kvsp.encoding import canonical_json
from kvsp.errors import KvspError
from kvsp.records import SessionCheckpoint

T = TypeVar("T")
CLOSE_TIMEOUT_S: Final = 2.0  # closing the client at shutdown
LOAD_BATCH: Final = 256  # sessions per pipeline when a new leader loads


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _int(value: object) -> int:
    """An integer of a script's reply (Lua numbers arrive as ints, strings as bytes)."""
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | str):
        return int(value)
    raise StoreUnavailable(f"unexpected reply {value!r} from a PC script")


class RedisStore:
    """The lease and the durable state of one group of PC processes in one Redis (or Cluster)."""

    def __init__(self, config: RedisConfig, client: Any | None = None) -> None:
        self.config = config
        self.bound_s = 2 * config.timeout_ms / 1000
        # redis-py's asyncio Redis and RedisCluster share the calls used here but no declared type
        self.redis: Any = cast(Any, client if client is not None else connect(config))
        base = f"{config.key_prefix}{{pc}}:"
        self.keys = {name: base + name for name in (
            "lease", "fence", "sessions", "instances", "instance-epochs", "maps", "map-versions", "directives",
            "directive-expiry")}
        self._session_prefix = base + "s:"
        self._scripts = {name: self.redis.register_script(getattr(scripts, name.upper())) for name in (
            "acquire", "renew", "release", "open_session", "checkpoint", "save_session", "drop_sessions",
            "save_versioned", "save_directive")}

    def session_key(self, session: str) -> str:
        return self._session_prefix + session

    async def _bounded(self, what: str, op: Callable[[], Awaitable[T]]) -> T:
        try:
            async with asyncio.timeout(self.bound_s):
                return await op()
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"{what}: Redis at {self.config.url} did not answer ({exc!r})") from exc

    async def _run(self, name: str, what: str, keys: Sequence[str], args: Sequence[Any]) -> list[object]:
        reply = await self._bounded(what, lambda: self._scripts[name](keys=list(keys), args=list(args)))
        if isinstance(reply, list):
            return reply
        return [reply]

    async def _write(self, name: str, what: str, keys: Sequence[str], args: Sequence[Any]) -> list[object]:
        reply = await self._run(name, what, keys, args)
        status = _text(reply[0])
        if status != "ok":
            current = _int(reply[1]) if len(reply) > 1 else None
            raise WriteRefused(Refused(Refusal(status), current), what)
        return reply

    # -- lease -------------------------------------------------------------------------------------
    async def acquire(self, holder: str, ttl_ms: int) -> LeaseView:
        reply = await self._run("acquire", "acquire the lease", [self.keys["lease"], self.keys["fence"]],
                                [holder, ttl_ms])
        held = parse_lease(_text(reply[1]))
        if held is None:
            return LeaseView(None, None)
        # A granted token, or our own grant seen again (a retried acquire whose first answer was lost).
        if _int(reply[0]) > 0 or held.holder == holder:
            return LeaseView(held, held.leader)
        return LeaseView(None, held.leader)

    async def renew(self, fence: Fence, ttl_ms: int) -> bool:
        reply = await self._run("renew", "renew the lease", [self.keys["lease"]], [fence.value, ttl_ms])
        return bool(_int(reply[0]))

    async def release(self, fence: Fence) -> None:
        await self._run("release", "release the lease", [self.keys["lease"]], [fence.value])

    async def leader(self) -> str | None:
        value = await self._bounded("read the lease", lambda: self.redis.get(self.keys["lease"]))
        held = None if value is None else parse_lease(_text(value))
        return None if held is None else held.leader

    # -- state ---------------------------------------------------------------------------------------
    async def open_session(self, fence: Fence, record: SessionRecord) -> None:
        await self._write("open_session", f"open session {record.session}",
                          [self.keys["lease"], self.keys["sessions"], self.session_key(record.session)],
                          [fence.value, record.session, *_session_fields(record)])

    async def record_checkpoint(self, fence: Fence, sender: str, checkpoint: SessionCheckpoint) -> int:
        reply = await self._write("checkpoint", f"checkpoint of {checkpoint.session} at epoch {checkpoint.epoch}",
                                  [self.keys["lease"], self.session_key(checkpoint.session)],
                                  [fence.value, sender, checkpoint.epoch, checkpoint.output_offset,
                                   _checkpoint_json(checkpoint)])
        return _int(reply[1])

    async def save_session(self, fence: Fence, record: SessionRecord) -> None:
        await self._write("save_session", f"session {record.session} at epoch {record.epoch}",
                          [self.keys["lease"], self.keys["sessions"], self.session_key(record.session)],
                          [fence.value, record.session, record.epoch, record.output_offset,
                           *_session_fields(record)])

    async def drop_sessions(self, fence: Fence, sessions: Sequence[str]) -> None:
        if not sessions:
            return
        await self._write("drop_sessions", "drop sessions",
                          [self.keys["lease"], self.keys["sessions"], *(self.session_key(s) for s in sessions)],
                          [fence.value, *sessions])

    async def save_instance(self, fence: Fence, record: InstanceRecord) -> None:
        await self._write("save_versioned", f"instance {record.instance} at epoch {record.epoch}",
                          [self.keys["lease"], self.keys["instances"], self.keys["instance-epochs"]],
                          [fence.value, record.instance, record.epoch, canonical_json(record.to_json())])

    async def save_map(self, fence: Fence, record: MapRecord) -> None:
        await self._write("save_versioned", f"map {record.map} at version {record.version}",
                          [self.keys["lease"], self.keys["maps"], self.keys["map-versions"]],
                          [fence.value, record.map, record.version, canonical_json(record.to_json())])

    async def save_directive(self, fence: Fence, record: DirectiveRecord) -> None:
        await self._write("save_directive", f"directive {record.id}",
                          [self.keys["lease"], self.keys["directives"], self.keys["directive-expiry"]],
                          [fence.value, record.id, record.lifetime_ms, canonical_json(record.to_json())])

    async def load(self) -> Snapshot:
        """Everything, a bounded round trip at a time (a set, sessions in pipelined batches, three hashes)."""
        r, bounded = self.redis, self._bounded
        ids = sorted(_text(s) for s in await bounded("load session ids", lambda: r.smembers(self.keys["sessions"])))
        sessions: list[SessionRecord] = []
        for start in range(0, len(ids), LOAD_BATCH):
            batch = ids[start:start + LOAD_BATCH]
            pipe = r.pipeline(transaction=False)
            for session in batch:
                pipe.hgetall(self.session_key(session))
            for session, fields in zip(batch, await bounded("load sessions", pipe.execute), strict=True):
                if fields:
                    sessions.append(_session_of(session, {_text(k): _text(v) for k, v in fields.items()}))
        raw_instances = await bounded("load instances", lambda: r.hgetall(self.keys["instances"]))
        raw_maps = await bounded("load maps", lambda: r.hgetall(self.keys["maps"]))
        seconds, micros = await bounded("read the server clock", r.time)
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        live = [_text(d) for d in await bounded("load directives", lambda: r.zrangebyscore(
            self.keys["directive-expiry"], now_ms + 1, "+inf"))]
        values = await bounded("load directives", lambda: r.hmget(self.keys["directives"], live)) if live else []
        try:
            return Snapshot(tuple(sessions),
                            tuple(InstanceRecord.from_json(json.loads(v)) for v in raw_instances.values()),
                            tuple(MapRecord.from_json(json.loads(v)) for v in raw_maps.values()),
                            tuple(DirectiveRecord.from_json(json.loads(v)) for v in values if v is not None))
        except (KvspError, ValueError, KeyError) as exc:
            raise StoreUnavailable(f"the stored PC state does not parse ({exc})") from exc

    async def close(self) -> None:
        """Bounded: a shutdown must not wait on a Redis that vanished (its sockets may never answer)."""
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.redis.aclose()


# -- the session hash ---------------------------------------------------------------------------------
def _checkpoint_json(checkpoint: SessionCheckpoint) -> bytes:
    return canonical_json(checkpoint.to_json())


def _session_fields(record: SessionRecord) -> list[object]:
    """Field/value pairs of the session hash; '' stands for None (a hash has no null)."""
    fields: dict[str, object] = {
        "epoch": record.epoch, "owner": record.owner or "", "offset": record.output_offset,
        "checkpoint": b"" if record.checkpoint is None else _checkpoint_json(record.checkpoint),
        "scope": "" if record.scope_id is None else record.scope_id.hex(),
        "compat": "" if record.compat_id is None else record.compat_id.hex(),
        "stranded": record.stranded or "", "closed": "1" if record.closed else "0",
        "max_tokens": "" if record.max_tokens is None else record.max_tokens,
        "prompt": "" if record.prompt is None else json.dumps(list(record.prompt), separators=(",", ":")),
        "last_owner": record.last_owner or "", "moving": "1" if record.moving else "0",
    }
    return [item for pair in fields.items() for item in pair]


def _session_of(session: str, f: dict[str, str]) -> SessionRecord:
    epoch = int(f["epoch"])
    checkpoint = None
    if f.get("checkpoint"):
        try:  # recorded at the session's epoch: a move keeps it and raises the hash's epoch
            checkpoint = dataclasses.replace(SessionCheckpoint.from_bytes(f["checkpoint"]), epoch=epoch)
        except KvspError as exc:
            raise StoreUnavailable(f"session {session}: the stored checkpoint does not parse ({exc})") from exc
    return SessionRecord(
        session=session, epoch=epoch, owner=f.get("owner") or None, checkpoint=checkpoint,
        scope_id=bytes.fromhex(f["scope"]) if f.get("scope") else None,
        compat_id=bytes.fromhex(f["compat"]) if f.get("compat") else None,
        stranded=f.get("stranded") or None, closed=f.get("closed") == "1",
        max_tokens=int(f["max_tokens"]) if f.get("max_tokens") else None,
        prompt=tuple(json.loads(f["prompt"])) if f.get("prompt") else None,
        last_owner=f.get("last_owner") or None, moving=f.get("moving") == "1")
