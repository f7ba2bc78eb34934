"""Draft-16 wire vectors: written from the text field by field, and made by aiomoqt's encoder.

Each text vector names the section of draft-ietf-moq-transport-16 whose wire format figure it
follows; our encoder must write exactly those octets and the parser must read them back. The aiomoqt
vectors are what ``interop/peers/aiomoqt_d16_vectors.py`` printed (source: aiomoqt 0.13.3, its encoders
with ``PROFILES[16]``); we decode each to the message aiomoqt was given and, where both write the
same canonical form, encode it to the same octets (where they differ, the entry says why).
"""

from __future__ import annotations

import dataclasses

import pytest

from moqt.data import (
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
from moqt.data_fields import FetchRangeEnd
from moqt.kinds import FetchType, FilterType, GroupOrder, ObjectStatus, SubgroupIdMode, SubscribeOptions
from moqt.messages import (
    ClientSetup,
    ControlMessage,
    ControlStreamParser,
    Fetch,
    FetchCancel,
    FetchOk,
    GoAway,
    JoiningFetch,
    MaxRequestId,
    NamespaceDone,
    NamespaceNotice,
    Publish,
    PublishDone,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishOk,
    RequestErrorReply,
    RequestOk,
    RequestsBlocked,
    RequestUpdate,
    ServerSetup,
    StandaloneFetch,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    TrackStatus,
    Unsubscribe,
    message_classes,
)
from moqt.params import AuthToken, RequestParameters, SetupParameters, SubscriptionFilter
from moqt.profiles import DRAFT_16
from moqt.wire import KeyValuePair, Location

D16 = DRAFT_16
V16 = 0xFF000010
KVSP = (b"kvsp",)
NS = (b"kvsp", b"5ed5c2f2")


def h(*parts: str) -> bytes:
    return bytes.fromhex("".join(parts).replace(" ", ""))


# (section, message, octets): Type (i), Length (16), then the payload fields of the section's figure.
# Parameters and Track Extensions are Key-Value-Pairs whose types are deltas from the previous type.
TEXT_VECTORS: list[tuple[str, ControlMessage, bytes]] = [
    ("CLIENT_SETUP and SERVER_SETUP: CLIENT_SETUP (no versions: the ALPN chose)",
     ClientSetup((V16,), SetupParameters(path="/kvsp", max_request_id=100)),
     h("20 000b", "02", "01 05 2f6b767370", "01 4064")),
    ("CLIENT_SETUP and SERVER_SETUP: SERVER_SETUP", ServerSetup(V16, SetupParameters(max_request_id=50)),
     h("21 0003", "01", "02 32")),
    ("AUTHORIZATION TOKEN setup parameter (USE_VALUE) and AUTHORITY, delta-coded",
     ClientSetup((V16,), SetupParameters(authorization_tokens=(AuthToken.use_value(0, b"tk"),), authority="h:1")),
     h("20 000c", "02", "03 04 03 00 746b", "02 03 683a31")),
    ("GOAWAY", GoAway("moqt://h"), h("10 0009", "08 6d6f71743a2f2f68")),
    ("MAX_REQUEST_ID", MaxRequestId(10), h("15 0001", "0a")),
    ("REQUESTS_BLOCKED", RequestsBlocked(64), h("1a 0002", "4040")),
    ("REQUEST_OK with LARGEST_OBJECT (length-prefixed Location)", RequestOk(8, Location(1, 2)),
     h("07 0006", "08", "01", "09 02 01 02")),
    ("REQUEST_ERROR (Retry Interval 0: do not retry)", RequestErrorReply(2, 0x10, "gone"),
     h("05 0008", "02 10 00", "04 676f6e65")),
    ("SUBSCRIBE: DELIVERY_TIMEOUT, FORWARD 0, SUBSCRIPTION_FILTER AbsoluteRange, GROUP_ORDER",
     Subscribe(2, KVSP, b"raw", 0x80, GroupOrder.DESCENDING, False, FilterType.ABSOLUTE_RANGE, Location(5, 0), 9,
               RequestParameters(delivery_timeout=1000)),
     h("03 0019", "02", "01 04 6b767370", "03 726177", "04", "02 43e8", "0e 00", "11 04 04 05 00 09", "01 02")),
    ("SUBSCRIBE: SUBSCRIBER_PRIORITY, NextGroupStart, ascending",
     Subscribe(0, KVSP, b"raw", 0x20, GroupOrder.ASCENDING, True, FilterType.NEXT_GROUP_START),
     h("03 0013", "00", "01 04 6b767370", "03 726177", "03", "20 20", "01 01 01", "01 01")),
    ("SUBSCRIBE_OK: EXPIRES, LARGEST_OBJECT, DEFAULT_PUBLISHER_GROUP_ORDER Track Extension",
     SubscribeOk(2, 5, 60000, GroupOrder.DESCENDING, Location(9, 3)),
     h("04 000e", "02 05", "02", "08 8000ea60", "01 02 09 03", "22 02")),
    ("REQUEST_UPDATE: FORWARD 0 and a new AbsoluteRange",
     RequestUpdate(4, 2, RequestParameters(forward=False, subscription_filter=SubscriptionFilter(
         FilterType.ABSOLUTE_RANGE, Location(6, 0), 9))),
     h("02 000b", "04 02", "02", "10 00", "11 04 04 06 00 09")),
    ("UNSUBSCRIBE", Unsubscribe(2), h("0a 0001", "02")),
    ("PUBLISH_DONE, UPDATE_FAILED (0x8)", PublishDone(2, 0x8, 1, ""), h("0b 0004", "02 08 01 00")),
    ("PUBLISH: LARGEST_OBJECT, FORWARD 0, descending as a Track Extension",
     Publish(1, KVSP, b"raw", 3, GroupOrder.DESCENDING, Location(2, 7), False),
     h("1d 0015", "01", "01 04 6b767370", "03 726177", "03", "02", "09 02 02 07", "07 00", "22 02")),
    ("PUBLISH_OK: SUBSCRIPTION_FILTER AbsoluteStart, GROUP_ORDER",
     PublishOk(1, True, 0x80, GroupOrder.ASCENDING, FilterType.ABSOLUTE_START, Location(0, 0)),
     h("1e 0009", "01", "02", "21 03 03 00 00", "01 01")),
    ("FETCH, standalone: SUBSCRIBER_PRIORITY 0, GROUP_ORDER ascending",
     Fetch(6, FetchType.STANDALONE, StandaloneFetch(KVSP, b"raw", Location(0, 0), Location(0, 4)), None, 0,
           GroupOrder.ASCENDING),
     h("16 0015", "06 01", "01 04 6b767370", "03 726177", "00 00", "00 04", "02", "20 00", "02 01")),
    ("FETCH, relative joining (the defaults are not sent)",
     Fetch(8, FetchType.RELATIVE_JOINING, None, JoiningFetch(2, 1), 0x80), h("16 0005", "08 02", "02 01", "00")),
    ("FETCH_OK (no Group Order)", FetchOk(6, Location(0, 4)), h("18 0005", "06 00 00 04 00")),
    ("FETCH_OK, End Of Track, DEFAULT_PUBLISHER_PRIORITY Track Extension",
     FetchOk(7, Location(3, 0), end_of_track=True, track_extensions=(KeyValuePair(0x0E, 64),)),
     h("18 0008", "07 01 03 00 00", "0e 4040")),
    ("FETCH_CANCEL", FetchCancel(6), h("17 0001", "06")),
    ("TRACK_STATUS (no delivery parameters)", TrackStatus(12, KVSP, b"raw"),
     h("0d 000c", "0c", "01 04 6b767370", "03 726177", "00")),
    ("PUBLISH_NAMESPACE", PublishNamespace(3, (b"kvsp", b"ab")), h("06 000b", "03", "02 04 6b767370 02 6162", "00")),
    ("NAMESPACE", NamespaceNotice((b"ab",)), h("08 0004", "01 02 6162")),
    ("PUBLISH_NAMESPACE_DONE (by Request ID)", PublishNamespaceDone(request_id=3), h("09 0001", "03")),
    ("NAMESPACE_DONE", NamespaceDone((b"ab",)), h("0e 0004", "01 02 6162")),
    ("PUBLISH_NAMESPACE_CANCEL (by Request ID)", PublishNamespaceCancel((), 0x1, "t/o", 3),
     h("0c 0006", "03", "01", "03 742f6f")),
    ("SUBSCRIBE_NAMESPACE, Subscribe Options NAMESPACE",
     SubscribeNamespace(14, KVSP, options=SubscribeOptions.NAMESPACE),
     h("11 0009", "0e", "01 04 6b767370", "01", "00")),
    ("SUBSCRIBE_NAMESPACE, the empty prefix, FORWARD 0",
     SubscribeNamespace(16, (), RequestParameters(forward=False)), h("11 0006", "10", "00", "02", "01", "10 00")),
]


def test_the_text_vectors_cover_every_draft_16_message() -> None:
    assert {type(m) for _, m, _ in TEXT_VECTORS} == set(message_classes(D16).values())


@pytest.mark.parametrize(("section", "message", "octets"), TEXT_VECTORS, ids=[v[0] for v in TEXT_VECTORS])
def test_text_vector(section: str, message: ControlMessage, octets: bytes) -> None:
    assert message.encode(D16).hex() == octets.hex()
    assert ControlStreamParser(D16).feed(octets) == [message]


def test_text_vectors_one_byte_at_a_time() -> None:
    stream = b"".join(octets for _, _, octets in TEXT_VECTORS)
    parser = ControlStreamParser(D16)
    out = [m for i in range(len(stream)) for m in parser.feed(stream[i : i + 1])]
    assert out == [message for _, message, _ in TEXT_VECTORS]
    assert parser.buffered == 0


# --- aiomoqt 0.13.3 (interop/peers/aiomoqt_d16_vectors.py) ---------------------------------------------------
SOURCE = "source: aiomoqt 0.13.3, {}.serialize(prof=PROFILES[16])"
_OMITS_DEFAULTS = "aiomoqt writes {} at its default value; we leave it out (the draft's default), same meaning"

#: (name, aiomoqt class, octets, the message kvsp decodes, why our octets differ or "")
AIOMOQT_CONTROL: list[tuple[str, str, str, ControlMessage, str]] = [
    ("client_setup", "ClientSetup", "20000b0201052f6b767370014064",
     ClientSetup((V16,), SetupParameters(path="/kvsp", max_request_id=100)), ""),
    ("client_setup_token_authority_implementation", "ClientSetup",
     "20002c0303050300637774021272656c61792e6578616d706c653a34343433020e61696f6d6f71742f302e31332e33",
     ClientSetup((V16,), SetupParameters(authorization_tokens=(AuthToken.use_value(0, b"cwt"),),
                                         authority="relay.example:4443", implementation="aiomoqt/0.13.3")), ""),
    ("server_setup", "ServerSetup", "210003010232", ServerSetup(V16, SetupParameters(max_request_id=50)), ""),
    ("goaway", "GoAway", "10001f1e6d6f71743a2f2f72656c61792e6578616d706c653a343434332f6b767370",
     GoAway("moqt://relay.example:4443/kvsp"), ""),
    ("max_request_id", "MaxSubscribeId", "15000240c9", MaxRequestId(201), ""),
    ("requests_blocked", "SubscribesBlocked", "1a00024040", RequestsBlocked(64), ""),
    ("subscribe_absolute_range", "Subscribe",
     "0300240202046b76737008356564356332663203726177050253880e0010200104040501090102",
     Subscribe(2, NS, b"raw", 32, GroupOrder.DESCENDING, False, FilterType.ABSOLUTE_RANGE, Location(5, 1), 9,
               RequestParameters(delivery_timeout=5000)), ""),
    ("subscribe_largest_object", "Subscribe", "0300180002046b7673700835656435633266320372617701210102",
     Subscribe(0, NS, b"raw"), ""),
    ("subscribe_ok", "SubscribeOk", "040011000702088000ea600102031f0e40401402",
     SubscribeOk(0, 7, 60000, GroupOrder.DESCENDING, Location(3, 31), track_extensions=(KeyValuePair(0x0E, 64),)),
     ""),
    ("request_ok_largest", "RequestOk", "070006080109020102", RequestOk(8, Location(1, 2)), ""),
    ("request_error", "RequestError", "050012001043e90d6e6f207375636820747261636b",
     RequestErrorReply(0, 0x10, "no such track", 1001), ""),
    ("request_update", "RequestUpdate", "02000c060003100010100103030400",
     RequestUpdate(6, 0, RequestParameters(forward=False, subscriber_priority=16, subscription_filter=(
         SubscriptionFilter(FilterType.ABSOLUTE_START, Location(4, 0))))), ""),
    ("unsubscribe", "Unsubscribe", "0a000100", Unsubscribe(0), ""),
    ("publish_done", "SubscribeDone", "0b000f0002030b747261636b20656e646564", PublishDone(0, 2, 3, "track ended"), ""),
    ("publish", "Publish", "1d001c0102046b7673700835656435633266320372617702020902000b0701",
     Publish(1, NS, b"raw", 2, GroupOrder.ASCENDING, Location(0, 11), True), _OMITS_DEFAULTS.format("FORWARD 1")),
    ("publish_ok", "PublishOk", "1e000e0104100110408001030300000101",
     PublishOk(1, True, 128, GroupOrder.ASCENDING, FilterType.ABSOLUTE_START, Location(0, 0)),
     _OMITS_DEFAULTS.format("FORWARD 1 and SUBSCRIBER_PRIORITY 128")),
    ("fetch_standalone", "Fetch", "16001e020102046b76737008356564356332663203726177000000210220010201",
     Fetch(2, FetchType.STANDALONE, StandaloneFetch(NS, b"raw", Location(0, 0), Location(0, 33)), None, 1,
           GroupOrder.ASCENDING), ""),
    ("fetch_relative_joining", "Fetch", "1600080402000201204080",
     Fetch(4, FetchType.RELATIVE_JOINING, None, JoiningFetch(0, 2)), _OMITS_DEFAULTS.format("SUBSCRIBER_PRIORITY 128")),
    ("fetch_ok", "FetchOk", "18000702010021012202",
     FetchOk(2, Location(0, 33), end_of_track=True, parameters=RequestParameters(unknown=(KeyValuePair(0x22, 2),))),
     "aiomoqt sends GROUP_ORDER in FETCH_OK, which is not among the messages draft-16 scopes it to "
     "(SUBSCRIBE, PUBLISH_OK, FETCH): we ignore it as the text says (kept raw, not a group order)"),
    ("fetch_cancel", "FetchCancel", "17000102", FetchCancel(2), ""),
    ("track_status", "TrackStatus", "0d00150802046b7673700835656435633266320372617700", TrackStatus(8, NS, b"raw"), ""),
    ("publish_namespace", "PublishNamespace", "0600110302046b76737008356564356332663200", PublishNamespace(3, NS), ""),
    ("publish_namespace_done", "PublishNamespaceDone", "09000103", PublishNamespaceDone(request_id=3), ""),
    ("publish_namespace_cancel", "PublishNamespaceCancel", "0c000a03010765787069726564",
     PublishNamespaceCancel((), 1, "expired", 3), ""),
    ("subscribe_namespace", "SubscribeNamespace", "1100090a01046b7673700100",
     SubscribeNamespace(10, KVSP, options=SubscribeOptions.NAMESPACE), ""),
    ("namespace", "Namespace", "08000a01083565643563326632", NamespaceNotice((b"5ed5c2f2",)), ""),
    ("namespace_done", "NamespaceDone", "0e000a01083565643563326632", NamespaceDone((b"5ed5c2f2",)), ""),
]


def test_the_aiomoqt_vectors_cover_every_draft_16_message() -> None:
    assert {type(m) for *_, m, _ in AIOMOQT_CONTROL} == set(message_classes(D16).values())


@pytest.mark.parametrize(("name", "cls", "octets", "expected", "differs"), AIOMOQT_CONTROL,
                         ids=[v[0] for v in AIOMOQT_CONTROL])
def test_aiomoqt_control_vector(name: str, cls: str, octets: str, expected: ControlMessage, differs: str) -> None:
    assert SOURCE.format(cls)  # where the octets came from
    assert ControlStreamParser(D16).feed(bytes.fromhex(octets)) == [expected]
    if not differs:
        assert expected.encode(D16).hex() == octets


def test_aiomoqt_control_vectors_one_byte_at_a_time() -> None:
    stream = bytes.fromhex("".join(octets for _, _, octets, _, _ in AIOMOQT_CONTROL))
    parser = ControlStreamParser(D16)
    assert [m for i in range(len(stream)) for m in parser.feed(stream[i : i + 1])] == \
        [expected for *_, expected, _ in AIOMOQT_CONTROL]


# --- data streams and datagrams -----------------------------------------------------------------------

def parse_bytewise(octets: bytes) -> list[object]:
    """Parse a data stream one octet at a time; payload chunks are joined per object."""
    parser = DataStreamParser(profile=D16)
    out: list[object] = []
    payload = bytearray()
    for i in range(len(octets)):
        for event in parser.feed(octets[i : i + 1], end_stream=i == len(octets) - 1):
            if isinstance(event, PayloadChunk):
                payload += event.data
                if event.end_of_object:
                    out.append(bytes(payload))
                    payload.clear()
            else:
                out.append(event)
    return out


def obj(group: int, subgroup: int, object_id: int, length: int, *, priority: int = 128,
        extensions: tuple[KeyValuePair, ...] = (), status: ObjectStatus = ObjectStatus.NORMAL) -> ObjectHeader:
    return ObjectHeader(group, subgroup, object_id, priority, extensions, status, length)


#: "Examples", first figure: type 0x14, Track Alias 2, group 0, subgroup 0, priority 0, "abcd", "efgh".
SUBGROUP_EXAMPLE = h("14 02 00 00 00", "00 04 61626364", "00 04 65666768")
#: "Examples", second figure (type 0x35: extensions, Subgroup ID present, default priority), with the
#: example's values. Its lengths (33, 21) do not match those values; these follow the field figures.
SUBGROUP_EXTENSIONS_EXAMPLE = h("35 02 00 00", "00 1a", "04 c0000000 8257dcd3", "4049 0e 74726163654944 3a313233343536",
                                "04 61626364", "00 00 04 65666768")


def test_the_examples_subgroup_streams() -> None:
    header = SubgroupHeader(2, 0, 0, 0, SubgroupIdMode.PRESENT)
    writer = SubgroupWriter(header, D16)
    assert writer.encode_header() + b"".join(bytes(p) for p in writer.encode_object(0, b"abcd")) \
        + b"".join(bytes(p) for p in writer.encode_object(1, b"efgh")) == SUBGROUP_EXAMPLE
    assert parse_bytewise(SUBGROUP_EXAMPLE) == [header, obj(0, 0, 0, 4, priority=0), b"abcd",
                                                obj(0, 0, 1, 4, priority=0), b"efgh", StreamFinished()]
    extensions = (KeyValuePair(4, 2186796243), KeyValuePair(77, b"traceID:123456"))
    header = SubgroupHeader(2, 0, 0, 128, SubgroupIdMode.PRESENT, extensions_present=True, default_priority=True)
    writer = SubgroupWriter(header, D16)
    octets = writer.encode_header()
    octets += b"".join(bytes(p) for p in writer.encode_object(0, b"abcd", extensions=extensions))
    octets += b"".join(bytes(p) for p in writer.encode_object(1, b"efgh"))
    assert octets.hex() == SUBGROUP_EXTENSIONS_EXAMPLE.hex()
    assert parse_bytewise(octets) == [header, obj(0, 0, 0, 4, extensions=extensions), b"abcd", obj(0, 0, 1, 4),
                                      b"efgh", StreamFinished()]


#: A fetch stream as the "Fetch Header" figures lay it out: the first object explicit (flags 0x1C: group,
#: object, priority present, Subgroup ID zero), the next all implied (0x00), an End of Non-Existent
#: Range up to (0, 5), an empty object (0, 6) implied from the range's end, then a datagram-preference
#: object (0x40 | 0x1C, Subgroup ID not sent).
FETCH_STREAM = h("05 02", "1c 00 00 80 02 6c30", "00 02 6c31", "408c 00 05", "00 00", "405c 00 07 80 01 64")


def test_a_fetch_stream_with_serialization_flags() -> None:
    writer = FetchWriter(FetchHeader(2), D16)
    octets = writer.encode_header() + b"".join(bytes(p) for p in writer.encode_object(0, 0, 0, b"l0"))
    octets += b"".join(bytes(p) for p in writer.encode_object(0, 0, 1, b"l1"))
    octets += writer.encode_range_end(0, 5) + b"".join(bytes(p) for p in writer.encode_object(0, 0, 6))
    assert octets.hex() == FETCH_STREAM[: len(octets)].hex()
    assert parse_bytewise(FETCH_STREAM) == [
        FetchHeader(2), obj(0, 0, 0, 2), b"l0", obj(0, 0, 1, 2), b"l1", FetchRangeEnd(0, 5, False), obj(0, 0, 6, 0),
        obj(0, 7, 7, 1), b"d", StreamFinished()]
    with pytest.raises(ValueError, match="no Object Status"):
        writer.encode_object(0, 0, 7, status=ObjectStatus.END_OF_GROUP)


#: (name, octets, what it decodes to) from aiomoqt 0.13.3's data encoders.
AIOMOQT_STREAMS: list[tuple[str, str, list[object]]] = [
    ("subgroup_explicit_id", "1402000000000461626364000465666768",
     [SubgroupHeader(2, 0, 0, 0), obj(0, 0, 0, 4, priority=0), b"abcd", obj(0, 0, 1, 4, priority=0), b"efgh"]),
    ("subgroup_default_priority_extensions",
     "390500000d404d05747261636580004b0903064b4b4b5656560000066c617965723103000003",
     [SubgroupHeader(5, 0, 0, 128, SubgroupIdMode.ZERO, True, True, True),
      obj(0, 0, 0, 6, extensions=(KeyValuePair(0x4D, b"trace"), KeyValuePair(0x4B56, 3))), b"KKKVVV",
      obj(0, 0, 1, 6), b"layer1", obj(0, 0, 5, 0, status=ObjectStatus.END_OF_GROUP)]),
    ("fetch_stream", "05021f00000080066c61796572303f000001800580004b5602046b6b7676408c00041f0000058000",
     [FetchHeader(2), obj(0, 0, 0, 6), b"layer0", obj(0, 0, 1, 4, extensions=(KeyValuePair(0x4B56, 2),)), b"kkvv",
      FetchRangeEnd(0, 4, False), obj(0, 0, 5, 0)]),
]


@pytest.mark.parametrize(("name", "octets", "events"), AIOMOQT_STREAMS, ids=[v[0] for v in AIOMOQT_STREAMS])
def test_aiomoqt_data_stream_vector(name: str, octets: str, events: list[object]) -> None:
    # source: aiomoqt 0.13.3, SubgroupHeader(prof=PROFILES[16]) / FetchHeader + FetchObject.serialize
    assert parse_bytewise(bytes.fromhex(octets)) == [*events, StreamFinished()]


def test_our_writers_match_aiomoqts_subgroup_octets() -> None:
    header = SubgroupHeader(5, 0, 0, 128, SubgroupIdMode.ZERO, True, True, True)
    writer = SubgroupWriter(header, D16)
    parts = [writer.encode_header(),
             *writer.encode_object(0, b"KKKVVV", extensions=(KeyValuePair(0x4B56, 3), KeyValuePair(0x4D, b"trace"))),
             *writer.encode_object(1, b"layer1"), *writer.encode_object(5, status=ObjectStatus.END_OF_GROUP)]
    assert b"".join(bytes(p) for p in parts).hex() == AIOMOQT_STREAMS[1][1]  # extension types sorted for the deltas


#: Datagrams: (name, octets, datagram, source). The text's figure: 0x0C = default priority + Object ID 0;
#: 0x24 = status, Object ID 0. aiomoqt 0.13.3 (ObjectDatagram.serialize(prof=PROFILES[16])) for the rest.
DATAGRAMS: list[tuple[str, str, ObjectDatagram, str]] = [
    ("default priority, Object ID 0", "0c0401" "6869", ObjectDatagram(4, 1, 0, payload=b"hi", default_priority=True),
     "Object Datagram figure"),
    ("status, Object ID 0", "2404028004", ObjectDatagram(4, 2, 0, status=ObjectStatus.END_OF_TRACK),
     "Object Datagram figure"),
    ("datagram_object_id_zero", "0404018068656c6c6f", ObjectDatagram(4, 1, 0, payload=b"hello"), "aiomoqt 0.13.3"),
    ("datagram_eog_extensions", "0304010609023c02627965",
     ObjectDatagram(4, 1, 6, 9, b"bye", (KeyValuePair(0x3C, 2),), end_of_group=True), "aiomoqt 0.13.3"),
    ("datagram_status", "200402038004", ObjectDatagram(4, 2, 3, status=ObjectStatus.END_OF_TRACK), "aiomoqt 0.13.3"),
]


@pytest.mark.parametrize(("name", "octets", "datagram", "source"), DATAGRAMS, ids=[v[0] for v in DATAGRAMS])
def test_datagram_vector(name: str, octets: str, datagram: ObjectDatagram, source: str) -> None:
    decoded = ObjectDatagram.decode(bytes.fromhex(octets), profile=D16)
    assert dataclasses.replace(decoded, payload=bytes(decoded.payload)) == datagram
    assert datagram.encode(D16).hex() == octets
