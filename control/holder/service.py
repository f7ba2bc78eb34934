"""The holder's asyncio adapter: applies the store's events to the tiers and the Index Service.

`BlockStore` and `LeaseTable` decide; `Holder` carries the decisions out, in event order:

* data moves (`Place`, `Demote`) go to the tiers, file I/O in worker threads so the event loop never
  waits on a disk;
* every `Withdraw` is started at once and each `Evict` waits for its block's withdrawal (bounded by
  ``withdraw_timeout_ms``) before the bytes go, so the IS stops pointing here before the data is gone
  (spec section 6.1 allows "immediately after"; "before" is stricter and costs one IS round trip);
* `Publish`/`Republish` queue a record publication.

Store mutations run one at a time under a lock, so a batch of events is applied completely before
the next decision.  Readers take no lock: they work on an immutable `Entry` snapshot, and tier reads
fall back from host to disk, so a block being demoted is served from whichever copy exists.
A tier failure (a write error, a stored block that fails authentication) makes the block *lost*:
it is withdrawn first and then dropped, leased or not (spec section 6.6, the fault path).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Final

from control.holder.disk import DROP_UNREADABLE, DiskTier, VerifyError
from control.holder.leases import LeaseQuotaError, LeaseState, LeaseTable
from control.holder.metrics import HolderMetrics
from control.holder.publisher import Publisher
from control.holder.quota import holder_quotas
from control.holder.settings import HolderSettings
from control.holder.store import (
    BlockExistsError,
    BlockId,
    BlockMeta,
    BlockStore,
    Demote,
    Entry,
    Event,
    Evict,
    Move,
    Place,
    Publish,
    Republish,
    Segment,
    Withdraw,
)
from control.holder.tiers import MemoryTier, StorageCorruptError, StorageMissingError, TierError
from control.holder.tierset import TierSet
from kvsp.container import ContainerHeader, Geometry, LayerRange, parse_header
from kvsp.descriptor import CompatDescriptor
from kvsp.errors import ContainerError, KvspError
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import LeaseRenewal, LeaseRequest, ReplicaRecord, Residency
from kvsp.registry import Tier
from kvsp.service.logs import FailureStreak
from kvsp.service.policy import Quotas

log = logging.getLogger("kvsp.holder")

MAINTENANCE_PERIOD_S: Final = 1.0
THREAD_HASH_OCTETS: Final = 1 << 20  # hash larger representations off the event loop
RANGE_DIGESTS: Final = 4096  # remembered Repr-Digests of layer ranges (clients repeat their ranges)


class StoreFullError(KvspError):
    """No tier can make room: everything that could go is leased (HTTP 507)."""


@dataclass(frozen=True, slots=True)
class Representation:
    """A block representation ready to send: parts (views, no copy), their total length, and digest."""

    parts: tuple[bytes | memoryview, ...]
    length: int
    repr_digest: bytes
    whole: bool


class Holder:
    """Store, tiers, leases and publisher of one holder role."""

    def __init__(self, settings: HolderSettings, *, base_uri: str, quotas: Quotas, clock: Callable[[], float],
                 metrics: HolderMetrics, host: MemoryTier | None, disk: DiskTier | None,
                 device: MemoryTier | None = None, wall: Callable[[], float] = time.time) -> None:
        capacities: dict[Tier, int] = {}
        if device is not None:
            capacities[Tier.DEVICE] = settings.device_capacity_octets
        if host is not None:
            capacities[Tier.HOST] = settings.host_capacity_octets
        if disk is not None:
            capacities[Tier.LOCAL_STORAGE] = settings.storage_capacity_octets
        self.settings = settings
        self.base_uri = base_uri
        self.clock = clock
        self.wall = wall  # persisted times are wall-clock (``clock`` may be monotonic: not across restarts)
        self.metrics = metrics
        self.host = host
        self.disk = disk
        self.device = device
        self.tiers = TierSet(device=device, host=host, disk=disk)
        # lease_octets_per_client against what these tiers can hold (unset: a quarter of it)
        self.quota = holder_quotas(quotas, capacities, fast_layers=settings.fast_layers)
        self.leases = LeaseTable(replace(quotas, lease_octets_per_client=self.quota.lease_octets_per_client))
        self.store = BlockStore(capacities, retention_s=settings.retention_ms / 1000, pins=self.leases,
                                fast_layers=settings.fast_layers)
        self.publisher = Publisher(base_uri, self.record_of, clock, settings.replica_ttl_ms / 3000, metrics)
        self._mutex = asyncio.Lock()
        self._adopted: tuple[BlockMeta, ...] = ()  # taken over from local storage at startup
        self.adoption_published = asyncio.Event()  # their records are published (the listeners serve)
        self.verification_done = asyncio.Event()  # their contents are checked (or verify_stored is off)
        self._wake = asyncio.Event()
        # Keyed by the full container's digest too, so a block stored again with other octets misses.
        self._range_digests: OrderedDict[tuple[BlockId, bytes, LayerRange], bytes] = OrderedDict()
        for tier in self.store.tiers:
            metrics.tier_capacity.labels(tier.value).set(self.store.capacity(tier))

    # -- records ---------------------------------------------------------------------------------
    def read_rate(self, tier: Tier) -> float | None:
        """Measured read rate of a tier, Mbit/s, rounded to a whole number (None: unmeasured)."""
        return self.tiers.rate(tier)

    def record_of(self, block: BlockId) -> ReplicaRecord | None:
        """The replica record to publish now, or None when the block is no longer served."""
        now = self.clock()
        entry = self.store.get(block, now, touch=False)
        if entry is None:
            return None
        ttl_ms = self.settings.replica_ttl_ms
        if not self.store.is_leased(entry, now):  # never advertise beyond retention
            ttl_ms = min(ttl_ms, math.ceil(entry.remaining_s(now) * 1000))
        residency = tuple(
            Residency(s.tier, (s.layers.first, s.layers.last), self.read_rate(s.tier)) for s in entry.placement)
        meta = entry.meta
        return ReplicaRecord(block.block_key, block.compat_id, block.scope_id, self.base_uri, meta.codec,
                             meta.size, meta.digest, residency, max(1, ttl_ms), meta.layer_digests)

    def max_age_s(self, entry: Entry, now: float) -> int:
        """Cache-Control max-age: no longer than the replica's remaining TTL (spec section 6.7)."""
        return int(min(entry.remaining_s(now), self.settings.replica_ttl_ms / 1000))

    # -- storing ---------------------------------------------------------------------------------
    async def put(self, meta: BlockMeta, container: memoryview) -> Entry:
        """Store a decoded, verified block.  Raises `BlockExistsError` or `StoreFullError`."""
        async with self._mutex:
            outcome = self.store.put(meta, self.clock())
            await self._apply(outcome.events, {meta.block: container})
        entry = self.store.peek(meta.block)
        if outcome.tier is None:
            raise StoreFullError("no tier can make room for this block: leased data fills them")
        if entry is None:
            raise TierError(f"the {outcome.tier} tier failed to store the block")
        self.metrics.blocks_stored.inc()
        self._update_gauges()
        return entry

    async def lose(self, block: BlockId) -> None:
        """The fault path: withdraw the block first, then drop it even if leased (spec 6.6)."""
        async with self._mutex:
            await self._apply(self.store.force_evict(block), {})
        self._update_gauges()

    async def _apply(self, events: tuple[Event, ...] | list[Event], incoming: Mapping[BlockId, memoryview]) -> None:
        withdrawals = {e.block: self.publisher.withdraw(e.block) for e in events if isinstance(e, Withdraw)}
        failed: list[BlockId] = []
        for event in events:
            if event.block in failed:
                continue
            try:
                await self._apply_one(event, incoming, withdrawals)
            except (OSError, TierError) as exc:
                log.error("tier failure on %s (%s): %s; the replica is dropped", event.block, event, exc)
                failed.append(event.block)
        for block in failed:
            await self._apply(self.store.force_evict(block), {})

    async def _apply_one(self, event: Event, incoming: Mapping[BlockId, memoryview],
                         withdrawals: Mapping[BlockId, asyncio.Task[bool]]) -> None:
        match event:
            case Place(meta, tier, layers):
                await self.tiers.place(meta, tier, layers, incoming[meta.block], self._wall_stored(meta.block))
            case Move(meta, layers, source, target):  # and Demote, its capacity-driven kind
                await self.tiers.move(meta, layers, source, target, self._wall_stored(meta.block))
                if isinstance(event, Demote):
                    self.metrics.demotions.inc()
            case Withdraw():
                pass  # started before the batch
            case Evict(block, reason):
                await self._await_withdrawal(withdrawals.get(block))
                await self.tiers.drop(block)
                self.metrics.evictions.labels(reason).inc()
            case Publish(block) | Republish(block):
                self.publisher.publish(block)
            case _:
                raise TierError(f"no tier to carry out {event}")

    def _wall_stored(self, block: BlockId) -> float:
        """When the block was stored, in wall-clock seconds (what local storage keeps for retention)."""
        entry = self.store.peek(block)
        age = 0.0 if entry is None else max(0.0, self.clock() - entry.stored_at)
        return self.wall() - age

    async def adopt(self) -> int:
        """Take over the blocks an earlier process left in local storage (a restart keeps the cache).

        Only the metadata is checked here, in a worker thread (`DiskTier.adopt` without ``verify``:
        commit records authenticate, headers match, files are long enough); what fails is removed,
        counted, and withdrawn at once (after a crash the IS may still list it).  The rest enter the
        store with their stored-at times, oldest first (so least recently used), and the tiers are
        trimmed to their capacities.  Their records are published by `publish_adopted` once the
        listeners serve, their contents checked by `verify_adopted` while serving.  Call once at
        startup, before serving.  Returns how many blocks were adopted.
        """
        if self.disk is None:
            return 0
        adoption = await asyncio.to_thread(self.disk.adopt, stored_accepts(self.settings.descriptors),
                                           self.settings.retention_ms / 1000, self.wall(), verify=False)
        for reason, count in sorted(adoption.dropped.items()):
            self.metrics.adoption_drops.labels(reason).inc(count)
            log.warning("local storage: removed %d stored blocks (%s) instead of adopting them", count, reason)
        async with self._mutex:
            now, wall = self.clock(), self.wall()
            for found in sorted(adoption.adopted, key=lambda a: a.stored_at):
                try:
                    self.store.adopt(found.meta, (Segment(Tier.LOCAL_STORAGE, found.meta.layers),),
                                     now - max(0.0, wall - found.stored_at))
                except BlockExistsError:
                    continue
            await self._apply(self.store.trim(now), {})
        self._adopted = tuple(a.meta for a in adoption.adopted if self._still_adopted(a.meta))
        for block in adoption.removed:
            if block not in self.store:
                self.publisher.withdraw(block)
        self.metrics.blocks_adopted.inc(len(self._adopted))
        self._update_gauges()
        log.info("local storage: adopted %d blocks (%d octets)", len(self._adopted),
                 self.store.used(Tier.LOCAL_STORAGE))
        return len(self._adopted)

    def _still_adopted(self, meta: BlockMeta) -> bool:
        """The adopted block is held, as adopted (not evicted, not lost, not stored again since)."""
        entry = self.store.peek(meta.block)
        return entry is not None and entry.meta.repr_digest == meta.repr_digest

    def publish_adopted(self) -> int:
        """Publish the records of the adopted blocks still held (fresh TTLs); call once the HTTPS
        listener (and the MOQT one) serves, so the IS never points readers at a holder not yet
        listening.  Returns how many were published."""
        held = [meta.block for meta in self._adopted if self._still_adopted(meta)]
        for block in held:
            self.publisher.publish(block)
        self.adoption_published.set()
        return len(held)

    async def verify_adopted(self) -> int:
        """Read and check every adopted block still wholly in local storage (`DiskTier.verify`, in a
        worker thread, one block at a time, newest first) while the holder serves.  A block that
        fails is dropped and withdrawn like one failing a read (`lose`).  Reads of blocks not yet
        checked are safe meanwhile: every read authenticates the layers it returns.  Returns how
        many blocks were dropped; sets ``verification_done`` at the end."""
        lost = 0
        try:
            for meta in reversed(self._adopted):
                if await self._verify_one(meta):
                    lost += 1
        finally:
            self.verification_done.set()
        log.info("local storage: verified %d adopted blocks, %d dropped", len(self._adopted), lost)
        return lost

    async def _verify_one(self, meta: BlockMeta) -> bool:
        disk = self.disk
        if disk is None or not self._still_adopted(meta) or disk.held(meta.block) != meta.layers:
            return False  # gone, or (partly) moved to memory through authenticated reads
        try:
            await asyncio.to_thread(disk.verify, meta)
            return False
        except StorageMissingError:
            return False
        except (VerifyError, OSError) as exc:
            if not self._still_adopted(meta) or disk.held(meta.block) != meta.layers:
                return False  # moved or evicted while it was read: not a fault
            reason = exc.reason if isinstance(exc, VerifyError) else DROP_UNREADABLE
            log.error("local storage: %s (%s); withdrawing and dropping it", exc, reason)
            self.metrics.adoption_drops.labels(reason).inc()
            self.metrics.digest_failures.labels("storage").inc()
            await self.lose(meta.block)
            return True

    async def arrange(self, block: BlockId, placement: tuple[Segment, ...]) -> bool:
        """Move layers of a held block between tiers (promotion, demotion, a new split) and republish
        its record with the new residency.  False when no room could be made; raises `KeyError` when
        the block is not held and `PlacementError` for a placement the store cannot take."""
        async with self._mutex:
            outcome = self.store.arrange(block, placement, self.clock())
            await self._apply(outcome.events, {})
        self._update_gauges()
        return outcome.done

    async def _await_withdrawal(self, task: asyncio.Task[bool] | None) -> None:
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), self.settings.withdraw_timeout_ms / 1000)
        except TimeoutError:
            log.warning("withdrawal not confirmed within %d ms; evicting anyway (the record expires)",
                        self.settings.withdraw_timeout_ms)

    # -- serving ---------------------------------------------------------------------------------
    async def representation(self, entry: Entry, layers: LayerRange) -> Representation:
        """The container of ``layers`` as parts.  Raises `StorageMissingError` / `StorageCorruptError`.

        The whole block comes with its precomputed digest (and, from memory, as the very octets that
        were stored); a layer range gets a new header and a digest computed over what is sent.
        """
        meta = entry.meta
        whole = layers == meta.layers
        if whole:
            stored = self.tiers.whole(meta)
            if stored is not None:
                return Representation((stored,), stored.nbytes, meta.repr_digest, True)
        header = meta.header if whole else _range_header(meta.header, layers)
        parts: list[bytes | memoryview] = [header.encode()]
        for segment in entry.segments(layers):
            parts.append(await self._read(meta, segment.layers))
        length = header.container_length
        if whole:
            return Representation(tuple(parts), length, meta.repr_digest, False)
        return Representation(tuple(parts), length, await self._range_digest(meta, layers, parts), False)

    async def _range_digest(self, meta: BlockMeta, layers: LayerRange, parts: list[bytes | memoryview]) -> bytes:
        key = (meta.block, meta.repr_digest, layers)
        digest = self._range_digests.get(key)
        if digest is not None:
            self._range_digests.move_to_end(key)
            return digest
        large = sum(len(memoryview(p)) for p in parts) > THREAD_HASH_OCTETS
        digest = await asyncio.to_thread(_sha256, parts) if large else _sha256(parts)
        self._range_digests[key] = digest
        if len(self._range_digests) > RANGE_DIGESTS:
            self._range_digests.popitem(last=False)
        return digest

    async def _read(self, meta: BlockMeta, layers: LayerRange) -> memoryview:
        try:  # from any tier holding them all: also while a move of these layers is in flight
            return await self.tiers.read(meta, layers)
        except StorageCorruptError:
            self.metrics.digest_failures.labels("storage").inc()
            raise

    # -- leases ----------------------------------------------------------------------------------
    def grant(self, client: str, request: LeaseRequest, may_read: Callable[[bytes], bool]) -> LeaseState:
        """A lease on held replicas the client may read; others count as unknown (no existence leak)."""
        now = self.clock()
        sizes: dict[bytes, int] = {}
        for key in request.block_keys:
            entries = [e for e in self.store.with_key(key, now) if may_read(e.block.scope_id)]
            if entries:
                sizes[key] = sum(e.meta.size for e in entries)
        try:
            state = self.leases.grant(client, request, sizes, now)
        except LeaseQuotaError as exc:
            self.metrics.lease_rejections.labels(exc.reason).inc()
            raise
        except ProblemError as exc:
            if exc.problem.kind is ProblemType.NOT_FOUND:
                self.metrics.lease_rejections.labels("not-found").inc()
            raise
        self.metrics.lease_grants.inc()
        self.metrics.leases_active.set(len(self.leases))
        return state

    def renew(self, client: str, lease_id: str, renewal: LeaseRenewal) -> LeaseState:
        try:
            return self.leases.renew(client, lease_id, renewal, self.clock())
        except LeaseQuotaError as exc:
            self.metrics.lease_rejections.labels(exc.reason).inc()
            raise

    def release(self, client: str, lease_id: str) -> None:
        self.leases.release(client, lease_id, self.clock())
        self.metrics.leases_active.set(len(self.leases))

    # -- maintenance -----------------------------------------------------------------------------
    async def maintain(self) -> None:
        """One round: forget expired leases, drop expired blocks, send due refreshes."""
        now = self.clock()
        self.leases.expire(now)
        async with self._mutex:
            await self._apply(self.store.expire(self.clock()), {})
        self.publisher.refresh_due(self.clock())
        self._update_gauges()

    def wake(self) -> None:
        """Run a maintenance round now (after a clock change, for instance)."""
        self._wake.set()

    async def run(self) -> None:
        """The maintenance loop; cancelled at shutdown."""
        streak = FailureStreak(log, "holder maintenance")
        while True:
            try:
                await self.maintain()
            except Exception as exc:  # a bad round must not end maintenance for the process lifetime
                streak.failed(exc, self.clock())
            else:
                streak.succeeded(self.clock())
            delay = self.publisher.schedule.delay(self.clock())
            timeout = MAINTENANCE_PERIOD_S if delay is None else min(max(delay, 0.01), MAINTENANCE_PERIOD_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()

    def _update_gauges(self) -> None:
        for tier in self.store.tiers:
            self.metrics.tier_used.labels(tier.value).set(self.store.used(tier))
            rate = self.read_rate(tier)
            if rate is not None:
                self.metrics.tier_read_rate.labels(tier.value).set(rate)
        self.metrics.leases_active.set(len(self.leases))


def stored_accepts(descriptors: Mapping[bytes, CompatDescriptor]) -> Callable[[BlockId, ContainerHeader], bool]:
    """Whether a block found in storage is one this holder would store now: a configured compat, and
    the whole block in that descriptor's geometry (what PUT insists on)."""
    def accepts(block: BlockId, header: ContainerHeader) -> bool:
        d = descriptors.get(block.compat_id)
        if d is None or header.first_layer != 0 or header.layer_count != d.layers:
            return False
        if header.token_count != d.block_tokens:
            return False
        try:
            parse_header(header.encode(), geometry=Geometry.for_dtype(d.kv_heads, d.head_dim, d.kv_dtype, d.layers))
        except ContainerError:
            return False
        return True

    return accepts


def _range_header(header: ContainerHeader, layers: LayerRange) -> ContainerHeader:
    lengths = header.lengths[layers.first - header.first_layer : layers.last - header.first_layer + 1]
    return ContainerHeader(header.codec, layers.first, header.token_count, lengths)


def _sha256(parts: list[bytes | memoryview]) -> bytes:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.digest()
