"""Memory tiers on torch (decision D5): ``host`` as uint8 tensors, ``device`` as CUDA tensors.

`TorchHostTier` keeps each block's layer data in a CPU ``uint8`` tensor, pinned when CUDA is present so
that a copy to the accelerator is one DMA transfer.  Without CUDA a whole block is not copied at all:
the tensor is `torch.frombuffer` over the received octets.  Reads hand out memoryviews of the tensor's
storage (``tensor.numpy()``), never copies, so serving from host costs what the plain `HostTier` costs.

`DeviceTier` keeps layer data in accelerator memory.  It exists only when CUDA is available: without it
the tier is absent from the holder (and from its records), never emulated in host memory.  Reading
from it is a copy into pinned host memory, timed: that is the tier's ``read_mbit_per_s``.

Rates are measured, never configured: each tier copies a calibration tensor at startup (host: to the
device when CUDA is present, else to host memory; device: to pinned host memory), and the copies the
tier really makes update an exponentially weighted average (`RateMeter`).

torch is imported here at module level; `control.holder.tierset.memory_tiers` imports this module only
when ``[holder]`` asks for a torch tier, so a holder with the plain-octets host tier runs without torch.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import torch

from control.holder.store import BlockId, BlockMeta
from control.holder.tiers import RateMeter, TierError, joined_range
from kvsp.container import LayerRange
from kvsp.registry import Tier

if TYPE_CHECKING:
    from typing_extensions import Buffer

log = logging.getLogger("kvsp.holder.tiers")

CALIBRATION_OCTETS: Final = 8 << 20


def cuda_available() -> bool:
    """Whether a CUDA device can be used."""
    return bool(torch.cuda.is_available())


def tensor_of(data: Buffer) -> torch.Tensor:
    """A uint8 CPU tensor over ``data`` without copying (read-only buffers too: we never write them)."""
    view = memoryview(data).cast("B")
    if not view.readonly:
        return torch.frombuffer(view, dtype=torch.uint8)
    with warnings.catch_warnings():  # torch warns that it cannot mark the tensor read-only
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(view, dtype=torch.uint8)


def view_of(tensor: torch.Tensor) -> memoryview:
    """A memoryview of a CPU tensor's storage (no copy)."""
    return tensor.numpy().data.cast("B")


@dataclass(frozen=True, slots=True)
class _Held:
    tensor: torch.Tensor  # the data of ``layers``, from layer ``layers.first``
    layers: LayerRange
    whole: memoryview | None  # the full container, while it is one buffer with every layer
    view: memoryview | None = None  # of ``tensor``'s storage, made once (CPU tensors): reads slice it

    @classmethod
    def of(cls, tensor: torch.Tensor, layers: LayerRange, whole: memoryview | None = None) -> _Held:
        return cls(tensor, layers, whole, view_of(tensor) if tensor.device.type == "cpu" else None)


class _TensorTier:
    """What both torch tiers share: one tensor per block holding one contiguous layer range."""

    def __init__(self) -> None:
        self._blocks: dict[BlockId, _Held] = {}
        self.rate = RateMeter()

    def __contains__(self, block: object) -> bool:
        return block in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def held(self, block: BlockId) -> LayerRange | None:
        held = self._blocks.get(block)
        return None if held is None else held.layers

    def tensor(self, meta: BlockMeta, layers: LayerRange) -> torch.Tensor | None:
        """A view (no copy) of the data of ``layers`` in this tier's memory, or None when not held."""
        held = self._blocks.get(meta.block)
        if held is None or layers.first < held.layers.first or layers.last > held.layers.last:
            return None
        base = meta.offset(held.layers.first)
        return held.tensor[meta.offset(layers.first) - base : meta.offset(layers.last + 1) - base]

    def _empty(self, octets: int) -> torch.Tensor:
        raise NotImplementedError

    def _stored(self, source: torch.Tensor) -> torch.Tensor:
        """A copy of ``source`` in this tier's memory."""
        out = self._empty(source.numel())
        out.copy_(source)
        return out

    def put_layers(self, meta: BlockMeta, layers: LayerRange, data: Buffer) -> None:
        source = tensor_of(data)
        if source.numel() != meta.octets(layers):
            raise TierError(f"layers {layers}: {source.numel()} octets given, {meta.octets(layers)} expected")
        held = self._blocks.get(meta.block)
        joined = joined_range(None if held is None else held.layers, layers)
        out = self._empty(meta.octets(joined))
        at = meta.offset(layers.first) - meta.offset(joined.first)
        out[at : at + source.numel()].copy_(source)
        if held is not None:
            at = meta.offset(held.layers.first) - meta.offset(joined.first)
            out[at : at + held.tensor.numel()].copy_(held.tensor)
        self._blocks[meta.block] = _Held.of(out, joined)

    def retain(self, meta: BlockMeta, layers: LayerRange | None) -> None:
        held = self._blocks.get(meta.block)
        if held is None:
            return
        if layers is None:
            del self._blocks[meta.block]
            return
        if layers == held.layers:
            return
        part = self.tensor(meta, layers)
        if part is None:
            raise TierError(f"layers {layers} of {meta.block} are not all held here")
        self._blocks[meta.block] = _Held.of(self._stored(part), layers)

    def drop(self, block: BlockId) -> None:
        self._blocks.pop(block, None)


