"""Draft-14 control messages: hand-written vectors, aiomoqt vectors, the incremental control parser,
Hypothesis round trips and the malformed inputs the draft says close the session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moqt.errors import ProtocolViolation
from moqt.kinds import AliasType, FetchType, FilterType, GroupOrder, MessageKind, SessionError
from moqt.messages import (
    ALL_MESSAGES,
    ClientSetup,
    ControlMessage,
    ControlStreamParser,
    Fetch,
    FetchCancel,
    FetchError,
    FetchOk,
    GoAway,
    JoiningFetch,
    MaxRequestId,
    MessageTooLarge,
    Publish,
    PublishDone,
    PublishError,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishNamespaceError,
    PublishNamespaceOk,
    PublishOk,
    RequestsBlocked,
    ServerSetup,
    StandaloneFetch,
    Subscribe,
    SubscribeError,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
    SubscribeOk,
    SubscribeUpdate,
    TrackStatus,
    TrackStatusError,
    TrackStatusOk,
    Unsubscribe,
    UnsubscribeNamespace,
    decode_message,
    message_classes,
)
from moqt.params import AuthToken, RequestParameters, SetupParameters
from moqt.profiles import DRAFT_14, PROFILES, Profile
from moqt.wire import VARINT_MAX, KeyValuePair, Location, encode_varint
from tests.support.moqt_strategies import locations, tokens

PV = SessionError.PROTOCOL_VIOLATION
VECTORS = Path(__file__).parent / "vectors" / "moqt"
KVSP = (b"kvsp",)
V14 = 0xFF00000E
#: The messages draft-14 has (moqt.messages also has draft-16's: tests/test_moqt_draft16_messages.py).
D14_MESSAGES = frozenset(message_classes(DRAFT_14).values())


def h(*parts: str) -> bytes:
    return bytes.fromhex("".join(parts).replace(" ", ""))


# Each vector: (section, message, octets). Octets are written field by field from the section's wire
# format figure: Type (i), Length (16), then the payload fields in order.
HAND_VECTORS: list[tuple[str, ControlMessage, bytes]] = [
    ("9.3 CLIENT_SETUP", ClientSetup((V14,), SetupParameters(path="/kvsp", max_request_id=100)),
     h("20 0014", "01 c0000000ff00000e", "02", "01 05 2f6b767370", "02 4064")),
    ("9.3 SERVER_SETUP", ServerSetup(V14, SetupParameters(max_request_id=50)),
     h("21 000b", "c0000000ff00000e", "01", "02 32")),
    ("9.3 CLIENT_SETUP with AUTHORIZATION TOKEN (USE_VALUE) and AUTHORITY",
     ClientSetup((V14,), SetupParameters(authorization_tokens=(AuthToken.use_value(0, b"tk"),), authority="h:1")),
     h("20 0015", "01 c0000000ff00000e", "02", "03 04 03 00 746b", "05 03 683a31")),
    ("9.4 GOAWAY", GoAway("moqt://h"), h("10 0009", "08 6d6f71743a2f2f68")),
    ("9.4 GOAWAY, empty URI", GoAway(""), h("10 0001", "00")),
    ("9.5 MAX_REQUEST_ID", MaxRequestId(10), h("15 0001", "0a")),
    ("9.6 REQUESTS_BLOCKED", RequestsBlocked(64), h("1a 0002", "4040")),
    ("9.7 SUBSCRIBE, AbsoluteRange + DELIVERY_TIMEOUT",
     Subscribe(2, KVSP, b"raw", 0x80, GroupOrder.DESCENDING, False, FilterType.ABSOLUTE_RANGE, Location(5, 0), 9,
               RequestParameters(delivery_timeout=1000)),
     h("03 0016", "02", "01 04 6b767370", "03 726177", "80 02 00", "04", "05 00", "09", "01 02 43e8")),
    ("9.7 SUBSCRIBE, NextGroupStart",
     Subscribe(0, KVSP, b"raw", 0x20, GroupOrder.ASCENDING, True, FilterType.NEXT_GROUP_START),
     h("03 0010", "00", "01 04 6b767370", "03 726177", "20 01 01", "01", "00")),
    ("9.8 SUBSCRIBE_OK, Content Exists + MAX_CACHE_DURATION",
     SubscribeOk(2, 5, 0, GroupOrder.ASCENDING, Location(9, 3), RequestParameters(max_cache_duration=60000)),
     h("04 000d", "02 05 00 01 01 09 03", "01 04 8000ea60")),
    ("9.9 SUBSCRIBE_ERROR", SubscribeError(2, 4, "gone"), h("05 0007", "02 04 04 676f6e65")),
    ("9.10 SUBSCRIBE_UPDATE (End Group 9 sent as 10)",
     SubscribeUpdate(4, 2, Location(6, 0), 9, 40, True), h("02 0008", "04 02 06 00 0a 28 01 00")),
    ("9.10 SUBSCRIBE_UPDATE, open-ended", SubscribeUpdate(6, 2, Location(7, 1), None, 1, False),
     h("02 0008", "06 02 07 01 00 01 00 00")),
    ("9.11 UNSUBSCRIBE", Unsubscribe(2), h("0a 0001", "02")),
    ("9.12 PUBLISH_DONE", PublishDone(2, 3, 1, ""), h("0b 0004", "02 03 01 00")),
    ("9.13 PUBLISH", Publish(1, KVSP, b"raw", 3, GroupOrder.ASCENDING, None, True),
     h("1d 0010", "01", "01 04 6b767370", "03 726177", "03 01 00 01", "00")),
    ("9.13 PUBLISH, Content Exists", Publish(3, KVSP, b"raw", 4, GroupOrder.DESCENDING, Location(2, 7), False),
     h("1d 0012", "03", "01 04 6b767370", "03 726177", "04 02 01 02 07 00", "00")),
    ("9.14 PUBLISH_OK, AbsoluteStart",
     PublishOk(1, True, 0x80, GroupOrder.ASCENDING, FilterType.ABSOLUTE_START, Location(0, 0)),
     h("1e 0008", "01 01 80 01 03 00 00 00")),
    ("9.15 PUBLISH_ERROR", PublishError(1, 4, ""), h("1f 0003", "01 04 00")),
    ("9.16 FETCH, standalone (KVSP stored block: layers 0..3)",
     Fetch(6, FetchType.STANDALONE, StandaloneFetch(KVSP, b"raw", Location(0, 0), Location(0, 4)), None, 0,
           GroupOrder.ASCENDING),
     h("16 0013", "06 00 01 01", "01 04 6b767370", "03 726177", "00 00", "00 04", "00")),
    ("9.16 FETCH, relative joining", Fetch(8, FetchType.RELATIVE_JOINING, None, JoiningFetch(2, 1), 0x80),
     h("16 0007", "08 80 00 02", "02 01", "00")),
    ("9.16 FETCH, absolute joining + AUTHORIZATION TOKEN",
     Fetch(10, FetchType.ABSOLUTE_JOINING, None, JoiningFetch(2, 5), 0x80, GroupOrder.DESCENDING,
           RequestParameters(authorization_tokens=(AuthToken.use_value(0, b"hi"),))),
     h("16 000d", "0a 80 02 03", "02 05", "01 03 04 03 00 6869")),
    ("9.17 FETCH_OK", FetchOk(6, Location(0, 4), GroupOrder.ASCENDING, False), h("18 0006", "06 01 00 00 04 00")),
    ("9.17 FETCH_OK, End Of Track", FetchOk(7, Location(3, 0), GroupOrder.DESCENDING, True),
     h("18 0006", "07 02 01 03 00 00")),
    ("9.18 FETCH_ERROR", FetchError(6, 5, "r"), h("19 0004", "06 05 01 72")),
    ("9.19 FETCH_CANCEL", FetchCancel(6), h("17 0001", "06")),
    ("9.20 TRACK_STATUS", TrackStatus(12, KVSP, b"raw", 0x80, GroupOrder.PUBLISHER_DEFAULT, True),
     h("0d 0010", "0c", "01 04 6b767370", "03 726177", "80 00 01", "02", "00")),
    ("9.21 TRACK_STATUS_OK", TrackStatusOk(12, 0, 0, GroupOrder.ASCENDING, None),
     h("0e 0006", "0c 00 00 01 00 00")),
    ("9.22 TRACK_STATUS_ERROR", TrackStatusError(12, 4, ""), h("0f 0003", "0c 04 00")),
    ("9.23 PUBLISH_NAMESPACE", PublishNamespace(3, (b"kvsp", b"ab")),
     h("06 000b", "03", "02 04 6b767370 02 6162", "00")),
    ("9.24 PUBLISH_NAMESPACE_OK", PublishNamespaceOk(3), h("07 0001", "03")),
    ("9.25 PUBLISH_NAMESPACE_ERROR", PublishNamespaceError(3, 1, ""), h("08 0003", "03 01 00")),
    ("9.26 PUBLISH_NAMESPACE_DONE", PublishNamespaceDone((b"kvsp", b"ab")),
     h("09 0009", "02 04 6b767370 02 6162")),
    ("9.27 PUBLISH_NAMESPACE_CANCEL", PublishNamespaceCancel(KVSP, 2, "t/o"),
     h("0c 000b", "01 04 6b767370", "02", "03 742f6f")),
    ("9.28 SUBSCRIBE_NAMESPACE", SubscribeNamespace(14, KVSP), h("11 0008", "0e", "01 04 6b767370", "00")),
    ("9.29 SUBSCRIBE_NAMESPACE_OK", SubscribeNamespaceOk(14), h("12 0001", "0e")),
    ("9.30 SUBSCRIBE_NAMESPACE_ERROR", SubscribeNamespaceError(14, 5, ""), h("13 0003", "0e 05 00")),
    ("9.31 UNSUBSCRIBE_NAMESPACE", UnsubscribeNamespace(KVSP), h("14 0006", "01 04 6b767370")),
]


def test_every_message_type_has_a_hand_vector() -> None:
    covered = {type(message) for _, message, _ in HAND_VECTORS}
    assert covered == D14_MESSAGES
    assert {cls.KIND for cls in ALL_MESSAGES} == set(MessageKind)
    assert {cls.KIND for cls in D14_MESSAGES} == set(DRAFT_14.message_types.codes)


@pytest.mark.parametrize(("section", "message", "octets"), HAND_VECTORS, ids=[v[0] for v in HAND_VECTORS])
def test_hand_vector(section: str, message: ControlMessage, octets: bytes) -> None:
    assert message.encode().hex() == octets.hex()
    assert ControlStreamParser().feed(octets) == [message]


def test_all_hand_vectors_one_byte_at_a_time() -> None:
    stream = b"".join(octets for _, _, octets in HAND_VECTORS)
    parser = ControlStreamParser()
    out: list[ControlMessage] = []
    for i in range(len(stream)):
        out += parser.feed(stream[i : i + 1])
    assert out == [message for _, message, _ in HAND_VECTORS]
    assert parser.buffered == 0


@given(st.data())
def test_hand_vectors_any_split(data: st.DataObject) -> None:
    stream = b"".join(octets for _, _, octets in HAND_VECTORS)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    parser = ControlStreamParser()
    out: list[ControlMessage] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        out += parser.feed(memoryview(stream)[start:end])
    assert out == [message for _, message, _ in HAND_VECTORS]


# --- aiomoqt 0.13.3 vectors (tests/vectors/moqt/gen_aiomoqt_vectors.py) ------------------------------

def _order(code: int) -> GroupOrder:
    order = DRAFT_14.group_orders.name(code)
    assert order is not None
    return order


def _filter(code: int) -> FilterType:
    filter_type = DRAFT_14.filter_types.name(code)
    assert filter_type is not None
    return filter_type


def _fetch_type(code: int) -> FetchType:
    fetch_type = DRAFT_14.fetch_types.name(code)
    assert fetch_type is not None
    return fetch_type


def _b(value: Any) -> bytes:
    return bytes.fromhex(value["hex"])


def _params(raw: dict[str, Any]) -> RequestParameters:
    tokens = tuple(AuthToken.use_value(0, _b(v)) for k, v in raw.items() if k == "3")
    return RequestParameters(raw.get("2"), tokens, raw.get("4"))


def _largest(f: dict[str, Any]) -> Location | None:
    return Location(f["largest_group_id"], f["largest_object_id"]) if f.get("content_exists") else None


def _start(f: dict[str, Any]) -> Location | None:
    return Location(f["start_group"], f["start_object"]) if f.get("filter_type") in (3, 4) else None


def _setup(f: dict[str, Any]) -> SetupParameters:
    p = f["parameters"]
    tokens = (AuthToken.use_value(0, _b(p["3"])),) if "3" in p else ()
    return SetupParameters(path=p.get("1"), max_request_id=p.get("2"), authorization_tokens=tokens,
                           authority=p.get("5"), implementation=p.get("7"))


def _subscribe_like(cls: type[Subscribe] | type[TrackStatus], f: dict[str, Any]) -> ControlMessage:
    return cls(f["request_id"], tuple(_b(x) for x in f["track_namespace"]), _b(f["track_name"]), f["priority"],
               _order(f["group_order"]), bool(f["forward"]), _filter(f["filter_type"]), _start(f),
               f.get("end_group"), _params(f["parameters"]))


def _fetch(f: dict[str, Any]) -> Fetch:
    kind = _fetch_type(f["fetch_type"])
    standalone = joining = None
    if kind == FetchType.STANDALONE:
        standalone = StandaloneFetch(tuple(_b(x) for x in f["namespace"]), _b(f["track_name"]),
                                     Location(f["start_group"], f["start_object"]),
                                     Location(f["end_group"], f["end_object"]))
    else:
        joining = JoiningFetch(f["joining_request_id"], f["joining_start"])
    return Fetch(f["request_id"], kind, standalone, joining, f["subscriber_priority"], _order(f["group_order"]),
                 _params(f["parameters"]))


def expected_from_aiomoqt(cls: str, f: dict[str, Any]) -> ControlMessage:
    """Build our message from the fields aiomoqt was given, mapping its names to the draft's."""
    ns = "namespace" if "namespace" in f else "namespace_prefix"
    simple: dict[str, Any] = {
        "ClientSetup": lambda: ClientSetup(tuple(f["versions"]), _setup(f)),
        "ServerSetup": lambda: ServerSetup(f["selected_version"], _setup(f)),
        "GoAway": lambda: GoAway(f["new_session_uri"]),
        "MaxSubscribeId": lambda: MaxRequestId(f["request_id"]),
        "SubscribesBlocked": lambda: RequestsBlocked(f["maximum_request_id"]),
        "Subscribe": lambda: _subscribe_like(Subscribe, f),
        "TrackStatus": lambda: _subscribe_like(TrackStatus, f),
        "SubscribeOk": lambda: SubscribeOk(f["request_id"], f["track_alias"], f["expires"],
                                           _order(f["group_order"]), _largest(f), _params(f["parameters"])),
        "TrackStatusOk": lambda: TrackStatusOk(f["request_id"], f["track_alias"], f["expires"],
                                               _order(f["group_order"]), _largest(f), _params(f["parameters"])),
        "SubscribeUpdate": lambda: SubscribeUpdate(
            f["request_id"], f["subscription_request_id"], Location(f["start_group"], f["start_object"]),
            f["end_group"] - 1 if f["end_group"] else None, f["priority"], bool(f["forward"]),
            _params(f["parameters"])),
        "Unsubscribe": lambda: Unsubscribe(f["request_id"]),
        "SubscribeDone": lambda: PublishDone(f["request_id"], f["status_code"], f["stream_count"], f["reason"]),
        "Publish": lambda: Publish(f["request_id"], tuple(_b(x) for x in f["track_namespace"]), _b(f["track_name"]),
                                   f["track_alias"], _order(f["group_order"]), _largest(f), bool(f["forward"]),
                                   _params(f["parameters"])),
        "PublishOk": lambda: PublishOk(f["request_id"], bool(f["forward"]), f["priority"], _order(f["group_order"]),
                                       _filter(f["filter_type"]), _start(f), f.get("end_group"),
                                       _params(f["parameters"])),
        "Fetch": lambda: _fetch(f),
        "FetchOk": lambda: FetchOk(f["request_id"], Location(f["largest_group_id"], f["largest_object_id"]),
                                   _order(f["group_order"]), bool(f["end_of_track"]), _params(f["parameters"])),
        "FetchCancel": lambda: FetchCancel(f["request_id"]),
        "PublishNamespace": lambda: PublishNamespace(f["request_id"], tuple(_b(x) for x in f[ns]),
                                                     _params(f["parameters"])),
        "PublishNamespaceOk": lambda: PublishNamespaceOk(f["request_id"]),
        "PublishNamespaceDone": lambda: PublishNamespaceDone(tuple(_b(x) for x in f[ns])),
        "PublishNamespaceCancel": lambda: PublishNamespaceCancel(tuple(_b(x) for x in f[ns]), f["error_code"],
                                                                 f["reason"]),
        "SubscribeNamespace": lambda: SubscribeNamespace(f["request_id"], tuple(_b(x) for x in f[ns]),
                                                         _params(f["parameters"])),
        "SubscribeNamespaceOk": lambda: SubscribeNamespaceOk(f["request_id"]),
        "UnsubscribeNamespace": lambda: UnsubscribeNamespace(tuple(_b(x) for x in f[ns])),
    }
    errors = {"SubscribeError": SubscribeError, "TrackStatusError": TrackStatusError, "PublishError": PublishError,
              "FetchError": FetchError, "PublishNamespaceError": PublishNamespaceError,
              "SubscribeNamespaceError": SubscribeNamespaceError}
    if cls in errors:
        return errors[cls](f["request_id"], f["error_code"], f["reason"])
    message: ControlMessage = simple[cls]()
    return message


