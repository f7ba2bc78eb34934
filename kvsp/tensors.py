"""KV sections as torch tensors (decision D5): views of received octets, octets of cached tensors.

A raw section (spec section 4.3, layout "kvsp-layout-1") is ``tokens x kv_heads x head_dim`` elements of
the descriptor's ``kv_dtype``, token slowest, dimension fastest, each element little-endian.  That is
exactly a C-contiguous torch tensor ``[tokens, kv_heads, head_dim]`` on a little-endian host, so:

* receiving is a view: `section_view` wraps the received buffer with `torch.frombuffer` (no copy); the one
  copy is `copy_section`, straight into the engine's cache (with the device transfer when there is one);
* sending is a view too when the cache is a contiguous CPU tensor: `section_octets` returns a
  `memoryview` of the tensor's storage, which `kvsp.container.encode_parts`/`encode_into` take as is, so a
  container is encoded from tensors without building intermediate Python bytes.  A tensor on an
  accelerator, or not contiguous, costs exactly one copy into host memory.
* per-section torch calls cost microseconds, as much as copying a small section, so there are block-wide
  forms too: `CacheOctets` slices one view of a whole cache ``[K/V, layers, tokens, kv_heads, head_dim]``
  by offset, and `container_tensor` views all layers of a raw container as one tensor, so a block goes
  into a cache in one ``copy_`` (benchmarks/bench_engine.py measures both forms against a memcpy).

Registry element types map to torch dtypes as D5 says: bf16 -> bfloat16, fp16 -> float16, fp32 -> float32,
fp8-e4m3 -> float8_e4m3fn, fp8-e5m2 -> float8_e5m2.  On a big-endian host the views would be wrong, so
this module refuses to run there rather than mislabel octets.

torch is imported here at module level: import this module only where the engine extra is installed.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import Final

import torch

from kvsp.container import Container
from kvsp.registry import ELEMENT_TYPES, Codec

Bytes = bytes | bytearray | memoryview

TORCH_DTYPES: Final[dict[str, torch.dtype]] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "fp8-e4m3": torch.float8_e4m3fn,
    "fp8-e5m2": torch.float8_e5m2,
}
KV_DTYPES: Final[dict[torch.dtype, str]] = {dtype: name for name, dtype in TORCH_DTYPES.items()}

if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
    raise ImportError("kvsp.tensors views octets as tensors and needs a little-endian host")

_readonly_warning_spent = False


def _frombuffer(view: memoryview, dtype: torch.dtype) -> torch.Tensor:
    """`torch.frombuffer` without its warning about read-only buffers.

    The views made here are only read (copied into a cache, hashed, sent).  torch emits that warning
    once per process ("suppressed for the rest of this program"), so only the first read-only view
    needs `warnings.catch_warnings`, which would cost more than the view itself on every call.
    """
    global _readonly_warning_spent  # noqa: PLW0603 - mirrors torch's own once-per-process state
    if _readonly_warning_spent or not view.readonly:
        return torch.frombuffer(view, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.frombuffer(view, dtype=dtype)
    _readonly_warning_spent = True
    return tensor


class SectionError(ValueError):
    """A section's length or a tensor's shape or dtype does not match the geometry."""


def torch_dtype(kv_dtype: str) -> torch.dtype:
    """The torch dtype of a registry element type name."""
    try:
        return TORCH_DTYPES[kv_dtype]
    except KeyError:
        raise SectionError(f"kv_dtype {kv_dtype!r} is not one of {sorted(TORCH_DTYPES)}") from None


def kv_dtype_of(dtype: torch.dtype) -> str:
    """The registry element type name of a torch dtype."""
    try:
        return KV_DTYPES[dtype]
    except KeyError:
        raise SectionError(f"torch dtype {dtype} has no KVSP element type") from None


def section_view(data: Bytes, kv_dtype: str, kv_heads: int, head_dim: int,
                 tokens: int | None = None) -> torch.Tensor:
    """A ``[tokens, kv_heads, head_dim]`` tensor over ``data`` itself (no copy).

    The tensor shares the buffer: it is valid while the buffer is, and writing through it is only
    allowed when the buffer is writable (read-only buffers give a tensor that must not be written).
    """
    dtype = torch_dtype(kv_dtype)
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) or data.format != "B" else data
    row = kv_heads * head_dim * ELEMENT_TYPES[kv_dtype].size
    if view.nbytes % row or (tokens is not None and view.nbytes != tokens * row):
        want = "a multiple of" if tokens is None else f"{tokens} tokens x"
        raise SectionError(f"a section is {want} {row} octets per token, not {view.nbytes} octets")
    count = view.nbytes // row
    if count == 0:
        return torch.empty((0, kv_heads, head_dim), dtype=dtype)
    return _frombuffer(view, dtype).view(count, kv_heads, head_dim)


def section_octets(tensor: torch.Tensor) -> memoryview:
    """The kvsp-layout-1 octets of a ``[tokens, kv_heads, head_dim]`` tensor (a view when it is CPU-contiguous).

    The view keeps the tensor's storage alive; it reflects later writes to the tensor.
    """
    if tensor.dim() != 3:
        raise SectionError(f"a section tensor is [tokens, kv_heads, head_dim], not {list(tensor.shape)}")
    kv_dtype_of(tensor.dtype)
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        tensor = tensor.to("cpu", copy=False).contiguous()  # the one copy, when the tensor is not a host view
    if tensor.numel() == 0:
        return memoryview(b"")
    octets: memoryview = tensor.view(-1).view(torch.uint8).numpy().data
    return octets


def copy_section(destination: torch.Tensor, data: Bytes | torch.Tensor, kv_dtype: str) -> None:
    """Copy a received section into ``destination`` (a ``[tokens, kv_heads, head_dim]`` slice of a cache).

    One copy: the source is viewed in place; a dtype change (a cache kept in another type than the wire's)
    and a host-to-device transfer happen in the same ``copy_``.
    """
    tokens, kv_heads, head_dim = destination.shape
    source = data if isinstance(data, torch.Tensor) else section_view(data, kv_dtype, kv_heads, head_dim, tokens)
    if source.shape != destination.shape:
        raise SectionError(f"section shape {list(source.shape)} != destination {list(destination.shape)}")
    destination.copy_(source, non_blocking=destination.device.type != "cpu" and source.is_pinned())


def layer_tensors(k: Bytes, v: Bytes, kv_dtype: str, kv_heads: int,
                  head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V views of one layer of a container (checked to hold the same number of tokens)."""
    kt = section_view(k, kv_dtype, kv_heads, head_dim)
    return kt, section_view(v, kv_dtype, kv_heads, head_dim, kt.shape[0])


def container_tensor(container: Container, kv_dtype: str, kv_heads: int, head_dim: int) -> torch.Tensor:
    """All layers of a raw container as one ``[layers, K/V, tokens, kv_heads, head_dim]`` view (no copy).

    The data section of codec raw is K0 V0 K1 V1 ... with every section ``tokens x kv_heads x head_dim``
    elements, so it is that tensor as it stands; a whole block then goes into a cache in one ``copy_``.
    """
    if container.codec != Codec.RAW:
        raise SectionError(f"codec {container.codec:#06x} is not raw; its sections are not plain elements")
    section = container.token_count * kv_heads * head_dim * ELEMENT_TYPES[kv_dtype].size
    if any(k != section or v != section for k, v in container.header.lengths):
        raise SectionError(f"every section of this container must be {section} octets")
    shape = (container.layer_count, 2, container.token_count, kv_heads, head_dim)
    if section == 0:
        return torch.empty(shape, dtype=torch_dtype(kv_dtype))
    return _frombuffer(container.data, torch_dtype(kv_dtype)).view(shape)


class CacheOctets:
    """Octet views of the sections of a contiguous CPU cache ``[K/V, layers, tokens, kv_heads, head_dim]``.

    One flat view of the whole cache is made once; a section is then a slice of it (offset arithmetic),
    which costs far less than viewing each section tensor on its own.
    """

    __slots__ = ("_flat", "_layer", "_row")

    def __init__(self, cache: torch.Tensor) -> None:
        if cache.dim() != 5 or cache.shape[0] != 2 or cache.device.type != "cpu" or not cache.is_contiguous():
            raise SectionError("a cache is a contiguous CPU tensor [2, layers, tokens, kv_heads, head_dim]")
        kv_dtype_of(cache.dtype)
        self._flat: memoryview = cache.view(-1).view(torch.uint8).numpy().data
        self._row = cache.shape[3] * cache.shape[4] * cache.element_size()
        self._layer = cache.shape[2] * self._row

    def section(self, kind: int, layer: int, first_token: int, tokens: int) -> memoryview:
        """K (kind 0) or V (kind 1) of ``tokens`` tokens of one layer, from ``first_token``."""
        layers = self._flat.nbytes // (2 * self._layer)
        start = (kind * layers + layer) * self._layer + first_token * self._row
        return self._flat[start : start + tokens * self._row]


def encode_sections(layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[memoryview, memoryview]]:
    """(K, V) octets per layer for `kvsp.container.encode_parts`/`encode_into`, views where possible."""
    return [(section_octets(k), section_octets(v)) for k, v in layers]
