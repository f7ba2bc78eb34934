"""KV Block Container (spec section 4.3): spec vector, malformed inputs, zero copy, digests, properties,
and the incremental reader fed one octet at a time."""

from __future__ import annotations

import hashlib
import itertools
import random
import struct
from typing import TYPE_CHECKING

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import kvsp.container.encode as container_module
from kvsp.container import (
    DEFAULT_CODECS,
    MAGIC,
    RAW,
    CodecRegistry,
    CodecSpec,
    Container,
    ContainerHeader,
    Geometry,
    LayerDigestMismatchError,
    LayerRange,
    LayersUnavailableError,
    decode_container,
    encode_container,
    encode_header,
    encode_into,
    encode_parts,
    parse_header,
    register_codec,
    replica_digest,
    verify_layers,
)
from kvsp.container_stream import (
    ContainerReader,
    EndOfContainer,
    HeaderReceived,
    LayerReady,
)
from kvsp.errors import ContainerError, DigestMismatchError, ValidationError
from kvsp.registry import Codec

# Appendix A: header for codec raw, layers 0-1, four tokens, K and V sections of 8192 octets each.
APPENDIX_A_HEADER = bytes.fromhex(
    "4b 56 42 31 01 00 00 01 00 00 00 00 00 00 00 02"
    "00 00 00 04 00 00 00 00 00 00 20 00 00 00 00 00"
    "00 00 20 00 00 00 00 00 00 00 20 00 00 00 00 00"
    "00 00 20 00"
)
APPENDIX_A_GEOMETRY = Geometry(kv_heads=8, head_dim=128, element_size=2)  # bf16

if TYPE_CHECKING:
    from kvsp.container import BufferLike


def appendix_a_data() -> bytes:
    """Four distinct 8192-octet sections (L0 K, L0 V, L1 K, L1 V), so a mix-up cannot pass."""
    return b"".join(bytes([i]) * 8192 for i in range(1, 5))


def make_container(layers: int = 3, section: int = 16, first: int = 0, tokens: int = 4) -> bytes:
    rng = random.Random(layers * 1000 + section)
    pairs = [(rng.randbytes(section), rng.randbytes(section)) for _ in range(layers)]
    return encode_container(Codec.RAW, first, tokens, pairs)


def header_with(*, magic: bytes = MAGIC, version: int = 1, flags: int = 0, codec: int = 1, first: int = 0,
                count: int = 1, tokens: int = 4, lengths: list[int] | None = None) -> bytes:
    """A header built field by field, bypassing the encoder's checks, for malformed-input tests."""
    flat = lengths if lengths is not None else [16, 16] * count
    return struct.pack(f">4sBBHIII{len(flat)}Q", magic, version, flags, codec, first, count, tokens, *flat)


# -- Appendix A -----------------------------------------------------------------------------------------


def test_appendix_a_header_vector() -> None:
    assert encode_header(Codec.RAW, 0, 4, [(8192, 8192), (8192, 8192)]) == APPENDIX_A_HEADER
    assert len(APPENDIX_A_HEADER) == 20 + 16 * 2
    assert APPENDIX_A_GEOMETRY.section_length(4) == 8192
    assert Geometry.for_dtype(8, 128, "bf16") == APPENDIX_A_GEOMETRY


def test_appendix_a_decode() -> None:
    data = appendix_a_data()
    c = decode_container(APPENDIX_A_HEADER + data, geometry=APPENDIX_A_GEOMETRY, codec_required=Codec.RAW)
    assert (c.version, c.flags, c.codec, c.first_layer, c.layer_count, c.token_count) == (1, 0, 1, 0, 2, 4)
    assert (c.header_length, c.data_length, c.last_layer) == (52, 4 * 8192, 1)
    assert c.layer_range == LayerRange(0, 1)
    assert [view.layer for view in c.layers] == [0, 1]
    assert bytes(c.layer(0).k) == data[:8192]
    assert bytes(c.layer(0).v) == data[8192:16384]
    assert bytes(c.layer(1).k) == data[16384:24576]
    assert bytes(c.layer(1).v) == data[24576:]
    assert parse_header(APPENDIX_A_HEADER).lengths == ((8192, 8192), (8192, 8192))


