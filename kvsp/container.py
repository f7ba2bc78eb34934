"""KV Block Container codec (spec section 4.3): sans-I/O and zero-copy.

Why it looks like this:

* A container can be hundreds of MiB, so decoding never copies layer data.  `decode_container` parses
  the header and returns `memoryview` slices of the caller's buffer; its cost grows with the number of
  layers, not with the number of octets.  Encoding offers `encode_parts` (the header plus the caller's
  buffers, for ``writelines``/``sendmsg``) and `encode_container` (one allocation, one copy).
* Every malformed input raises `ContainerError` with a message naming the broken rule, and nothing else:
  a container comes from the network, so the decoder is the trust boundary.
* No sockets, no clock: the same code serves HTTP bodies, MOQT objects and files on disk.
  `kvsp.container_stream.ContainerReader` is the incremental (push-fed) form of the same parser.
"""

from __future__ import annotations

import hashlib
import itertools
import operator
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from kvsp.errors import ContainerError, DigestMismatchError, ValidationError
from kvsp.registry import (
    CODEC_NAMES,
    ELEMENT_TYPES,
    PRIVATE_CODEC_MAX,
    PRIVATE_CODEC_MIN,
    Codec,
    codec_name,
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
_CODEC_NAME: Final = re.compile(r"[a-z0-9-]{1,32}")
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


# -- codecs ------------------------------------------------------------------------------------------

SectionCheck = Callable[[ContainerHeader, "Geometry | None"], None]


@dataclass(frozen=True, slots=True)
class CodecSpec:
    """One entry of the KVSP Codecs registry (section 11.2), with the section rule the decoder enforces.

    ``check`` receives the validated header and the geometry (when the caller knows it) and raises
    `ContainerError` when the section lengths cannot be a valid encoding; None means no constraint.
    """

    value: int
    name: str
    description: str
    check: SectionCheck | None = None

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int) or not 1 <= self.value <= 0xFFFF:
            raise ValueError(f"codec value must be between 0x0001 and 0xffff, got {self.value!r}")
        if _CODEC_NAME.fullmatch(self.name) is None:
            raise ValueError(f"codec name {self.name!r} must be 1-32 of lowercase letters, digits and '-'")


def check_raw_sections(header: ContainerHeader, geometry: Geometry | None) -> None:
    """Codec raw (layout kvsp-layout-1): every K and V section holds the same token x head x dim grid.

    With a geometry the length is exact; without one, all sections must still be equal and a whole
    number of octets per token.
    """
    tokens = header.token_count
    if geometry is not None:
        expected = geometry.section_length(tokens)
    else:
        expected = header.lengths[0][0]
        if tokens and expected % tokens:
            raise ContainerError(f"raw section of {expected} octets is not a whole number of octets "
                                 f"for {tokens} tokens")
    if header._distinct == {expected}:  # the common case: one length for all sections
        return
    rule = ("all raw sections are equal" if geometry is None else
            f"{tokens} tokens x {geometry.kv_heads} heads x {geometry.head_dim} x {geometry.element_size} octets")
    for i, (k, v) in enumerate(header.lengths):
        if k != expected or v != expected:
            raise ContainerError(f"layer {header.first_layer + i}: raw K/V sections are {k}/{v} octets, "
                                 f"expected {expected} ({rule})")


RAW: Final = CodecSpec(Codec.RAW, CODEC_NAMES[Codec.RAW], 'uncompressed elements in layout "kvsp-layout-1"',
                       check_raw_sections)
STANDARD_CODECS: Final = (RAW,)


