"""Zero-copy decoding of a KV Block Container (section 4.3) and layer digests.

A container can be hundreds of MiB, so decoding never copies layer data: `decode_container` parses the
header and returns `memoryview` slices of the caller's buffer; its cost grows with the number of layers,
not with the number of octets. The decoder is the trust boundary: every malformed input raises
`ContainerError` and nothing else.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kvsp.container.codecs import DEFAULT_CODECS, CodecRegistry
from kvsp.container.header import (
    _DIGEST,
    DEFAULT_MAX_LAYERS,
    FIXED_HEADER_LENGTH,
    MAGIC,
    TABLE_ENTRY_LENGTH,
    U64_MAX,
    ContainerHeader,
    Geometry,
    LayerDigestMismatchError,
    LayerRange,
    LayersUnavailableError,
    _check_fixed,
    _unpack_fixed,
    as_octets,
)
from kvsp.errors import ContainerError

if TYPE_CHECKING:
    from kvsp.container.header import BufferLike


@dataclass(frozen=True, slots=True)
class DecodeRules:
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
    rules = DecodeRules(geometry, codec_required, max_layers, None, DEFAULT_CODECS if codecs is None else codecs)
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
    rules = DecodeRules(geometry, codec_required, max_layers, None, DEFAULT_CODECS if codecs is None else codecs)
    header = rules.parse(octets)
    available = octets.nbytes - header.header_length
    needed = header.data_length
    if needed > available:
        raise ContainerError(f"data truncated: layers need {needed} octets, have {available}")
    if needed < available:
        raise ContainerError(f"{available - needed} trailing octets after the layer data")
    return Container(header, octets[header.header_length :])


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