AIOMOQT = json.loads((VECTORS / "aiomoqt_vectors.json").read_text())
CONTROL_VECTORS = [v for v in AIOMOQT["vectors"] if v["kind"] == "control"]


def test_aiomoqt_vectors_cover_every_message_type() -> None:
    types = {decode_message(bytes.fromhex(v["hex"])[0], bytes.fromhex(v["hex"])[3:]).KIND for v in CONTROL_VECTORS}
    assert types == set(DRAFT_14.message_types.codes)
    assert AIOMOQT["aiomoqt_version"] == "0.13.3"


@pytest.mark.parametrize("vector", CONTROL_VECTORS, ids=[v["name"] for v in CONTROL_VECTORS])
def test_aiomoqt_vector(vector: dict[str, Any]) -> None:
    octets = bytes.fromhex(vector["hex"])
    [decoded] = ControlStreamParser().feed(octets)
    assert decoded == expected_from_aiomoqt(vector["aiomoqt_class"], vector["fields"])
    if "disagreement" not in vector:
        # aiomoqt writes minimal varints and our parameter order, so our encoding is the same octets
        assert decoded.encode().hex() == vector["hex"]


def test_aiomoqt_stream_one_byte_at_a_time() -> None:
    stream = b"".join(bytes.fromhex(v["hex"]) for v in CONTROL_VECTORS)
    parser = ControlStreamParser()
    count = sum(len(parser.feed(stream[i : i + 1])) for i in range(len(stream)))
    assert count == len(CONTROL_VECTORS)


