"""Data streams and datagrams (draft-14 section 10): hand vectors, aiomoqt vectors, the incremental
parser (byte at a time, any split, zero-copy chunks, limits) and the encoders. The round trips and the
parser fuzz run under draft-16 too (its vectors: tests/test_moqt_draft16_vectors.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moqt.data import (
    DEFAULT_MAX_EXTENSIONS_LENGTH,
    DEFAULT_MAX_OBJECT_SIZE,
    DataEvent,
    DataStreamParser,
    FetchHeader,
    FetchWriter,
    ObjectDatagram,
    ObjectHeader,
    PayloadChunk,
    StreamFinished,
    SubgroupHeader,
    SubgroupWriter,
)
from moqt.errors import ProtocolViolation
from moqt.kinds import ObjectStatus, SessionError, SubgroupIdMode
from moqt.profiles import DRAFT_14, DRAFT_16, PROFILES, Profile
from moqt.profiles.draft14 import DatagramType, DataStreamType  # this file tests the draft-14 framing
from moqt.wire import VARINT_MAX, KeyValuePair, encode_varint

PV = SessionError.PROTOCOL_VIOLATION
VECTORS = Path(__file__).parent / "vectors" / "moqt"


def h(*parts: str) -> bytes:
    return bytes.fromhex("".join(parts).replace(" ", ""))


def parse(octets: bytes, *, split: int | None = None, profile: Profile = DRAFT_14, **limits: int) -> list[DataEvent]:
    """Feed the octets (in ``split``-sized pieces), then FIN; return the events."""
    parser = DataStreamParser(max_object_size=limits.get("max_object_size", DEFAULT_MAX_OBJECT_SIZE),
                              max_extensions_length=limits.get("max_extensions_length", DEFAULT_MAX_EXTENSIONS_LENGTH),
                              profile=profile)
    step = split or max(1, len(octets))
    events: list[DataEvent] = []
    for i in range(0, len(octets), step):
        events += parser.feed(octets[i : i + step])
    return events + parser.feed(b"", end_stream=True)


def objects(events: list[DataEvent]) -> list[tuple[ObjectHeader, bytes]]:
    """(header, whole payload) pairs, joining the chunks."""
    out: list[tuple[ObjectHeader, bytearray]] = []
    for event in events:
        if isinstance(event, ObjectHeader):
            out.append((event, bytearray()))
        elif isinstance(event, PayloadChunk):
            assert event.offset == len(out[-1][1])
            out[-1][1].extend(event.data)
    for header, payload in out:
        assert len(payload) == header.payload_length
    return [(header, bytes(payload)) for header, payload in out]


# --- section 10.5 "Examples", byte for byte ------------------------------------------------------------

EXAMPLE_1 = h("14 02 00 00 00",            # SUBGROUP_HEADER type 0x14, Track Alias 2, Group 0, Subgroup 0, prio 0
              "00 04 61626364",            # Object ID Delta 0 (ID 0), Payload Length 4, "abcd"
              "00 04 65666768")            # Object ID Delta 0 (ID 1), Payload Length 4, "efgh"

# The second example says Extension Headers Length = 33 and a Type-77 header of Length 21 holding
# "traceID:123456" (14 octets): 33 = 1 + 8 (type 4, 8-octet varint) + 2 (type 77) + 1 + 21, so the
# value must be 21 octets; we use "traceID:1234567890123".
TRACE = b"traceID:1234567890123"
EXAMPLE_2 = h("15 02 00 00 00",            # type 0x15: Subgroup ID present, extensions present
              "00", "21",                  # Object ID Delta 0, Extension Headers Length 33
              "04 c0000000 8257dcd3",      # Type 4 (even), Value 2186796243
              "404d 15", TRACE.hex(),      # Type 77 (odd), Length 21, Value
              "04 61626364",               # Payload Length 4, "abcd"
              "00 00 04 65666768")         # Delta 0 (ID 1), Extension Headers Length 0, Length 4, "efgh"


def test_section_10_5_example_1() -> None:
    events = parse(EXAMPLE_1)
    assert events[0] == SubgroupHeader(2, 0, 0, 0, SubgroupIdMode.PRESENT)
    assert [(o.object_id, o.subgroup_id, p) for o, p in objects(events)] == [(0, 0, b"abcd"), (1, 0, b"efgh")]
    assert isinstance(events[-1], StreamFinished)
    writer = SubgroupWriter(SubgroupHeader(2, 0, 0, 0, SubgroupIdMode.PRESENT))
    encoded = writer.encode_header() + b"".join(
        bytes(p) for oid, data in ((0, b"abcd"), (1, b"efgh")) for p in writer.encode_object(oid, data))
    assert encoded == EXAMPLE_1


def test_section_10_5_example_2_with_extensions() -> None:
    events = parse(EXAMPLE_2)
    header = events[0]
    assert isinstance(header, SubgroupHeader) and header.extensions_present and header.stream_type() == 0x15
    (first, p0), (second, p1) = objects(events)
    assert first.extensions == (KeyValuePair(4, 2186796243), KeyValuePair(77, TRACE))
    assert (first.object_id, p0, second.object_id, second.extensions, p1) == (0, b"abcd", 1, (), b"efgh")
    writer = SubgroupWriter(header)
    encoded = writer.encode_header() + b"".join(
        bytes(p) for p in writer.encode_object(0, b"abcd", extensions=first.extensions)
    ) + b"".join(bytes(p) for p in writer.encode_object(1, b"efgh"))
    assert encoded == EXAMPLE_2


# --- SUBGROUP_HEADER types (section 10.4.2 table) ------------------------------------------------------

@pytest.mark.parametrize("stream_type", [t for t in DataStreamType if t != DataStreamType.FETCH_HEADER])
def test_every_subgroup_header_type(stream_type: int) -> None:
    mode = (SubgroupIdMode.ZERO, SubgroupIdMode.FIRST_OBJECT, SubgroupIdMode.PRESENT)[(stream_type >> 1) & 3]
    subgroup = {SubgroupIdMode.ZERO: 0, SubgroupIdMode.FIRST_OBJECT: None, SubgroupIdMode.PRESENT: 9}[mode]
    header = SubgroupHeader(7, 3, subgroup, 200, mode, bool(stream_type & 1), bool(stream_type & 8))
    assert header.stream_type() == stream_type
    octets = header.encode()
    expected = encode_varint(stream_type) + h("07 03") + (h("09") if mode == SubgroupIdMode.PRESENT else b"") + h("c8")
    assert octets == expected
    assert parse(octets) == [header, StreamFinished()]


@pytest.mark.parametrize("stream_type", [0x16, 0x17, 0x1E, 0x1F, 0x00, 0x04, 0x06, 0x20])
def test_unknown_stream_types(stream_type: int) -> None:
    with pytest.raises(ProtocolViolation) as info:
        DataStreamParser().feed(encode_varint(stream_type) + h("00 00 00 00"))
    assert info.value.error == PV


def test_object_id_delta_and_first_object_subgroup() -> None:
    # type 0x12: Subgroup ID = first Object ID; objects 5, 6, 10 -> deltas 5, 0, 3
    octets = h("12 01 04 80", "05 01 61", "00 01 62", "03 00 03")
    events = parse(octets)
    got = [(o.object_id, o.subgroup_id, o.status, p) for o, p in objects(events)]
    assert got == [(5, 5, ObjectStatus.NORMAL, b"a"), (6, 5, ObjectStatus.NORMAL, b"b"),
                   (10, 5, ObjectStatus.END_OF_GROUP, b"")]
    writer = SubgroupWriter(SubgroupHeader(1, 4, 5, 0x80, SubgroupIdMode.FIRST_OBJECT))
    parts = [writer.encode_header(), *writer.encode_object(5, b"a"), *writer.encode_object(6, b"b"),
             *writer.encode_object(10, status=ObjectStatus.END_OF_GROUP)]
    assert b"".join(bytes(p) for p in parts) == octets


@pytest.mark.parametrize(("status", "octets"), [
    (ObjectStatus.NORMAL, "00 00 00"),          # a zero-length object states Normal explicitly
    (ObjectStatus.DOES_NOT_EXIST, "00 00 01"),
    (ObjectStatus.END_OF_GROUP, "00 00 03"),
    (ObjectStatus.END_OF_TRACK, "00 00 04"),
])
def test_object_status_by_hand(status: ObjectStatus, octets: str) -> None:
    [(obj, payload)] = objects(parse(h("10 01 00 80", octets)))
    assert (obj.status, payload, obj.payload_length) == (status, b"", 0)


@pytest.mark.parametrize(("case", "octets"), [
    ("Object Status 2 is unassigned", h("10 01 00 80", "00 00 02")),
    ("Does Not Exist with extensions", h("11 01 00 80", "00 02 3c01 00 01")),
    ("an object after End of Group", h("10 01 00 80", "00 00 03", "00 01 61")),
    ("an object after End of Track", h("10 01 00 80", "00 00 04", "00 00 01")),
    ("extension block overrun", h("11 01 00 80", "00 02 4d05 00")),
])
def test_object_violations(case: str, octets: bytes) -> None:
    with pytest.raises(ProtocolViolation) as info:
        parse(octets)
    assert info.value.error == PV


def test_fin_inside_an_object_or_header() -> None:
    for cut in (1, 3, 6, 7, len(EXAMPLE_1) - 1):
        parser = DataStreamParser()
        parser.feed(EXAMPLE_1[:cut])
        with pytest.raises(ProtocolViolation):
            parser.feed(b"", end_stream=True)
    assert parse(EXAMPLE_1[:5]) == [SubgroupHeader(2, 0, 0, 0, SubgroupIdMode.PRESENT), StreamFinished()]


def test_limits() -> None:
    with pytest.raises(ProtocolViolation) as info:
        DataStreamParser(max_object_size=3).feed(h("10 01 00 80", "00 04"))  # refused before the payload
    assert "Object Payload" in info.value.reason
    with pytest.raises(ProtocolViolation):
        DataStreamParser(max_extensions_length=8).feed(h("11 01 00 80", "00 09"))
    assert objects(parse(h("10 01 00 80", "00 03 616263"), max_object_size=3))[0][1] == b"abc"


def test_large_extension_block_one_byte_at_a_time() -> None:
    """A header near the extension limit trickling in is parsed once it is complete (no re-parse storm)."""
    writer = SubgroupWriter(SubgroupHeader.create(1, 0, extensions_present=True))
    ext = (KeyValuePair(0x4D, b"x" * 16000),)
    octets = writer.encode_header() + b"".join(bytes(p) for p in writer.encode_object(0, b"abc", extensions=ext))
    [(obj, payload)] = objects(parse(octets, split=1))
    assert (obj.extensions, payload) == (ext, b"abc")


def test_header_never_buffers_payload_octets() -> None:
    payload = bytes(range(256)) * 400
    parser = DataStreamParser()
    parser.feed(h("10 01 00 80", "00"))  # header and a delta, then the rest in one piece
    data = encode_varint(len(payload)) + payload
    events = parser.feed(data)
    header, chunk = events
    assert isinstance(header, ObjectHeader) and isinstance(chunk, PayloadChunk)
    assert chunk.data.obj is data  # a view of what was fed, not a copy
    assert bytes(chunk.data) == payload and chunk.end_of_object


# --- FETCH_HEADER (section 10.4.4) ------------------------------------------------------------------

FETCH_STREAM = h("05 06",                      # FETCH_HEADER, Request ID 6
                 "00 00 00 80 00 02 6b76",     # Group 0, Subgroup 0, Object 0, prio 128, no ext, "kv"
                 "00 00 01 80 05 80004b56 01",  # Object 1, ext length 5: 0x4B56 = 1 (KVSP K length, D3)
                 "02 4b56",                    #   payload "KV"
                 "00 00 02 80 00 00 04")       # Object 2: End of Track status


def test_fetch_stream_by_hand() -> None:
    events = parse(FETCH_STREAM)
    assert events[0] == FetchHeader(6)
    got = objects(events)
    assert [(o.group_id, o.object_id, o.extensions, o.status, p) for o, p in got] == [
        (0, 0, (), ObjectStatus.NORMAL, b"kv"),
        (0, 1, (KeyValuePair(0x4B56, 1),), ObjectStatus.NORMAL, b"KV"),
        (0, 2, (), ObjectStatus.END_OF_TRACK, b"")]
    writer = FetchWriter(FetchHeader(6))
    parts = [writer.encode_header(), *writer.encode_object(0, 0, 0, b"kv"),
             *writer.encode_object(0, 0, 1, b"KV", extensions=(KeyValuePair(0x4B56, 1),)),
             *writer.encode_object(0, 0, 2, status=ObjectStatus.END_OF_TRACK)]
    assert b"".join(bytes(p) for p in parts) == FETCH_STREAM


def test_byte_at_a_time() -> None:
    for octets in (EXAMPLE_1, EXAMPLE_2, FETCH_STREAM):
        assert objects(parse(octets, split=1)) == objects(parse(octets))


@given(st.data())
def test_any_split(data: st.DataObject) -> None:
    octets = data.draw(st.sampled_from([EXAMPLE_1, EXAMPLE_2, FETCH_STREAM]))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(octets)), max_size=12)))
    parser = DataStreamParser()
    events: list[DataEvent] = []
    for start, end in zip([0, *cuts], [*cuts, len(octets)], strict=True):
        events += parser.feed(octets[start:end])
    events += parser.feed(b"", end_stream=True)
    assert objects(events) == objects(parse(octets))


# --- datagrams (section 10.3.1) -----------------------------------------------------------------------

DATAGRAMS = [
    (0x00, ObjectDatagram(1, 2, 3, 4, b"pl"), "00 01 02 03 04 706c"),
    (0x01, ObjectDatagram(1, 2, 3, 4, b"pl", (KeyValuePair(0x3C, 1),)), "01 01 02 03 04 02 3c01 706c"),
    (0x02, ObjectDatagram(1, 2, 3, 4, b"pl", end_of_group=True), "02 01 02 03 04 706c"),
    (0x03, ObjectDatagram(1, 2, 3, 4, b"", (KeyValuePair(0x3C, 1),), end_of_group=True), "03 01 02 03 04 02 3c01"),
    (0x04, ObjectDatagram(1, 2, 0, 4, b"pl"), "04 01 02 04 706c"),
    (0x05, ObjectDatagram(1, 2, 0, 4, b"pl", (KeyValuePair(0x3C, 1),)), "05 01 02 04 02 3c01 706c"),
    (0x06, ObjectDatagram(1, 2, 0, 4, b"pl", end_of_group=True), "06 01 02 04 706c"),
    (0x07, ObjectDatagram(1, 2, 0, 4, b"pl", (KeyValuePair(0x3C, 1),), end_of_group=True),
     "07 01 02 04 02 3c01 706c"),
    (0x20, ObjectDatagram(1, 2, 0, 4, status=ObjectStatus.END_OF_TRACK), "20 01 02 00 04 04"),
    (0x21, ObjectDatagram(1, 2, 3, 4, extensions=(KeyValuePair(0x3C, 1),), status=ObjectStatus.END_OF_GROUP),
     "21 01 02 03 04 02 3c01 03"),
]


@pytest.mark.parametrize(("kind", "datagram", "octets"), DATAGRAMS, ids=[f"0x{d[0]:02x}" for d in DATAGRAMS])
def test_datagram_by_hand(kind: int, datagram: ObjectDatagram, octets: str) -> None:
    assert datagram.datagram_type() == kind
    assert datagram.encode() == h(octets)
    decoded = ObjectDatagram.decode(h(octets))
    assert decoded == datagram
    assert isinstance(decoded.payload, memoryview) or decoded.status != ObjectStatus.NORMAL


def test_every_datagram_type_has_a_vector() -> None:
    assert {kind for kind, _, _ in DATAGRAMS} == set(DatagramType)


@pytest.mark.parametrize(("case", "octets"), [
    ("unknown type 0x08", "08 01 02 03 04"),
    ("unknown type 0x22", "22 01 02 03 04 00"),
    ("Extensions Present with an empty block", "01 01 02 03 04 00 706c"),
    ("payload after a status", "20 01 02 03 04 03 ff"),
    ("status 2", "20 01 02 03 04 02"),
    ("Does Not Exist with extensions", "21 01 02 03 04 02 3c01 01"),
    ("truncated", "00 01"),
])
def test_datagram_violations(case: str, octets: str) -> None:
    with pytest.raises(ProtocolViolation) as info:
        ObjectDatagram.decode(h(octets))
    assert info.value.error == PV


# --- encoders ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: f"d{p.draft}")
def test_encoders_do_not_copy_payloads(profile: Profile) -> None:
    payload = memoryview(bytearray(1 << 20))
    parts = SubgroupWriter(SubgroupHeader.create(1, 0)).encode_object(0, payload)
    assert parts[1] is payload
    parts = FetchWriter(FetchHeader(1), profile).encode_object(0, 0, 0, payload)
    assert parts[1] is payload


def test_encoder_refusals() -> None:
    writer = SubgroupWriter(SubgroupHeader.create(1, 0))
    writer.encode_object(3)
    with pytest.raises(ValueError):
        writer.encode_object(3)  # Object IDs increase on a subgroup stream
    with pytest.raises(ValueError):
        writer.encode_object(4, extensions=(KeyValuePair(2, 1),))  # header type has no extensions
    with pytest.raises(ValueError):
        writer.encode_object(5, b"x", status=ObjectStatus.END_OF_GROUP)
    with pytest.raises(ValueError):
        SubgroupWriter(SubgroupHeader(1, 0, 4, 0, SubgroupIdMode.FIRST_OBJECT)).encode_object(5)
    with pytest.raises(ValueError):
        ObjectDatagram(1, 0, 0, extensions=(KeyValuePair(2, 1),), status=ObjectStatus.DOES_NOT_EXIST)


payloads = st.binary(max_size=300)
extension_lists = st.lists(st.one_of(
    st.builds(KeyValuePair, st.integers(0, 1000).map(lambda n: 2 * n), st.integers(0, VARINT_MAX)),
    st.builds(KeyValuePair, st.integers(0, 1000).map(lambda n: 2 * n + 1), st.binary(max_size=20))),
    max_size=3).map(tuple)


@st.composite
def subgroup_streams(draw: st.DrawFn) -> tuple[SubgroupHeader, list[tuple[int, bytes, tuple[KeyValuePair, ...]]]]:
    mode = draw(st.sampled_from(SubgroupIdMode))
    ext = draw(st.booleans())
    ids = sorted(set(draw(st.lists(st.integers(0, 1 << 40), min_size=1, max_size=6))))
    subgroup = {SubgroupIdMode.ZERO: 0, SubgroupIdMode.FIRST_OBJECT: ids[0],
                SubgroupIdMode.PRESENT: draw(st.integers(0, VARINT_MAX))}[mode]
    header = SubgroupHeader(draw(st.integers(0, VARINT_MAX)), draw(st.integers(0, VARINT_MAX)), subgroup,
                            draw(st.integers(0, 255)), mode, ext, draw(st.booleans()))
    objs = [(i, draw(payloads), draw(extension_lists) if ext else ()) for i in ids]
    return header, objs


def on_the_wire(extensions: tuple[KeyValuePair, ...], profile: Profile) -> tuple[KeyValuePair, ...]:
    """The order extensions come back in: draft-16's delta-coded types go by ascending type."""
    return tuple(sorted(extensions, key=lambda p: p.type)) if profile.layout.kvp_delta_types else extensions


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: f"d{p.draft}")
@given(stream=subgroup_streams(), split=st.integers(1, 64))
def test_subgroup_round_trip(profile: Profile, stream: tuple[SubgroupHeader, list[Any]], split: int) -> None:
    header, objs = stream
    writer = SubgroupWriter(header, profile)
    octets = writer.encode_header() + b"".join(bytes(p) for oid, data, ext in objs
                                                for p in writer.encode_object(oid, data, extensions=ext))
    got = objects(parse(octets, split=split, profile=profile))
    assert [(o.object_id, p, o.extensions) for o, p in got] == [(i, d, on_the_wire(e, profile)) for i, d, e in objs]
    assert all(o.subgroup_id == header.subgroup_id and o.group_id == header.group_id for o, _ in got)


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: f"d{p.draft}")
@given(objs=st.lists(st.tuples(st.integers(0, VARINT_MAX), st.integers(0, VARINT_MAX), st.integers(0, VARINT_MAX),
                               st.integers(0, 255), payloads, extension_lists), max_size=5), split=st.integers(1, 64))
