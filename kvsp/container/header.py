"""KV Block Container (spec section 4.3): constants, geometry, layer ranges and the checked header.

Sans-I/O. Every malformed input raises `ContainerError` naming the broken rule.
"""

from __future__ import annotations

import itertools
import operator
import re
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from kvsp.errors import ContainerError, DigestMismatchError, ValidationError
from kvsp.registry import (
    ELEMENT_TYPES,
    Codec,
)

if TYPE_CHECKING:
    import numpy as np
    from typing_extensions import Buffer

    # Any buffer-protocol object.  numpy's stubs only declare __buffer__ for Python >= 3.12, so arrays
    # are named explicitly for the 3.11 type checker.
    BufferLike: TypeAlias = Buffer | np.ndarray[Any, Any]
    Sections: TypeAlias = Sequence[tuple[BufferLike, BufferLike]]  # (K, V) per layer, ascending


MAGIC: Final = b"KVB1"
VERSION: Final = 1
MEDIA_TYPE: Final = "application/kvsp-block"
FIXED_HEADER_LENGTH: Final = 20
TABLE_ENTRY_LENGTH: Final = 16
# A bound on Layer Count so that a hostile header cannot make us unpack a 64 GiB lengths table.  Real
# models have at most a few hundred layers; callers with more pass max_layers.
DEFAULT_MAX_LAYERS: Final = 4096
U32_MAX: Final = 0xFFFF_FFFF
U64_MAX: Final = 0xFFFF_FFFF_FFFF_FFFF

_FIXED: Final = struct.Struct(">4sBBHIII")
_DIGEST: Final = operator.methodcaller("digest")
_CAST: Final[Callable[[object, str], memoryview]] = memoryview.cast  # type: ignore[assignment]
_LAYER_RANGE: Final = re.compile(r"([0-9]{1,10})-([0-9]{1,10})")


class LayersUnavailableError(ContainerError, LookupError):
    """The requested layers are not in this container (problem type kvsp-layers-unavailable).

    A `LookupError` too, because asking for an absent layer is a lookup miss, not malformed data.
    """


class LayerDigestMismatchError(DigestMismatchError):
    """One layer does not match its expected digest; ``layer`` says which, so the caller can refetch it."""

    def __init__(self, layer: int, expected: bytes | None, actual: bytes) -> None:
        what = ("no expected digest" if expected is None
                else f"digest {actual.hex()} != expected {expected.hex()}")
        super().__init__(f"layer {layer}: {what}")
        self.layer = layer
        self.expected = expected
        self.actual = actual


def _check_count(value: int, name: str, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ContainerError(f"{name} must be an integer between 0 and {maximum}, got {value!r}")


# -- geometry and layer ranges -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Geometry:
    """Cache geometry from the Compatibility Descriptor, which fixes the size of every raw section.

    ``layers`` (the model's layer count) is optional; when given, decoding rejects layers beyond it.
    """

    kv_heads: int
    head_dim: int
    element_size: int
    layers: int | None = None

    def __post_init__(self) -> None:
        for name in ("kv_heads", "head_dim", "element_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Geometry.{name} must be a positive integer, got {value!r}")
        if self.layers is not None and (isinstance(self.layers, bool) or self.layers < 1):
            raise ValueError(f"Geometry.layers must be a positive integer, got {self.layers!r}")

    @classmethod
    def for_dtype(cls, kv_heads: int, head_dim: int, kv_dtype: str, layers: int | None = None) -> Geometry:
        """Geometry for a registry element type name (``"bf16"``...), as a descriptor states it."""
        element = ELEMENT_TYPES.get(kv_dtype)
        if element is None:
            raise ValueError(f"unknown kv_dtype {kv_dtype!r}; registered: {sorted(ELEMENT_TYPES)}")
        return cls(kv_heads, head_dim, element.size, layers)

    def section_length(self, tokens: int) -> int:
        """Octets of one raw K (or V) section: tokens x kv_heads x head_dim elements."""
        return tokens * self.kv_heads * self.head_dim * self.element_size


@dataclass(frozen=True, slots=True, order=True)
class LayerRange:
    """An inclusive layer range ``first..last``, as in the ``layers=a-b`` query and record residency."""

    first: int
    last: int

    def __post_init__(self) -> None:
        _check_count(self.first, "first layer", U32_MAX)
        _check_count(self.last, "last layer", U32_MAX)
        if self.first > self.last:
            raise ContainerError(f"layer range {self.first}-{self.last} is empty (first > last)")

    @classmethod
    def parse(cls, text: str, member: str = "layers") -> LayerRange:
        """Parse the ``a-b`` form of the ``layers`` query parameter (spec section 6.7)."""
        match = _LAYER_RANGE.fullmatch(text)
        if match is None:
            raise ValidationError(member, 'must be "a-b" with decimal layer numbers')
        try:
            return cls(int(match[1]), int(match[2]))
        except ContainerError as exc:
            raise ValidationError(member, str(exc)) from exc

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    def __contains__(self, layer: object) -> bool:
        return isinstance(layer, int) and self.first <= layer <= self.last

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.first, self.last + 1))

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


