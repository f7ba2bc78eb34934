"""The block fetch pipeline of an engine or the PC: lookup, lease, GET, verify, fall back (sections 6-8).

Why it looks like this:

* Block Keys are chained (section 4.2), so only a *leading* run of blocks is useful: the engine extends
  its cache at the end and recomputes everything after the first hole.  `BlockFetcher` fetches several
  blocks at once (bounded by a semaphore, lowest index first), but the moment block i is lost on every
  replica it cancels blocks > i, and the result is the loaded prefix with ``recompute_from_token``.
* For each block the replicas are tried cheapest first (`kvsp.client.ranking`); each attempt leases the
  block at the holder (section 6.6), GETs it with every check of section 6.7, and releases the lease in
  the background.  Whatever goes wrong with one replica — a 404 (a miss: the index is advisory), a
  digest mismatch (discard, withdraw the replica on the holder's behalf, section 7), a transport failure
  or stall (the holder is then tried last for later blocks), a refusal — moves on to the next one.
  With none left the block is recomputed; nothing raises for a failed block and nothing waits forever.
* With a `MoqtBlockClient` (``moqt=``), replicas whose holder is a ``moqt://`` publisher or relay compete
  on the same cost estimate (decision D3): their layers are FETCHed, each checked against its layer
  digest, without a lease (MOQT has none); any failure falls back down the same list, to HTTPS or to
  recompute.  A moqt replica needs the token count for the container header: ``block_tokens``, or raw
  layers and ``FetchOptions.geometry``.
* ``on_layer`` (an engine loading layer-wise) gets each layer of block i the moment it has arrived and
  passed its layer digest, while later layers are on the wire (HTTPS streaming read or MOQT objects);
  each (block, layer) once, ascending.  After a failure mid-block the next replica continues the block,
  but only a replica whose layer digests equal those of the layers already handed out (the engine may
  have used them).  Layers without a layer digest to check come when their block is complete.
* Counters for section 8 (fetched versus recomputed tokens, digest failures, misses, lease rejections)
  accumulate in a plain `ClientStats` that a metrics exporter can read.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field, fields
from typing import Final

from kvsp.client.holder import BlockMiss, HolderClient, MissReason
from kvsp.client.http import KvspSession, TransportError
from kvsp.client.index import IndexClient
from kvsp.client.moqt import MoqtBlockClient, MoqtRefusedError
from kvsp.client.ranking import HTTPS_AND_MOQT, HTTPS_ONLY, LinkTable, full_range, needed_range, rank_replicas
from kvsp.client.verify import BlockCheck, ReprDigestMissingError, VerifiedBlock
from kvsp.container import Container, Geometry, LayerRange, LayerView
from kvsp.errors import ContainerError, DigestMismatchError, ValidationError
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import Lease, Link, LookupRequest, ReplicaRecord
from kvsp.records.base import uri_scheme
from kvsp.registry import Codec

log = logging.getLogger("kvsp.client.fetch")

BACKGROUND_GRACE_S: Final = 2.0
LayerSink = Callable[[int, LayerView], None]
"""``on_layer(i, view)``: layer ``view.layer`` of block ``i`` of the request, verified (see the module)."""


@dataclass(frozen=True, slots=True)
class FetchOptions:
    """Knobs of the fetch pipeline.

    ``lease_ms`` None fetches without leases.  Without ``require_lease`` a lease refused for quota
    (429) is counted and the block is fetched unleased: the lease only protects against eviction, and
    an evicted block is a 404 that falls back like any miss.  ``deadline_s`` bounds a whole fetch (a
    prefetch deadline, section 6.5); ``links`` are the client's measured links (section 6.4).
    """

    concurrency: int = 8
    lease_ms: int | None = 10_000
    require_lease: bool = False
    withdraw_on_mismatch: bool = True
    withdraw_timeout_s: float = 5.0
    deadline_s: float | None = None
    links: tuple[Link, ...] = ()
    default_mbit_per_s: float = 10_000.0
    default_rtt_us: int = 1_000
    geometry: Geometry | None = None
    local_relay: str | None = None  # moqt:// URI of the own rack's relay: moqt replicas are read through it

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.lease_ms is not None and self.lease_ms < 1:
            raise ValueError("lease_ms must be positive (or None for no lease)")


class Outcome(enum.Enum):
    """What one attempt at one replica came to."""

    LOADED = "loaded"
    MISS = "miss"  # 404 from the holder (block or layers not held)
    DIGEST_MISMATCH = "digest-mismatch"  # Repr-Digest, layer or replica digest wrong: data discarded
    BAD_RESPONSE = "bad-response"  # no Repr-Digest, malformed or unexpected container or body
    TRANSPORT = "transport"  # unreachable, reset, closed early, stalled
    REJECTED = "rejected"  # a problem answer (403, 409, 5xx ...)
    LEASE_REJECTED = "lease-rejected"  # lease quota (429) with require_lease


@dataclass(frozen=True, slots=True)
class Attempt:
    block: int
    holder: str
    outcome: Outcome
    detail: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class LoadedBlock:
    """One block of the loaded prefix and the replica it came from."""

    index: int
    block_key: bytes
    replica: ReplicaRecord
    block: VerifiedBlock

    @property
    def container(self) -> Container:
        return self.block.container

    @property
    def layers(self) -> tuple[LayerView, ...]:
        return self.block.layers


@dataclass(frozen=True, slots=True, eq=False)
class FetchResult:
    """The leading blocks that were loaded; the engine recomputes from ``recompute_from_token`` on.

    ``block_tokens`` is the caller's B, or the token count of the loaded containers when not given.
    """

    requested: int
    matched: int
    blocks: tuple[LoadedBlock, ...]
    block_tokens: int | None
    attempts: tuple[Attempt, ...] = ()
    lookup_error: str | None = None
    deadline_expired: bool = False

    @property
    def loaded_blocks(self) -> int:
        return len(self.blocks)

    @property
    def recompute_from_token(self) -> int:
        return self.loaded_blocks * (self.block_tokens or 0)


@dataclass(slots=True)
class ClientStats:
    """Client-side counters (section 8); plain integers, cumulative over the fetcher's life."""

    lookups: int = 0
    lookup_failures: int = 0
    lookup_keys: int = 0
    matched_keys: int = 0
    fetched_blocks: int = 0
    fetched_tokens: int = 0
    fetched_octets: int = 0
    recomputed_blocks: int = 0
    recomputed_tokens: int = 0
    digest_failures: int = 0
    misses: int = 0
    lease_rejections: int = 0
    transport_failures: int = 0
    bad_responses: int = 0
    rejections: int = 0
    withdrawals: int = 0
    withdrawals_denied: int = 0

    @property
    def hit_ratio(self) -> float:
        """Matched keys over looked-up keys (section 8: lookup hit ratio)."""
        return self.matched_keys / self.lookup_keys if self.lookup_keys else 0.0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_COUNTER: Final = {Outcome.MISS: "misses", Outcome.DIGEST_MISMATCH: "digest_failures",
                   Outcome.BAD_RESPONSE: "bad_responses", Outcome.TRANSPORT: "transport_failures",
                   Outcome.REJECTED: "rejections"}


