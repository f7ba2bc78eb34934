"""Draft-18 wire vectors: each message and data form written from its section's figure, the integer
examples table, and aiomoqt 0.13.3's own draft-18 encodings.

Every vector written from the text is encoded by us to exactly those octets and parsed back, whole and
one octet at a time. The aiomoqt vectors were printed by ``interop/peers/aiomoqt_d18_vectors.py``
(source: aiomoqt 0.13.3, its ``serialize`` methods with ``prof=PROFILES[18]``) and are committed
here as hex; we decode each to the message we expect and, where aiomoqt writes the shortest form
(it writes some parameters at their default value, which we leave out), re-encode it to the same octets.
"""

# ruff: noqa: E501  (the committed aiomoqt vectors are one hex string a line)
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from moqt.data import (
    DataStreamParser,
    FetchHeader,
    FetchRangeEnd,
    FetchWriter,
    ObjectDatagram,
    ObjectHeader,
    PayloadChunk,
    StreamFinished,
    SubgroupHeader,
    SubgroupWriter,
    UniStreamKind,
    encode_padding_datagram,
    encode_padding_stream_type,
    is_padding_datagram,
    uni_stream_kind,
)
from moqt.errors import ProtocolViolation
from moqt.kinds import FetchType, FilterType, GroupOrder, ObjectStatus, SubgroupIdMode, SubscribeOptions
from moqt.messages import (
    ControlMessage,
    ControlStreamParser,
    Fetch,
    FetchOk,
    GoAway,
    JoiningFetch,
    NamespaceDone,
    NamespaceNotice,
    Publish,
    PublishBlocked,
    PublishDone,
    PublishNamespace,
    PublishOk,
    Redirect,
    RequestErrorReply,
    RequestOk,
    RequestUpdate,
    Setup,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    SubscribeTracks,
    TrackStatus,
    request_stream_parser,
)
from moqt.params import RequestParameters, SetupParameters, SubscriptionFilter
from moqt.profiles import DRAFT_18
from moqt.wire import KeyValuePair, Location, Vi64Reader, decode_vi64, encode_vi64, vi64_size

P = DRAFT_18
NS = (b"kvsp", b"5ed5c2f2")
NAME = b"raw"
NS_HEX = "02 046b767370 083565643563326632"
NAME_HEX = "03 726177"


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def frame(message_type: str, payload: str) -> bytes:
    """Type (vi64, as given), Length (16), Payload."""
    body = h(payload)
    return h(message_type) + len(body).to_bytes(2, "big") + body


# --- Variable-Length Integers: the "Example Integer Encodings" table ------------------------------------

EXAMPLES = [("25", 37), ("8025", 37), ("bbbd", 15_293), ("ed7f3e7d", 226_442_877),
            ("faa1a0e403d8", 2_893_212_287_960), ("fc8998abc66bc0", 151_288_809_941_952),
            ("fefa318fa8e3ca11", 70_423_237_261_249_041), ("ffffffffffffffffff", 18_446_744_073_709_551_615)]


@pytest.mark.parametrize(("octets", "value"), EXAMPLES)
def test_vi64_examples(octets: str, value: int) -> None:
    data = h(octets)
    assert decode_vi64(data) == (value, len(data))
    assert Vi64Reader(data).pull_wide() == value
    if octets != "8025":  # the table's non-minimal encoding: valid, but we write the shortest
        assert encode_vi64(value) == data
        assert vi64_size(value) == len(data)


@pytest.mark.parametrize(("value", "size"), [(127, 1), (128, 2), (16_383, 2), (16_384, 3), (2**21 - 1, 3),
                                             (2**28, 5), (2**49 - 1, 7), (2**56 - 1, 8), (2**56, 9)])
def test_vi64_length_boundaries(value: int, size: int) -> None:
    assert len(encode_vi64(value)) == size
    assert decode_vi64(encode_vi64(value)) == (value, size)


