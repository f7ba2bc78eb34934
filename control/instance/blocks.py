"""The instance's own tiers: where loaded and generated blocks are placed and found again.

An instance is normally also a holder of its own tiers (roles = ["instance", "holder"]): then the
blocks go into that holder's store (`control.holder.app.HOLDER`), whose publisher announces each one
to the IS as a new replica of this instance (spec sections 6.5 and 6.8).  Without a holder role in
the process, `MemoryBlocks` keeps a bounded cache that is used but not published.  Either way the
blocks live in the holder's tier classes (decision D5): `HostTier` octets or, given one, a torch tier
(`control.holder.torch_tiers`: host tensors, pinned with CUDA, or the CUDA device tier).
`HolderBlocks.split` moves a block's first layers to the holder's fastest tier and republishes its
residency, for blocks the engine is about to use.

`Replicator` additionally PUTs every placed block to the configured ``replicate_to`` holders, in the
background and bounded, so that prompt and generated blocks survive the death of this process (the
holder in the same process dies with it, and a resuming instance needs the prompt blocks: the
checkpoint carries only their keys, section 6.8).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final, Protocol

from control.holder.service import Holder, StoreFullError
from control.holder.store import BlockExistsError, BlockId, BlockMeta, PlacementError, Segment
from control.holder.tiers import HostTier, MemoryTier, StorageCorruptError, StorageMissingError, TierError
from control.instance.metrics import InstanceMetrics
from kvsp.client.holder import HolderClient, StoreOutcome
from kvsp.client.http import TransportError
from kvsp.container import Container, Geometry, LayerRange, decode_container, replica_digest
from kvsp.errors import ContainerError
from kvsp.problems import ProblemError

log = logging.getLogger("kvsp.instance.blocks")

MAX_REPLICATIONS: Final = 256  # pending background PUTs; beyond, copies are skipped (and counted)
REPLICATE_CONCURRENCY: Final = 4
Octets = bytes | bytearray  # a whole block's container: an engine may write one into a bytearray


class LocalBlocks(Protocol):
    """The own tiers as the instance uses them."""

    @property
    def published(self) -> bool:
        """Whether placed blocks are announced to the IS."""
        ...

    def held(self, block: BlockId) -> bool: ...

    async def read(self, block: BlockId) -> Container | None:
        """The whole stored block, or None when it is not (or no longer) held."""
        ...

    async def place(self, block: BlockId, container: Octets) -> bool:
        """Store a whole block; True when it was stored now (False: already held, or no room)."""
        ...


def block_meta(block: BlockId, container: Octets, geometry: Geometry) -> BlockMeta:
    """Decode a whole block and compute its digests (CPU: call it in a worker thread)."""
    decoded = decode_container(container, geometry=geometry)
    if decoded.first_layer != 0 or (geometry.layers is not None and decoded.layer_count != geometry.layers):
        raise ContainerError(f"layers {decoded.layer_range}: the own tiers keep whole blocks")
    digests = decoded.layer_digests()
    return BlockMeta(block, decoded.header, digests, replica_digest(digests), hashlib.sha256(container).digest())


class HolderBlocks:
    """The holder role of this process: placed blocks are published as replicas of this holder."""

    published = True

    def __init__(self, holder: Holder, geometry: Geometry) -> None:
        self.holder = holder
        self.geometry = geometry

    def held(self, block: BlockId) -> bool:
        return self.holder.store.get(block, self.holder.clock(), touch=False) is not None

    async def read(self, block: BlockId) -> Container | None:
        entry = self.holder.store.get(block, self.holder.clock())
        if entry is None:
            return None
        try:
            rep = await self.holder.representation(entry, entry.meta.layers)
        except (StorageMissingError, StorageCorruptError, TierError) as exc:
            log.warning("own replica of %s unreadable (%s): recomputing or fetching instead", block, exc)
            return None
        data = rep.parts[0] if len(rep.parts) == 1 else b"".join(rep.parts)
        return decode_container(data, geometry=self.geometry)

    async def place(self, block: BlockId, container: Octets) -> bool:
        if self.held(block):
            return False
        meta = await asyncio.to_thread(block_meta, block, container, self.geometry)
        try:
            await self.holder.put(meta, memoryview(container))
        except BlockExistsError:
            return False
        except (StoreFullError, TierError) as exc:
            log.warning("block %s not placed: %s", block, exc)
            return False
        return True

    async def split(self, block: BlockId, fast_layers: int) -> bool:
        """Keep the first ``fast_layers`` layers of a held block in the holder's fastest tier and the
        rest in the next one (spec section 4.4); the record is republished with the new residency.
        False when the block is not held, the holder has one tier, or there is no room."""
        tiers = self.holder.store.tiers
        entry = self.holder.store.get(block, self.holder.clock(), touch=False)
        if entry is None or len(tiers) < 2 or fast_layers < 1:
            return False
        last = entry.meta.layers.last
        placement: tuple[Segment, ...] = (Segment(tiers[0], LayerRange(0, min(fast_layers, last + 1) - 1)),)
        if fast_layers <= last:
            placement += (Segment(tiers[1], LayerRange(fast_layers, last)),)
        try:
            return await self.holder.arrange(block, placement)
        except (KeyError, PlacementError):
            return False


class MemoryBlocks:
    """A bounded LRU of whole blocks in one memory tier of this process, not published (no holder
    role here).  ``tier`` defaults to plain `HostTier` octets; a torch tier keeps them as tensors."""

    published = False

    def __init__(self, capacity_octets: int, geometry: Geometry, tier: MemoryTier | None = None) -> None:
        self.capacity = capacity_octets
        self.geometry = geometry
        self.tier: MemoryTier = HostTier() if tier is None else tier
        self.used = 0
        self._blocks: OrderedDict[BlockId, BlockMeta] = OrderedDict()

    def held(self, block: BlockId) -> bool:
        return block in self._blocks

    async def read(self, block: BlockId) -> Container | None:
        meta = self._blocks.get(block)
        if meta is None:
            return None
        self._blocks.move_to_end(block)
        data: bytes | memoryview | None = self.tier.whole(meta)
        if data is None:  # a tier that is not host memory (device): one copy out, in a worker thread
            layers = await asyncio.to_thread(self.tier.read, meta, meta.layers)
            if layers is None:
                return None
            data = b"".join((meta.header.encode(), layers))
        return decode_container(data, geometry=self.geometry)

    async def place(self, block: BlockId, container: Octets) -> bool:
        if block in self._blocks or len(container) > self.capacity:
            return False
        meta = await asyncio.to_thread(block_meta, block, container, self.geometry)  # refuses what is malformed
        while self.used + len(container) > self.capacity:
            _, old = self._blocks.popitem(last=False)
            self.tier.drop(old.block)
            self.used -= old.size
        if self.tier.copies_on_read:
            await asyncio.to_thread(self.tier.put, meta, memoryview(container))
        else:
            self.tier.put(meta, memoryview(container))
        self._blocks[block] = meta
        self.used += len(container)
        return True


class Replicator:
    """Background PUTs of placed blocks to other holders, bounded in number and concurrency."""

    def __init__(self, client: HolderClient | None, targets: tuple[str, ...], metrics: InstanceMetrics) -> None:
        self.client = client
        self.targets = targets
        self.metrics = metrics
        self._gate = asyncio.Semaphore(REPLICATE_CONCURRENCY)
        self._tasks: set[asyncio.Task[None]] = set()
        self._copying: dict[BlockId, asyncio.Task[None]] = {}  # the copy in flight of each block

    def submit(self, block: BlockId, container: Octets) -> None:
        if self.client is None or not self.targets:
            return
        if len(self._tasks) >= MAX_REPLICATIONS:
            self.metrics.blocks_replicated.labels("skipped").inc()
            return
        task = asyncio.get_running_loop().create_task(self._copy(block, container))
        self._tasks.add(task)
        self._copying[block] = task
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda t: self._copying.pop(block, None) if self._copying.get(block) is t else None)

    async def settled(self, blocks: Sequence[BlockId]) -> None:
        """Until the copies of ``blocks`` still in flight have ended (stored, present or failed)."""
        tasks = [task for task in (self._copying.get(b) for b in blocks) if task is not None]
        if tasks:
            await asyncio.wait(tasks)

    async def _copy(self, block: BlockId, container: Octets) -> None:
        client = self.client
        if client is None:
            return
        async with self._gate:
            for target in self.targets:
                try:
                    outcome = await client.put_block(target, block.compat_id, block.scope_id, block.block_key,
                                                     container)
                except (ProblemError, TransportError, TimeoutError) as exc:
                    log.warning("replicating %s to %s failed: %s", block, target, exc)
                    self.metrics.blocks_replicated.labels("failed").inc()
                    continue
                result = "stored" if outcome is StoreOutcome.STORED else "present"
                self.metrics.blocks_replicated.labels(result).inc()

    async def drain(self) -> None:
        """Wait for the copies in flight (tests, clean shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


class Tiers:
    """Placing blocks: the own tiers first; computed blocks are also copied to ``replicate_to``."""

    def __init__(self, local: LocalBlocks, replicator: Replicator, metrics: InstanceMetrics) -> None:
        self.local = local
        self.replicator = replicator
        self.metrics = metrics

    async def place(self, block: BlockId, container: Octets, *, computed: bool) -> bool:
        """Store ``container`` as ``block``; True when it is new here.  Blocks loaded from another holder
        already live there, so only computed ones (prompt recomputed, generated) are replicated."""
        try:
            # Shielded: a cancelled caller (a prefetch past its deadline) must not cut a store in half.
            stored = await asyncio.shield(self.local.place(block, container))
        except ContainerError as exc:
            log.error("block %s is malformed and was not placed: %s", block, exc)
            return False
        if stored:
            self.metrics.blocks_placed.labels("computed" if computed else "loaded").inc()
            if computed:
                self.replicator.submit(block, container)
        return stored
