"""The holder's tiers together: where a layer range is written, read, moved and dropped (decision D5).

`BlockStore` decides which layers of a block live in which tier; `TierSet` carries out the data side
of those decisions for whatever tiers the holder has, fastest first:

* ``device``: `control.holder.torch_tiers.DeviceTier`, torch memory on CUDA (absent without CUDA);
* ``host``: `HostTier` (plain octets) or `control.holder.torch_tiers.TorchHostTier` (uint8 tensors,
  pinned when CUDA is present);
* ``local-storage``: `DiskTier`, encrypted files where a layer range is one offset read.

Reads hand out views where the tier is addressable memory (host), and copy in a worker thread where it
is not (device, disk), so the event loop never waits on a copy or a disk.  A move writes the target
first and frees the source after, so a reader holding an older `Entry` snapshot finds the layers in
one tier or the other; `read` therefore tries every tier, not only the one the snapshot names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from control.holder.disk import DiskTier
from control.holder.store import BlockId, BlockMeta
from control.holder.tiers import HostTier, MemoryTier, StorageMissingError, TierError, remaining_range
from kvsp.container import LayerRange
from kvsp.registry import Tier

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from control.holder.settings import HolderSettings

log = logging.getLogger("kvsp.holder.tiers")

TIER_ORDER = (Tier.DEVICE, Tier.HOST, Tier.LOCAL_STORAGE)
_P = ParamSpec("_P")
_R = TypeVar("_R")


class TierSet:
    """The device, host and local-storage tiers of one holder; any of them may be absent."""

    def __init__(self, *, device: MemoryTier | None = None, host: MemoryTier | None = None,
                 disk: DiskTier | None = None) -> None:
        for tier, expected in ((device, Tier.DEVICE), (host, Tier.HOST)):
            if tier is not None and tier.tier is not expected:
                raise TierError(f"a {tier.tier} tier given as the {expected} tier")
        self.device = device
        self.host = host
        self.disk = disk
        self.memory: dict[Tier, MemoryTier] = {t.tier: t for t in (device, host) if t is not None}

    @property
    def tiers(self) -> tuple[Tier, ...]:
        """The tiers present, fastest first."""
        present = set(self.memory) | ({Tier.LOCAL_STORAGE} if self.disk is not None else set())
        return tuple(t for t in TIER_ORDER if t in present)

    def _memories(self) -> Iterator[MemoryTier]:
        """Memory tiers, those that hand out views first (a view costs nothing, a copy does)."""
        yield from (t for t in self.memory.values() if not t.copies_on_read)
        yield from (t for t in self.memory.values() if t.copies_on_read)

    def rate(self, tier: Tier) -> float | None:
        """The measured read rate of ``tier`` in whole Mbit/s (at least 1), None when unmeasured."""
        memory = self.memory.get(tier)
        meter = memory.rate if memory is not None else self.disk.rate if (
            tier is Tier.LOCAL_STORAGE and self.disk is not None) else None
        value = None if meter is None else meter.mbit_per_s
        return None if value is None else float(max(1, round(value)))

    def calibrate(self) -> None:
        """Measure the memory tiers' copy rates (blocking: call it in a worker thread at startup)."""
        for memory in self.memory.values():
            calibrate = getattr(memory, "calibrate", None)
            if callable(calibrate):
                calibrate()

    # -- data ------------------------------------------------------------------------------------
    def whole(self, meta: BlockMeta) -> memoryview | None:
        """The full container as stored, from a tier that keeps it as addressable memory."""
        for memory in self.memory.values():
            stored = None if memory.copies_on_read else memory.whole(meta)
            if stored is not None:
                return stored
        return None

    async def place(self, meta: BlockMeta, tier: Tier, layers: LayerRange, container: memoryview,
                    stored_at: float | None = None) -> None:
        """Write ``layers`` of a new block, whose full container is ``container``, into ``tier``
        (``stored_at``: wall-clock seconds, kept with a block written to local storage)."""
        memory = self.memory.get(tier)
        if memory is not None and layers == meta.layers:
            await self._call(memory, memory.put, meta, container)
            return
        start = meta.header.header_length
        data = container[start + meta.offset(layers.first) : start + meta.offset(layers.last + 1)]
        await self._write(meta, layers, tier, data, stored_at)

    async def move(self, meta: BlockMeta, layers: LayerRange, source: Tier, target: Tier,
                   stored_at: float | None = None) -> None:
        """Copy ``layers`` into ``target``, then free them in ``source`` (in a file: its record stops
        naming them and their octets are deallocated, so local storage holds what the store counts)."""
        data = await self.read(meta, layers)
        await self._write(meta, layers, target, data, stored_at)
        memory = self.memory.get(source)
        if memory is not None:
            held = memory.held(meta.block)
            if held is not None:
                memory.retain(meta, remaining_range(held, layers))
        elif source is Tier.LOCAL_STORAGE and self.disk is not None:
            on_disk = self.disk.held(meta.block)
            if on_disk is not None:
                await asyncio.to_thread(self.disk.retain, meta, remaining_range(on_disk, layers))

    async def read(self, meta: BlockMeta, layers: LayerRange) -> memoryview:
        """The data of ``layers`` from whichever tier has them all.  Raises `StorageMissingError`, or
        `StorageCorruptError` from local storage."""
        for memory in self._memories():
            held = memory.held(meta.block)
            if held is None or layers.first < held.first or layers.last > held.last:
                continue
            view = await self._call(memory, memory.read, meta, layers)
            if view is not None:
                return view
        if self.disk is None:
            raise StorageMissingError(f"layers {layers} of {meta.block} are gone")
        try:
            return await asyncio.to_thread(self.disk.read, meta, layers)
        except StorageMissingError:
            for memory in self._memories():  # promoted out of local storage while the read ran
                view = await self._call(memory, memory.read, meta, layers)
                if view is not None:
                    return view
            raise

    async def drop(self, block: BlockId) -> None:
        for memory in self.memory.values():
            memory.drop(block)
        if self.disk is not None:
            await asyncio.to_thread(self.disk.delete, block)

    async def _write(self, meta: BlockMeta, layers: LayerRange, tier: Tier, data: Buffer,
                     stored_at: float | None) -> None:
        memory = self.memory.get(tier)
        if memory is not None:
            await self._call(memory, memory.put_layers, meta, layers, data)
        elif tier is Tier.LOCAL_STORAGE and self.disk is not None:
            await asyncio.to_thread(self.disk.write, meta, layers, data, stored_at)
        else:
            raise TierError(f"this holder has no {tier} tier")

    @staticmethod
    async def _call(memory: MemoryTier, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """Run ``fn`` inline for a tier of views, in a worker thread for a tier that copies.  torch
        reports failures (out of device memory, a lost device) as RuntimeError: a tier failure here."""
        try:
            if memory.copies_on_read:
                return await asyncio.to_thread(fn, *args, **kwargs)
            return fn(*args, **kwargs)
        except RuntimeError as exc:
            raise TierError(f"the {memory.tier} tier failed: {exc}") from exc


def memory_tiers(settings: HolderSettings) -> tuple[MemoryTier | None, MemoryTier | None]:
    """The (device, host) tiers that ``[holder]`` asks for and this machine has.

    ``device_capacity_octets > 0`` asks for the device tier: without CUDA (or without torch) it is
    absent, logged, never emulated in host memory.  ``torch_tiers = true``, or a device tier, makes the
    host tier torch tensors (pinned with CUDA) instead of plain octets.  torch is imported only then.
    """
    wants_torch = settings.torch_tiers or settings.device_capacity_octets > 0
    if not wants_torch:
        return None, HostTier() if settings.host_capacity_octets > 0 else None
    try:
        from control.holder import torch_tiers  # noqa: PLC0415 - only holders with torch tiers need torch
    except ImportError as exc:
        if settings.torch_tiers:
            raise TierError("torch_tiers = true needs torch (the engine extra)") from exc
        log.warning("device_capacity_octets is set but torch is not installed: no device tier")
        return None, HostTier() if settings.host_capacity_octets > 0 else None
    device: MemoryTier | None = None
    if settings.device_capacity_octets > 0:
        if torch_tiers.cuda_available():
            device = torch_tiers.DeviceTier(settings.device)
        else:
            log.warning("device_capacity_octets is set but no CUDA device is available: no device tier")
    host: MemoryTier | None = None
    if settings.host_capacity_octets > 0:
        host = torch_tiers.TorchHostTier() if settings.torch_tiers or device is not None else HostTier()
    return device, host
