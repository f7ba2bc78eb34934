"""MoqtSession, part 1: two real aioquic connections in memory (TLS with a test certificate, fake clock),
plus direct-feed tests over a recording QUIC stand-in: setup, SUBSCRIBE, FETCH, request IDs, GOAWAY, PUBLISH.
Part 2 (test_moqt_session_streams.py): namespaces, TRACK_STATUS, token aliases, data streams, control rules."""

from __future__ import annotations

import hashlib

import pytest
from aioquic.quic.events import StreamDataReceived

from moqt import (
    ControlMessageReceived,
    DataStreamEnded,
    FilterType,
    GoingAwayError,
    GroupOrder,
    KeyValuePair,
    LocalError,
    Location,
    MalformedTrack,
    MessageKind,
    ObjectChunkReceived,
    ObjectReceived,
    ObjectSource,
    ObjectStatus,
    RequestError,
    RequestsBlockedError,
    SessionClosedError,
    SessionError,
    SessionEstablished,
    SetupParameters,
    SetupRequested,
    StreamClosedError,
)
from moqt.data import FetchHeader, FetchWriter
from moqt.kinds import FetchType
from moqt.messages import (
    Fetch,
    FetchCancel,
    FetchError,
    FetchOk,
    GoAway,
    JoiningFetch,
    MaxRequestId,
    Publish,
    PublishDone,
    PublishOk,
    RequestsBlocked,
    Subscribe,
    SubscribeError,
    SubscribeOk,
    SubscribeUpdate,
    Unsubscribe,
)
from moqt.params import AuthToken
from moqt.profiles import DRAFT_14
from moqt.testing import (
    MoqtPair,
    established_client,
    established_server,
    feed_control,
    only,
    terminated,
)
from moqt.testing import (
    received_messages as messages,
)
from tests.support.moqt_session import BLOCK_NS, PV, V14, pair, subscribed, wire_code

__all__ = ["pair"]  # the fixture

# --- setup and version negotiation (section 3.3, 9.3) ------------------------------------------------

def test_setup_exchanges_versions_and_parameters() -> None:
    token = AuthToken.use_value(0, b"cwt")
    p = MoqtPair(client_options={"path": "/kvsp", "setup_parameters": SetupParameters(authorization_tokens=(token,))},
                 server_options={"path": "/kvsp", "request_window": 10})
    [client_ok] = only(p.client.take(), SessionEstablished)
    [server_ok] = only(p.server.take(), SessionEstablished)
    assert client_ok.version == server_ok.version == V14
    assert server_ok.peer_parameters.path == "/kvsp"
    assert server_ok.peer_parameters.authorization_tokens == (token,)
    assert client_ok.peer_parameters.max_request_id == 19  # ten client requests: IDs 0, 2, .., 18 < 19
    assert p.client.moqt.peer_max_request_id == 19 and p.server.moqt.is_established


def test_server_refuses_other_path() -> None:
    p = MoqtPair(client_options={"path": "/other"}, server_options={"path": "/kvsp"})
    assert terminated(p.server.take()).error == SessionError.INVALID_PATH
    client_end = terminated(p.client.take())
    assert client_end.remote and client_end.error == SessionError.INVALID_PATH


def test_version_negotiation_failure() -> None:
    p = MoqtPair(client_options={"supported_versions": [0xFF00000D]})
    assert terminated(p.server.take()).error == SessionError.VERSION_NEGOTIATION_FAILED
    assert terminated(p.client.take()).error == SessionError.VERSION_NEGOTIATION_FAILED


def test_server_picks_a_version_the_client_offered() -> None:
    p = MoqtPair(client_options={"supported_versions": [0xFF00000D, V14]})
    assert only(p.client.take(), SessionEstablished)[0].version == V14