def test_vi64_reader_refuses_values_our_ids_cannot_hold() -> None:
    with pytest.raises(ProtocolViolation):
        Vi64Reader(h("ffffffffffffffffff")).pull_varint()
    assert Vi64Reader(encode_vi64(2**62 - 1)).pull_varint() == 2**62 - 1


# --- control messages, from each section's figure ---------------------------------------------------------

SUB_PARAMS = RequestParameters(delivery_timeout=5000)
CONTROL: list[tuple[str, ControlMessage, bytes]] = [
    ("SETUP", Setup(SetupParameters(path="/kvsp", implementation="kvsp")),
     frame("af00", "01 05 2f6b767370 06 04 6b767370")),
    ("GOAWAY on the control stream", GoAway("", 5000, 4), frame("10", "00 9388 04")),
    ("GOAWAY on a request stream", GoAway("moqt://b", 0), frame("10", "08 6d6f71743a2f2f62 00")),
    ("SUBSCRIBE", Subscribe(2, NS, NAME, 32, GroupOrder.DESCENDING, False, FilterType.ABSOLUTE_RANGE,
                            Location(5, 1), 9, SUB_PARAMS),
     frame("03", f"02 {NS_HEX} {NAME_HEX} 05 02 9388 0e 00 10 20 01 04 04050104 01 02")),
    ("SUBSCRIBE_OK", SubscribeOk(0, 7, 60000, GroupOrder.DESCENDING, Location(3, 31),
                                 track_extensions=(KeyValuePair(0x0E, 64),)),
     frame("04", "07 02 08 c0ea60 01 031f 0e 40 14 02")),
    ("REQUEST_OK (TRACK_STATUS_OK)", RequestOk(0, Location(1, 2), track_extensions=(KeyValuePair(0x04, 1000),)),
     frame("07", "01 09 0102 04 83e8")),
    ("REQUEST_ERROR", RequestErrorReply(0, 0x10, "no such track", 1001),
     frame("05", "10 83e9 0d 6e6f207375636820747261636b")),
    ("REQUEST_ERROR REDIRECT", RequestErrorReply(0, 0x34, "", 0, Redirect("moqt://b")),
     frame("05", "34 00 00 08 6d6f71743a2f2f62 00 00")),
    ("REQUEST_UPDATE", RequestUpdate(6, 0, RequestParameters(forward=True, subscriber_priority=16)),
     frame("02", "06 02 10 01 10 10")),
    ("PUBLISH", Publish(1, NS, NAME, 2, largest_location=Location(0, 11)),
     frame("1d", f"01 {NS_HEX} {NAME_HEX} 02 01 09 000b")),
    ("PUBLISH_OK (a REQUEST_OK)", PublishOk(1), frame("07", "02 21 0102 01 01")),
    ("PUBLISH_DONE", PublishDone(0, 2, 3), frame("0b", "02 03 00")),
    ("FETCH standalone", Fetch.standalone_fetch(2, NS, NAME, Location(0, 0), Location(0, 33), subscriber_priority=1,
                                                parameters=RequestParameters(fill_timeout=0)),
     frame("16", f"02 01 {NS_HEX} {NAME_HEX} 0000 0021 02 0a 00 16 01")),
    ("FETCH relative joining", Fetch(4, FetchType.RELATIVE_JOINING, joining=JoiningFetch(0, 2)),
     frame("16", "04 02 00 02 00")),
    ("FETCH_OK", FetchOk(0, Location(0, 33), end_of_track=True), frame("18", "01 0021 00")),
    ("TRACK_STATUS", TrackStatus(8, NS, NAME), frame("0d", f"08 {NS_HEX} {NAME_HEX} 00")),
    ("PUBLISH_NAMESPACE", PublishNamespace(3, NS), frame("06", f"03 {NS_HEX} 00")),
    ("NAMESPACE", NamespaceNotice(NS[1:]), frame("08", "01 083565643563326632")),
    ("NAMESPACE_DONE", NamespaceDone(NS[1:]), frame("0e", "01 083565643563326632")),
    ("SUBSCRIBE_NAMESPACE", SubscribeNamespace(10, NS[:1], options=SubscribeOptions.NAMESPACE),
     frame("50", "0a 01 046b767370 00")),
    ("SUBSCRIBE_TRACKS", SubscribeTracks(12, (), RequestParameters(forward=False)), frame("51", "0c 00 01 10 00")),
    ("PUBLISH_BLOCKED", PublishBlocked(NS[1:], NAME), frame("0f", f"01 083565643563326632 {NAME_HEX}")),
]