# -- malformed inputs, one rule each --------------------------------------------------------------------


def test_bad_magic() -> None:
    with pytest.raises(ContainerError, match="magic"):
        decode_container(header_with(magic=b"KVB2") + bytes(32))


def test_version_2() -> None:
    with pytest.raises(ContainerError, match="version 2"):
        decode_container(header_with(version=2) + bytes(32))


def test_flags_1() -> None:
    with pytest.raises(ContainerError, match="flags"):
        decode_container(header_with(flags=1) + bytes(32))


def test_codec_0_reserved() -> None:
    with pytest.raises(ContainerError, match="reserved"):
        decode_container(header_with(codec=0) + bytes(32))


def test_truncated_header() -> None:
    with pytest.raises(ContainerError, match="too short"):
        decode_container(APPENDIX_A_HEADER[:19])
    with pytest.raises(ContainerError, match="too short"):
        decode_container(b"")


def test_truncated_table() -> None:
    with pytest.raises(ContainerError, match="lengths table truncated"):
        decode_container(APPENDIX_A_HEADER[:51])


def test_truncated_data() -> None:
    with pytest.raises(ContainerError, match="data truncated"):
        decode_container(APPENDIX_A_HEADER + appendix_a_data()[:-1])


def test_trailing_bytes() -> None:
    with pytest.raises(ContainerError, match="1 trailing octets"):
        decode_container(APPENDIX_A_HEADER + appendix_a_data() + b"\x00")


def test_lengths_overflowing() -> None:
    # 2**64-1 twice sums past 64 bits; Python does not wrap, the decoder must still refuse it.
    buf = header_with(codec=0xFF01, lengths=[2**64 - 1, 2**64 - 1]) + bytes(16)
    with pytest.raises(ContainerError, match="past 64 bits"):
        decode_container(buf)
    with pytest.raises(ContainerError, match="data truncated"):
        decode_container(header_with(codec=0xFF01, lengths=[2**64 - 1, 0]) + bytes(16))
    with pytest.raises(ContainerError, match="past 64 bits"):
        ContainerReader().feed(buf)


def test_geometry_mismatch() -> None:
    with pytest.raises(ContainerError, match=r"layer 0: raw K/V sections are 8192/8192 octets, expected 16384"):
        decode_container(APPENDIX_A_HEADER + appendix_a_data(), geometry=Geometry(8, 128, 4))


def test_raw_sections_must_be_equal_without_geometry() -> None:
    with pytest.raises(ContainerError, match="layer 1: raw"):
        decode_container(header_with(count=2, lengths=[16, 16, 16, 8]) + bytes(56))
    with pytest.raises(ContainerError, match="whole number"):
        decode_container(header_with(tokens=3, lengths=[16, 16]) + bytes(32))


def test_layer_out_of_range() -> None:
    c = decode_container(APPENDIX_A_HEADER + appendix_a_data())
    with pytest.raises(LayersUnavailableError, match="layer 2 is not in this container"):
        c.layer(2)
    with pytest.raises(LookupError):
        c.layer_digest(-1)


def test_slice_out_of_range() -> None:
    c = decode_container(make_container(layers=3, first=5))
    for first, last in [(4, 6), (6, 8), (7, 6)]:
        with pytest.raises(LayersUnavailableError):
            c.slice(first, last)


def test_layer_count_zero() -> None:
    with pytest.raises(ContainerError, match="at least one layer"):
        decode_container(header_with(count=0))


def test_layer_count_above_limit() -> None:
    # 2**32-1 layers would mean a 64 GiB lengths table: refused from the fixed header alone.
    with pytest.raises(ContainerError, match="exceeds the limit of 4096"):
        decode_container(header_with(count=2**32 - 1, lengths=[]))
    with pytest.raises(ContainerError, match="limit of 2"):
        decode_container(make_container(layers=3), max_layers=2)