class TorchHostTier(_TensorTier):
    """``host`` as uint8 CPU tensors, pinned when CUDA is present (``pin`` overrides, for tests)."""

    tier: Final = Tier.HOST
    copies_on_read: Final = False

    def __init__(self, *, pin: bool | None = None) -> None:
        super().__init__()
        self.pin = cuda_available() if pin is None else pin
        if self.pin and not cuda_available():
            raise TierError("pinned host memory needs CUDA")

    def _empty(self, octets: int) -> torch.Tensor:
        return torch.empty(octets, dtype=torch.uint8, pin_memory=self.pin)

    def put(self, meta: BlockMeta, container: memoryview) -> None:
        """Keep the full container: viewed in place, or copied once into pinned memory."""
        if container.nbytes != meta.size:
            raise TierError(f"container of {container.nbytes} octets, the block has {meta.size}")
        source = tensor_of(container)
        whole = self._stored(source) if self.pin else source
        data = whole[meta.header.header_length :]
        self._blocks[meta.block] = _Held.of(data, meta.layers, view_of(whole))

    def whole(self, meta: BlockMeta) -> memoryview | None:
        held = self._blocks.get(meta.block)
        return None if held is None else held.whole

    def read(self, meta: BlockMeta, layers: LayerRange) -> memoryview | None:
        """A memoryview of the tensor storage of ``layers`` (no copy)."""
        held = self._blocks.get(meta.block)
        if held is None or held.view is None or layers.first < held.layers.first or layers.last > held.layers.last:
            return None
        base = meta.offset(held.layers.first)
        return held.view[meta.offset(layers.first) - base : meta.offset(layers.last + 1) - base]

    def to_device(self, meta: BlockMeta, layers: LayerRange, device: str = "cuda") -> torch.Tensor | None:
        """Copy ``layers`` to ``device`` (one DMA from pinned memory), timing the copy for the rate."""
        part = self.tensor(meta, layers)
        if part is None:
            return None
        began = time.perf_counter()
        out = part.to(device)
        _synchronize(device)
        self.rate.record(part.numel(), time.perf_counter() - began)
        return out

    def calibrate(self, octets: int = CALIBRATION_OCTETS) -> float | None:
        """Copy a calibration tensor out of host memory the way readers do: to the device with CUDA,
        else to other host memory; the first sample of the rate."""
        source = self._empty(octets)
        source.random_(0, 256)
        target = torch.empty(0)
        for _ in range(2):  # the first copy pays for page faults and lazy CUDA setup
            began = time.perf_counter()
            target = source.to("cuda") if self.pin else source.clone()
            _synchronize("cuda" if self.pin else "cpu")
            elapsed = time.perf_counter() - began
        del target
        self.rate.record(octets, elapsed)
        log.info("host tier copy rate %.0f Mbit/s (%s)", self.rate.mbit_per_s or 0,
                 "pinned, to the device" if self.pin else "memory to memory")
        return self.rate.mbit_per_s


class DeviceTier(_TensorTier):
    """``device``: layer data in CUDA memory.  Refuses to exist without CUDA (the tier is then absent)."""

    tier: Final = Tier.DEVICE
    copies_on_read: Final = True

    def __init__(self, device: str = "cuda") -> None:
        if not cuda_available():
            raise TierError("no CUDA device: the device tier is absent")
        super().__init__()
        self.device = device

    def _empty(self, octets: int) -> torch.Tensor:
        return torch.empty(octets, dtype=torch.uint8, device=self.device)

    def put(self, meta: BlockMeta, container: memoryview) -> None:
        if container.nbytes != meta.size:
            raise TierError(f"container of {container.nbytes} octets, the block has {meta.size}")
        data = tensor_of(container)[meta.header.header_length :]
        self._blocks[meta.block] = _Held.of(self._stored(data), meta.layers)

    def whole(self, meta: BlockMeta) -> memoryview | None:
        return None  # device memory is not addressable by the host: served by `read`, a copy

    def read(self, meta: BlockMeta, layers: LayerRange) -> memoryview | None:
        """Copy ``layers`` into pinned host memory (timed for the rate); blocking: call in a thread."""
        part = self.tensor(meta, layers)
        if part is None:
            return None
        out = torch.empty(part.numel(), dtype=torch.uint8, pin_memory=True)
        began = time.perf_counter()
        out.copy_(part)
        self.rate.record(part.numel(), time.perf_counter() - began)
        return view_of(out)

    def calibrate(self, octets: int = CALIBRATION_OCTETS) -> float | None:
        source = self._empty(octets)
        source.random_(0, 256)
        out = torch.empty(octets, dtype=torch.uint8, pin_memory=True)
        for _ in range(2):  # the first copy pays for lazy CUDA setup
            began = time.perf_counter()
            out.copy_(source)
            elapsed = time.perf_counter() - began
        self.rate.record(octets, elapsed)
        log.info("device tier read rate %.0f Mbit/s (device to pinned host)", self.rate.mbit_per_s or 0)
        return self.rate.mbit_per_s


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