def test_fetch_round_trip(profile: Profile, objs: list[Any], split: int) -> None:
    if profile.data_framing.fetch_id_deltas:  # draft-18 writes ID deltas: the objects go in ascending order
        objs = sorted({(g, o): (g, s, o, *rest) for g, s, o, *rest in objs}.values(), key=lambda t: (t[0], t[2]))
    writer = FetchWriter(FetchHeader(9), profile)
    octets = writer.encode_header() + b"".join(
        bytes(p) for g, s, o, prio, data, ext in objs
        for p in writer.encode_object(g, s, o, data, publisher_priority=prio, extensions=ext))
    got = objects(parse(octets, split=split, profile=profile))
    assert [(o.group_id, o.subgroup_id, o.object_id, o.publisher_priority, p, o.extensions) for o, p in got] == \
        [(g, s, o, prio, d, on_the_wire(e, profile)) for g, s, o, prio, d, e in objs]


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: f"d{p.draft}")
@given(datagram=st.builds(ObjectDatagram, st.integers(0, VARINT_MAX), st.integers(0, VARINT_MAX),
                          st.integers(0, VARINT_MAX), st.integers(0, 255), payloads, extension_lists,
                          st.just(ObjectStatus.NORMAL), st.booleans()))
def test_datagram_round_trip(profile: Profile, datagram: ObjectDatagram) -> None:
    expected = dataclasses.replace(datagram, extensions=on_the_wire(datagram.extensions, profile))
    assert ObjectDatagram.decode(datagram.encode(profile), profile=profile) == expected


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: f"d{p.draft}")
@given(octets=st.binary(max_size=200), split=st.integers(1, 16), fin=st.booleans())
def test_parser_fuzz(profile: Profile, octets: bytes, split: int, fin: bool) -> None:
    """Any input is parsed or refused with PROTOCOL_VIOLATION, never anything else."""
    parser = DataStreamParser(max_object_size=1000, max_extensions_length=100, profile=profile)
    try:
        for i in range(0, len(octets), split):
            parser.feed(octets[i : i + split])
        parser.feed(b"", end_stream=fin)
    except ProtocolViolation as exc:
        assert exc.error == PV


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: f"d{p.draft}")
@given(octets=st.binary(max_size=100))
def test_datagram_fuzz(profile: Profile, octets: bytes) -> None:
    try:
        ObjectDatagram.decode(octets, profile=profile)
    except ProtocolViolation as exc:
        assert exc.error == PV