def test_layer_range_overflows_u32() -> None:
    with pytest.raises(ContainerError, match="32-bit layer space"):
        decode_container(header_with(first=2**32 - 1, count=2) + bytes(64))
    c = decode_container(header_with(first=2**32 - 1) + bytes(32))
    assert c.last_layer == 2**32 - 1


def test_layers_beyond_model() -> None:
    buf = make_container(layers=2, first=31, section=16, tokens=4)
    with pytest.raises(ContainerError, match="exceed the model's 32 layers"):
        decode_container(buf, geometry=Geometry(1, 2, 2, layers=32))
    assert decode_container(buf, geometry=Geometry(1, 2, 2, layers=33)).last_layer == 32


def test_codec_required_and_unknown_codecs() -> None:
    unknown = header_with(codec=0x0002, lengths=[3, 5]) + bytes(8)
    assert decode_container(unknown).codec == 2  # unknown codec: lengths are not checked
    assert decode_container(unknown, codec_required=2).codec == 2
    with pytest.raises(ContainerError, match=r"codec 0x0002 \(codec-0002\), required 0x0001 \(raw\)"):
        decode_container(unknown, codec_required=Codec.RAW)
    private = header_with(codec=0xFFFF, lengths=[0, 7]) + bytes(7)
    assert decode_container(private).codec == 0xFFFF


def test_non_contiguous_input() -> None:
    arr = np.zeros((4, 8), dtype=np.uint8)[:, ::2]
    with pytest.raises(ContainerError, match="C-contiguous"):
        decode_container(arr)
    with pytest.raises(ContainerError, match="C-contiguous"):
        encode_parts(Codec.RAW, 0, 1, [(arr, arr)])


# -- encoding -------------------------------------------------------------------------------------------


def test_encode_rejects_what_decode_rejects() -> None:
    with pytest.raises(ContainerError, match="reserved"):
        encode_header(0, 0, 4, [(1, 1)])
    with pytest.raises(ContainerError, match="at least one layer"):
        encode_header(1, 0, 4, [])
    with pytest.raises(ContainerError, match="section lengths"):
        encode_header(0xFF00, 0, 4, [(1, 2**64)])
    with pytest.raises(ContainerError, match="token count"):
        encode_header(1, 0, 2**32, [(0, 0)])
    with pytest.raises(ContainerError, match="expected 8192"):
        encode_container(Codec.RAW, 0, 4, [(bytes(100), bytes(100))], geometry=APPENDIX_A_GEOMETRY)
    with pytest.raises(ContainerError, match="raw K/V sections are 4/8"):
        encode_container(Codec.RAW, 0, 4, [(bytes(4), bytes(8))])


def test_encode_parts_do_not_copy() -> None:
    k = bytearray(b"k" * 32)
    v = np.arange(8, dtype=np.float32)  # 32 octets, a numpy array as a section
    parts = encode_parts(Codec.RAW, 7, 2, [(k, v)])
    assert parts[0] == encode_header(Codec.RAW, 7, 2, [(32, 32)])
    assert isinstance(parts[1], memoryview) and parts[1].obj is k
    assert isinstance(parts[2], memoryview)
    exporter: object = parts[2].obj
    assert exporter is v
    whole = encode_container(Codec.RAW, 7, 2, [(k, v)])
    assert whole == b"".join(parts)
    assert bytes(decode_container(whole).layer(7).v) == v.tobytes()


def test_encode_into_a_preallocated_buffer() -> None:
    layers = [(b"a" * 8, b"b" * 8), (b"c" * 8, b"d" * 8)]
    expected = encode_container(Codec.RAW, 3, 2, layers)
    out = bytearray(len(expected) + 5)
    assert encode_into(out, Codec.RAW, 3, 2, layers) == len(expected)
    assert bytes(out[: len(expected)]) == expected and out[len(expected) :] == bytes(5)
    with pytest.raises(ContainerError, match="needs 84 octets"):
        encode_into(bytearray(83), Codec.RAW, 3, 2, layers)
    with pytest.raises(ContainerError, match="read-only"):
        encode_into(bytes(100), Codec.RAW, 3, 2, layers)