@dataclass(slots=True)
class _Run:
    """State of one fetch: ids, the prefix limit, suspect holders, attempts, background tasks."""

    scope_id: bytes
    compat_id: bytes
    layers: LayerRange | None
    block_tokens: int | None
    limit: int
    suspects: set[str] = field(default_factory=set)
    attempts: list[Attempt] = field(default_factory=list)
    background: set[asyncio.Task[None]] = field(default_factory=set)
    on_layer: LayerSink | None = None
    delivered: dict[int, dict[int, bytes]] = field(default_factory=dict)  # block -> layer -> its digest
    # holder -> (the keys of the blocks whose first choice it is, one lease for all of them)
    batch: dict[str, tuple[frozenset[bytes], asyncio.Task[Lease | None]]] = field(default_factory=dict)

    def deliver(self, index: int, view: LayerView, digest: bytes) -> None:
        """Hand a verified layer to ``on_layer`` once per (block, layer)."""
        done = self.delivered.setdefault(index, {})
        if view.layer in done or self.on_layer is None:
            return
        done[view.layer] = digest
        self.on_layer(index, view)

    def continues(self, index: int, record: ReplicaRecord) -> bool:
        """Whether ``record`` holds the very layers already handed out for block ``index``."""
        digests = record.layer_digests
        return all(layer < len(digests) and digests[layer] == digest
                   for layer, digest in self.delivered.get(index, {}).items())

    def spawn(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.create_task(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)


class BlockFetcher:
    """Find, lease, fetch and verify the leading cached blocks of a prompt (see the module docstring)."""

    def __init__(self, session: KvspSession, index: IndexClient | str, *, holder: HolderClient | None = None,
                 options: FetchOptions | None = None, stats: ClientStats | None = None,
                 moqt: MoqtBlockClient | None = None) -> None:
        self.session = session
        self.index = index if isinstance(index, IndexClient) else IndexClient(session, index)
        self.holder = holder or HolderClient(session)
        self.moqt = moqt  # with it, moqt:// replicas are tried by cost beside https ones (decision D3)
        self.options = options or FetchOptions()
        self.stats = stats or ClientStats()
        self.links = LinkTable.of(self.options.links, default_mbit_per_s=self.options.default_mbit_per_s,
                                  default_rtt_us=self.options.default_rtt_us, local_relay=self.options.local_relay)

    async def fetch(self, scope_id: bytes, compat_id: bytes, block_keys: Sequence[bytes], *,
                    block_tokens: int | None = None, layers: LayerRange | tuple[int, int] | None = None,
                    on_layer: LayerSink | None = None) -> FetchResult:
        """Look the keys up at the IS, then load the longest verifiable prefix of them.

        ``layers`` fetches only that inclusive layer range of every block; ``on_layer`` gets layers as
        they arrive (see the module docstring).  A failed lookup is not an
        exception: the result loads nothing and says why in ``lookup_error`` (the engine recomputes).
        """
        keys = tuple(block_keys)
        if not keys:
            return FetchResult(0, 0, (), block_tokens)
        self.stats.lookups += 1
        self.stats.lookup_keys += len(keys)
        try:
            response = await self.index.lookup(LookupRequest(scope_id, compat_id, keys))
        except (ProblemError, TransportError, ValidationError) as exc:
            self.stats.lookup_failures += 1
            log.warning("lookup failed, recomputing %d blocks: %s", len(keys), exc)
            self._account(len(keys), (), block_tokens)
            return FetchResult(len(keys), 0, (), block_tokens, lookup_error=str(exc))
        self.stats.matched_keys += response.matched
        return await self.load(scope_id, compat_id, response.replicas, requested=len(keys),
                               block_tokens=block_tokens, layers=layers, on_layer=on_layer)

    async def load(self, scope_id: bytes, compat_id: bytes, replicas: Sequence[Sequence[ReplicaRecord]], *,
                   requested: int | None = None, block_tokens: int | None = None,
                   layers: LayerRange | tuple[int, int] | None = None,
                   on_layer: LayerSink | None = None) -> FetchResult:
        """Load the longest prefix of blocks whose replicas are already known (a lookup's answer)."""
        wanted = None if layers is None else layers if isinstance(layers, LayerRange) else LayerRange(*layers)
        run = _Run(scope_id, compat_id, wanted, block_tokens, limit=len(replicas), on_layer=on_layer)
        try:
            loaded, expired = await self._load_prefix(run, replicas)
        finally:
            await _settle(run.background)
        blocks = _consistent_prefix(loaded, block_tokens)
        tokens = block_tokens if block_tokens is not None else (
            blocks[0].container.token_count if blocks else None)
        total = len(replicas) if requested is None else requested
        self._account(total, blocks, tokens)
        return FetchResult(total, len(replicas), tuple(blocks), tokens, tuple(run.attempts),
                           deadline_expired=expired)

    def _account(self, requested: int, blocks: Sequence[LoadedBlock], block_tokens: int | None) -> None:
        loaded = len(blocks)
        self.stats.fetched_blocks += loaded
        self.stats.recomputed_blocks += requested - loaded
        self.stats.fetched_octets += sum(b.block.size for b in blocks)
        if block_tokens is not None:
            self.stats.fetched_tokens += loaded * block_tokens
            self.stats.recomputed_tokens += (requested - loaded) * block_tokens

    # -- scheduling ----------------------------------------------------------------------------------
    async def _load_prefix(self, run: _Run,
                           replicas: Sequence[Sequence[ReplicaRecord]]) -> tuple[list[LoadedBlock], bool]:
        """Fetch blocks concurrently; a block lost on every replica cancels all blocks after it."""
        results: list[LoadedBlock | None] = [None] * len(replicas)
        gate = asyncio.Semaphore(self.options.concurrency)
        tasks: list[asyncio.Task[None]] = []

        async def one(i: int) -> None:
            async with gate:  # FIFO: lower block indexes start first
                if i >= run.limit:
                    return
                results[i] = await self._load_block(run, i, replicas[i])
            if results[i] is None and i < run.limit:
                run.limit = i
                for later in tasks[i + 1 :]:
                    later.cancel()

        self._lease_batches(run, replicas)
        tasks = [asyncio.create_task(one(i)) for i in range(len(replicas))]
        expired = False
        try:
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=self.options.deadline_s)
                expired = bool(pending)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._release_batches(run)
        for task in tasks:
            error = None if task.cancelled() else task.exception()
            if error is not None:
                raise error  # a bug, not a failed replica (those are outcomes): surface it
        prefix: list[LoadedBlock] = []
        for loaded in results[: run.limit]:
            if loaded is None:
                break
            prefix.append(loaded)
        return prefix, expired

    async def _load_block(self, run: _Run, index: int, group: Sequence[ReplicaRecord]) -> LoadedBlock | None:
        """Try the block's replicas cheapest first; holders that failed in this fetch go last."""
        model_layers = self.options.geometry.layers if self.options.geometry else None
        needed = needed_range(group, run.layers, model_layers)
        remaining = self._ranked(run, group)
        while remaining and needed is not None:
            record = next((r for r in remaining if r.holder not in run.suspects), remaining[0])
            remaining.remove(record)
            loaded = await self._attempt(run, index, record, needed, group)
            if loaded is not None:
                return loaded
        return None

    def _ranked(self, run: _Run, group: Sequence[ReplicaRecord]) -> list[ReplicaRecord]:
        model_layers = self.options.geometry.layers if self.options.geometry else None
        schemes = HTTPS_AND_MOQT if self.moqt is not None else HTTPS_ONLY
        return [r for r in rank_replicas(group, self.links, layers=run.layers, model_layers=model_layers,
                                         schemes=schemes) if self._reachable(run, r)]

    def _lease_batches(self, run: _Run, replicas: Sequence[Sequence[ReplicaRecord]]) -> None:
        """One lease per holder for all the blocks whose first choice it is (a lease lists keys, section 6.6):
        n blocks from one holder cost one lease round trip, not n (measured: per-block leases about doubled
        the fetch time of a block).  A refused batch (a key gone, quota) falls back to per-block leases."""
        if self.options.lease_ms is None:
            return
        by_holder: dict[str, dict[bytes, None]] = {}
        for group in replicas:
            ranked = self._ranked(run, group)
            if ranked and uri_scheme(ranked[0].holder) == "https":
                by_holder.setdefault(ranked[0].holder, {})[ranked[0].block_key] = None
        for holder, keys in by_holder.items():
            if len(keys) > 1:
                run.batch[holder] = (frozenset(keys), asyncio.create_task(self._batch_lease(holder, list(keys))))

    async def _batch_lease(self, holder: str, keys: list[bytes]) -> Lease | None:
        assert self.options.lease_ms is not None
        try:
            return await self.holder.lease(holder, keys, self.options.lease_ms)
        except (ProblemError, TransportError, ValidationError) as exc:
            log.debug("one lease for %d blocks at %s refused (%s): leasing them one by one", len(keys), holder, exc)
            return None

    async def _batched(self, run: _Run, record: ReplicaRecord) -> bool:
        """Whether a batch lease covers ``record``; shielded, since every block of the batch awaits it."""
        batch = run.batch.get(record.holder)
        if batch is None or record.block_key not in batch[0]:
            return False
        return await asyncio.shield(batch[1]) is not None

    async def _release_batches(self, run: _Run) -> None:
        for holder, (_, task) in run.batch.items():
            if not task.done():
                task.cancel()
            elif not task.cancelled() and task.exception() is None and (lease := task.result()) is not None:
                run.spawn(self._release(holder, lease.lease))
        await asyncio.gather(*(task for _, task in run.batch.values()), return_exceptions=True)

    def _reachable(self, run: _Run, record: ReplicaRecord) -> bool:
        """A moqt replica needs the token count for the container header: B, or raw layers and the geometry."""
        if uri_scheme(record.holder) != "moqt":
            return True
        return run.block_tokens is not None or (record.codec == Codec.RAW and self.options.geometry is not None)

    # -- one attempt -----------------------------------------------------------------------------------
    async def _attempt(self, run: _Run, index: int, record: ReplicaRecord, needed: LayerRange,
                       group: Sequence[ReplicaRecord]) -> LoadedBlock | None:
        if uri_scheme(record.holder) == "moqt":  # MOQT has no leases: the holder's retention applies
            return await self._get(run, index, record, needed, group)
        if await self._batched(run, record):
            return await self._get(run, index, record, needed, group)
        proceed, lease = await self._lease(run, index, record)
        if not proceed:
            return None
        try:
            return await self._get(run, index, record, needed, group)
        finally:
            if lease is not None:
                run.spawn(self._release(record.holder, lease.lease))

    async def _lease(self, run: _Run, index: int, record: ReplicaRecord) -> tuple[bool, Lease | None]:
        """(whether to go on with this replica, the lease if one was granted)."""
        if self.options.lease_ms is None:
            return True, None
        try:
            return True, await self.holder.lease(record.holder, [record.block_key], self.options.lease_ms)
        except ProblemError as exc:
            problem = exc.problem
            if problem.kind is ProblemType.LEASE_QUOTA or problem.status == 429:
                self.stats.lease_rejections += 1
                if not self.options.require_lease:
                    return True, None
                self._note(run, index, record, Outcome.LEASE_REJECTED, str(exc))
            elif problem.status == 404:
                self._note(run, index, record, Outcome.MISS, f"lease: {exc}")
            else:
                self._note(run, index, record, Outcome.REJECTED, f"lease: {exc}")
        except TransportError as exc:
            run.suspects.add(record.holder)
            self._note(run, index, record, Outcome.TRANSPORT, f"lease: {exc}")
        except ValidationError as exc:
            self._note(run, index, record, Outcome.BAD_RESPONSE, f"lease: {exc}")
        return False, None

    async def _transfer(self, run: _Run, record: ReplicaRecord, needed: LayerRange) -> VerifiedBlock | BlockMiss:
        """GET over HTTPS, or FETCH over MOQT for a moqt holder; every digest of section 6.7 checked."""
        if self.moqt is not None and uri_scheme(record.holder) == "moqt":
            return await self.moqt.fetch_block(record, layers=needed, token_count=run.block_tokens,
                                               geometry=self.options.geometry)
        layers = None if needed == full_range(record) else needed
        check = BlockCheck.for_replica(record, layers=layers, token_count=run.block_tokens,
                                       geometry=self.options.geometry, max_size=self.holder.options.max_block_size)
        return await self.holder.get_block(record.holder, run.compat_id, run.scope_id, record.block_key,
                                           layers=layers, expect=check)

    async def _streamed(self, run: _Run, index: int, record: ReplicaRecord,
                        needed: LayerRange) -> VerifiedBlock | BlockMiss:
        """`_transfer`, handing each layer verified by its layer digest to ``run.on_layer`` on arrival."""
        if not run.continues(index, record):
            raise ContainerError("this replica's layer digests differ from the layers already used")
        digests = record.layer_digests
        if self.moqt is not None and uri_scheme(record.holder) == "moqt":
            try:
                async with self.moqt.open_block(record, layers=needed, token_count=run.block_tokens,
                                                geometry=self.options.geometry) as moqt_stream:
                    async for view in moqt_stream.layers():
                        if digests:  # each object was checked against its layer digest
                            run.deliver(index, view, digests[view.layer])
                    block = moqt_stream.block
            except MoqtRefusedError as exc:
                if not exc.not_found:
                    raise
                reason = MissReason.LAYERS_UNAVAILABLE if exc.layers_unavailable else MissReason.NOT_FOUND
                return BlockMiss(record.holder, reason, str(exc))
        else:
            layers = None if needed == full_range(record) else needed
            check = BlockCheck.for_replica(record, layers=layers, token_count=run.block_tokens,
                                           geometry=self.options.geometry, max_size=self.holder.options.max_block_size)
            async with self.holder.open_block(record.holder, run.compat_id, run.scope_id, record.block_key,
                                              layers=layers, expect=check) as answer:
                if isinstance(answer, BlockMiss):
                    return answer
                async for view in answer.layers():
                    header = answer.header
                    if digests and header is not None and check.hashes_layers(header):
                        run.deliver(index, view, digests[view.layer])
                block = answer.block
        for view in block.layers:  # those no layer digest vouched for, now that the whole block did
            run.deliver(index, view, digests[view.layer] if view.layer < len(digests) else b"")
        return block

    async def _get(self, run: _Run, index: int, record: ReplicaRecord, needed: LayerRange,
                   group: Sequence[ReplicaRecord]) -> LoadedBlock | None:
        try:
            async with asyncio.timeout(self.holder.options.block_timeout_s):
                if run.on_layer is None:
                    answer = await self._transfer(run, record, needed)
                else:
                    answer = await self._streamed(run, index, record, needed)
        except DigestMismatchError as exc:
            self._note(run, index, record, Outcome.DIGEST_MISMATCH, str(exc))
            for origin in self._origins(record, group):
                await self._withdraw(origin)
            return None
        except (TransportError, TimeoutError) as exc:
            run.suspects.add(record.holder)
            self._note(run, index, record, Outcome.TRANSPORT, str(exc) or type(exc).__name__)
            return None
        except (ContainerError, ReprDigestMissingError) as exc:
            self._note(run, index, record, Outcome.BAD_RESPONSE, str(exc))
            return None
        except (ProblemError, MoqtRefusedError) as exc:
            self._note(run, index, record, Outcome.REJECTED, str(exc))
            return None
        if isinstance(answer, BlockMiss):
            self._note(run, index, record, Outcome.MISS, answer.reason.value)
            return None
        self._note(run, index, record, Outcome.LOADED)
        return LoadedBlock(index, record.block_key, record, answer)

    def _note(self, run: _Run, index: int, record: ReplicaRecord, outcome: Outcome, detail: str = "") -> None:
        run.attempts.append(Attempt(index, record.holder, outcome, detail))
        counter = _COUNTER.get(outcome)
        if counter is not None:
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)
            log.info("block %d at %s: %s %s", index, record.holder, outcome.value, detail)

    def _origins(self, record: ReplicaRecord, group: Sequence[ReplicaRecord]) -> list[ReplicaRecord]:
        """The published records behind ``record``: itself, or for a replica reached through the local relay
        (a rewritten record the IS never saw) the moqt records of the same namespace."""
        relay = self.links.local_relay
        if relay is None or record.holder != relay or record.moqt_namespace is None:
            return [record]
        return [r for r in group if r.moqt_namespace == record.moqt_namespace and uri_scheme(r.holder) == "moqt"]

    async def _withdraw(self, record: ReplicaRecord) -> None:
        """Report a bad replica to the IS by withdrawing it on the holder's behalf (section 7), if allowed."""
        if not self.options.withdraw_on_mismatch:
            return
        try:
            async with asyncio.timeout(self.options.withdraw_timeout_s):
                await self.index.withdraw(record.holder, record.block_key, producer=record.producer_id)
            self.stats.withdrawals += 1
        except ProblemError as exc:
            if exc.problem.status == 403:
                self.stats.withdrawals_denied += 1  # not authorized for this holder: fine, carry on
            else:
                log.warning("withdrawal of a bad replica at %s refused: %s", record.holder, exc)
        except (TransportError, TimeoutError, ValidationError) as exc:
            log.warning("withdrawal of a bad replica at %s failed: %s", record.holder, exc)

    async def _release(self, holder: str, lease_id: str) -> None:
        try:
            await self.holder.release(holder, lease_id)
        except (ProblemError, TransportError) as exc:
            log.info("lease %s at %s not released (it expires anyway): %s", lease_id, holder, exc)


def _consistent_prefix(blocks: list[LoadedBlock], block_tokens: int | None) -> list[LoadedBlock]:
    """Without a given B, every block of the prefix must hold as many tokens as the first."""
    if block_tokens is not None or not blocks:
        return blocks
    tokens = blocks[0].container.token_count
    for i, block in enumerate(blocks):
        if block.container.token_count != tokens:
            return blocks[:i]
    return blocks


async def _settle(tasks: set[asyncio.Task[None]]) -> None:
    """Give background requests (lease releases) a short grace, then cancel what is left."""
    if not tasks:
        return
    pending = set(tasks)
    _, late = await asyncio.wait(pending, timeout=BACKGROUND_GRACE_S)
    for task in late:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