class CodecRegistry:
    """The codecs a process understands: the standard ones plus registered private-use codecs.

    Only values 0xFF00-0xFFFF can be registered at run time: anything else is assigned by IANA and
    must come with this library, so two peers never disagree about a standard value.
    """

    __slots__ = ("_by_value",)

    def __init__(self) -> None:
        self._by_value: dict[int, CodecSpec] = {spec.value: spec for spec in STANDARD_CODECS}

    def register(self, spec: CodecSpec) -> CodecSpec:
        if not PRIVATE_CODEC_MIN <= spec.value <= PRIVATE_CODEC_MAX:
            raise ValueError(f"codec 0x{spec.value:04x} is not in the private-use range "
                             f"0x{PRIVATE_CODEC_MIN:04x}-0x{PRIVATE_CODEC_MAX:04x}")
        if spec.value in self._by_value:
            raise ValueError(f"codec 0x{spec.value:04x} is already registered")
        if any(s.name == spec.name for s in self._by_value.values()):
            raise ValueError(f"codec name {spec.name!r} is already registered")
        self._by_value[spec.value] = spec
        return spec

    def get(self, value: int) -> CodecSpec | None:
        return self._by_value.get(value)

    def name(self, value: int) -> str:
        """Registry name, or ``codec-XXXX`` for a codec without one (decision D3)."""
        spec = self._by_value.get(value)
        return spec.name if spec is not None else codec_name(value)

    def __contains__(self, value: object) -> bool:
        return value in self._by_value

    def __iter__(self) -> Iterator[CodecSpec]:
        return iter(sorted(self._by_value.values(), key=lambda s: s.value))


DEFAULT_CODECS: Final = CodecRegistry()
_STANDARD_VALUES: Final = frozenset(spec.value for spec in STANDARD_CODECS)
# Checked headers of recent encodes (see `_checked_header`), by codec, first layer, tokens, geometry and
# section lengths.
_HEADERS: Final[dict[tuple[object, ...], tuple[ContainerHeader, bytes]]] = {}
_MAX_HEADERS: Final = 256


def register_codec(spec: CodecSpec, registry: CodecRegistry | None = None) -> CodecSpec:
    """Register a private-use codec (0xFF00-0xFFFF) in ``registry`` (the process-wide default if None)."""
    return (DEFAULT_CODECS if registry is None else registry).register(spec)


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


@dataclass(frozen=True, slots=True)
class _Rules:
    """The validation options of one decode, shared by `decode_container` and the stream reader."""

    geometry: Geometry | None = None
    codec_required: int | None = None
    max_layers: int = DEFAULT_MAX_LAYERS
    max_size: int | None = None
    codecs: CodecRegistry = DEFAULT_CODECS

    def header_length(self, octets: memoryview) -> int:
        """Check the 20-octet fixed part and return the full header length (bounded by max_layers)."""
        if octets.nbytes < FIXED_HEADER_LENGTH:
            raise ContainerError(f"container too short for its {FIXED_HEADER_LENGTH}-octet header")
        magic, version, flags, codec, first, count, _ = _unpack_fixed(octets)
        if magic != MAGIC:
            raise ContainerError(f"bad magic {magic!r}, expected {MAGIC!r}")
        _check_fixed(version, flags, codec, first, count)
        if self.codec_required is not None and codec != self.codec_required:
            raise ContainerError(f"codec 0x{codec:04x} ({self.codecs.name(codec)}), required "
                                 f"0x{self.codec_required:04x} ({self.codecs.name(self.codec_required)})")
        if count > self.max_layers:
            raise ContainerError(f"layer count {count} exceeds the limit of {self.max_layers}")
        return FIXED_HEADER_LENGTH + TABLE_ENTRY_LENGTH * count

    def parse(self, octets: memoryview) -> ContainerHeader:
        """Parse and check the header at the start of ``octets`` (layer data may follow or be absent)."""
        length = self.header_length(octets)
        if octets.nbytes < length:
            raise ContainerError(f"lengths table truncated: header needs {length} octets, "
                                 f"have {octets.nbytes}")
        _, version, flags, codec, first, count, tokens = _unpack_fixed(octets)
        flat = struct.unpack_from(f">{2 * count}Q", octets, FIXED_HEADER_LENGTH)
        header = ContainerHeader(codec, first, tokens, tuple(zip(flat[0::2], flat[1::2], strict=True)),
                                 version, flags)
        self.check(header)
        return header

    def check(self, header: ContainerHeader) -> None:
        _check_whole(header, self.geometry, self.max_size, self.codecs)