def test_draft_16_subgroup_types_without_a_priority() -> None:
    for code, form in DRAFT_16.data_framing.subgroup_types.items():
        subgroup = 0 if form.subgroup_id_mode is SubgroupIdMode.ZERO else 7
        header = SubgroupHeader(1, 2, None if form.subgroup_id_mode is SubgroupIdMode.FIRST_OBJECT else subgroup,
                                128, form.subgroup_id_mode, form.extensions_present, form.end_of_group,
                                form.default_priority)
        assert header.stream_type(DRAFT_16) == code
        [parsed] = parse(header.encode(DRAFT_16), profile=DRAFT_16)[:1]
        assert parsed == header


# --- aiomoqt 0.13.3 data-plane vectors -----------------------------------------------------------------

AIOMOQT = [v for v in json.loads((VECTORS / "aiomoqt_vectors.json").read_text())["vectors"] if v["kind"] != "control"]


def _exts(raw: dict[str, Any] | None) -> tuple[KeyValuePair, ...]:
    return tuple(KeyValuePair(int(k), bytes.fromhex(v["hex"]) if isinstance(v, dict) else v)
                 for k, v in (raw or {}).items())


def _payload(raw: dict[str, Any]) -> bytes:
    return bytes.fromhex(raw["hex"])


@pytest.mark.parametrize("vector", [v for v in AIOMOQT if v["kind"] == "subgroup_stream"],
                         ids=lambda v: v["name"])