def test_encode_takes_any_section_buffer_in_one_call() -> None:
    """Memoryviews, bytes, numpy arrays of other dtypes and shapes, 'b' views: all encode alike (in one call)."""
    raw = [bytes(range(i, i + 16)) for i in range(6)]
    expected = encode_container(Codec.RAW, 0, 2, [(raw[0], raw[1]), (raw[2], raw[3]), (raw[4], raw[5])])
    mixed: list[tuple[BufferLike, BufferLike]] = [(memoryview(raw[0]), bytearray(raw[1])),
             (np.frombuffer(raw[2], dtype=np.float16).reshape(2, 4), memoryview(raw[3]).cast("b")),
             (memoryview(raw[4] + b"xx")[:16], np.frombuffer(raw[5], dtype=np.uint8))]
    assert encode_container(Codec.RAW, 0, 2, mixed) == expected
    out = bytearray(len(expected))
    assert encode_into(out, Codec.RAW, 0, 2, mixed) == len(expected) and out == expected
    assert encode_container(Codec.RAW, 0, 2, iter(mixed)) == expected  # type: ignore[arg-type]  # an iterator too
    with pytest.raises(ValueError):
        encode_parts(Codec.RAW, 0, 2, [(raw[0], raw[1], raw[2])])  # type: ignore[list-item]  # not a (K, V) pair
    strided = np.zeros(64, dtype=np.uint8)[::2]  # 1-D octets, not contiguous: viewed as before, copied by into
    assert encode_into(bytearray(200), Codec.RAW, 0, 2, [(strided, strided)]) == 20 + 16 + 64


def test_checked_headers_are_remembered_per_geometry_and_codec() -> None:
    """A header checked once is reused, but never for another geometry, codec or first layer."""
    section = bytes(8192)
    geometry = APPENDIX_A_GEOMETRY
    first = encode_parts(Codec.RAW, 0, 4, [(section, section)], geometry=geometry)[0]
    assert encode_parts(Codec.RAW, 0, 4, [(section, section)], geometry=geometry)[0] == first
    assert encode_parts(Codec.RAW, 1, 4, [(section, section)], geometry=geometry)[0] != first
    with pytest.raises(ContainerError, match="expected 16384"):
        encode_parts(Codec.RAW, 0, 4, [(section, section)], geometry=Geometry(1, 2048, 2))
    with pytest.raises(ContainerError, match="exceed the model"):
        encode_parts(Codec.RAW, 5, 4, [(section, section)], geometry=Geometry(2, 1024, 2, layers=4))
    with pytest.raises(ContainerError, match="reserved"):
        encode_parts(0, 0, 4, [(section, section)])
    # Private codecs can be registered later, so their headers are never remembered.
    assert encode_parts(0xFF42, 0, 4, [(section, section)])[0] == encode_header(0xFF42, 0, 4, [(8192, 8192)])
    registry_before = len(container_module._HEADERS)
    encode_parts(0xFF43, 0, 4, [(section, section)])
    assert len(container_module._HEADERS) == registry_before


def test_layer_digests_without_views_match_the_views() -> None:
    layers = [(bytes([i]) * (100 + i), bytes([i + 1]) * 50) for i in range(5)]
    container = decode_container(encode_container(0xFF00, 2, 3, layers))
    assert container.layer_digests() == tuple(hashlib.sha256(bytes(k) + bytes(v)).digest() for k, v in layers)
    assert container.layer_digests() == tuple(view.digest() for view in container.layers)


# -- zero copy ------------------------------------------------------------------------------------------


def test_decoded_layers_are_views_of_the_input() -> None:
    buf = APPENDIX_A_HEADER + appendix_a_data()
    c = decode_container(buf)
    for view in c.layers:
        assert view.payload.obj is buf and view.k.obj is buf and view.v.obj is buf
    arr = np.frombuffer(bytearray(buf), dtype=np.uint8)
    c2 = decode_container(arr)
    layer1 = np.frombuffer(c2.layer(1).k, dtype=np.uint8)
    assert np.shares_memory(layer1, arr)
    arr[52 + 2 * 8192] = 0xEE  # a write to the input shows through the view
    assert c2.layer(1).k[0] == 0xEE


