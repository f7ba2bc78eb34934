"""Draft-18 codecs beyond the vectors: Hypothesis round trips (whole and one octet at a time), the
inputs the text says close the session, what the profile refuses to send, malformed data streams and
datagrams, and the request / control stream rules of the parsers."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moqt.data import (
    DataStreamParser,
    FetchHeader,
    FetchWriter,
    ObjectDatagram,
    ObjectHeader,
    SubgroupHeader,
    SubgroupWriter,
)
from moqt.errors import ProtocolViolation
from moqt.kinds import FilterType, GroupOrder, SessionError, SubscribeOptions
from moqt.messages import (
    ClientSetup,
    ControlMessage,
    ControlStreamParser,
    FetchOk,
    GoAway,
    MaxRequestId,
    PublishDone,
    PublishOk,
    RequestErrorReply,
    RequestOk,
    RequestUpdate,
    Setup,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    SubscribeTracks,
    Unsubscribe,
    control_stream_parser,
    request_stream_parser,
)
from moqt.params import RequestParameters, SetupParameters, SubscriptionFilter
from moqt.profiles import DRAFT_14, DRAFT_16, DRAFT_18
from moqt.profiles.draft18 import PropertyType
from moqt.wire import VARINT_MAX, KeyValuePair, Location, encode_vi64

P = DRAFT_18
NS = (b"kvsp", b"x")
ids = st.integers(0, VARINT_MAX)
locations = st.builds(Location, ids, ids)
priorities = st.integers(0, 255)
params = st.builds(
    RequestParameters, delivery_timeout=st.none() | ids, subgroup_delivery_timeout=st.none() | ids,
    rendezvous_timeout=st.none() | ids, new_group_request=st.none() | ids)


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def frame(message_type: str, payload: str) -> bytes:
    body = h(payload)
    return h(message_type) + len(body).to_bytes(2, "big") + body


def _round_trip(message: ControlMessage) -> None:
    octets = message.encode(P)
    (whole,) = ControlStreamParser(P).feed(octets)
    parser = ControlStreamParser(P)
    split = [m for i in range(len(octets)) for m in parser.feed(octets[i : i + 1])]
    assert split == [whole]
    assert whole.encode(P) == octets


@settings(max_examples=150, deadline=None)
@given(st.builds(Subscribe, ids, st.just(NS), st.binary(max_size=8), priorities,
                 st.sampled_from(list(GroupOrder)), st.booleans(), st.just(FilterType.ABSOLUTE_RANGE),
                 st.builds(Location, st.integers(0, 2**40), ids), st.integers(2**40, 2**41), params))
def test_subscribe_round_trip(message: Subscribe) -> None:
    _round_trip(message)


_even_types = st.integers(0, 100).map(lambda n: 2 * n)


def _unchecked_property(kind: int) -> bool:
    """Properties whose values the codec does not check (a known one may refuse a random value)."""
    return kind not in set(PropertyType)


@settings(max_examples=150, deadline=None)
@given(st.one_of(
    st.builds(SubscribeOk, st.just(-1), ids, ids, st.sampled_from([GroupOrder.ASCENDING, GroupOrder.DESCENDING]),
              st.none() | locations),
    st.builds(PublishDone, st.just(-1), ids, ids, st.text(max_size=20)),
    st.builds(RequestErrorReply, st.just(-1), st.integers(0, 0x33), st.text(max_size=20), ids),
    st.builds(RequestOk, st.just(-1), st.none() | locations,
              track_extensions=st.lists(st.builds(KeyValuePair, _even_types.filter(_unchecked_property), ids),
                                        max_size=3, unique_by=lambda p: p.type).map(tuple)),
    st.builds(FetchOk, st.just(-1), locations, end_of_track=st.booleans()),
    st.builds(GoAway, st.text(max_size=30), ids, st.none() | ids),
    st.builds(RequestUpdate, ids, st.just(-1), st.builds(RequestParameters, forward=st.none() | st.booleans(),
                                                         subscriber_priority=st.none() | priorities)),
    st.builds(SubscribeTracks, ids, st.lists(st.binary(min_size=1, max_size=4), max_size=3).map(tuple)),
    st.builds(Setup, st.builds(SetupParameters, path=st.none() | st.just("/a?b"),
                               implementation=st.none() | st.text(max_size=10))),
))
def test_reply_and_other_round_trips(message: ControlMessage) -> None:
    _round_trip(message)


@pytest.mark.parametrize(("case", "octets", "code"), [
    ("unknown Message Parameter", frame("03", "00 01 046b767370 00 01 0c 00"), SessionError.PROTOCOL_VIOLATION),
    ("parameter outside its scope (RENDEZVOUS_TIMEOUT in FETCH)",
     frame("16", "00 02 00 00 01 04 00"), SessionError.PROTOCOL_VIOLATION),
    ("FORWARD 2", frame("03", "00 01 046b767370 00 01 10 02"), SessionError.PROTOCOL_VIOLATION),
    ("GROUP_ORDER 3", frame("03", "00 01 046b767370 00 01 22 03"), SessionError.PROTOCOL_VIOLATION),
    ("repeated parameter", frame("03", "00 01 046b767370 00 02 20 01 00 02"), SessionError.PROTOCOL_VIOLATION),
    ("Type Delta past 2^64-1", frame("03", "00 01 046b767370 00 02 20 01 ffffffffffffffffff 00"),
     SessionError.PROTOCOL_VIOLATION),
    ("empty Track Namespace field", frame("03", "00 01 00 00 00"), SessionError.PROTOCOL_VIOLATION),
    ("33 namespace fields", frame("50", "00 21" + "0161" * 33 + "00"), SessionError.PROTOCOL_VIOLATION),
    ("Track Properties in PUBLISH_OK (0x1E)", frame("1e", "00 0e 40"), SessionError.PROTOCOL_VIOLATION),
    ("old CLIENT_SETUP type", frame("20", "00"), SessionError.PROTOCOL_VIOLATION),
    ("MAX_REQUEST_ID is gone", frame("15", "00"), SessionError.PROTOCOL_VIOLATION),
    ("USE_ALIAS token in SETUP", frame("af00", "03 02 02 05"), SessionError.PROTOCOL_VIOLATION),
    ("filter End Group Delta past the range", frame("03", "00 01 046b767370 00 01 21 0c 04 ff3fffffffffffffff 00 "
                                                    "ff3fffffffffffffff"), SessionError.PROTOCOL_VIOLATION),
])
def test_malformed_draft_18_message(case: str, octets: bytes, code: SessionError) -> None:
    with pytest.raises(ProtocolViolation) as info:
        ControlStreamParser(P).feed(octets)
    assert info.value.error == code


def test_absolute_range_end_group_is_a_delta() -> None:
    flt = SubscriptionFilter(FilterType.ABSOLUTE_RANGE, Location(5, 1), 9)
    assert flt.encode(P) == h("04 05 01 04")
    assert flt.encode(DRAFT_16) == h("04 05 01 09")
    with pytest.raises(ValueError, match="before the Start Group"):
        SubscriptionFilter(FilterType.ABSOLUTE_RANGE, Location(5, 1), 4).encode(P)


@pytest.mark.parametrize(("message", "why"), [
    (ClientSetup((P.version,)), "no CLIENT_SETUP"),
    (MaxRequestId(4), "no MAX_REQUEST_ID"),
    (Unsubscribe(0), "no UNSUBSCRIBE"),
    (SubscribeNamespace(0, NS), "always asks for NAMESPACE"),
    (SubscribeNamespace(0, NS, options=SubscribeOptions.PUBLISH), "always asks for NAMESPACE"),
    (Subscribe(0, NS, b"t", parameters=RequestParameters(unknown=(KeyValuePair(0x40, 1),))), "all known"),
    (RequestErrorReply(0, 0x34, "moved"), "Redirect goes with"),
])
def test_what_draft_18_refuses_to_send(message: ControlMessage, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        message.encode(P)


@pytest.mark.parametrize("profile", [DRAFT_14, DRAFT_16], ids=["d14", "d16"])
def test_what_earlier_drafts_refuse_of_draft_18(profile: object) -> None:
    assert profile is not P
    with pytest.raises(ValueError):
        GoAway("", 5000).encode(profile)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SubscribeTracks(0, NS).encode(profile)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Subscribe(0, NS, b"t", parameters=RequestParameters(fill_timeout=1)).encode(profile)  # type: ignore[arg-type]


def test_control_stream_rules() -> None:
    setup = Setup().encode(P)
    assert control_stream_parser(P).feed(setup + GoAway(timeout=1, request_id=2).encode(P)) == [
        Setup(), GoAway("", 1, 2)]
    with pytest.raises(ProtocolViolation, match="first message"):
        control_stream_parser(P).feed(GoAway().encode(P))
    with pytest.raises(ProtocolViolation, match="later on this stream"):
        control_stream_parser(P).feed(setup + Subscribe(0, NS, b"t").encode(P))
    with pytest.raises(ProtocolViolation, match="later on this stream"):
        control_stream_parser(P).feed(setup + setup)


def test_request_stream_rules() -> None:
    with pytest.raises(ProtocolViolation, match="first message"):
        request_stream_parser(P, peer_opened=True).feed(SubscribeOk(0, 1).encode(P))
    with pytest.raises(ProtocolViolation):
        request_stream_parser(P, peer_opened=False, request_id=0).feed(Setup().encode(P))
    # a request split across feeds is checked once, as the first message
    octets = Subscribe(2, NS, b"t").encode(P)
    parser = request_stream_parser(P, peer_opened=True)
    assert parser.feed(octets[:3]) == []
    assert parser.feed(octets[3:]) == [Subscribe(2, NS, b"t")]
    assert parser.request_id == 2


def test_publish_ok_goes_out_as_request_ok() -> None:
    octets = PublishOk(3, forward=False).encode(P)
    assert octets[0] == 0x07
    (ok,) = ControlStreamParser(P).feed(octets)
    assert isinstance(ok, RequestOk)
    assert PublishOk.from_request_ok(dataclasses.replace(ok, request_id=3)) == PublishOk(3, forward=False)
    with pytest.raises(ProtocolViolation):
        PublishOk.from_request_ok(RequestOk(3, track_extensions=(KeyValuePair(0x0E, 1),)))


# --- data streams and datagrams ---------------------------------------------------------------------

@pytest.mark.parametrize(("case", "octets"), [
    ("reserved subgroup ID mode", h("16 01 00 00")),
    ("type outside 0b0XX1XXXX", h("20 01 00")),
    ("fetch: first object without a Group ID", h("05 00 14 00 80 00")),
    ("fetch: first object refers to the prior subgroup", h("05 00 1d 00 00 80 00")),
    ("fetch: Serialization Flags 0x80", h("05 00 8080")),
    ("fetch: descending Group ID Delta under 0", h("05 00 1c 01 00 80 00 0c 05 00 00")),
    ("properties on an End of Group object", h("11 01 00 00 00 02 0e01 00 03")),
])
def test_malformed_draft_18_data_stream(case: str, octets: bytes) -> None:
    order = GroupOrder.DESCENDING if "descending" in case else GroupOrder.ASCENDING
    with pytest.raises(ProtocolViolation):
        DataStreamParser(profile=P, fetch_order=lambda _rid: order).feed(octets, end_stream=True)


@pytest.mark.parametrize(("case", "octets"), [
    ("status with End of Group", h("22 04 01 00 80 03")),
    ("properties bit with an empty block", h("01 04 01 00 80 00 61")),
    ("status with properties and not Normal", h("21 04 01 00 80 02 0e01 03")),
    ("padding is no object", h("f0132b3e29 00")),
])
def test_malformed_draft_18_datagram(case: str, octets: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        ObjectDatagram.decode(octets, profile=P)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 50), priorities,
                          st.binary(max_size=4)), min_size=1, max_size=8),
       st.sampled_from([GroupOrder.ASCENDING, GroupOrder.DESCENDING]))
def test_fetch_stream_round_trip(objects: list[tuple[int, int, int, int, bytes]], order: GroupOrder) -> None:
    """Objects in the fetch's group order (IDs ascending in a group) come back as they were written."""
    ordered = sorted(objects, key=lambda o: ((o[0] if order is GroupOrder.ASCENDING else -o[0]), o[2]))
    dedup = list({(o[0], o[2]): o for o in ordered}.values())
    writer = FetchWriter(FetchHeader(1), P, order)
    octets = writer.encode_header() + b"".join(
        bytes(part) for g, s, o, p, payload in dedup for part in writer.encode_object(g, s, o, payload,
                                                                                    publisher_priority=p))
    parser = DataStreamParser(profile=P, fetch_order=lambda _rid: order)
    events = [e for i in range(len(octets)) for e in parser.feed(octets[i : i + 1])]
    heads = [e for e in events if isinstance(e, ObjectHeader)]
    assert [(e.group_id, e.subgroup_id, e.object_id, e.publisher_priority) for e in heads] == [
        (g, s, o, p) for g, s, o, p, _ in dedup]


def test_subgroup_stream_with_large_ids_round_trips() -> None:
    header = SubgroupHeader.create(2**40, 2**50, 7, 3, extensions_present=True)
    writer = SubgroupWriter(header, P)
    octets = writer.encode_header() + b"".join(bytes(p) for p in writer.encode_object(
        2**45, b"x", extensions=(KeyValuePair(0x3800, 2**61),)))
    events = DataStreamParser(profile=P).feed(octets, end_stream=True)
    assert events[0] == header
    assert events[1].object_id == 2**45 and events[1].extensions == (KeyValuePair(0x3800, 2**61),)  # type: ignore[union-attr]
    assert encode_vi64(2**45) in octets