def test_aiomoqt_subgroup_vector(vector: dict[str, Any]) -> None:
    events = parse(bytes.fromhex(vector["hex"]), split=1)
    fields = vector["fields"]
    header = events[0]
    assert isinstance(header, SubgroupHeader)
    hf = fields["header"]
    assert (header.track_alias, header.group_id, header.subgroup_id_mode) == (
        hf["track_alias"], hf["group_id"], {0: SubgroupIdMode.ZERO, 1: SubgroupIdMode.FIRST_OBJECT,
                                            2: SubgroupIdMode.PRESENT}[hf["subgroup_id_mode"]])
    assert header.publisher_priority == hf.get("publisher_priority", 128)
    assert header.extensions_present == hf.get("extensions_present", False)
    assert header.end_of_group == hf.get("end_of_group", False)
    got = objects(events)
    expected_ext = [() if "disagreement" in vector else _exts(o.get("extensions")) for o in fields["objects"]]
    assert [(o.object_id, p, o.extensions, DRAFT_14.object_statuses.code(o.status)) for o, p in got] == [
        (o["object_id"], _payload(o["payload"]), e, o.get("status", 0))
        for o, e in zip(fields["objects"], expected_ext, strict=True)]
    if "disagreement" not in vector:  # our encoder writes the same octets
        writer = SubgroupWriter(header)
        again = writer.encode_header() + b"".join(bytes(p) for o, data in got for p in writer.encode_object(
            o.object_id, data, extensions=o.extensions, status=o.status))
        assert again.hex() == vector["hex"]