def test_slice_parts_reference_the_input() -> None:
    buf = make_container(layers=4, first=10)
    c = decode_container(buf)
    header, data = c.slice(11, 12)
    assert isinstance(data, memoryview) and data.obj is buf
    sliced = decode_container(c.slice_bytes(11, 12))
    assert (sliced.first_layer, sliced.layer_count) == (11, 2)
    assert bytes(header) == encode_header(Codec.RAW, 11, 4, [(16, 16), (16, 16)])
    for layer in (11, 12):
        assert bytes(sliced.layer(layer).payload) == bytes(c.layer(layer).payload)


# -- digests --------------------------------------------------------------------------------------------


def test_layer_digests_match_hashlib() -> None:
    data = appendix_a_data()
    c = decode_container(APPENDIX_A_HEADER + data)
    k0, v0, k1, v1 = (data[i * 8192 : (i + 1) * 8192] for i in range(4))
    expected = (hashlib.sha256(k0 + v0).digest(), hashlib.sha256(k1 + v1).digest())
    assert c.layer_digests() == expected
    assert c.layer_digest(1) == expected[1]
    assert replica_digest(expected) == hashlib.sha256(expected[0] + expected[1]).digest()
    with pytest.raises(ValueError, match="32 octets"):
        replica_digest([b"short"])


def test_verify_layers() -> None:
    c = decode_container(make_container(layers=3, first=4))
    digests = c.layer_digests()
    assert verify_layers(c, dict(zip((4, 5, 6), digests, strict=True))) == digests
    assert verify_layers(c, [b"\x00" * 32] * 4 + list(digests)) == digests  # record list from layer 0
    assert verify_layers(c, list(digests), first_layer=4) == digests
    bad = {4: digests[0], 5: bytes(32), 6: digests[2]}
    with pytest.raises(LayerDigestMismatchError, match="layer 5: digest") as info:
        verify_layers(c, bad)
    assert info.value.layer == 5 and isinstance(info.value, DigestMismatchError)
    with pytest.raises(LayerDigestMismatchError, match="layer 6: no expected digest"):
        verify_layers(c, {4: digests[0], 5: digests[1]})


# -- registry and helpers -------------------------------------------------------------------------------


def test_codec_registry() -> None:
    registry = CodecRegistry()
    assert registry.get(Codec.RAW) is RAW and registry.name(1) == "raw" and registry.name(0xFF10) == "codec-ff10"

    def even_only(header: ContainerHeader, geometry: Geometry | None) -> None:
        if any(k % 2 or v % 2 for k, v in header.lengths):
            raise ContainerError("sections of the test codec are even")

    spec = register_codec(CodecSpec(0xFF10, "test-q8", "test codec", even_only), registry)
    assert 0xFF10 in registry and 0xFF10 not in DEFAULT_CODECS and list(registry) == [RAW, spec]
    assert decode_container(header_with(codec=0xFF10, lengths=[2, 4]) + bytes(6), codecs=registry)
    with pytest.raises(ContainerError, match="even"):
        decode_container(header_with(codec=0xFF10, lengths=[2, 3]) + bytes(5), codecs=registry)
    with pytest.raises(ValueError, match="private-use"):
        registry.register(CodecSpec(0x0002, "lz4", "not ours to assign"))
    with pytest.raises(ValueError, match="already registered"):
        registry.register(CodecSpec(0xFF10, "other", "duplicate value"))
    with pytest.raises(ValueError, match="already registered"):
        registry.register(CodecSpec(0xFF11, "test-q8", "duplicate name"))
    with pytest.raises(ValueError, match="lowercase"):
        CodecSpec(0xFF12, "Upper", "bad name")
    with pytest.raises(ValueError, match="between"):
        CodecSpec(0, "zero", "reserved")


def test_layer_range() -> None:
    r = LayerRange.parse("2-5")
    assert (r.first, r.last, r.count, str(r), list(r)) == (2, 5, 4, "2-5", [2, 3, 4, 5])
    assert 5 in r and 6 not in r
    for bad in ("5-2", "a-b", "-1-2", "1", "1-99999999999"):
        with pytest.raises(ValidationError):
            LayerRange.parse(bad)