def test_deferred_setup_accept_and_reject() -> None:
    p = MoqtPair(server_options={"auto_accept": False})
    [requested] = p.server.take()
    assert isinstance(requested, SetupRequested) and requested.message.supported_versions == (V14,)
    assert not p.client.take()  # no SERVER_SETUP yet
    events = p.server.moqt.accept_setup()
    assert only(events, SessionEstablished)
    p.pump()
    assert only(p.client.take(), SessionEstablished)

    q = MoqtPair(server_options={"auto_accept": False})
    q.server.take()
    q.server.moqt.reject_setup(SessionError.UNAUTHORIZED, "token refused")
    q.pump()
    assert terminated(q.client.take()).error == SessionError.UNAUTHORIZED


# --- SUBSCRIBE and objects (sections 9.7-9.12, 10.4) ------------------------------------------------------

def test_subscribe_streams_a_block_layer_by_layer(pair: MoqtPair) -> None:
    rid, alias = subscribed(pair)
    server = pair.server.moqt
    layers = [hashlib.sha256(bytes([i])).digest() * 8192 for i in range(3)]  # 256 KiB each
    stream = server.open_subgroup(rid, 0, extensions_present=True, end_of_group=True)
    for layer, payload in enumerate(layers):
        server.send_object(stream, layer, memoryview(payload), extensions=(KeyValuePair(0x4B56, 4096),),
                           end_of_stream=layer == len(layers) - 1)
    pair.pump()
    events = pair.client.take()
    received = only(events, ObjectReceived)
    assert [(o.request_id, o.track_alias, o.group_id, o.subgroup_id, o.object_id) for o in received] == [
        (rid, alias, 0, 0, 0), (rid, alias, 0, 0, 1), (rid, alias, 0, 0, 2)]
    assert [bytes(o.payload) for o in received] == layers
    assert all(o.source == ObjectSource.SUBGROUP and o.extensions == (KeyValuePair(0x4B56, 4096),) for o in received)
    assert received[-1].end_of_stream and received[-1].end_of_group
    assert only(events, DataStreamEnded) == [DataStreamEnded(stream, rid, end_of_group=True)]
    server.publish_done(rid, reason="block complete")
    pair.pump()
    [done] = messages(pair.client.take())
    assert isinstance(done, PublishDone) and done.stream_count == 1 and done.request_id == rid
    assert pair.client.moqt.track_alias(rid) is None  # subscription state is gone


def test_publish_done_right_behind_the_objects(pair: MoqtPair) -> None:
    """A producer finishing a block sends its layers, FIN and PUBLISH_DONE at once; all layers arrive."""
    rid, _ = subscribed(pair)
    server = pair.server.moqt
    for group in range(3):
        stream = server.open_subgroup(rid, group, end_of_group=True)
        server.send_object(stream, 0, bytes([group]) * 50_000, end_of_stream=True)
    server.publish_done(rid)
    pair.pump()
    events = pair.client.take()
    assert sorted(o.group_id for o in only(events, ObjectReceived)) == [0, 1, 2]
    assert messages(events) == [PublishDone(rid, 2, 3, "")]


def test_small_objects_arrive_as_views_of_the_received_octets(pair: MoqtPair) -> None:
    rid, _ = subscribed(pair)
    stream = pair.server.moqt.open_subgroup(rid, 4, 1)
    pair.server.moqt.send_object(stream, 0, b"k" * 10)
    pair.server.moqt.send_object(stream, 1, b"", status=ObjectStatus.END_OF_GROUP, end_of_stream=True)
    pair.pump()
    first, last = only(pair.client.take(), ObjectReceived)
    assert isinstance(first.payload, memoryview) and isinstance(first.payload.obj, bytes)
    assert (first.group_id, first.subgroup_id, bytes(first.payload)) == (4, 1, b"k" * 10)
    assert (last.status, last.payload.nbytes, last.end_of_stream) == (ObjectStatus.END_OF_GROUP, 0, True)