# --- Hypothesis round trips ---------------------------------------------------------------------------

varint = st.integers(0, VARINT_MAX)
small = st.integers(0, 1 << 20)
u8 = st.integers(0, 255)
field = st.binary(max_size=12)
namespaces = st.lists(field, min_size=1, max_size=32).map(tuple)
names = st.binary(max_size=40)
text = st.text(max_size=40)
orders = st.sampled_from(GroupOrder)
response_orders = st.sampled_from([GroupOrder.ASCENDING, GroupOrder.DESCENDING])
unknown_pairs = st.lists(st.one_of(
    st.builds(KeyValuePair, st.integers(3, 1000).map(lambda n: n * 2 + 40), varint),
    st.builds(KeyValuePair, st.integers(3, 1000).map(lambda n: n * 2 + 41), st.binary(max_size=8))),
    max_size=3).map(tuple)


def request_params(allowed: set[str]) -> st.SearchStrategy[RequestParameters]:
    return st.builds(RequestParameters,
                     st.none() | varint if "delivery" in allowed else st.none(),
                     st.lists(tokens, max_size=2).map(tuple) if "auth" in allowed else st.just(()),
                     st.none() | varint if "cache" in allowed else st.none(),
                     unknown_pairs)


@st.composite
def filters(draw: st.DrawFn) -> tuple[FilterType, Location | None, int | None]:
    kind = draw(st.sampled_from(FilterType))
    start = draw(locations) if kind in (FilterType.ABSOLUTE_START, FilterType.ABSOLUTE_RANGE) else None
    end = draw(varint) if kind == FilterType.ABSOLUTE_RANGE else None
    return kind, start, end