# -- header ------------------------------------------------------------------------------------------


def _check_fixed(version: int, flags: int, codec: int, first_layer: int, layer_count: int) -> None:
    """Rules of the fixed header part, shared by the decoder (before the table) and `ContainerHeader`."""
    if version != VERSION:
        raise ContainerError(f"unsupported container version {version}, expected {VERSION}")
    if flags != 0:
        raise ContainerError(f"flags are reserved and must be 0, got 0x{flags:02x}")
    if codec == Codec.RESERVED:
        raise ContainerError("codec 0x0000 is reserved")
    _check_count(codec, "codec", 0xFFFF)
    _check_count(first_layer, "first layer", U32_MAX)
    if layer_count < 1:
        raise ContainerError("a container must hold at least one layer (layer count 0)")
    if first_layer + layer_count - 1 > U32_MAX:
        raise ContainerError(f"layers {first_layer}+{layer_count} run past the 32-bit layer space")


@dataclass(frozen=True, slots=True)
class ContainerHeader:
    """A validated container header: everything but the layer data.

    Construction checks every structural rule of section 4.3, so an instance is always encodable and
    the decoder and encoder share one set of rules.
    """

    codec: int
    first_layer: int
    token_count: int
    lengths: tuple[tuple[int, int], ...]  # (K octets, V octets) per layer, ascending
    version: int = VERSION
    flags: int = 0
    # Derived once, since every encode and decode asks for them: the distinct section lengths (for the
    # codec's rule) and their sum.
    _distinct: frozenset[int] = field(init=False, repr=False, compare=False)
    _data_length: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_fixed(self.version, self.flags, self.codec, self.first_layer, len(self.lengths))
        _check_count(self.token_count, "token count", U32_MAX)
        # Distinct values, then min/max: all in C, since this runs on the decode path of every container.
        values = frozenset(itertools.chain.from_iterable(self.lengths))
        if min(values) < 0 or max(values) > U64_MAX:
            raise ContainerError(f"section lengths must be between 0 and {U64_MAX}")
        object.__setattr__(self, "_distinct", values)
        object.__setattr__(self, "_data_length", sum(itertools.chain.from_iterable(self.lengths)))

    @property
    def layer_count(self) -> int:
        return len(self.lengths)

    @property
    def last_layer(self) -> int:
        return self.first_layer + len(self.lengths) - 1

    @property
    def layer_range(self) -> LayerRange:
        return LayerRange(self.first_layer, self.last_layer)

    @property
    def header_length(self) -> int:
        return FIXED_HEADER_LENGTH + TABLE_ENTRY_LENGTH * len(self.lengths)

    @property
    def data_length(self) -> int:
        return self._data_length

    @property
    def container_length(self) -> int:
        return self.header_length + self.data_length

    def encode(self) -> bytes:
        flat = [n for pair in self.lengths for n in pair]
        return struct.pack(f">4sBBHIII{len(flat)}Q", MAGIC, self.version, self.flags, self.codec,
                           self.first_layer, len(self.lengths), self.token_count, *flat)


# -- decoding ----------------------------------------------------------------------------------------


def as_octets(buf: BufferLike) -> memoryview:
    """A flat, one-octet-per-item view of any C-contiguous buffer (bytes, memoryview, numpy...), no copy."""
    view = memoryview(buf)  # type: ignore[arg-type]  # ndarray exports a buffer; see BufferLike
    if view.ndim == 1 and view.format in ("B", "b", "c") and view.itemsize == 1:
        return view if view.format == "B" else view.cast("B")
    if not view.c_contiguous:
        raise ContainerError("buffer must be C-contiguous to be viewed without a copy")
    try:
        return view.cast("B")
    except TypeError as exc:  # formats memoryview cannot cast, e.g. some numpy extension dtypes
        raise ContainerError(f"cannot view a buffer of format {view.format!r} as octets: {exc}") from exc


def _unpack_fixed(octets: memoryview) -> tuple[bytes, int, int, int, int, int, int]:
    """Magic, version, flags, codec, first layer, layer count, token count."""
    fields: tuple[bytes, int, int, int, int, int, int] = _FIXED.unpack_from(octets)
    return fields