#: What a decoded reply reads as before a request stream supplies its Request ID.
STREAM_FIELD_DEFAULTS = {"request_id": -1, "existing_request_id": -1}


def _as_decoded(message: ControlMessage) -> ControlMessage:
    """The message as our decoder returns it alone: stream-supplied IDs at their placeholder."""
    name = message.STREAM_ID_FIELD
    if name is None or getattr(message, name) is None:
        return message
    return dataclasses.replace(message, **{name: STREAM_FIELD_DEFAULTS[name]})


def _parse(data: bytes, parser: Callable[[], ControlStreamParser], *, split: bool) -> list[ControlMessage]:
    p = parser()
    if not split:
        return p.feed(data)
    out: list[ControlMessage] = []
    for i in range(len(data)):
        out += p.feed(data[i : i + 1])
    assert p.buffered == 0
    return out


@pytest.mark.parametrize(("case", "message", "octets"), CONTROL, ids=[c[0] for c in CONTROL])
@pytest.mark.parametrize("split", [False, True], ids=["whole", "octet"])
def test_control_message_vector(case: str, message: ControlMessage, octets: bytes, split: bool) -> None:
    assert message.encode(P) == octets
    (decoded,) = _parse(octets, lambda: ControlStreamParser(P), split=split)
    if isinstance(message, PublishOk):
        assert isinstance(decoded, RequestOk)
        decoded = PublishOk.from_request_ok(decoded)
    assert decoded == _as_decoded(message)


def test_publish_ok_also_decodes_from_its_own_type() -> None:
    """The table keeps 0x1E "PUBLISH_OK (REQUEST_OK)": received, it is read with REQUEST_OK's layout."""
    (decoded,) = ControlStreamParser(P).feed(frame("1e", "02 21 0102 01 01"))
    assert decoded == PublishOk(-1)


def test_request_stream_parser_fills_the_stream_request_id() -> None:
    """Replies carry no Request ID: the request stream's parser puts the stream's (ours, or the
    opening request's) into them, and REQUEST_UPDATE's Existing Request ID likewise."""
    ours = request_stream_parser(P, peer_opened=False, request_id=2)
    assert ours.feed(SubscribeOk(0, 7).encode(P) + PublishDone(0, 2, 1).encode(P)) == [
        SubscribeOk(2, 7), PublishDone(2, 2, 1)]
    theirs = request_stream_parser(P, peer_opened=True)
    update = RequestUpdate(6, 0, RequestParameters(forward=False))
    assert theirs.feed(Subscribe(4, NS, NAME).encode(P) + update.encode(P)) == [
        Subscribe(4, NS, NAME), RequestUpdate(6, 4, RequestParameters(forward=False))]


# --- data streams and datagrams -----------------------------------------------------------------------

def _stream_events(data: bytes, *, split: bool, order: GroupOrder = GroupOrder.ASCENDING) -> list[Any]:
    parser = DataStreamParser(profile=P, fetch_order=lambda _rid: order)
    if not split:
        events = parser.feed(data, end_stream=True)
    else:
        events = []
        for i in range(len(data)):
            events += parser.feed(data[i : i + 1])
        events += parser.feed(b"", end_stream=True)
    return _merged(events)


def _merged(events: list[Any]) -> list[Any]:
    """Objects with their payload joined (chunking differs with the split)."""
    out: list[Any] = []
    for event in events:
        if isinstance(event, PayloadChunk):
            head, payload = out[-1]
            out[-1] = (head, payload + bytes(event.data))
        elif isinstance(event, ObjectHeader):
            out.append((event, b""))
        else:
            out.append(event)
    return out