def test_geometry_validation() -> None:
    with pytest.raises(ValueError, match="kv_heads"):
        Geometry(0, 128, 2)
    with pytest.raises(ValueError, match="kv_dtype"):
        Geometry.for_dtype(8, 128, "int3")
    assert Geometry.for_dtype(8, 128, "fp8-e4m3", layers=32) == Geometry(8, 128, 1, 32)


# -- properties -----------------------------------------------------------------------------------------


@st.composite
def containers(draw: st.DrawFn) -> tuple[bytes, Geometry, list[tuple[bytes, bytes]], int, int]:
    geometry = Geometry(draw(st.integers(1, 4)), draw(st.integers(1, 16)), draw(st.sampled_from([1, 2, 4])))
    tokens = draw(st.integers(0, 4))
    count = draw(st.integers(1, 6))
    first = draw(st.one_of(st.integers(0, 100), st.just(2**32 - count)))
    rng = random.Random(draw(st.integers(0, 2**32)))
    size = geometry.section_length(tokens)
    layers = [(rng.randbytes(size), rng.randbytes(size)) for _ in range(count)]
    return encode_container(Codec.RAW, first, tokens, layers, geometry=geometry), geometry, layers, first, tokens


@given(containers())
def test_round_trip(case: tuple[bytes, Geometry, list[tuple[bytes, bytes]], int, int]) -> None:
    buf, geometry, layers, first, tokens = case
    c = decode_container(buf, geometry=geometry, codec_required=Codec.RAW)
    assert (c.first_layer, c.layer_count, c.token_count) == (first, len(layers), tokens)
    for view, (k, v) in zip(c.layers, layers, strict=True):
        assert (bytes(view.k), bytes(view.v)) == (k, v)
        assert view.digest() == hashlib.sha256(k + v).digest()
    assert b"".join(encode_parts(Codec.RAW, first, tokens, layers)) == buf


@given(containers(), st.data())
def test_slice_decodes_to_the_same_layers(case: tuple[bytes, Geometry, list[tuple[bytes, bytes]], int, int],
                                          data: st.DataObject) -> None:
    buf, geometry, *_ = case
    c = decode_container(buf, geometry=geometry)
    lo = data.draw(st.integers(c.first_layer, c.last_layer))
    hi = data.draw(st.integers(lo, c.last_layer))
    sliced = decode_container(c.slice_bytes(lo, hi), geometry=geometry)
    assert sliced.layer_range == LayerRange(lo, hi)
    for layer in range(lo, hi + 1):
        assert bytes(sliced.layer(layer).payload) == bytes(c.layer(layer).payload)
    assert sliced.layer_digests() == tuple(c.layer_digest(layer) for layer in range(lo, hi + 1))


def decode_or_container_error(buf: bytes, **kw: object) -> Container | None:
    try:
        return decode_container(buf, **kw)  # type: ignore[arg-type]
    except ContainerError:
        return None


@given(st.binary(max_size=300))
def test_fuzz_arbitrary_bytes(buf: bytes) -> None:
    decode_or_container_error(buf)
    decode_or_container_error(MAGIC + buf)
    decode_or_container_error(MAGIC + b"\x01\x00" + buf, geometry=Geometry(1, 1, 1))


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(containers(), st.data())
def test_fuzz_mutations(case: tuple[bytes, Geometry, list[tuple[bytes, bytes]], int, int],
                        data: st.DataObject) -> None:
    buf, geometry, *_ = case
    mutated = bytearray(buf)
    header_length = 20 + 16 * len(case[2])
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, min(len(buf), header_length) - 1))
        mutated[pos] ^= data.draw(st.integers(1, 255))
    for candidate in (bytes(mutated), buf[: data.draw(st.integers(0, len(buf) - 1))],
                      buf + data.draw(st.binary(min_size=1, max_size=8))):
        for kw in ({}, {"geometry": geometry}, {"codec_required": 1}, {"max_layers": 2}):
            decoded = decode_or_container_error(candidate, **kw) is not None
            reader = ContainerReader(max_size=1 << 20, **kw)
            try:
                reader.feed(candidate)
                reader.close()
            except ContainerError:
                streamed = False
            else:
                streamed = True
            assert streamed == decoded  # the reader applies exactly the decoder's rules