def _check_whole(header: ContainerHeader, geometry: Geometry | None, max_size: int | None = None,
                 codecs: CodecRegistry = DEFAULT_CODECS) -> None:
    """Rules that need the whole header: model layer count, size limit, the codec's section rule."""
    data_length = header.data_length
    if data_length > U64_MAX:
        raise ContainerError(f"section lengths add up to {data_length} octets, past 64 bits")
    if geometry is not None and geometry.layers is not None and header.last_layer >= geometry.layers:
        raise ContainerError(f"layers {header.layer_range} exceed the model's {geometry.layers} layers")
    if max_size is not None and header.header_length + data_length > max_size:
        raise ContainerError(f"container of {header.container_length} octets exceeds the limit of {max_size}")
    spec = codecs.get(header.codec)
    if spec is not None and spec.check is not None:
        spec.check(header, geometry)


def parse_header(buf: BufferLike, *, geometry: Geometry | None = None,
                 codec_required: int | None = None, max_layers: int = DEFAULT_MAX_LAYERS,
                 codecs: CodecRegistry | None = None) -> ContainerHeader:
    """Parse only the header at the start of ``buf``, e.g. to route or size a body before it has arrived."""
    rules = _Rules(geometry, codec_required, max_layers, None, DEFAULT_CODECS if codecs is None else codecs)
    return rules.parse(as_octets(buf))


@dataclass(frozen=True, slots=True, eq=False)
class LayerView:
    """One layer of a container: its K section followed by its V section, viewed in place.

    ``payload`` is K||V as one view (they are adjacent on the wire), so the layer digest is a single
    hash pass and a MOQT object payload (decision D3) is the same view.  Views share the caller's
    buffer, including its writability; equality is identity because views are not values.
    """

    layer: int
    payload: memoryview
    k_length: int

    def __post_init__(self) -> None:
        if not 0 <= self.k_length <= self.payload.nbytes:
            raise ContainerError(f"layer {self.layer}: K length {self.k_length} exceeds the payload")

    @property
    def k(self) -> memoryview:
        return self.payload[: self.k_length]

    @property
    def v(self) -> memoryview:
        return self.payload[self.k_length :]

    @property
    def nbytes(self) -> int:
        return self.payload.nbytes

    def digest(self) -> bytes:
        """Layer digest (section 4.3): SHA-256 of the K section followed by the V section."""
        return hashlib.sha256(self.payload).digest()


@dataclass(frozen=True, slots=True, eq=False)
class Container:
    """A decoded container: the header and a view of its data section in the original buffer.

    Layer views are made on first use and then kept, so decoding costs a header parse whatever the
    size, and a holder that only slices never makes them.  Equality is identity: views are not values.
    """

    header: ContainerHeader
    data: memoryview  # the data section, all layers in ascending order
    _offsets: tuple[int, ...] = field(init=False, repr=False)  # start of each layer in data, then the end
    _layers: tuple[LayerView, ...] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        offsets = (0, *itertools.accumulate(map(sum, self.header.lengths)))
        if offsets[-1] != self.data.nbytes:
            raise ContainerError(f"data section is {self.data.nbytes} octets, header says {offsets[-1]}")
        object.__setattr__(self, "_offsets", offsets)

    @property
    def layers(self) -> tuple[LayerView, ...]:
        """Views of every layer, in ascending order."""
        layers = self._layers
        if layers is None:
            layers = tuple(self._view(i) for i in range(len(self.header.lengths)))
            object.__setattr__(self, "_layers", layers)
        return layers

    def _view(self, index: int) -> LayerView:
        start, end = self._offsets[index], self._offsets[index + 1]
        return LayerView(self.header.first_layer + index, self.data[start:end], self.header.lengths[index][0])

    @property
    def version(self) -> int:
        return self.header.version

    @property
    def flags(self) -> int:
        return self.header.flags

    @property
    def codec(self) -> int:
        return self.header.codec

    @property
    def first_layer(self) -> int:
        return self.header.first_layer

    @property
    def last_layer(self) -> int:
        return self.header.last_layer

    @property
    def layer_count(self) -> int:
        return self.header.layer_count

    @property
    def layer_range(self) -> LayerRange:
        return self.header.layer_range

    @property
    def token_count(self) -> int:
        return self.header.token_count

    @property
    def header_length(self) -> int:
        return self.header.header_length

    @property
    def data_length(self) -> int:
        return self.data.nbytes

    def layer(self, layer: int) -> LayerView:
        """The view of absolute layer index ``layer``."""
        index = layer - self.header.first_layer
        if not 0 <= index < len(self.header.lengths):
            raise LayersUnavailableError(f"layer {layer} is not in this container "
                                         f"({self.header.layer_range})")
        return self._view(index) if self._layers is None else self._layers[index]

    def layer_digest(self, layer: int) -> bytes:
        return self.layer(layer).digest()

    def layer_digests(self) -> tuple[bytes, ...]:
        """Layer digests in ascending layer order, hashed in place.

        Straight from the offsets, without making `LayerView`s, and with the per-layer steps mapped in C:
        for small layers the Python steps around each hash would otherwise cost a noticeable share.
        """
        offsets = self._offsets
        payloads = map(self.data.__getitem__, map(slice, offsets[:-1], offsets[1:]))
        return tuple(map(_DIGEST, map(hashlib.sha256, payloads)))

    def slice(self, first: int, last: int) -> list[bytes | memoryview]:
        """A container of the inclusive layer range ``first..last``: a new header and one view of the data.

        The parts are ready for ``writelines``/``sendmsg``; no layer octet is copied.
        """
        if not (self.header.first_layer <= first <= last <= self.header.last_layer):
            raise LayersUnavailableError(f"layers {first}-{last} are not all in this container "
                                         f"({self.header.layer_range})")
        lo, hi = first - self.header.first_layer, last - self.header.first_layer + 1
        header = replace(self.header, first_layer=first, lengths=self.header.lengths[lo:hi])
        return [header.encode(), self.data[self._offsets[lo] : self._offsets[hi]]]

    def slice_bytes(self, first: int, last: int) -> bytes:
        """`slice` as one bytes object (one copy), for callers that need contiguous octets."""
        return b"".join(self.slice(first, last))


