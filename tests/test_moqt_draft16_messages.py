"""Draft-16 codecs beyond the vectors: Hypothesis round trips of every message (whole and one octet at
a time), the inputs the text says close the session, and what a draft-16 profile refuses to send."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moqt.data import DataStreamParser, FetchHeader, FetchWriter, ObjectDatagram, SubgroupHeader
from moqt.errors import ProtocolViolation
from moqt.kinds import AliasType, FetchType, FilterType, GroupOrder, SessionError, SubscribeOptions
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
    SubscribeError,
    SubscribeNamespace,
    SubscribeOk,
    SubscribeUpdate,
    TrackStatus,
    Unsubscribe,
    message_classes,
)
from moqt.params import RequestParameters, SetupParameters, SubscriptionFilter
from moqt.profiles import DRAFT_14, DRAFT_16
from moqt.wire import VARINT_MAX, KeyValuePair, Location, encode_varint
from tests.support.moqt_strategies import locations, tokens

D16 = DRAFT_16
V16 = 0xFF000010
PV = SessionError.PROTOCOL_VIOLATION
KVF = SessionError.KEY_VALUE_FORMATTING_ERROR

varint = st.integers(0, VARINT_MAX)
u8 = st.integers(0, 255)
field = st.binary(min_size=1, max_size=12)  # draft-16: a namespace field of length 0 closes the session
namespaces = st.lists(field, min_size=1, max_size=32).map(tuple)
prefixes = st.lists(field, max_size=32).map(tuple)
names = st.binary(max_size=40)
text = st.text(max_size=40)
orders = st.sampled_from(GroupOrder)
response_orders = st.sampled_from([GroupOrder.ASCENDING, GroupOrder.DESCENDING])
setup_tokens = tokens.filter(lambda t: t.alias_type in (AliasType.USE_VALUE, AliasType.REGISTER))
#: Track Extensions with no rule on their value (the bounded ones and the group order have tests of their own)
extensions = st.lists(st.one_of(
    st.builds(KeyValuePair, st.integers(0x20, 2000).map(lambda n: n * 2 + 0x40), varint),
    st.builds(KeyValuePair, st.integers(0x20, 2000).map(lambda n: n * 2 + 0x41), st.binary(max_size=8))),
    max_size=3).map(lambda pairs: tuple(sorted(pairs, key=lambda p: p.type)))
unknown_setup = extensions


@st.composite
def filters(draw: st.DrawFn) -> SubscriptionFilter:
    kind = draw(st.sampled_from(FilterType))
    start = draw(locations) if kind in (FilterType.ABSOLUTE_START, FilterType.ABSOLUTE_RANGE) else None
    end = draw(varint) if kind == FilterType.ABSOLUTE_RANGE else None
    return SubscriptionFilter(kind, start, end)


def params(**allowed: st.SearchStrategy[Any]) -> st.SearchStrategy[RequestParameters]:
    """RequestParameters with only the named fields drawn (None or a value)."""
    fields = {name: (strategy if name == "authorization_tokens" else st.none() | strategy)
              for name, strategy in allowed.items()}
    return st.fixed_dictionaries(fields).map(lambda f: RequestParameters(**cast(dict[str, Any], f)))


auth = st.lists(tokens, max_size=2).map(tuple)
delivery = st.integers(1, VARINT_MAX)
setup_params = st.builds(SetupParameters, st.none() | st.sampled_from(["", "/", "/kvsp", "/a/b?c=d"]),
                         st.none() | varint, st.lists(setup_tokens, max_size=2).map(tuple), st.none() | varint,
                         st.none() | st.sampled_from(["h", "relay.example:4443", "[::1]:443"]),
                         st.none() | text, unknown_setup)


def _subscribe(rid: int, ns: tuple[bytes, ...], name: bytes, prio: int, order: GroupOrder, forward: bool,
               flt: SubscriptionFilter, p: RequestParameters) -> Subscribe:
    return Subscribe(rid, ns, name, prio, order, forward, flt.filter_type, flt.start, flt.end_group, p)


def _publish_ok(rid: int, forward: bool, prio: int, order: GroupOrder, flt: SubscriptionFilter,
                p: RequestParameters) -> PublishOk:
    return PublishOk(rid, forward, prio, order, flt.filter_type, flt.start, flt.end_group, p)


MESSAGES: dict[type[ControlMessage], st.SearchStrategy[Any]] = {
    ClientSetup: st.builds(ClientSetup, st.just((V16,)), setup_params),
    ServerSetup: st.builds(ServerSetup, st.just(V16), setup_params.map(
        lambda p: SetupParameters(p.path, p.max_request_id, p.authorization_tokens, p.max_auth_token_cache_size,
                                  p.authority, p.implementation, p.unknown))),
    GoAway: st.builds(GoAway, text),
    MaxRequestId: st.builds(MaxRequestId, varint),
    RequestsBlocked: st.builds(RequestsBlocked, varint),
    RequestOk: st.builds(RequestOk, varint, st.none() | locations),
    RequestErrorReply: st.builds(RequestErrorReply, varint, varint, text, varint),
    Subscribe: st.builds(_subscribe, varint, namespaces, names, u8, orders, st.booleans(), filters(),
                         params(delivery_timeout=delivery, authorization_tokens=auth, new_group_request=varint)),
    SubscribeOk: st.builds(SubscribeOk, varint, varint, varint, response_orders, st.none() | locations,
                           st.just(RequestParameters()), extensions),
    RequestUpdate: st.builds(RequestUpdate, varint, varint, params(
        delivery_timeout=delivery, authorization_tokens=auth, forward=st.booleans(), subscriber_priority=u8,
        subscription_filter=filters(), new_group_request=varint)),
    Unsubscribe: st.builds(Unsubscribe, varint),
    Publish: st.builds(Publish, varint, namespaces, names, varint, response_orders, st.none() | locations,
                       st.booleans(), params(authorization_tokens=auth, expires=varint), extensions),
    PublishOk: st.builds(_publish_ok, varint, st.booleans(), u8, response_orders, filters(),
                         params(delivery_timeout=delivery, expires=varint, new_group_request=varint)),
    PublishDone: st.builds(PublishDone, varint, varint, varint, text),
    Fetch: st.one_of(
        st.builds(lambda rid, ns, name, a, b, prio, order, p: Fetch(
            rid, FetchType.STANDALONE, StandaloneFetch(ns, name, a, b), None, prio, order, p),
            varint, namespaces, names, locations, locations, u8, orders, params(authorization_tokens=auth)),
        st.builds(lambda rid, kind, j, s, prio, order, p: Fetch(rid, kind, None, JoiningFetch(j, s), prio, order, p),
                  varint, st.sampled_from([FetchType.RELATIVE_JOINING, FetchType.ABSOLUTE_JOINING]), varint, varint,
                  u8, orders, params(authorization_tokens=auth))),
    FetchOk: st.builds(FetchOk, varint, locations, st.just(GroupOrder.ASCENDING), st.booleans(),
                       st.just(RequestParameters()), extensions),
    FetchCancel: st.builds(FetchCancel, varint),
    TrackStatus: st.builds(TrackStatus, varint, namespaces, names, parameters=params(authorization_tokens=auth)),
    PublishNamespace: st.builds(PublishNamespace, varint, namespaces, params(authorization_tokens=auth)),
    NamespaceNotice: st.builds(NamespaceNotice, prefixes),
    PublishNamespaceDone: st.builds(lambda r: PublishNamespaceDone(request_id=r), varint),
    NamespaceDone: st.builds(NamespaceDone, prefixes),
    PublishNamespaceCancel: st.builds(lambda r, c, t: PublishNamespaceCancel((), c, t, r), varint, varint, text),
    SubscribeNamespace: st.builds(SubscribeNamespace, varint, prefixes,
                                  params(authorization_tokens=auth, forward=st.booleans()),
                                  st.sampled_from(SubscribeOptions)),
}


def test_every_draft_16_message_has_a_strategy() -> None:
    assert set(MESSAGES) == set(message_classes(D16).values())


@pytest.mark.parametrize("cls", list(MESSAGES), ids=[c.__name__ for c in MESSAGES])
@given(data=st.data())
def test_round_trip(cls: type[ControlMessage], data: st.DataObject) -> None:
    message = data.draw(MESSAGES[cls])
    octets = message.encode(D16)
    assert ControlStreamParser(D16).feed(octets) == [message]
    parser = ControlStreamParser(D16)
    assert [m for i in range(len(octets)) for m in parser.feed(octets[i : i + 1])] == [message]


# --- what closes the session ------------------------------------------------------------------------

def h(*parts: str) -> bytes:
    return bytes.fromhex("".join(parts).replace(" ", ""))


def frame(message_type: int, payload: bytes) -> bytes:
    return encode_varint(message_type) + len(payload).to_bytes(2, "big") + payload


SUB = "00 01 04 6b767370 03 726177"  # SUBSCRIBE: Request ID 0, ("kvsp",), "raw", then its parameters
MAX_DELTA = encode_varint(VARINT_MAX).hex()  # 2^62-1: odd, so a length follows


@pytest.mark.parametrize(("case", "octets", "code", "reason"), [
    ("a draft-14 type: SUBSCRIBE_NAMESPACE_OK", h("12 0001 00"), PV, "unknown control message type"),
    ("a draft-14 type: FETCH_ERROR", h("19 0003 00 00 00"), PV, "unknown control message type"),
    ("MAX_CACHE_DURATION is no Message Parameter", frame(3, h(SUB, "01 04 05")), PV, "unknown Message Parameter"),
    ("SUBSCRIBER_PRIORITY 256", frame(3, h(SUB, "01 20 4100")), PV, "SUBSCRIBER_PRIORITY 256"),
    ("FORWARD 2", frame(3, h(SUB, "01 10 02")), PV, "FORWARD 2"),
    ("GROUP_ORDER 0", frame(3, h(SUB, "01 22 00")), PV, "GROUP_ORDER 0"),
    ("GROUP_ORDER 3", frame(3, h(SUB, "01 22 03")), PV, "GROUP_ORDER 3"),
    ("DELIVERY_TIMEOUT 0", frame(3, h(SUB, "01 02 00")), PV, "DELIVERY_TIMEOUT of 0"),
    ("DELIVERY_TIMEOUT twice (delta 0)", frame(3, h(SUB, "02 02 05 00 06")), PV, "repeated"),
    ("SUBSCRIPTION_FILTER longer than its filter", frame(3, h(SUB, "01 21 02 02 00")), PV, "longer than"),
    ("SUBSCRIPTION_FILTER shorter than its filter", frame(3, h(SUB, "01 21 02 03 00")), PV, "shorter than"),
    ("Filter Type 5", frame(3, h(SUB, "01 21 01 05")), PV, "Filter Type 5"),
    ("LARGEST_OBJECT of one octet", frame(4, h("00 01 01 09 01 05")), KVF, "LARGEST_OBJECT"),
    ("a namespace field of length 0", frame(3, h("00 02 04 6b767370 00 03 726177 00")), PV, "length 0"),
    ("USE_ALIAS in CLIENT_SETUP", frame(0x20, h("01 03 02 02 05")), PV, "CLIENT_SETUP"),
    ("Key-Value-Pair types past 2^64-1", frame(0x20, h("05", (MAX_DELTA + "00") * 5)), PV, "2^64-1"),
    ("Subscribe Options 3", frame(0x11, h("0e 01 04 6b767370 03 00")), PV, "Subscribe Options 3"),
    ("DEFAULT_PUBLISHER_GROUP_ORDER 3", frame(4, h("00 01 00 22 03")), PV, "DEFAULT_PUBLISHER_GROUP_ORDER 3"),
    ("DYNAMIC_GROUPS 2", frame(4, h("00 01 00 30 02")), PV, "value 2"),
    ("DELIVERY_TIMEOUT Track Extension 0", frame(0x18, h("06 00 00 04 00 02 00")), PV, "value 0"),
    ("a Track Extension that runs past the message", frame(4, h("00 01 00 3f 05 00")), PV, "past the end"),
    ("REQUEST_ERROR without its Retry Interval", frame(5, h("02 10 00")), PV, "longer than its Message Length"),
    ("PUBLISH_NAMESPACE_DONE naming a namespace", frame(9, h("01 04 6b767370")), PV, "shorter than"),
])
def test_malformed_draft_16_message(case: str, octets: bytes, code: SessionError, reason: str) -> None:
    with pytest.raises(ProtocolViolation) as info:
        ControlStreamParser(D16).feed(octets)
    assert info.value.error == code
    assert reason in info.value.reason


def test_a_known_parameter_outside_its_scope_is_ignored_and_kept() -> None:
    # SUBSCRIBER_PRIORITY may not appear in TRACK_STATUS ("related to Track delivery"): ignored, kept raw
    octets = frame(0x0D, h(SUB, "01 20 05"))
    [message] = ControlStreamParser(D16).feed(octets)
    assert isinstance(message, TrackStatus) and message.subscriber_priority == 128
    assert message.parameters == RequestParameters(unknown=(KeyValuePair(0x20, 5),))
    assert message.encode(D16) == octets


def test_absent_fields_read_as_the_drafts_defaults() -> None:
    [subscribe] = ControlStreamParser(D16).feed(frame(3, h(SUB, "00")))
    assert isinstance(subscribe, Subscribe)
    # priority 128, the publisher's order, forward 1, and no filter: an unfiltered subscription
    assert (subscribe.subscriber_priority, subscribe.group_order, subscribe.forward) == \
        (128, GroupOrder.PUBLISHER_DEFAULT, True)
    assert (subscribe.filter_type, subscribe.start_location, subscribe.end_group) == \
        (FilterType.ABSOLUTE_START, Location(0, 0), None)
    [ok] = ControlStreamParser(D16).feed(frame(4, h("00 01 00")))
    assert ok == SubscribeOk(0, 1, 0, GroupOrder.ASCENDING, None)


def test_extension_types_may_exceed_the_varint_range_when_delta_coded() -> None:
    # two odd types of 2^62-1 in a row: the second is 2^63-2, even, carried by its delta and sent again so
    setup = frame(0x20, h("02", MAX_DELTA, "00", MAX_DELTA, "07"))
    [message] = ControlStreamParser(D16).feed(setup)
    assert isinstance(message, ClientSetup)
    assert [p.type for p in message.parameters.unknown] == [VARINT_MAX, 2 * VARINT_MAX]
    assert message.encode(D16) == setup


# --- what a profile refuses to send -------------------------------------------------------------------

@pytest.mark.parametrize(("case", "message", "profile"), [
    ("SUBSCRIBE_UPDATE is draft-14's", SubscribeUpdate(0, 0, Location(0, 0)), D16),
    ("SUBSCRIBE_ERROR travels as REQUEST_ERROR", SubscribeError(0, 0), D16),
    ("REQUEST_OK is draft-16's", RequestOk(0), DRAFT_14),
    ("a version in a draft-16 CLIENT_SETUP", ClientSetup((0xFF00000E,)), D16),
    ("MAX_CACHE_DURATION is a Track Extension in draft-16", SubscribeOk(0, 1, parameters=RequestParameters(
        max_cache_duration=5)), D16),
    ("FORWARD as a draft-14 parameter", Subscribe(0, (b"k",), b"t", parameters=RequestParameters(forward=False)),
     DRAFT_14),
    ("Track Extensions in draft-14", SubscribeOk(0, 1, track_extensions=(KeyValuePair(0x41, b""),)), DRAFT_14),
    ("the empty prefix in draft-14", SubscribeNamespace(0, ()), DRAFT_14),
    ("Subscribe Options in draft-14", SubscribeNamespace(0, (b"k",), options=SubscribeOptions.PUBLISH), DRAFT_14),
    ("PUBLISH_NAMESPACE_DONE without a namespace in draft-14", PublishNamespaceDone(request_id=3), DRAFT_14),
    ("PUBLISH_NAMESPACE_DONE without a Request ID in draft-16", PublishNamespaceDone((b"k",)), D16),
])
def test_a_profile_refuses_what_its_draft_cannot_say(case: str, message: ControlMessage, profile: Any) -> None:
    with pytest.raises(ValueError):
        message.encode(profile)


def test_data_codecs_refuse_what_draft_14_cannot_say() -> None:
    with pytest.raises(ValueError):
        SubgroupHeader.create(1, 0, default_priority=True).encode(DRAFT_14)
    with pytest.raises(ValueError):
        ObjectDatagram(1, 0, 0, payload=b"x", default_priority=True).encode(DRAFT_14)
    with pytest.raises(ValueError):
        FetchWriter(FetchHeader(0), DRAFT_14).encode_range_end(0, 1)


# --- malformed data streams and datagrams -----------------------------------------------------------

@pytest.mark.parametrize(("case", "octets", "reason"), [
    ("Subgroup ID mode 0b11 (0x16)", h("16 01 00 80"), "unknown data stream type 0x16"),
    ("Subgroup ID mode 0b11 with default priority (0x36)", h("36 01 00"), "unknown data stream type 0x36"),
    ("bit 6 set (0x50)", h("4050 01 00"), "unknown data stream type 0x50"),
    ("fetch Serialization Flags 0x80", h("05 00", "4080"), "Serialization Flags 0x80"),
    ("fetch Serialization Flags 0x8D", h("05 00", "408d 00 00"), "Serialization Flags 0x8d"),
    ("first fetch object refers to the prior Group ID", h("05 00", "14 00 80 00"), "prior object's Group ID"),
    ("first fetch object refers to the prior priority", h("05 00", "0c 00 00 00"), "prior object's priority"),
    ("first fetch object refers to the prior Subgroup ID", h("05 00", "1d 00 00 80 00"), "prior object's Subgroup ID"),
    ("Object Status 1 is draft-14's", h("10 01 00 80", "00 00 01"), "unknown Object Status 1"),
    ("End of Group with Extension Headers", h("11 01 00 80", "00 02 3c01 00 03"), "Extension Headers"),
])
def test_malformed_draft_16_data_stream(case: str, octets: bytes, reason: str) -> None:
    with pytest.raises(ProtocolViolation) as info:
        DataStreamParser(profile=D16).feed(octets)
    assert info.value.error == PV
    assert reason in info.value.reason


@pytest.mark.parametrize(("case", "octets", "reason"), [
    ("status with End of Group (0x22)", h("22 01 00 00 80 03"), "unknown datagram type 0x22"),
    ("bit 4 set (0x10)", h("10 01 00 00 80"), "unknown datagram type 0x10"),
    ("status with Extension Headers", h("21 01 00 00 80 02 3c01 03"), "Extension Headers"),
])
def test_malformed_draft_16_datagram(case: str, octets: bytes, reason: str) -> None:
    with pytest.raises(ProtocolViolation) as info:
        ObjectDatagram.decode(octets, profile=D16)
    assert reason in info.value.reason
