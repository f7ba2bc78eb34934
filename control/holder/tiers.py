"""The holder's memory tiers and what every tier shares (decision D5).

`HostTier` keeps each block as the octets that arrived and hands out views of them: serving from
memory copies nothing.  `MemoryTier` is what the tier set needs of a memory tier (this one, or the
torch tiers of `control.holder.torch_tiers`); `RateMeter` measures ``read_mbit_per_s`` from real
reads (an exponentially weighted average), never configured.  Encrypted ``local-storage`` files are
`control.holder.disk.DiskTier`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from control.holder.store import BlockId, BlockMeta
from kvsp.container import (
    LayerRange,
)
from kvsp.errors import KvspError
from kvsp.registry import Tier

if TYPE_CHECKING:
    from typing_extensions import Buffer

log = logging.getLogger("kvsp.holder.tiers")

EWMA_WEIGHT: Final = 0.2


class TierError(KvspError):
    """A tier cannot do what was asked."""


class StorageCorruptError(TierError):
    """Stored octets fail authentication or are truncated: the replica is lost (not merely absent)."""

    def __init__(self, block: BlockId, detail: str) -> None:
        super().__init__(f"stored block {block}: {detail}")
        self.block = block


class StorageMissingError(TierError):
    """The block's file is gone (evicted while a read was starting): a cache miss, not corruption."""


class RateMeter:
    """Read rate in Mbit/s: a measured first value, then an EWMA of real reads (thread-safe)."""

    __slots__ = ("_lock", "_rate")

    def __init__(self) -> None:
        self._rate: float | None = None
        self._lock = threading.Lock()

    @property
    def mbit_per_s(self) -> float | None:
        return self._rate

    def record(self, octets: int, seconds: float) -> None:
        if octets <= 0 or seconds <= 0:
            return
        sample = octets * 8 / 1e6 / seconds
        with self._lock:
            self._rate = sample if self._rate is None else (1 - EWMA_WEIGHT) * self._rate + EWMA_WEIGHT * sample


# -- memory tiers ----------------------------------------------------------------------------------


class MemoryTier(Protocol):
    """A tier in process or accelerator memory: `HostTier` (plain octets), and the torch tiers of
    `control.holder.torch_tiers` (host tensors, pinned with CUDA; the CUDA device tier).

    A tier holds one contiguous layer range of each block.  Not thread-safe: called from the event
    loop, except the copies of tiers whose ``copies_on_read`` is true, which the holder runs in a worker
    thread (torch releases the GIL while it copies).
    """

    @property
    def tier(self) -> Tier: ...

    @property
    def rate(self) -> RateMeter | None:
        """The measured read rate, or None for a tier that only hands out views (nothing to measure)."""
        ...

    @property
    def copies_on_read(self) -> bool:
        """True when `read` copies (device memory): call it in a worker thread."""
        ...

    def __contains__(self, block: object) -> bool: ...

    def __len__(self) -> int: ...

    def put(self, meta: BlockMeta, container: memoryview) -> None:
        """Keep the whole block; ``container`` is the full container as received."""
        ...

    def put_layers(self, meta: BlockMeta, layers: LayerRange, data: Buffer) -> None:
        """Add ``layers`` (their K||V data, contiguous), adjacent to what is held of the block."""
        ...

    def held(self, block: BlockId) -> LayerRange | None: ...

    def whole(self, meta: BlockMeta) -> memoryview | None:
        """The full container as stored, when every layer is here and it is addressable memory."""
        ...

    def read(self, meta: BlockMeta, layers: LayerRange) -> memoryview | None:
        """The data of ``layers`` (contiguous), or None when not all of them are here."""
        ...

    def retain(self, meta: BlockMeta, layers: LayerRange | None) -> None:
        """Keep only ``layers`` (a sub-range of what is held, copied so the rest is freed), or nothing."""
        ...

    def drop(self, block: BlockId) -> None: ...