def test_partial_object_delivery() -> None:
    p = MoqtPair(client_options={"deliver_partial_objects": True})
    p.client.take()
    p.server.take()
    rid, _ = subscribed(p)
    payload = bytes(range(256)) * 1024
    stream = p.server.moqt.open_subgroup(rid, 0)
    p.server.moqt.send_object(stream, 0, payload, end_of_stream=True)
    p.pump()
    chunks = only(p.client.take(), ObjectChunkReceived)
    assert len(chunks) > 1 and chunks[-1].end_of_object and not any(c.end_of_object for c in chunks[:-1])
    assert b"".join(bytes(c.data) for c in chunks) == payload
    assert [c.offset for c in chunks] == [sum(len(c.data) for c in chunks[:i]) for i in range(len(chunks))]


def test_subscribe_error_for_unknown_track(pair: MoqtPair) -> None:
    rid = pair.client.moqt.subscribe(BLOCK_NS, b"codec-00ff")
    pair.pump()
    pair.server.take()
    pair.server.moqt.subscribe_error(rid, RequestError.TRACK_DOES_NOT_EXIST, "no such block")
    pair.pump()
    [error] = messages(pair.client.take())
    assert error == SubscribeError(rid, wire_code(MessageKind.SUBSCRIBE_ERROR, RequestError.TRACK_DOES_NOT_EXIST),
                                   "no such block")
    with pytest.raises(LocalError):
        pair.server.moqt.subscribe_ok(rid)  # answered already


def test_unsubscribe_resets_the_publishers_streams(pair: MoqtPair) -> None:
    rid, _ = subscribed(pair)
    stream = pair.server.moqt.open_subgroup(rid, 0)
    pair.server.moqt.send_object(stream, 0, b"layer0")
    pair.pump()
    assert only(pair.client.take(), ObjectReceived)
    pair.client.moqt.unsubscribe(rid)
    pair.pump()
    assert messages(pair.server.take()) == [Unsubscribe(rid)]
    with pytest.raises(StreamClosedError):
        pair.server.moqt.send_object(stream, 1, b"layer1")
    assert not only(pair.client.take(), ObjectReceived)


def test_subscribe_update_narrows_and_checks(pair: MoqtPair) -> None:
    rid, _ = subscribed(pair, filter_type=FilterType.ABSOLUTE_RANGE, start_location=Location(0, 0), end_group=10)
    update_id = pair.client.moqt.subscribe_update(rid, start_location=Location(2, 0), end_group=8, forward=False)
    assert update_id == rid + 2  # SUBSCRIBE_UPDATE takes a Request ID of its own (draft-14)
    pair.pump()
    [update] = messages(pair.server.take())
    assert update == SubscribeUpdate(update_id, rid, Location(2, 0), 8, 128, False)
    with pytest.raises(LocalError, match="Forward"):
        pair.server.moqt.open_subgroup(rid, 2)
    with pytest.raises(LocalError):
        pair.client.moqt.subscribe_update(rid, start_location=Location(1, 0), end_group=8)  # widening


def test_subscribe_update_widening_from_peer_is_protocol_violation() -> None:
    session, quic = established_server()
    feed_control(session, Subscribe(0, BLOCK_NS, b"raw", filter_type=FilterType.ABSOLUTE_START,
                                    start_location=Location(5, 0)).encode())
    session.subscribe_ok(0)
    events = feed_control(session, SubscribeUpdate(2, 0, Location(4, 0)).encode())
    assert terminated(events).error == PV
    assert quic.close_args is not None and quic.close_args[0] == DRAFT_14.session_errors.code(PV)


def test_datagram_objects(pair: MoqtPair) -> None:
    rid, alias = subscribed(pair)
    pair.server.moqt.send_datagram(rid, 7, 0, b"tiny", end_of_group=True)
    pair.pump()
    [obj] = only(pair.client.take(), ObjectReceived)
    assert (obj.source, obj.track_alias, obj.group_id, obj.object_id, bytes(obj.payload), obj.end_of_group) == (
        ObjectSource.DATAGRAM, alias, 7, 0, b"tiny", True)
    assert obj.stream_id is None and obj.subgroup_id is None


# --- FETCH (sections 9.16-9.19, 10.4.4) -----------------------------------------------------------------