# -- incremental reader ---------------------------------------------------------------------------------


def feed_chunks(reader: ContainerReader, buf: bytes, cuts: list[int]) -> list[object]:
    events: list[object] = []
    points = [0, *sorted(set(cuts)), len(buf)]
    for a, b in itertools.pairwise(points):
        events += reader.feed(buf[a:b])
    reader.close()
    return events


def check_events(events: list[object], expected: Container) -> None:
    assert isinstance(events[0], HeaderReceived) and events[0].header == expected.header
    assert isinstance(events[-1], EndOfContainer)
    ready = events[1:-1]
    assert [e.layer for e in ready if isinstance(e, LayerReady)] == [v.layer for v in expected.layers]
    for event, view in zip(ready, expected.layers, strict=True):
        assert isinstance(event, LayerReady)
        assert (bytes(event.k), bytes(event.v)) == (bytes(view.k), bytes(view.v))


def test_reader_one_octet_at_a_time_and_layer_order() -> None:
    buf = APPENDIX_A_HEADER + appendix_a_data()
    expected = decode_container(buf)
    reader = ContainerReader(geometry=APPENDIX_A_GEOMETRY)
    events: list[object] = []
    for i in range(len(buf)):
        new = reader.feed(buf[i : i + 1])
        if any(isinstance(e, LayerReady) for e in new):
            layer = next(e for e in new if isinstance(e, LayerReady)).layer
            # Layer l is reported on its own last octet, before any octet of layer l+1 is fed.
            assert i + 1 == 52 + (layer + 1) * 16384
        events += new
    reader.close()
    check_events(events, expected)
    assert reader.container().layer_digests() == expected.layer_digests()
    assert hashlib.sha256(reader.octets).digest() == hashlib.sha256(buf).digest()  # Repr-Digest


@given(containers(), st.lists(st.integers(0, 10_000), max_size=20))
def test_reader_random_chunkings(case: tuple[bytes, Geometry, list[tuple[bytes, bytes]], int, int],
                                 cuts: list[int]) -> None:
    buf, geometry, *_ = case
    reader = ContainerReader(geometry=geometry)
    events = feed_chunks(reader, buf, [c for c in cuts if c < len(buf)])
    check_events(events, decode_container(buf))
    assert reader.done and reader.received == len(buf)


def test_reader_rejects_trailing_and_truncated_and_stays_failed() -> None:
    buf = make_container(layers=2)
    reader = ContainerReader()
    events = reader.feed(buf)
    assert isinstance(events[-1], EndOfContainer)
    with pytest.raises(ContainerError, match="trailing"):
        reader.feed(b"x")
    with pytest.raises(ContainerError, match="already failed"):
        reader.feed(b"")
    short = ContainerReader()
    short.feed(buf[:-1])
    with pytest.raises(ContainerError, match="incomplete"):
        short.close()
    with pytest.raises(ContainerError, match="not complete"):
        ContainerReader().container()


def test_reader_rejects_early() -> None:
    # The fixed header alone is enough to refuse a wrong codec or a huge layer count.
    with pytest.raises(ContainerError, match="required"):
        ContainerReader(codec_required=0xFF00).feed(APPENDIX_A_HEADER[:20])
    with pytest.raises(ContainerError, match="limit of 4096"):
        ContainerReader().feed(header_with(count=5000, lengths=[])[:20])
    with pytest.raises(ContainerError, match="exceeds the limit of 1000"):
        ContainerReader(max_size=1000).feed(APPENDIX_A_HEADER)


@given(st.binary(max_size=200), st.integers(1, 16))
def test_reader_fuzz(buf: bytes, step: int) -> None:
    assume(len(buf) > 0)
    reader = ContainerReader(max_size=1 << 20)
    try:
        for i in range(0, len(buf), step):
            reader.feed(buf[i : i + step])
        reader.close()
    except ContainerError:
        return
    assert decode_container(buf).header == reader.header