def test_aiomoqt_fetch_vector() -> None:
    [vector] = [v for v in AIOMOQT if v["kind"] == "fetch_stream"]
    events = parse(bytes.fromhex(vector["hex"]), split=1)
    assert events[0] == FetchHeader(vector["fields"]["request_id"])
    got = objects(events)
    expected = [(o["group_id"], o["subgroup_id"], o["object_id"], o["publisher_priority"], _exts(o.get("extensions")),
                 o.get("status", 0), _payload(o["payload"])) for o in vector["fields"]["objects"]]
    status_code = DRAFT_14.object_statuses.code
    assert [(o.group_id, o.subgroup_id, o.object_id, o.publisher_priority, o.extensions, status_code(o.status), p)
            for o, p in got] == expected
    writer = FetchWriter(FetchHeader(vector["fields"]["request_id"]))
    again = writer.encode_header() + b"".join(bytes(p) for o, data in got for p in writer.encode_object(
        o.group_id, o.subgroup_id, o.object_id, data, publisher_priority=o.publisher_priority,
        extensions=o.extensions, status=o.status))
    assert again.hex() == vector["hex"]


@pytest.mark.parametrize("vector", [v for v in AIOMOQT if v["kind"] == "datagram"], ids=lambda v: v["name"])
def test_aiomoqt_datagram_vector(vector: dict[str, Any]) -> None:
    f = vector["fields"]
    decoded = ObjectDatagram.decode(bytes.fromhex(vector["hex"]))
    expected = ObjectDatagram(f["track_alias"], f["group_id"], f["object_id"], f.get("publisher_priority", 128),
                              _payload(f["payload"]) if "payload" in f else b"", _exts(f.get("extensions")),
                              DRAFT_14.object_statuses.names[f.get("status", 0)], f.get("end_of_group", False))
    assert decoded == expected
    assert expected.encode().hex() == vector["hex"]
