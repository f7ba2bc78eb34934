"""MOQT primitives: RFC 9000 varints, the bounded reader, namespaces, Key-Value-Pairs, Location,
Reason Phrase (draft-14 section 1.3 "Notational Conventions" and 1.3.x structures)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moqt.errors import NeedMoreData, ProtocolViolation
from moqt.kinds import SessionError
from moqt.wire import (
    VARINT_MAX,
    KeyValuePair,
    Location,
    Reader,
    Writer,
    decode_kvp_block,
    decode_varint,
    encode_kvps,
    encode_varint,
    pull_full_track_name,
    pull_namespace,
    pull_reason_phrase,
    push_namespace,
    push_reason_phrase,
    varint_size,
)

PV = SessionError.PROTOCOL_VIOLATION

# RFC 9000 Appendix A.1: (encoding, value); the last is a non-minimal two-byte encoding of 37.
RFC9000_EXAMPLES = [
    ("c2197c5eff14e88c", 151288809941952652),
    ("9d7f3e7d", 494878333),
    ("7bbd", 15293),
    ("25", 37),
]


@pytest.mark.parametrize(("encoded", "value"), RFC9000_EXAMPLES)
def test_rfc9000_varint_examples(encoded: str, value: int) -> None:
    assert decode_varint(bytes.fromhex(encoded)) == (value, len(encoded) // 2)
    assert encode_varint(value).hex() == encoded  # these examples are all minimal


def test_non_minimal_varint_decodes() -> None:
    # RFC 9000 A.1: "the two-byte sequence 0x40 0x25 also decodes to 37"
    assert decode_varint(bytes.fromhex("4025")) == (37, 2)
    assert decode_varint(bytes.fromhex("80000025")) == (37, 4)
    assert decode_varint(bytes.fromhex("c000000000000025")) == (37, 8)


@pytest.mark.parametrize(("value", "size"), [(0, 1), (63, 1), (64, 2), (16383, 2), (16384, 4),
                                             ((1 << 30) - 1, 4), (1 << 30, 8), (VARINT_MAX, 8)])
def test_varint_boundaries(value: int, size: int) -> None:
    assert varint_size(value) == size
    assert len(encode_varint(value)) == size
    assert decode_varint(encode_varint(value)) == (value, size)


@pytest.mark.parametrize("value", [-1, VARINT_MAX + 1])
def test_varint_out_of_range(value: int) -> None:
    with pytest.raises(ValueError, match="varint"):
        encode_varint(value)


@given(st.integers(min_value=0, max_value=VARINT_MAX))
def test_varint_round_trip(value: int) -> None:
    encoded = encode_varint(value)
    assert decode_varint(encoded) == (value, len(encoded))
    for cut in range(len(encoded)):
        with pytest.raises(NeedMoreData):
            decode_varint(encoded[:cut])


def test_reader_needs_more_data_versus_violation() -> None:
    reader = Reader(bytes.fromhex("05616263"))  # length 5, only 3 octets
    with pytest.raises(NeedMoreData):
        reader.pull_length_prefixed(10, "field")
    # a length over the limit is refused at once, before waiting for the octets
    with pytest.raises(ProtocolViolation) as info:
        Reader(bytes.fromhex("4400")).pull_length_prefixed(1000, "field")  # 1024 > 1000
    assert info.value.error == PV


def test_reader_returns_views_without_copying() -> None:
    data = bytearray(b"\x03abcdef")
    view = Reader(data).pull_length_prefixed(10, "x")
    assert isinstance(view, memoryview)
    assert view.obj is data and bytes(view) == b"abc"


def test_writer_fixed_width_fields() -> None:
    writer = Writer()
    writer.push_uint8(0xFF)
    writer.push_uint16(0x1234)
    writer.push_varint(15293)
    assert writer.getvalue().hex() == "ff12347bbd"
    with pytest.raises(ValueError):
        writer.push_uint8(256)
    with pytest.raises(ValueError):
        writer.push_uint16(65536)


# --- Track Namespace ("Track Naming": 1..32 fields, Full Track Name <= 4096 octets) ---------------

def test_namespace_round_trip_by_hand() -> None:
    writer = Writer()
    push_namespace(writer, (b"kvsp", b"ab"))
    assert writer.getvalue().hex() == "02" "04" "6b767370" "02" "6162"
    assert pull_namespace(Reader(writer.getvalue())) == (b"kvsp", b"ab")


@pytest.mark.parametrize("count", [0, 33])
def test_namespace_field_count_limits(count: int) -> None:
    data = encode_varint(count) + b"\x01a" * count
    with pytest.raises(ProtocolViolation) as info:
        pull_namespace(Reader(data))
    assert info.value.error == PV


def test_namespace_32_fields_ok() -> None:
    assert len(pull_namespace(Reader(encode_varint(32) + b"\x01a" * 32))) == 32


def test_full_track_name_length_limit() -> None:
    ok = b"\x01" + encode_varint(4000) + b"n" * 4000 + encode_varint(96) + b"t" * 96
    assert pull_full_track_name(Reader(ok)) == ((b"n" * 4000,), b"t" * 96)
    too_long = b"\x01" + encode_varint(4000) + b"n" * 4000 + encode_varint(97) + b"t" * 97
    with pytest.raises(ProtocolViolation):
        pull_full_track_name(Reader(too_long))
    with pytest.raises(ProtocolViolation):
        pull_namespace(Reader(b"\x02" + encode_varint(4000) + b"n" * 4000 + encode_varint(97) + b"t" * 97))


# --- Key-Value-Pair ---------------------------------------------------------------------------------

def test_kvp_even_and_odd_by_hand() -> None:
    pairs = (KeyValuePair(0x4B56, 3), KeyValuePair(0x4D, b"trace"))
    assert encode_kvps(pairs).hex() == "80004b56" "03" "404d" "05" "7472616365"
    assert decode_kvp_block(encode_kvps(pairs)) == pairs


def test_kvp_value_type_must_match_parity() -> None:
    with pytest.raises(ValueError):
        KeyValuePair(2, b"x")
    with pytest.raises(ValueError):
        KeyValuePair(3, 7)


def test_kvp_over_max_length_is_protocol_violation() -> None:
    data = encode_varint(1) + encode_varint(0x10000) + b"x" * 0x10000
    with pytest.raises(ProtocolViolation) as info:
        KeyValuePair.decode(Reader(data))
    assert info.value.error == PV
    assert KeyValuePair.decode(Reader(encode_varint(1) + encode_varint(0xFFFF) + b"x" * 0xFFFF)).value == b"x" * 0xFFFF


def test_kvp_block_overrun() -> None:
    with pytest.raises(ProtocolViolation):
        decode_kvp_block(bytes.fromhex("0305616263"))  # odd type, length 5, 3 octets


kvps = st.one_of(
    st.builds(KeyValuePair, st.integers(0, VARINT_MAX // 2).map(lambda n: n * 2), st.integers(0, VARINT_MAX)),
    st.builds(KeyValuePair, st.integers(0, VARINT_MAX // 2 - 1).map(lambda n: n * 2 + 1), st.binary(max_size=64)),
)


@given(st.lists(kvps, max_size=8))
def test_kvp_block_round_trip(pairs: list[KeyValuePair]) -> None:
    assert decode_kvp_block(encode_kvps(pairs)) == tuple(pairs)


# --- Location and Reason Phrase ----------------------------------------------------------------------

def test_location_order_is_the_drafts() -> None:
    assert Location(1, 9) < Location(2, 0) < Location(2, 1)
    writer = Writer()
    Location(5, 300).encode(writer)
    assert writer.getvalue().hex() == "05" "412c"
    assert Location.decode(Reader(writer.getvalue())) == Location(5, 300)


def test_reason_phrase_limit() -> None:
    writer = Writer()
    push_reason_phrase(writer, "x" * 1024)
    assert pull_reason_phrase(Reader(writer.getvalue())) == "x" * 1024
    with pytest.raises(ValueError):
        push_reason_phrase(Writer(), "x" * 1025)
    with pytest.raises(ProtocolViolation) as info:
        pull_reason_phrase(Reader(encode_varint(1025) + b"x" * 1025))
    assert info.value.error == PV


def test_reason_phrase_bad_utf8_is_replaced_not_fatal() -> None:
    assert pull_reason_phrase(Reader(b"\x02\xff\xfe")) == "\ufffd\ufffd"