def joined_range(held: LayerRange | None, layers: LayerRange) -> LayerRange:
    """The range after adding ``layers`` to ``held``; they must be adjacent (a tier holds one range)."""
    if held is None:
        return layers
    if layers.last + 1 == held.first:
        return LayerRange(layers.first, held.last)
    if held.last + 1 == layers.first:
        return LayerRange(held.first, layers.last)
    raise TierError(f"layers {layers} are not adjacent to the held layers {held}")


def remaining_range(held: LayerRange, moved: LayerRange) -> LayerRange | None:
    """What is left of ``held`` once ``moved`` (its bottom or its top) has gone."""
    if moved.first <= held.first and moved.last >= held.last:
        return None
    if moved.first <= held.first:
        return LayerRange(moved.last + 1, held.last)
    if moved.last >= held.last:
        return LayerRange(held.first, moved.first - 1)
    raise TierError(f"layers {moved} are inside {held}: a tier keeps one contiguous range")


@dataclass(frozen=True, slots=True)
class _HostBlock:
    data: memoryview  # the layer data of ``layers``, from layer ``layers.first``
    layers: LayerRange  # the layers held: one contiguous range
    whole: memoryview | None  # the full container as received, while every layer is here


class HostTier:
    """Blocks in process memory as plain octets, viewed in place.  Not thread-safe: event loop only."""

    tier: Final = Tier.HOST
    rate: Final[RateMeter | None] = None  # views only: serving copies nothing, so there is no rate to state
    copies_on_read: Final = False

    def __init__(self) -> None:
        self._blocks: dict[BlockId, _HostBlock] = {}

    def __contains__(self, block: object) -> bool:
        return block in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def put(self, meta: BlockMeta, container: memoryview) -> None:
        """Keep the full container ``container`` (its octets are not copied)."""
        if container.nbytes != meta.size:
            raise TierError(f"container of {container.nbytes} octets, the block has {meta.size}")
        data = container[meta.header.header_length :]
        self._blocks[meta.block] = _HostBlock(data, meta.layers, container)

    def put_layers(self, meta: BlockMeta, layers: LayerRange, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        if view.nbytes != meta.octets(layers):
            raise TierError(f"layers {layers}: {view.nbytes} octets given, {meta.octets(layers)} expected")
        held = self._blocks.get(meta.block)
        joined = joined_range(None if held is None else held.layers, layers)
        if held is None:
            merged = bytes(view)
        elif layers.first < held.layers.first:
            merged = b"".join((view, held.data))
        else:
            merged = b"".join((held.data, view))
        self._blocks[meta.block] = _HostBlock(memoryview(merged), joined, None)

    def held(self, block: BlockId) -> LayerRange | None:
        held = self._blocks.get(block)
        return None if held is None else held.layers

    def whole(self, meta: BlockMeta) -> memoryview | None:
        """The full container as stored, when every layer is here."""
        held = self._blocks.get(meta.block)
        return None if held is None else held.whole

    def read(self, meta: BlockMeta, layers: LayerRange) -> memoryview | None:
        """A view of the data of ``layers`` (contiguous), or None when not all of them are here."""
        held = self._blocks.get(meta.block)
        if held is None or layers.first < held.layers.first or layers.last > held.layers.last:
            return None
        base = meta.offset(held.layers.first)
        return held.data[meta.offset(layers.first) - base : meta.offset(layers.last + 1) - base]

    def retain(self, meta: BlockMeta, layers: LayerRange | None) -> None:
        held = self._blocks.get(meta.block)
        if held is None:
            return
        if layers is None:
            del self._blocks[meta.block]
            return
        if layers == held.layers:
            return
        view = self.read(meta, layers)
        if view is None:
            raise TierError(f"layers {layers} of {meta.block} are not all held here")
        self._blocks[meta.block] = _HostBlock(memoryview(bytes(view)), layers, None)

    def keep(self, meta: BlockMeta, last: int | None) -> None:
        """After a demotion: keep only the held layers up to ``last`` (copied, so the rest is freed)."""
        held = self._blocks.get(meta.block)
        if held is None:
            return
        keep = None if last is None or last < held.layers.first else LayerRange(held.layers.first, last)
        self.retain(meta, keep)

    def drop(self, block: BlockId) -> None:
        self._blocks.pop(block, None)