def subscribe_like(cls: type[Subscribe] | type[TrackStatus], allowed: set[str]) -> st.SearchStrategy[ControlMessage]:
    return st.builds(lambda rid, ns, name, prio, order, fwd, flt, params: cls(rid, ns, name, prio, order, fwd, flt[0],
                                                                               flt[1], flt[2], params),
                     varint, namespaces, names, u8, orders, st.booleans(), filters(), request_params(allowed))


setup_params = st.builds(SetupParameters, st.none() | st.sampled_from(["", "/", "/kvsp", "/a/b?c=d"]),
                         st.none() | varint, st.lists(tokens, max_size=2).map(tuple), st.none() | varint,
                         st.none() | st.sampled_from(["h", "relay.example:4443", "[::1]:443"]),
                         st.none() | text, unknown_pairs.map(lambda t: tuple(p for p in t if p.type > 0x10)))

MESSAGES: dict[type[ControlMessage], st.SearchStrategy[Any]] = {
    ClientSetup: st.builds(ClientSetup, st.lists(st.integers(0, 0xFFFFFFFF), max_size=4).map(tuple), setup_params),
    ServerSetup: st.builds(ServerSetup, st.integers(0, 0xFFFFFFFF), setup_params),
    GoAway: st.builds(GoAway, text),
    MaxRequestId: st.builds(MaxRequestId, varint),
    RequestsBlocked: st.builds(RequestsBlocked, varint),
    Subscribe: subscribe_like(Subscribe, {"delivery", "auth"}),
    TrackStatus: subscribe_like(TrackStatus, {"delivery", "auth"}),
    SubscribeOk: st.builds(SubscribeOk, varint, varint, varint, response_orders, st.none() | locations,
                           request_params({"delivery", "cache"})),
    TrackStatusOk: st.builds(TrackStatusOk, varint, varint, varint, response_orders, st.none() | locations,
                             request_params({"delivery", "cache"})),
    SubscribeUpdate: st.builds(SubscribeUpdate, varint, varint, locations, st.none() | st.integers(0, VARINT_MAX - 1),
                               u8, st.booleans(), request_params({"delivery", "auth"})),
    Unsubscribe: st.builds(Unsubscribe, varint),
    PublishDone: st.builds(PublishDone, varint, varint, varint, text),
    Publish: st.builds(Publish, varint, namespaces, names, varint, response_orders, st.none() | locations,
                       st.booleans(), request_params({"delivery", "auth", "cache"})),
    PublishOk: st.builds(lambda rid, fwd, prio, order, flt, p: PublishOk(rid, fwd, prio, order, flt[0], flt[1],
                                                                         flt[2], p),
                         varint, st.booleans(), u8, response_orders, filters(), request_params({"delivery"})),
    Fetch: st.one_of(
        st.builds(lambda rid, ns, name, a, b, prio, order, p: Fetch(
            rid, FetchType.STANDALONE, StandaloneFetch(ns, name, a, b), None, prio, order, p),
            varint, namespaces, names, locations, locations, u8, orders, request_params({"auth"})),
        st.builds(lambda rid, kind, j, s, prio, order, p: Fetch(rid, kind, None, JoiningFetch(j, s), prio, order, p),
                  varint, st.sampled_from([FetchType.RELATIVE_JOINING, FetchType.ABSOLUTE_JOINING]), varint, varint,
                  u8, orders, request_params({"auth"}))),
    FetchOk: st.builds(FetchOk, varint, locations, response_orders, st.booleans(), request_params({"cache"})),
    FetchCancel: st.builds(FetchCancel, varint),
    PublishNamespace: st.builds(PublishNamespace, varint, namespaces, request_params({"auth"})),
    PublishNamespaceOk: st.builds(PublishNamespaceOk, varint),
    PublishNamespaceDone: st.builds(PublishNamespaceDone, namespaces),
    PublishNamespaceCancel: st.builds(PublishNamespaceCancel, namespaces, varint, text),
    SubscribeNamespace: st.builds(SubscribeNamespace, varint, namespaces, request_params({"auth"})),
    SubscribeNamespaceOk: st.builds(SubscribeNamespaceOk, varint),
    UnsubscribeNamespace: st.builds(UnsubscribeNamespace, namespaces),
    **{cls: st.builds(cls, varint, varint, text) for cls in (SubscribeError, TrackStatusError, PublishError,
                                                              FetchError, PublishNamespaceError,
                                                              SubscribeNamespaceError)},
}