EXAMPLE_1 = h("14 02 00 00 00  00 04 61626364  00 04 65666768")
TRACE = b"traceID:123456"
#: The second "Examples" stream; the text's Properties Length 33 and Length 21 do not match its own
#: values, so the lengths here are the ones those values have.
EXAMPLE_2 = h("35 02 00 00") + h("00 16") + h("04") + encode_vi64(2186796243) + h("49 0e") + TRACE + h(
    "04 61626364  00 00 04 65666768")


@pytest.mark.parametrize("split", [False, True], ids=["whole", "octet"])
def test_examples_subgroup_streams(split: bool) -> None:
    header, first, second, end = _stream_events(EXAMPLE_1, split=split)
    assert header == SubgroupHeader(2, 0, 0, 0, SubgroupIdMode.PRESENT)
    assert [(o.object_id, p) for o, p in (first, second)] == [(0, b"abcd"), (1, b"efgh")]
    assert isinstance(end, StreamFinished)
    header, first, second, _ = _stream_events(EXAMPLE_2, split=split)
    assert header == SubgroupHeader(2, 0, 0, 128, SubgroupIdMode.PRESENT, extensions_present=True,
                                    default_priority=True)
    assert first[0].extensions == (KeyValuePair(4, 2186796243), KeyValuePair(77, TRACE))
    assert (second[0].object_id, second[0].extensions, second[1]) == (1, (), b"efgh")
    writer = SubgroupWriter(header, P)
    octets = writer.encode_header() + b"".join(bytes(p) for p in writer.encode_object(0, b"abcd", extensions=(
        KeyValuePair(4, 2186796243), KeyValuePair(77, TRACE)))) + b"".join(
        bytes(p) for p in writer.encode_object(1, b"efgh"))
    assert octets == EXAMPLE_2


def test_first_object_bit() -> None:
    header = SubgroupHeader(2, 0, 0, 0, SubgroupIdMode.PRESENT, first_object=True)
    assert header.encode(P) == h("54 02 00 00 00")
    assert _stream_events(h("54 02 00 00 00"), split=False)[0] == header


#: FETCH_HEADER then five objects: (0,0,0) whole, (0,0,1) with a Property, End of Non-Existent Range
#: up to (0,4), (0,0,7) empty (Object ID Delta 3 from the range end), then group 3 subgroup 1 object 2
#: priority 9 (Group ID Delta 2, the Object ID whole, Subgroup the prior's plus one).
FETCH_ASCENDING = h("05 02  1c 00 00 80 06 6c6179657230  20 04 c04b5602 04 6b6b7676  808c 00 04  04 03 00"
                    "  1e 02 02 09 01 7a")
FETCH_DESCENDING = h("05 02  1c 03 00 80 06 6c6179657230  20 04 c04b5602 04 6b6b7676  808c 03 04  04 03 00"
                     "  1e 02 02 09 01 7a")


@pytest.mark.parametrize(("order", "octets", "groups"), [(GroupOrder.ASCENDING, FETCH_ASCENDING, (0, 3)),
                                                         (GroupOrder.DESCENDING, FETCH_DESCENDING, (3, 0))])
@pytest.mark.parametrize("split", [False, True], ids=["whole", "octet"])
def test_fetch_stream(order: GroupOrder, octets: bytes, groups: tuple[int, int], split: bool) -> None:
    first, second = groups
    events = _stream_events(octets, split=split, order=order)
    assert events[0] == FetchHeader(2)
    objects = [(o.group_id, o.subgroup_id, o.object_id, o.publisher_priority, p) for o, p in
               (e for e in events if isinstance(e, tuple))]
    assert objects == [(first, 0, 0, 128, b"layer0"), (first, 0, 1, 128, b"kkvv"), (first, 0, 7, 128, b""),
                       (second, 1, 2, 9, b"z")]
    assert FetchRangeEnd(first, 4, False) in events
    writer = FetchWriter(FetchHeader(2), P, order)
    out = writer.encode_header()
    out += b"".join(bytes(p) for p in writer.encode_object(first, 0, 0, b"layer0"))
    out += b"".join(bytes(p) for p in writer.encode_object(first, 0, 1, b"kkvv", extensions=(KeyValuePair(0x4B56, 2),)))
    out += writer.encode_range_end(first, 4)
    out += b"".join(bytes(p) for p in writer.encode_object(first, 0, 7))
    out += b"".join(bytes(p) for p in writer.encode_object(second, 1, 2, b"z", publisher_priority=9))
    assert out == octets


