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
  into a cache in one ``copy_``; the other way, `encode_cache_block_into` writes a raw container from a
  cache in one strided copy (K and V of a layer are not adjacent in a cache, so the section-by-section
  form costs 2 x layers copies).  benchmarks/bench_engine.py measures these forms against a memcpy.

Registry element types map to torch dtypes as D5 says: bf16 -> bfloat16, fp16 -> float16, fp32 -> float32,
fp8-e4m3 -> float8_e4m3fn, fp8-e5m2 -> float8_e5m2.  On a big-endian host the views would be wrong, so
this module refuses to run there rather than mislabel octets.

torch is imported here at module level: import this module only where the engine extra is installed.
"""

from __future__ import annotations

import functools
import itertools
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import torch

from kvsp.container import Container, ContainerHeader, Geometry, as_octets, check_raw_sections
from kvsp.errors import ContainerError
from kvsp.registry import ELEMENT_TYPES, Codec

if TYPE_CHECKING:
    from kvsp.container import BufferLike

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


def _raw_section(container: Container, kv_dtype: str, kv_heads: int, head_dim: int) -> int:
    """The octets of every section of a raw container of this geometry; `SectionError` if it is not that."""
    if container.codec != Codec.RAW:
        raise SectionError(f"codec {container.codec:#06x} is not raw; its sections are not plain elements")
    section = container.token_count * kv_heads * head_dim * ELEMENT_TYPES[kv_dtype].size
    if set(itertools.chain.from_iterable(container.header.lengths)) - {section}:  # in C: this runs per block
        raise SectionError(f"every section of this container must be {section} octets")
    return section


def container_tensor(container: Container, kv_dtype: str, kv_heads: int, head_dim: int) -> torch.Tensor:
    """All layers of a raw container as one ``[layers, K/V, tokens, kv_heads, head_dim]`` view (no copy).

    The data section of codec raw is K0 V0 K1 V1 ... with every section ``tokens x kv_heads x head_dim``
    elements, so it is that tensor as it stands; a whole block then goes into a cache in one ``copy_``.
    """
    section = _raw_section(container, kv_dtype, kv_heads, head_dim)
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


def _check_cache(cache: torch.Tensor, layers: tuple[int, int], first_token: int, tokens: int) -> None:
    if cache.dim() != 5 or cache.shape[0] != 2:
        raise SectionError(f"a cache is [2, layers, tokens, kv_heads, head_dim], not {list(cache.shape)}")
    first, last = layers
    if not 0 <= first <= last < cache.shape[1]:
        raise SectionError(f"layers {first}-{last} outside the cache's 0-{cache.shape[1] - 1}")
    if first_token < 0 or tokens < 0 or first_token + tokens > cache.shape[2]:
        raise SectionError(f"tokens {first_token}+{tokens} outside the cache's {cache.shape[2]}")


def _host_rows(cache: torch.Tensor) -> np.ndarray[Any, np.dtype[np.uint8]] | None:
    """A contiguous CPU cache as octets ``[K/V, layers, tokens x row]`` (numpy), else None.

    numpy copies a strided block with one memcpy per contiguous run; torch's ``copy_`` of the same typed
    views took about twice as long per 512 KiB block on one thread (benchmarks/bench_engine.py).
    """
    if cache.device.type != "cpu" or not cache.is_contiguous():
        return None
    octets: np.ndarray[Any, np.dtype[np.uint8]] = cache.view(torch.uint8).numpy()
    return octets.reshape(2, cache.shape[1], -1)


@functools.lru_cache(maxsize=64)
def _raw_header(first_layer: int, layer_count: int, tokens: int, section: int,
                geometry: Geometry | None) -> tuple[ContainerHeader, np.ndarray[Any, np.dtype[np.uint8]]]:
    """A checked raw header and its octets: every block of a cache encodes the same few, and building and
    checking one costs as much as copying a small block's octets."""
    header = ContainerHeader(Codec.RAW, first_layer, tokens, ((section, section),) * layer_count)
    if geometry is not None and geometry.layers is not None and header.last_layer >= geometry.layers:
        raise ContainerError(f"layers {header.layer_range} exceed the model's {geometry.layers} layers")
    check_raw_sections(header, geometry)
    return header, np.frombuffer(header.encode(), np.uint8)


def encode_cache_block_into(buffer: BufferLike, cache: torch.Tensor, layers: tuple[int, int], first_token: int,
                            tokens: int, *, geometry: Geometry | None = None) -> int:
    """Write a raw container of ``tokens`` tokens of ``layers`` of ``cache`` at the start of ``buffer``.

    ``cache`` is ``[K/V, layers, tokens, kv_heads, head_dim]`` in the wire's element type, on any device.
    The data section K0 V0 K1 V1 ... is the cache block transposed to ``[layers, K/V, ...]``, so it is
    written by one strided copy into ``buffer`` viewed as that array (a device cache: one ``copy_`` with
    the transfer to the host) instead of one copy per section.  Returns the container's length in octets.
    """
    kv_dtype_of(cache.dtype)
    _check_cache(cache, layers, first_token, tokens)
    row = cache.shape[3] * cache.shape[4] * cache.element_size()
    header, header_octets = _raw_header(layers[0], layers[1] - layers[0] + 1, tokens, tokens * row, geometry)
    out = as_octets(buffer)
    if out.readonly:
        raise ContainerError("the destination buffer is read-only")
    start, total = header.header_length, header.container_length
    if out.nbytes < total:
        raise ContainerError(f"the container needs {total} octets, the buffer has {out.nbytes}")
    octets = np.frombuffer(out, np.uint8, total)
    octets[:start] = header_octets
    if total == start:
        return total
    data = octets[start:].reshape(header.layer_count, 2, tokens * row)
    host = _host_rows(cache)
    if host is not None:
        np.copyto(data, host[:, layers[0] : layers[1] + 1, first_token * row : (first_token + tokens) * row]
                  .transpose(1, 0, 2))
    else:
        block = cache[:, layers[0] : layers[1] + 1, first_token : first_token + tokens].transpose(0, 1)
        shape = (header.layer_count, 2, -1)
        torch.from_numpy(data).copy_(block.reshape(shape).view(torch.uint8))
    return total