def test_every_message_has_a_strategy() -> None:
    assert set(MESSAGES) == D14_MESSAGES


@pytest.mark.parametrize("cls", list(MESSAGES), ids=[c.__name__ for c in MESSAGES])
@given(data=st.data())
def test_round_trip(cls: type[ControlMessage], data: st.DataObject) -> None:
    message = data.draw(MESSAGES[cls])
    octets = message.encode()
    assert ControlStreamParser().feed(octets) == [message]
    parser = ControlStreamParser()
    assert [m for i in range(len(octets)) for m in parser.feed(octets[i : i + 1])] == [message]


# --- what closes the session ------------------------------------------------------------------------

def frame(message_type: int, payload: bytes) -> bytes:
    return encode_varint(message_type) + len(payload).to_bytes(2, "big") + payload


KVF = SessionError.KEY_VALUE_FORMATTING_ERROR
SUB = "00 01 04 6b767370 03 726177"  # SUBSCRIBE: Request ID 0, ("kvsp",), "raw"
SETUP = "01 c0000000ff00000e"  # CLIENT_SETUP: one version, draft-14


@pytest.mark.parametrize(("case", "octets", "code", "reason"), [
    ("unknown message type 0x01 (reserved SETUP)", h("01 0000"), PV, "unknown control message type"),
    ("unknown type, refused before its length arrives", h("4040"), PV, "unknown control message type"),
    ("payload shorter than the fields", h("0a 0000"), PV, "longer than its Message Length"),
    ("payload longer than the fields", h("0a 0002 02 00"), PV, "shorter than its Message Length"),
    ("Group Order 3 in SUBSCRIBE", frame(3, h(SUB, "20 03 01 02 00")), PV, "Group Order 3"),
    ("Forward 2 in SUBSCRIBE", frame(3, h(SUB, "20 01 02 02 00")), PV, "Forward is 2"),
    ("Filter Type 5", frame(3, h(SUB, "20 01 01 05 00")), PV, "Filter Type 5"),
    ("Group Order 0 in SUBSCRIBE_OK", frame(4, h("02 05 00 00 00 00")), PV, "Group Order 0"),
    ("Content Exists 2", frame(4, h("02 05 00 01 02 00")), PV, "Content Exists is 2"),
    ("End Of Track 2 in FETCH_OK", frame(0x18, h("06 01 02 00 04 00")), PV, "End Of Track is 2"),
    ("Fetch Type 4", frame(0x16, h("08 80 00 04 00")), PV, "Fetch Type 4"),
    ("namespace with 0 fields", frame(0x11, h("0e 00 00")), PV, "0 fields"),
    ("namespace with 33 fields", frame(0x14, h("21") + h("0161") * 33), PV, "33 fields"),
    ("DELIVERY_TIMEOUT twice", frame(3, h(SUB, "20 01 01 02 02 0201 0202")), PV, "repeated"),
    ("KVP value over 2^16-1", frame(3, h(SUB, "20 01 01 02 01 4041 80010000")), PV, "Key-Value-Pair value length"),
    ("AUTHORIZATION TOKEN with unknown Alias Type", frame(6, h("03 01 04 6b767370 01 03 01 07")), KVF,
     "Alias Type 7"),
    ("AUTHORIZATION TOKEN USE_ALIAS with trailing octets", frame(6, h("03 01 04 6b767370 01 03 03 02 05 07")), KVF,
     "trailing"),
    ("AUTHORIZATION TOKEN truncated REGISTER", frame(6, h("03 01 04 6b767370 01 03 02 01 05")), KVF, "truncated"),
    ("PATH not a URI path", frame(0x20, h(SETUP, "01 01 02 6162")), SessionError.MALFORMED_PATH, "PATH"),
    ("PATH not UTF-8", frame(0x20, h(SETUP, "01 01 02 2fff")), SessionError.MALFORMED_PATH, "UTF-8"),
    ("PATH twice", frame(0x20, h(SETUP, "02 01 01 2f 01 01 2f")), PV, "repeated"),
    ("AUTHORITY with a path", frame(0x20, h(SETUP, "01 05 03 682f78")), SessionError.MALFORMED_AUTHORITY,
     "AUTHORITY"),
    ("GOAWAY URI not UTF-8", frame(0x10, h("01 ff")), PV, "UTF-8"),
])
def test_malformed_control_message(case: str, octets: bytes, code: SessionError, reason: str) -> None:
    with pytest.raises(ProtocolViolation) as info:
        ControlStreamParser().feed(octets)
    assert info.value.error == code
    assert reason in info.value.reason