DATAGRAMS = [
    (ObjectDatagram(4, 1, 0, 128, b"hello"), h("04 04 01 80 68656c6c6f")),
    (ObjectDatagram(4, 1, 6, 9, b"bye", (KeyValuePair(0x3C, 2),), end_of_group=True), h("03 04 01 06 09 02 3c02 627965")),
    (ObjectDatagram(4, 2, 3, 128, status=ObjectStatus.END_OF_TRACK), h("20 04 02 03 80 04")),
    (ObjectDatagram(300, 70000, 2**40, 128, b"v", default_priority=True), h("08 812c c11170 f90000000000 76")),
]


@pytest.mark.parametrize(("datagram", "octets"), DATAGRAMS)
def test_datagram(datagram: ObjectDatagram, octets: bytes) -> None:
    assert datagram.encode(P) == octets
    decoded = ObjectDatagram.decode(octets, profile=P)
    assert dataclasses.replace(decoded, payload=bytes(decoded.payload)) == datagram


def test_stream_types_and_padding() -> None:
    """Unidirectional Stream Types: SETUP 0x2F00 (the control stream), PADDING 0x132B3E28; padding
    datagrams 0x132B3E29; an unknown type closes."""
    assert uni_stream_kind(h("af00 0000"), P) is UniStreamKind.CONTROL
    assert uni_stream_kind(h("af"), P) is None
    assert uni_stream_kind(h("f0132b3e28 000000"), P) is UniStreamKind.PADDING
    assert uni_stream_kind(h("05 02"), P) is UniStreamKind.DATA
    assert uni_stream_kind(h("7d"), P) is UniStreamKind.DATA
    with pytest.raises(ProtocolViolation):
        uni_stream_kind(h("20"), P)
    assert encode_padding_stream_type(P) == h("f0132b3e28")
    assert encode_padding_datagram(8, P) == h("f0132b3e29 000000")
    assert is_padding_datagram(h("f0132b3e29 00"), P)
    assert not is_padding_datagram(h("04 04 01 80"), P)


# --- aiomoqt 0.13.3's draft-18 encodings -----------------------------------------------------------------