def test_fetch_a_stored_block(pair: MoqtPair) -> None:
    client, server = pair.client.moqt, pair.server.moqt
    rid = client.fetch(BLOCK_NS, b"raw", Location(0, 0), Location(0, 4), group_order=GroupOrder.ASCENDING)
    pair.pump()
    [fetch] = messages(pair.server.take())
    assert isinstance(fetch, Fetch) and fetch.standalone is not None and fetch.standalone.end == Location(0, 4)
    stream = server.open_fetch_stream(rid)  # objects may precede FETCH_OK
    for layer in range(4):
        server.send_fetch_object(stream, 0, 0, layer, bytes([layer]) * 1000, end_of_stream=layer == 3)
    server.fetch_ok(rid, Location(0, 4), end_of_track=True)
    pair.pump()
    events = pair.client.take()
    objs = only(events, ObjectReceived)
    assert [(o.source, o.request_id, o.track_alias, o.object_id, bytes(o.payload)) for o in objs] == [
        (ObjectSource.FETCH, rid, None, layer, bytes([layer]) * 1000) for layer in range(4)]
    assert objs[-1].end_of_stream
    assert messages(events) == [FetchOk(rid, Location(0, 4), GroupOrder.ASCENDING, True)]
    assert only(events, DataStreamEnded) == [DataStreamEnded(stream, rid)]
    with pytest.raises(LocalError):
        client.fetch_cancel(rid)  # the fetch is over


def test_fetch_error_for_unknown_track(pair: MoqtPair) -> None:
    rid = pair.client.moqt.fetch(BLOCK_NS, b"nope", Location(0, 0), Location(0, 4))
    pair.pump()
    pair.server.take()
    pair.server.moqt.fetch_error(rid, RequestError.TRACK_DOES_NOT_EXIST, "unknown block")
    pair.pump()
    not_there = wire_code(MessageKind.FETCH_ERROR, RequestError.TRACK_DOES_NOT_EXIST)
    assert messages(pair.client.take()) == [FetchError(rid, not_there, "unknown block")]


def test_fetch_cancel_resets_the_fetch_stream(pair: MoqtPair) -> None:
    rid = pair.client.moqt.fetch(BLOCK_NS, b"raw", Location(0, 0), Location(1, 0))
    pair.pump()
    pair.server.take()
    stream = pair.server.moqt.open_fetch_stream(rid)
    pair.server.moqt.send_fetch_object(stream, 0, 0, 0, b"x")
    pair.pump()
    pair.client.moqt.fetch_cancel(rid)
    pair.pump()
    assert messages(pair.server.take()) == [FetchCancel(rid)]
    with pytest.raises(StreamClosedError):
        pair.server.moqt.send_fetch_object(stream, 0, 0, 1, b"y")


def test_joining_fetch(pair: MoqtPair) -> None:
    rid, _ = subscribed(pair)
    fetch_id = pair.client.moqt.joining_fetch(rid, 1)
    assert fetch_id == rid + 2
    pair.pump()
    [fetch] = messages(pair.server.take())
    assert fetch == Fetch(fetch_id, FetchType.RELATIVE_JOINING, None, JoiningFetch(rid, 1))
    pair.server.moqt.fetch_ok(fetch_id, Location(0, 1))
    pair.pump()
    assert messages(pair.client.take()) == [FetchOk(fetch_id, Location(0, 1))]


def test_joining_fetch_of_unknown_subscription_is_answered_by_the_session() -> None:
    session, quic = established_server()
    events = feed_control(session, Fetch(0, FetchType.ABSOLUTE_JOINING, None, JoiningFetch(8, 1)).encode())
    assert events == []  # the application never sees it
    assert quic.control_messages(0)[1:] == [
        FetchError(0, wire_code(MessageKind.FETCH_ERROR, RequestError.INVALID_JOINING_REQUEST_ID),
                   "no such subscription")]