def decode_container(buf: BufferLike, *, geometry: Geometry | None = None,
                     codec_required: int | None = None, max_layers: int = DEFAULT_MAX_LAYERS,
                     codecs: CodecRegistry | None = None) -> Container:
    """Decode a complete container held in ``buf`` without copying its layers.

    ``geometry`` makes raw section lengths exact; ``codec_required`` rejects any other codec (a client
    that asked for the replica's codec); unknown codecs are otherwise accepted with their lengths
    unchecked.  Any malformed input raises `ContainerError`; trailing octets are malformed too.
    """
    octets = as_octets(buf)
    rules = _Rules(geometry, codec_required, max_layers, None, DEFAULT_CODECS if codecs is None else codecs)
    header = rules.parse(octets)
    available = octets.nbytes - header.header_length
    needed = header.data_length
    if needed > available:
        raise ContainerError(f"data truncated: layers need {needed} octets, have {available}")
    if needed < available:
        raise ContainerError(f"{available - needed} trailing octets after the layer data")
    return Container(header, octets[header.header_length :])


# -- encoding ----------------------------------------------------------------------------------------


def encode_header(codec: int, first_layer: int, token_count: int,
                  lengths: Sequence[tuple[int, int]]) -> bytes:
    """The header of a container whose layers have the given (K, V) section lengths."""
    return ContainerHeader(codec, first_layer, token_count, tuple((k, v) for k, v in lengths)).encode()


def _section_views(layers: Sections) -> list[memoryview]:
    """K0, V0, K1, V1... as flat octet views.

    ``memoryview.cast("B")`` is what `as_octets` does to a C-contiguous buffer, and mapped over every
    section it runs in C: the common inputs (memoryview slices of a cache, then any buffer) take no
    Python step per section.  A buffer it refuses (not C-contiguous, an odd format) sends all sections
    through `as_octets`, which raises the precise error or views it the long way.
    """
    if not isinstance(layers, list | tuple):
        layers = list(layers)
    if set(map(len, layers)) == {2}:
        try:  # the unbound method refuses anything but a memoryview (TypeError), so it is never misapplied
            return list(map(_CAST, itertools.chain.from_iterable(layers), itertools.repeat("B")))
        except TypeError:
            pass
        try:
            return list(map(_CAST, map(memoryview, itertools.chain.from_iterable(layers)),  # type: ignore[arg-type]
                            itertools.repeat("B")))
        except TypeError:  # not a buffer, or a buffer that cannot be cast (not C-contiguous, odd format)
            pass
    return [octets for k, v in layers for octets in (as_octets(k), as_octets(v))]