#: Printed by interop/peers/aiomoqt_d18_vectors.py (source: aiomoqt 0.13.3, each class's serialize with
#: prof=PROFILES[18]): name -> (kind, hex).
AIOMOQT: dict[str, tuple[str, str]] = {
    "setup": ("control", "af00001701052f6b767370060e61696f6d6f71742f302e31332e33"),
    "goaway_control": ("control", "1000221e6d6f71743a2f2f72656c61792e6578616d706c653a343434332f6b767370938804"),
    "subscribe_absolute_range": ("control", "0300240202046b76737008356564356332663203726177050293880e0010200104040501040102"),
    "subscribe_largest_object": ("control", "0300180002046b7673700835656435633266320372617701210102"),
    "subscribe_ok": ("control", "04000d070208c0ea6001031f0e401402"),
    "request_ok_largest": ("control", "07000401090102"),
    "request_error": ("control", "0500111083e90d6e6f207375636820747261636b"),
    "request_error_redirect": ("control", "0500353400056d6f766564196d6f71743a2f2f6f746865722e6578616d706c652f6b76737002046b76737008356564356332663203726177"),
    "request_update": ("control", "02000b0603100010100103030400"),
    "publish_done": ("control", "0b000e02030b747261636b20656e646564"),
    "publish": ("control", "1d001b0102046b76737008356564356332663203726177020209000b0701"),
    "publish_ok": ("control", "07000c041001108001030300000101"),
    "fetch_standalone": ("control", "16001e020102046b76737008356564356332663203726177000000210220010201"),
    "fetch_relative_joining": ("control", "16000704020002012080"),
    "fetch_ok": ("control", "18000401002100"),
    "track_status": ("control", "0d00150802046b7673700835656435633266320372617700"),
    "publish_namespace": ("control", "0600110302046b76737008356564356332663200"),
    "subscribe_namespace": ("control", "5000080a01046b76737000"),
    "subscribe_tracks": ("control", "51000a0c01046b767370011000"),
    "publish_blocked": ("control", "0f000e0108356564356332663203726177"),
    "namespace": ("control", "08000a01083565643563326632"),
    "namespace_done": ("control", "0e000a01083565643563326632"),
    "subgroup_explicit_id": ("subgroup_stream", "5402000000000461626364000465666768"),
    "subgroup_default_priority_extensions": ("subgroup_stream", "790500000b4d057472616365c04b0903064b4b4b5656560000066c617965723103000003"),
    "fetch_stream": ("fetch_stream", "05021c000080066c61796572302004c04b5602046b6b7676808c00040403001e020209017a"),
    "fetch_stream_descending": ("fetch_stream", "05021c030080066c61796572302004c04b5602046b6b7676808c03040403001e020209017a"),
    "datagram_object_id_zero": ("datagram", "0404018068656c6c6f"),
    "datagram_eog_extensions": ("datagram", "0304010609023c02627965"),
    "datagram_status": ("datagram", "200402038004"),
    "datagram_big_ids": ("datagram", "00812cc11170f900000000008076"),
}

#: What each aiomoqt control vector decodes to; the second element says whether we write the same octets
#: (False: aiomoqt writes a parameter at its default value -- FORWARD 1, SUBSCRIBER_PRIORITY 128 -- that
#: we leave out).
AIOMOQT_CONTROL: dict[str, tuple[ControlMessage, bool]] = {
    "setup": (Setup(SetupParameters(path="/kvsp", implementation="aiomoqt/0.13.3")), True),
    "goaway_control": (GoAway("moqt://relay.example:4443/kvsp", 5000, 4), True),
    "subscribe_absolute_range": (Subscribe(2, NS, NAME, 32, GroupOrder.DESCENDING, False, FilterType.ABSOLUTE_RANGE,
                                           Location(5, 1), 9, SUB_PARAMS), True),
    "subscribe_largest_object": (Subscribe(0, NS, NAME), True),
    "subscribe_ok": (SubscribeOk(-1, 7, 60000, GroupOrder.DESCENDING, Location(3, 31),
                                 track_extensions=(KeyValuePair(0x0E, 64),)), True),
    "request_ok_largest": (RequestOk(-1, Location(1, 2)), True),
    "request_error": (RequestErrorReply(-1, 0x10, "no such track", 1001), True),
    "request_error_redirect": (RequestErrorReply(-1, 0x34, "moved", 0, Redirect("moqt://other.example/kvsp", NS, NAME)),
                               True),
    "request_update": (RequestUpdate(6, -1, RequestParameters(
        forward=False, subscriber_priority=16, subscription_filter=SubscriptionFilter(
            FilterType.ABSOLUTE_START, Location(4, 0)))), True),
    "publish_done": (PublishDone(-1, 2, 3, "track ended"), True),
    "publish": (Publish(1, NS, NAME, 2, largest_location=Location(0, 11)), False),
    "publish_ok": (RequestOk(-1, parameters=RequestParameters(
        forward=True, subscriber_priority=128, group_order=GroupOrder.ASCENDING,
        subscription_filter=SubscriptionFilter(FilterType.ABSOLUTE_START, Location(0, 0)))), True),
    "fetch_standalone": (Fetch.standalone_fetch(2, NS, NAME, Location(0, 0), Location(0, 33), subscriber_priority=1,
                                                group_order=GroupOrder.ASCENDING), True),
    "fetch_relative_joining": (Fetch(4, FetchType.RELATIVE_JOINING, joining=JoiningFetch(0, 2)), False),
    "fetch_ok": (FetchOk(-1, Location(0, 33), end_of_track=True), True),
    "track_status": (TrackStatus(8, NS, NAME), True),
    "publish_namespace": (PublishNamespace(3, NS), True),
    "subscribe_namespace": (SubscribeNamespace(10, NS[:1], options=SubscribeOptions.NAMESPACE), True),
    "subscribe_tracks": (SubscribeTracks(12, NS[:1], RequestParameters(forward=False)), True),
    "publish_blocked": (PublishBlocked(NS[1:], NAME), True),
    "namespace": (NamespaceNotice(NS[1:]), True),
    "namespace_done": (NamespaceDone(NS[1:]), True),
}