def test_joining_fetch_needs_a_largest_object_subscription() -> None:
    session, _ = established_server()
    feed_control(session, Subscribe(0, BLOCK_NS, b"raw", filter_type=FilterType.NEXT_GROUP_START).encode())
    events = feed_control(session, Fetch(2, FetchType.RELATIVE_JOINING, None, JoiningFetch(0, 1)).encode())
    assert terminated(events).error == PV


def test_malformed_fetch_response_is_cancelled() -> None:
    session, quic = established_client()
    rid = session.fetch(BLOCK_NS, b"raw", Location(0, 0), Location(1, 0), group_order=GroupOrder.ASCENDING)
    writer = FetchWriter(FetchHeader(rid))
    octets = writer.encode_header() + b"".join(bytes(p) for p in writer.encode_object(0, 0, 2, b"a")) + b"".join(
        bytes(p) for p in writer.encode_object(0, 0, 1, b"b"))  # Object IDs go backwards within the group
    events = session.handle_event(StreamDataReceived(octets, False, 3))
    assert only(events, MalformedTrack)[0].request_id == rid
    assert len(only(events, ObjectReceived)) == 1
    assert FetchCancel(rid) in quic.control_messages(0) and quic.stops.get(3) is not None


# --- request IDs and flow control (sections 9.1, 9.5, 9.6) -------------------------------------------------

def test_request_id_flow_control() -> None:
    p = MoqtPair(server_options={"request_window": 2, "auto_grant_requests": False})
    p.client.take()
    p.server.take()
    client = p.client.moqt
    assert [client.subscribe(BLOCK_NS, b"a"), client.subscribe(BLOCK_NS, b"b")] == [0, 2]
    assert not client.can_send_request()
    with pytest.raises(RequestsBlockedError) as info:
        client.subscribe(BLOCK_NS, b"c")
    assert info.value.maximum_request_id == 3
    with pytest.raises(RequestsBlockedError):
        client.subscribe(BLOCK_NS, b"c")  # REQUESTS_BLOCKED is sent once per maximum
    p.pump()
    assert [type(m) for m in messages(p.server.take())] == [Subscribe, Subscribe, RequestsBlocked]
    p.server.moqt.grant_requests(1)
    p.pump()
    assert messages(p.client.take()) == [MaxRequestId(5)]
    assert client.subscribe(BLOCK_NS, b"c") == 4


def test_auto_grant_keeps_the_window_open() -> None:
    p = MoqtPair(server_options={"request_window": 4})
    p.client.take()
    p.server.take()
    for i in range(10):
        p.client.moqt.track_status(BLOCK_NS, f"t{i}".encode())
        p.pump()
    assert len(only(p.server.take(), ControlMessageReceived)) == 10
    assert any(isinstance(m, MaxRequestId) for m in messages(p.client.take()))


@pytest.mark.parametrize(("request_id", "code"), [
    (1, SessionError.INVALID_REQUEST_ID),   # a server's (odd) ID from the client
    (2, SessionError.INVALID_REQUEST_ID),   # skips the expected 0
    (200, SessionError.TOO_MANY_REQUESTS),  # at or past the Maximum Request ID
])
def test_bad_request_ids_close_the_session(request_id: int, code: SessionError) -> None:
    p = MoqtPair(server_options={"request_window": 100, "auto_grant_requests": False})
    p.client.take()
    p.server.take()
    p.client.quic.send_stream_data(0, Subscribe(request_id, BLOCK_NS, b"raw").encode())
    p.pump()
    assert terminated(p.server.take()).error == code
    end = terminated(p.client.take())
    assert end.remote and end.error == code
    with pytest.raises(SessionClosedError):
        p.client.moqt.subscribe(BLOCK_NS, b"raw")


def test_max_request_id_must_grow() -> None:
    session, _ = established_client()
    events = feed_control(session, MaxRequestId(250).encode())  # SERVER_SETUP granted 200
    assert messages(events) == [MaxRequestId(250)]
    assert session.peer_max_request_id == 250
    assert terminated(feed_control(session, MaxRequestId(250).encode())).error == PV


# --- GOAWAY (section 9.4) ---------------------------------------------------------------------------------