def violation(octets: bytes) -> SessionError:
    with pytest.raises(ProtocolViolation) as info:
        ControlStreamParser().feed(octets)
    return info.value.error


def test_reason_phrase_and_goaway_uri_limits() -> None:
    long_reason = encode_varint(1025) + b"r" * 1025
    payload = h("02 04") + long_reason
    assert violation(h("05") + len(payload).to_bytes(2, "big") + payload) == PV
    uri = encode_varint(8193) + b"u" * 8193
    assert violation(h("10") + len(uri).to_bytes(2, "big") + uri) == PV
    ok = encode_varint(8192) + b"u" * 8192
    assert ControlStreamParser().feed(h("10") + len(ok).to_bytes(2, "big") + ok) == [GoAway("u" * 8192)]


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: f"d{p.draft}")
def test_max_message_length_refused_before_payload(profile: Profile) -> None:
    parser = ControlStreamParser(profile, max_message_length=100)
    with pytest.raises(ProtocolViolation):
        parser.feed(h("03 0065"))  # 101 > 100: no need to wait for the payload


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: f"d{p.draft}")
def test_message_too_large_to_encode(profile: Profile) -> None:
    # tokens, not unknown parameters: draft-18 has no way to send a parameter it does not know
    params = RequestParameters(authorization_tokens=tuple(AuthToken.use_value(1, b"y" * 4000) for _ in range(20)))
    with pytest.raises(MessageTooLarge):
        PublishNamespace(0, tuple(b"x" * 4000 for _ in range(1)), params).encode(profile)


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: f"d{p.draft}")
def test_unknown_type_refused_before_its_length_arrives(profile: Profile) -> None:
    with pytest.raises(ProtocolViolation, match="unknown control message type"):
        ControlStreamParser(profile).feed(h("4040"))


def test_parameters_out_of_scope_are_kept_as_unknown() -> None:
    # MAX_CACHE_DURATION (0x04) may not appear in SUBSCRIBE: it is ignored (kept raw), duplicates allowed
    octets = frame(3, h(SUB, "20 01 01 02 02 0401 0402"))
    [message] = ControlStreamParser().feed(octets)
    assert isinstance(message, Subscribe)
    assert message.parameters == RequestParameters(unknown=(KeyValuePair(4, 1), KeyValuePair(4, 2)))
    assert message.encode() == octets


def test_constructors_refuse_inconsistent_fields() -> None:
    with pytest.raises(ValueError):
        Subscribe(0, KVSP, b"raw", filter_type=FilterType.ABSOLUTE_START)  # no start
    with pytest.raises(ValueError):
        Subscribe(0, (), b"raw")
    with pytest.raises(ValueError):
        SubscribeOk(0, 1, group_order=GroupOrder.PUBLISHER_DEFAULT)
    with pytest.raises(ValueError):
        Fetch(0, FetchType.STANDALONE, None, JoiningFetch(0, 0))
    with pytest.raises(ValueError):
        AuthToken(AliasType.USE_ALIAS)