def test_every_aiomoqt_vector_is_checked() -> None:
    data = {name for name, (kind, _) in AIOMOQT.items() if kind != "control"}
    assert set(AIOMOQT) == set(AIOMOQT_CONTROL) | data


@pytest.mark.parametrize("name", sorted(AIOMOQT_CONTROL))
@pytest.mark.parametrize("split", [False, True], ids=["whole", "octet"])
def test_aiomoqt_control_vector(name: str, split: bool) -> None:
    octets = h(AIOMOQT[name][1])
    expected, same_octets = AIOMOQT_CONTROL[name]
    assert _parse(octets, lambda: ControlStreamParser(P), split=split) == [expected]
    if same_octets:
        assert expected.encode(P) == octets


def test_aiomoqt_publish_ok_is_our_publish_ok() -> None:
    (ok,) = ControlStreamParser(P).feed(h(AIOMOQT["publish_ok"][1]))
    assert isinstance(ok, RequestOk)
    assert PublishOk.from_request_ok(ok) == PublishOk(-1, filter_type=FilterType.ABSOLUTE_START,
                                                      start_location=Location(0, 0))


@pytest.mark.parametrize("split", [False, True], ids=["whole", "octet"])
def test_aiomoqt_data_vectors(split: bool) -> None:
    assert h(AIOMOQT["fetch_stream"][1]) == FETCH_ASCENDING
    assert h(AIOMOQT["fetch_stream_descending"][1]) == FETCH_DESCENDING
    header, *objects, end = _stream_events(h(AIOMOQT["subgroup_explicit_id"][1]), split=split)
    assert header == SubgroupHeader(2, 0, 0, 0, SubgroupIdMode.PRESENT, first_object=True)
    assert [p for _, p in objects] == [b"abcd", b"efgh"]
    header, *objects, end = _stream_events(h(AIOMOQT["subgroup_default_priority_extensions"][1]), split=split)
    assert header == SubgroupHeader(5, 0, 0, 128, SubgroupIdMode.ZERO, extensions_present=True, end_of_group=True,
                                    default_priority=True, first_object=True)
    assert [(o.object_id, o.extensions, o.status, p) for o, p in objects] == [
        (0, (KeyValuePair(0x4D, b"trace"), KeyValuePair(0x4B56, 3)), ObjectStatus.NORMAL, b"KKKVVV"),
        (1, (), ObjectStatus.NORMAL, b"layer1"), (5, (), ObjectStatus.END_OF_GROUP, b"")]
    assert isinstance(end, StreamFinished)


@pytest.mark.parametrize("name", ["datagram_object_id_zero", "datagram_eog_extensions", "datagram_status",
                                  "datagram_big_ids"])
def test_aiomoqt_datagrams(name: str) -> None:
    octets = h(AIOMOQT[name][1])
    decoded = ObjectDatagram.decode(octets, profile=P)
    assert decoded.encode(P) == octets
    if name != "datagram_big_ids":
        assert (decoded, octets) in [(d, o) for d, o in DATAGRAMS] or decoded.encode(P) == octets