def test_goaway_stops_new_requests(pair: MoqtPair) -> None:
    pair.server.moqt.goaway("moqt://relay-b.example/kvsp")
    pair.pump()
    assert messages(pair.client.take()) == [GoAway("moqt://relay-b.example/kvsp")]
    with pytest.raises(GoingAwayError):
        pair.client.moqt.subscribe(BLOCK_NS, b"raw")


def test_goaway_timeout_closes_the_session(pair: MoqtPair) -> None:
    pair.server.moqt.goaway(now=pair.now, timeout=5.0)
    pair.pump()
    assert pair.server.moqt.get_timer() == pytest.approx(pair.now + 5.0, abs=0.1)
    pair.advance(6.0)
    assert terminated(pair.server.take()).error == SessionError.GOAWAY_TIMEOUT
    assert terminated(pair.client.take()).error == SessionError.GOAWAY_TIMEOUT


def test_goaway_rules() -> None:
    session, _ = established_client()
    feed_control(session, GoAway("").encode())
    assert terminated(feed_control(session, GoAway("").encode())).error == PV  # a second GOAWAY
    server, _ = established_server()
    assert terminated(feed_control(server, GoAway("moqt://x").encode())).error == PV  # a client's URI
    client, _ = established_client()
    with pytest.raises(LocalError):
        client.goaway("moqt://x")


# --- PUBLISH (sections 9.13-9.15) -----------------------------------------------------------------------------

def test_publish_then_objects(pair: MoqtPair) -> None:
    server, client = pair.server.moqt, pair.client.moqt
    rid = server.publish(BLOCK_NS, b"raw", largest_location=Location(0, 3))
    alias = server.track_alias(rid)
    assert alias is not None
    stream = server.open_subgroup(rid, 0)  # objects may go before PUBLISH_OK
    server.send_object(stream, 0, b"early")
    pair.pump()
    events = pair.client.take()
    [publish] = messages(events)
    assert isinstance(publish, Publish) and publish.track_alias == alias and publish.request_id == 1
    assert [bytes(o.payload) for o in only(events, ObjectReceived)] == [b"early"]
    client.publish_ok(rid, filter_type=FilterType.LARGEST_OBJECT)
    pair.pump()
    assert isinstance(messages(pair.server.take())[0], PublishOk)
    server.send_object(stream, 1, b"later", end_of_stream=True)
    server.publish_done(rid)
    pair.pump()
    events = pair.client.take()
    assert [bytes(o.payload) for o in only(events, ObjectReceived)] == [b"later"]
    assert isinstance(messages(events)[0], PublishDone)


def test_duplicate_track_alias_closes_the_session() -> None:
    session, _ = established_client()
    feed_control(session, Publish(1, BLOCK_NS, b"a", 7).encode())
    events = feed_control(session, Publish(3, BLOCK_NS, b"b", 7).encode())
    assert terminated(events).error == SessionError.DUPLICATE_TRACK_ALIAS
    session2, _ = established_client()
    rid = session2.subscribe(BLOCK_NS, b"a")
    feed_control(session2, Publish(1, BLOCK_NS, b"b", 9).encode())
    assert terminated(feed_control(session2, SubscribeOk(rid, 9).encode())).error == SessionError.DUPLICATE_TRACK_ALIAS


def test_garbage_over_real_quic_ends_cleanly(pair: MoqtPair) -> None:
    """Arbitrary octets on a real data stream and the real control stream: a draft code, both sides told."""
    stream = pair.server.quic.get_next_available_stream_id(is_unidirectional=True)
    pair.server.quic.send_stream_data(stream, b"\x1f\x00\x00\x00", end_stream=True)  # type 0x1F is unassigned
    pair.pump()
    assert terminated(pair.client.take()).error == PV
    assert terminated(pair.server.take()).remote
    other = MoqtPair()
    other.client.take()
    other.server.take()
    other.client.quic.send_stream_data(0, b"\x3f\xff\xff")  # unknown message type 0x3f
    other.pump()
    assert terminated(other.server.take()).error == PV