def _checked_header(codec: int, first_layer: int, token_count: int, views: list[memoryview],
                    geometry: Geometry | None) -> tuple[ContainerHeader, bytes]:
    """The checked header of these sections and its octets, remembered for standard codecs.

    Every block of a model has the same layout, so an engine exporting blocks asks for a few headers
    over and over; a standard codec's rules cannot change at run time (only private codecs can be
    registered), which makes a header checked once valid for good.
    """
    lengths = tuple(map(len, views))  # a 1-D octet view's len() is its octet count
    key = (codec, first_layer, token_count, geometry, lengths)
    found = _HEADERS.get(key)
    if found is None:
        header = ContainerHeader(codec, first_layer, token_count, tuple(zip(lengths[0::2], lengths[1::2], strict=True)))
        _check_whole(header, geometry)
        found = (header, header.encode())
        if codec in _STANDARD_VALUES:
            if len(_HEADERS) >= _MAX_HEADERS:
                _HEADERS.clear()
            _HEADERS[key] = found
    return found


def encode_parts(codec: int, first_layer: int, token_count: int, layers: Sections,
                 *, geometry: Geometry | None = None) -> list[bytes | memoryview]:
    """The header followed by views of the given K and V buffers: a container without copying them.

    The codec's section rule (and ``geometry`` when given) is checked, so nothing is encoded that a
    peer's decoder would reject.
    """
    views = _section_views(layers)
    parts: list[bytes | memoryview] = [_checked_header(codec, first_layer, token_count, views, geometry)[1]]
    parts += views
    return parts


def encode_container(codec: int, first_layer: int, token_count: int, layers: Sections,
                     *, geometry: Geometry | None = None) -> bytes:
    """The container as one bytes object: one allocation and one copy of each section (a single join)."""
    return b"".join(encode_parts(codec, first_layer, token_count, layers, geometry=geometry))


def encode_into(buffer: BufferLike, codec: int, first_layer: int, token_count: int, layers: Sections,
                *, geometry: Geometry | None = None) -> int:
    """Write the container at the start of a writable ``buffer`` and return its length in octets.

    For a destination the caller already has (a reused or pinned buffer, an mmap of a file), this is
    the floor of encoding: one memcpy per section and no allocation.  ``buffer`` may be longer.
    Per section the only Python work is one slice assignment (K and V of a cache are not adjacent, so
    there is nothing to merge); the views, lengths and checks are made for all sections at once.
    """
    out = as_octets(buffer)
    if out.readonly:
        raise ContainerError("the destination buffer is read-only")
    views = _section_views(layers)
    header, octets = _checked_header(codec, first_layer, token_count, views, geometry)
    total = header.container_length
    if out.nbytes < total:
        raise ContainerError(f"the container needs {total} octets, the buffer has {out.nbytes}")
    position = len(octets)
    out[:position] = octets
    for view in views:
        end = position + len(view)
        out[position:end] = view
        position = end
    return position


# -- digests -----------------------------------------------------------------------------------------


def replica_digest(layer_digests: Iterable[bytes]) -> bytes:
    """Replica digest (section 4.3): SHA-256 of the layer digests of all layers, in ascending order."""
    h = hashlib.sha256()
    for digest in layer_digests:
        if len(digest) != 32:
            raise ValueError(f"a layer digest is 32 octets, got {len(digest)}")
        h.update(digest)
    return h.digest()


def verify_layers(container: Container, expected: Mapping[int, bytes] | Sequence[bytes], *,
                  first_layer: int = 0) -> tuple[bytes, ...]:
    """Check every layer of ``container`` against its expected digest and return the digests.

    ``expected`` maps absolute layer index to digest, or is a record's ``layer_digests`` list whose
    item i is layer ``first_layer + i``.  A layer without an expected digest fails (fail closed).  The
    returned digests let the caller compute the replica digest without hashing the layers again.
    """
    digests = []
    for view in container.layers:
        if isinstance(expected, Mapping):
            want = expected.get(view.layer)
        else:
            index = view.layer - first_layer
            want = expected[index] if 0 <= index < len(expected) else None
        actual = view.digest()
        if want is None or actual != want:
            raise LayerDigestMismatchError(view.layer, want, actual)
        digests.append(actual)
    return tuple(digests)
