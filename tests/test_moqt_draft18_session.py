"""Two draft-18 sessions in memory (real aioquic and TLS, ALPN "moqt-18"), and draft-18's session rules
checked byte by byte on a recording transport.

What draft-18 changed in shape, each checked here: SETUP on a unidirectional control stream each way
(then only GOAWAY there), every request on a bidirectional stream of its own with its replies there
(no Request ID), cancellation by RESET_STREAM / STOP_SENDING / FIN instead of UNSUBSCRIBE, FETCH_CANCEL,
PUBLISH_NAMESPACE_DONE / _CANCEL and UNSUBSCRIBE_NAMESPACE (which the session still reports, as the
neutral messages), Request IDs in any order but never twice, GOAWAY's Timeout and Request ID,
SUBSCRIBE_TRACKS, delta-coded fetch streams in either group order, and padding.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from aioquic.quic.events import DatagramFrameReceived, StopSendingReceived, StreamDataReceived, StreamReset
from hypothesis import given, settings
from hypothesis import strategies as st

from moqt import GoingAwayError, LocalError, Location, MoqtSession, RequestError, SessionError
from moqt.data import encode_padding_datagram, encode_padding_stream_type
from moqt.events import ControlMessageReceived, MoqtEvent, ObjectReceived, SessionEstablished, SessionTerminated
from moqt.kinds import FilterType, GroupOrder, SubscribeOptions
from moqt.messages import (
    ControlMessage,
    ControlStreamParser,
    Fetch,
    FetchCancel,
    FetchError,
    FetchOk,
    GoAway,
    NamespaceDone,
    NamespaceNotice,
    Publish,
    PublishDone,
    PublishError,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishNamespaceError,
    PublishNamespaceOk,
    PublishOk,
    RequestErrorReply,
    RequestOk,
    RequestUpdate,
    Setup,
    Subscribe,
    SubscribeError,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
    SubscribeOk,
    SubscribeTracks,
    TrackStatus,
    TrackStatusError,
    TrackStatusOk,
    Unsubscribe,
    UnsubscribeNamespace,
)
from moqt.params import RequestParameters, SetupParameters
from moqt.profiles import DRAFT_18
from moqt.testing import MoqtPair, RecordingQuic, only, recording_session, terminated
from moqt.testing import received_messages as messages
from moqt.wire import KeyValuePair

D18 = DRAFT_18
NS = (b"kvsp", b"5ed5c2f2")
PV = SessionError.PROTOCOL_VIOLATION


def d18_pair(**server: Any) -> MoqtPair:
    pair = MoqtPair(client_options={"path": "/kvsp"}, server_options={"path": "/kvsp", **server}, profile=D18)
    assert pair.client.moqt.is_established and pair.server.moqt.is_established
    pair.client.take(), pair.server.take()
    return pair


def open_streams(session: MoqtSession) -> int:
    """Request streams the session's strategy still tracks (both halves not yet closed)."""
    return len(session._core.shape._streams)  # type: ignore[attr-defined]


# -- two peers -----------------------------------------------------------------------------------------

def test_setup_travels_on_a_unidirectional_control_stream_each_way() -> None:
    pair = MoqtPair(client_options={"path": "/kvsp"}, server_options={"path": "/kvsp"}, profile=D18)
    [client_up] = only(pair.client.take(), SessionEstablished)
    [server_up] = only(pair.server.take(), SessionEstablished)
    assert client_up.version == server_up.version == D18.version == pair.client.moqt.version
    assert pair.client.quic.tls.alpn_negotiated == "moqt-18"
    assert server_up.peer_parameters.path == "/kvsp" and client_up.peer_parameters.max_request_id is None
    assert pair.client.moqt._core.control_stream_id == 2  # the client's first unidirectional stream
    assert pair.server.moqt._core.control_stream_id == 3  # the server's


def test_subscribe_objects_and_publish_done() -> None:
    pair = d18_pair()
    client, server = pair.client.moqt, pair.server.moqt
    request_id = client.subscribe(NS, b"raw", filter_type=FilterType.ABSOLUTE_RANGE, start_location=Location(0, 0),
                                  end_group=0, subscriber_priority=7)
    pair.pump()
    [subscribe] = messages(pair.server.take())
    assert subscribe == Subscribe(request_id, NS, b"raw", 7, filter_type=FilterType.ABSOLUTE_RANGE,
                                  start_location=Location(0, 0), end_group=0)
    server.subscribe_ok(request_id, largest_location=Location(0, 1))
    stream = server.open_subgroup(request_id, 0, end_of_group=True)
    for layer in range(3):
        server.send_object(stream, layer, b"layer%d" % layer, end_of_stream=layer == 2)
    pair.pump()
    server.send_datagram(request_id, 1, 0, b"dgram")
    pair.pump()
    server.publish_done(request_id)
    pair.pump()
    events = pair.client.take()
    [ok, done] = messages(events)
    assert isinstance(ok, SubscribeOk) and ok.request_id == request_id and ok.largest_location == Location(0, 1)
    assert done == PublishDone(request_id, 0x2, 1)  # TRACK_ENDED, on the SUBSCRIBE's stream
    assert [bytes(o.payload) for o in only(events, ObjectReceived)] == [b"layer0", b"layer1", b"layer2", b"dgram"]
    assert client.request_state(request_id) is None and server.request_state(request_id) is None
    assert open_streams(client) == open_streams(server) == 0  # both halves closed (FIN after PUBLISH_DONE)


@pytest.mark.parametrize("order", [GroupOrder.ASCENDING, GroupOrder.DESCENDING, GroupOrder.PUBLISHER_DEFAULT])
def test_fetch_streams_run_their_group_deltas_in_the_fetchs_order(order: GroupOrder) -> None:
    pair = d18_pair()
    client, server = pair.client.moqt, pair.server.moqt
    request_id = client.fetch(NS, b"raw", Location(0, 0), Location(3, 0), group_order=order)
    pair.pump()
    [fetch] = messages(pair.server.take())
    assert isinstance(fetch, Fetch) and fetch.group_order is order
    groups = [2, 1, 0] if order is GroupOrder.DESCENDING else [0, 1, 2]  # omitted: "the receiver uses Ascending"
    stream = server.open_fetch_stream(request_id)
    for group in groups:
        server.send_fetch_object(stream, group, 0, 0, b"g%d" % group)
        server.send_fetch_object(stream, group, 0, 3, b"g%d.3" % group, end_of_stream=group == groups[-1])
    server.fetch_ok(request_id, Location(3, 0))
    pair.pump()
    events = pair.client.take()
    assert [(o.group_id, o.object_id) for o in only(events, ObjectReceived)] == [(g, o) for g in groups for o in (0, 3)]
    [ok] = messages(events)
    assert isinstance(ok, FetchOk) and ok.end_location == Location(3, 0)
    assert client.request_state(request_id) is None and server.request_state(request_id) is None
    assert open_streams(client) == open_streams(server) == 0


def test_every_request_answered_ok() -> None:
    pair = d18_pair()
    client, server = pair.client.moqt, pair.server.moqt
    status = client.track_status(NS, b"raw")
    publish = client.publish(NS, b"pushed", largest_location=Location(1, 0))
    announce = client.publish_namespace(NS)
    watch = client.subscribe_namespace(NS[:1])
    pair.pump()
    kinds = [type(m) for m in messages(pair.server.take())]
    assert kinds == [TrackStatus, Publish, PublishNamespace, SubscribeNamespace, SubscribeNamespace]
    server.track_status_ok(status, largest_location=Location(4, 2))
    server.publish_ok(publish, forward=False)
    server.publish_namespace_ok(announce)
    server.subscribe_namespace_ok(watch)
    server.namespace(watch, NS[1:])
    server.namespace_done(watch, NS[1:])
    pair.pump()
    answers = messages(pair.client.take())
    assert answers[0] == TrackStatusOk(status, 0, largest_location=Location(4, 2))
    assert isinstance(answers[1], PublishOk) and answers[1].request_id == publish and not answers[1].forward
    assert answers[2:] == [PublishNamespaceOk(announce), SubscribeNamespaceOk(watch), NamespaceNotice(NS[1:], watch),
                           NamespaceDone(NS[1:], watch)]
    assert client.request_state(status) is None and open_streams(client) == 4  # the TRACK_STATUS's closed
    client.publish_done(publish, reason="pushed enough")
    pair.pump()
    assert messages(pair.server.take()) == [PublishDone(publish, 0x2, 0, "pushed enough")]
    assert server.request_state(publish) is None and open_streams(client) == 3


def test_subscribe_namespace_options_map_to_subscribe_namespace_and_subscribe_tracks() -> None:
    pair = d18_pair()
    client, server = pair.client.moqt, pair.server.moqt
    watch = client.subscribe_namespace(NS[:1])  # Subscribe Options BOTH: namespaces and tracks
    pair.pump()
    namespaces, tracks = messages(pair.server.take())
    assert namespaces == SubscribeNamespace(watch, NS[:1], options=SubscribeOptions.NAMESPACE)
    assert tracks == SubscribeNamespace(watch + 2, NS[:1], options=SubscribeOptions.PUBLISH)  # SUBSCRIBE_TRACKS
    server.subscribe_namespace_ok(watch)
    server.subscribe_namespace_error(tracks.request_id, RequestError.NOT_SUPPORTED)  # the companion's answer
    pair.pump()
    assert messages(pair.client.take()) == [SubscribeNamespaceOk(watch)]  # the companion's is not the app's
    client.unsubscribe_namespace(NS[:1])
    pair.pump()
    assert messages(pair.server.take()) == [UnsubscribeNamespace(NS[:1])]
    assert server.request_state(watch) is None and client.is_established


def test_every_request_refused() -> None:
    pair = d18_pair()
    client, server = pair.client.moqt, pair.server.moqt
    ids = [client.subscribe(NS, b"a"), client.fetch(NS, b"a", Location(0, 0), Location(1, 0)),
           client.track_status(NS, b"a"), client.publish(NS, b"b"), client.publish_namespace(NS),
           client.subscribe_namespace(NS[:1])]
    pair.pump()
    pair.server.take()
    subscribe, fetch, status, publish, announce, watch = ids
    server.subscribe_error(subscribe, RequestError.TRACK_DOES_NOT_EXIST, "gone")
    server.fetch_error(fetch, RequestError.INVALID_RANGE)
    server.track_status_error(status, RequestError.UNAUTHORIZED)
    server.publish_error(publish, RequestError.UNINTERESTED)
    server.publish_namespace_error(announce, RequestError.UNAUTHORIZED)
    server.subscribe_namespace_error(watch, RequestError.NAMESPACE_PREFIX_OVERLAP)
    server.subscribe_namespace_error(watch + 2, RequestError.NAMESPACE_PREFIX_OVERLAP)
    pair.pump()
    assert messages(pair.client.take()) == [
        SubscribeError(subscribe, 0x10, "gone"), FetchError(fetch, 0x11), TrackStatusError(status, 0x1),
        PublishError(publish, 0x20), PublishNamespaceError(announce, 0x1), SubscribeNamespaceError(watch, 0x30)]
    assert all(client.request_state(r) is None and server.request_state(r) is None for r in ids)
    assert open_streams(client) == open_streams(server) == 0  # REQUEST_ERROR, then FIN both ways


def test_the_requester_cancels_by_resetting_its_stream() -> None:
    pair = d18_pair()
    client, server = pair.client.moqt, pair.server.moqt
    subscribe = client.subscribe(NS, b"raw")
    fetch = client.fetch(NS, b"raw", Location(0, 0), Location(5, 0))
    announce = client.publish_namespace(NS)
    watch = client.subscribe_namespace(NS[:1])
    early = client.subscribe(NS, b"early")
    pair.pump()
    pair.server.take()
    server.subscribe_ok(subscribe)
    server.open_fetch_stream(fetch)
    server.publish_namespace_ok(announce)
    server.subscribe_namespace_ok(watch)
    pair.pump()
    pair.client.take()
    client.unsubscribe(subscribe)
    client.fetch_cancel(fetch)
    client.publish_namespace_done(NS)
    client.unsubscribe_namespace(NS[:1])
    client.unsubscribe(early)  # before its answer
    pair.pump()
    # each on its own stream: in no particular order
    assert set(messages(pair.server.take())) == {Unsubscribe(subscribe), FetchCancel(fetch),
                                                 PublishNamespaceDone(NS, announce), UnsubscribeNamespace(NS[:1]),
                                                 Unsubscribe(early)}
    assert all(server.request_state(r) is None for r in (subscribe, fetch, announce, watch, early))
    assert all(client.request_state(r) is None for r in (subscribe, fetch, announce, watch, early))
    assert open_streams(client) == open_streams(server) == 0
    assert client.is_established and server.is_established


def test_the_responder_cancels_by_resetting_its_stream() -> None:
    pair = d18_pair()
    client, server = pair.client.moqt, pair.server.moqt
    pushed = client.publish(NS, b"pushed")
    announce = client.publish_namespace(NS)
    pair.pump()
    pair.server.take()
    server.publish_ok(pushed)
    server.publish_namespace_ok(announce)
    pair.pump()
    pair.client.take()
    server.unsubscribe(pushed)  # the subscriber of a PUBLISH ends it: STOP_SENDING
    server.publish_namespace_cancel(NS, RequestError.UNAUTHORIZED, "token expired")
    pair.pump()
    assert set(messages(pair.client.take())) == {
        Unsubscribe(pushed), PublishNamespaceCancel(NS, 0x0, "the request stream was reset (0x1)", announce)}
    subscription = server.subscribe(NS, b"back")
    pair.pump()
    pair.client.take()
    client.subscribe_ok(subscription)
    pair.pump()
    pair.server.take()
    client.publish_done(subscription, reason="track over")
    pair.pump()
    [done] = messages(pair.server.take())
    assert done == PublishDone(subscription, 0x2, 0, "track over")
    assert open_streams(client) == open_streams(server) == 0


def test_request_update_rides_the_requests_stream() -> None:
    pair = d18_pair()
    client, server = pair.client.moqt, pair.server.moqt
    subscription = client.subscribe(NS, b"raw")
    pair.pump()
    pair.server.take()
    server.subscribe_ok(subscription, largest_location=Location(3, 9))
    pair.pump()
    pair.client.take()
    first = client.request_update(subscription, RequestParameters(forward=False))
    second = client.request_update(subscription, RequestParameters(subscriber_priority=1))
    pair.pump()
    assert messages(pair.server.take()) == [RequestUpdate(first, subscription, RequestParameters(forward=False)),
                                            RequestUpdate(second, subscription,
                                                          RequestParameters(subscriber_priority=1))]
    server.update_ok(first, largest_location=Location(3, 9))
    server.update_error(second, RequestError.NOT_SUPPORTED, "no", retry_interval=1)
    pair.pump()
    assert messages(pair.client.take()) == [RequestOk(first, Location(3, 9)), RequestErrorReply(second, 0x3, "no", 1)]
    assert client.request_state(first) is None and server.request_state(second) is None


def test_goaway_carries_its_timeout_and_closes_after_it() -> None:
    pair = d18_pair()
    client, server = pair.client.moqt, pair.server.moqt
    client.subscribe(NS, b"raw")
    pair.pump()
    pair.server.take()
    server.goaway("moqt://elsewhere.test/relay", now=pair.now, timeout=1.5)
    pair.pump()
    [goaway] = messages(pair.client.take())
    assert goaway == GoAway("moqt://elsewhere.test/relay", 1500, 2)  # the client's IDs from 2 were not processed
    with pytest.raises(GoingAwayError):
        client.subscribe(NS, b"other")
    pair.advance(2.0)
    assert terminated(pair.client.take()).error_code == D18.session_errors.code(SessionError.GOAWAY_TIMEOUT)


def test_request_streams_close_so_a_long_session_never_runs_out_of_them() -> None:
    """QUIC lets the peer open 128 bidirectional streams and grants more as streams end: every request
    stream must end both ways (here 3 x 60 requests, answered, cancelled or fetched to the end)."""
    pair = d18_pair()
    client, server = pair.client.moqt, pair.server.moqt
    for round_ in range(60):
        subscription = client.subscribe(NS, b"t%d" % round_)
        fetch = client.fetch(NS, b"raw", Location(0, 0), Location(1, 0))
        status = client.track_status(NS, b"raw")
        pair.pump()
        pair.server.take()
        server.subscribe_ok(subscription)
        stream = server.open_fetch_stream(fetch)
        server.send_fetch_object(stream, 0, 0, 0, b"x", end_of_stream=True)
        server.fetch_ok(fetch, Location(0, 1))
        server.track_status_ok(status)
        pair.pump()
        assert len(messages(pair.client.take())) == 3, round_
        client.unsubscribe(subscription)
        pair.pump()
    assert open_streams(client) == open_streams(server) == 0
    assert not client._core.requests and not server._core.requests


# -- byte by byte on a recording transport ---------------------------------------------------------------

CLIENT_CONTROL, SERVER_CONTROL = 2, 3


def d18_server(**options: Any) -> tuple[MoqtSession, RecordingQuic]:
    session, quic = recording_session(is_client=False, profile=D18, **options)
    session.handle_event(StreamDataReceived(Setup(SetupParameters(path="/kvsp")).encode(D18), False, CLIENT_CONTROL))
    assert session.is_established
    return session, quic


def d18_client(**options: Any) -> tuple[MoqtSession, RecordingQuic]:
    session, quic = recording_session(is_client=True, profile=D18, **options)
    session.handle_event(StreamDataReceived(Setup().encode(D18), False, SERVER_CONTROL))
    assert session.is_established
    return session, quic


def written(quic: RecordingQuic, stream_id: int) -> list[ControlMessage]:
    return ControlStreamParser(D18).feed(bytes(quic.stream_data[stream_id]))


def on_stream(session: MoqtSession, stream_id: int, *items: ControlMessage, fin: bool = False) -> list[MoqtEvent]:
    return session.handle_event(StreamDataReceived(b"".join(m.encode(D18) for m in items), fin, stream_id))


def test_setup_is_each_sides_first_message_and_the_streams_type() -> None:
    _, quic = recording_session(is_client=True, profile=D18, path="/kvsp")
    octets = bytes(quic.stream_data[CLIENT_CONTROL])
    assert octets == Setup(SetupParameters(path="/kvsp")).encode(D18)
    assert octets[:2] == bytes.fromhex("af00")  # vi64 0x2F00: SETUP's type is the stream's
    _, server_quic = d18_server()
    assert written(server_quic, SERVER_CONTROL) == [Setup()]  # no MAX_REQUEST_ID option in draft-18


def test_setup_and_a_request_one_octet_at_a_time() -> None:
    session, quic = recording_session(is_client=False, profile=D18)
    events: list[MoqtEvent] = []
    for octet in Setup(SetupParameters(path="/kvsp")).encode(D18):
        events += session.handle_event(StreamDataReceived(bytes([octet]), False, CLIENT_CONTROL))
    assert only(events, SessionEstablished)
    for octet in Subscribe(0, NS, b"raw").encode(D18):
        events += session.handle_event(StreamDataReceived(bytes([octet]), False, 0))
    assert messages(events) == [Subscribe(0, NS, b"raw")]
    session.subscribe_ok(0, track_alias=5)
    assert written(quic, 0) == [SubscribeOk(-1, 5)]  # no Request ID on the wire: the stream names it


def test_answers_and_cancellations_are_stream_events() -> None:
    session, quic = d18_server()
    on_stream(session, 0, Subscribe(0, NS, b"raw"))
    on_stream(session, 4, TrackStatus(2, NS, b"raw"), fin=True)
    session.subscribe_ok(0)
    session.track_status_ok(2, largest_location=Location(1, 1))
    assert written(quic, 4) == [RequestOk(-1, Location(1, 1))] and 4 in quic.finished
    events = session.handle_event(StopSendingReceived(error_code=1, stream_id=0))
    assert messages(events) == [Unsubscribe(0)] and quic.stops[0] == 1  # (aioquic itself reset our half)


def test_request_ids_in_any_order_but_never_twice() -> None:
    session, _ = d18_server()
    on_stream(session, 0, Subscribe(4, NS, b"a"))
    events = on_stream(session, 4, Subscribe(0, NS, b"b"))  # out of order: the streams are independent
    assert messages(events) == [Subscribe(0, NS, b"b")]
    assert terminated(on_stream(session, 8, Subscribe(4, NS, b"c"))).error is SessionError.INVALID_REQUEST_ID


def test_a_request_id_of_the_wrong_parity_closes() -> None:
    session, _ = d18_server()
    assert terminated(on_stream(session, 0, Subscribe(1, NS, b"a"))).error is SessionError.INVALID_REQUEST_ID


@pytest.mark.parametrize("first", [SubscribeOk(0, 1), RequestOk(0), PublishDone(0, 0, 0),
                                   RequestUpdate(0, 0)], ids=lambda m: m.KIND.value)
def test_a_request_stream_must_begin_with_a_request(first: ControlMessage) -> None:
    session, _ = d18_server()
    assert terminated(on_stream(session, 0, first)).error is PV


def test_the_first_answer_must_answer_the_request() -> None:
    session, quic = d18_client()
    request_id = session.subscribe(NS, b"raw")
    [stream_id] = [s for s in quic.stream_data if s != CLIENT_CONTROL]
    assert written(quic, stream_id) == [Subscribe(request_id, NS, b"raw")]
    assert terminated(on_stream(session, stream_id, PublishDone(-1, 0, 0))).error is PV


def test_a_request_stream_before_setup_is_reset() -> None:
    session, quic = recording_session(is_client=False, profile=D18)
    on_stream(session, 0, Subscribe(0, NS, b"raw"))
    assert 0 in quic.stops and 0 in quic.resets
    session.handle_event(StreamDataReceived(Setup().encode(D18), False, CLIENT_CONTROL))
    assert messages(on_stream(session, 0, Subscribe(0, NS, b"more"))) == []  # the rest of it is dropped


def test_padding_is_discarded() -> None:
    session, _ = d18_client()
    padding = encode_padding_stream_type(D18) + bytes(40)
    assert session.handle_event(StreamDataReceived(padding, False, 7)) == []
    assert session.handle_event(StreamDataReceived(bytes(10), True, 7)) == []
    assert session.handle_event(DatagramFrameReceived(encode_padding_datagram(30, D18))) == []
    assert session.is_established


@pytest.mark.parametrize(("case", "event"), [
    ("a second control stream", StreamDataReceived(Setup().encode(D18), False, 7)),
    ("the control stream closed", StreamDataReceived(b"", True, SERVER_CONTROL)),
    ("the control stream reset", StreamReset(error_code=0, stream_id=SERVER_CONTROL)),
    ("STOP_SENDING on our control stream", StopSendingReceived(error_code=0, stream_id=CLIENT_CONTROL)),
    ("an unknown stream type", StreamDataReceived(bytes.fromhex("3f"), False, 7)),
    ("a second SETUP", StreamDataReceived(Setup().encode(D18), False, SERVER_CONTROL)),
])
def test_what_closes_the_control_streams(case: str, event: Any) -> None:
    session, _ = d18_client()
    assert terminated(session.handle_event(event)).error is PV


def test_goaway_on_the_control_stream_names_a_request_id_of_ours() -> None:
    session, _ = d18_client()
    events = session.handle_event(StreamDataReceived(GoAway("", 0, 1).encode(D18), False, SERVER_CONTROL))
    assert terminated(events).error is SessionError.INVALID_REQUEST_ID  # 1 is the server's parity
    session, _ = d18_client()
    events = session.handle_event(StreamDataReceived(GoAway("", 250, 0).encode(D18), False, SERVER_CONTROL))
    assert messages(events) == [GoAway("", 250, 0)] and session.goaway_received


def test_requests_after_our_goaway_are_refused_going_away() -> None:
    session, quic = d18_server()
    session.goaway(timeout=None)
    assert written(quic, SERVER_CONTROL)[-1] == GoAway("", 0, 0)
    assert messages(on_stream(session, 0, Subscribe(0, NS, b"raw"))) == []
    assert written(quic, 0) == [RequestErrorReply(-1, 0x6, "going away")] and 0 in quic.finished


def test_a_peers_subscribe_tracks_reads_as_subscribe_namespace_for_tracks() -> None:
    session, quic = d18_server()
    events = on_stream(session, 0, SubscribeTracks(0, NS[:1]))
    assert messages(events) == [SubscribeNamespace(0, NS[:1], options=SubscribeOptions.PUBLISH)]
    events = on_stream(session, 4, SubscribeNamespace(2, NS[:1], options=SubscribeOptions.NAMESPACE))
    assert messages(events) == [SubscribeNamespace(2, NS[:1], options=SubscribeOptions.NAMESPACE)]  # its own space
    session.subscribe_namespace_ok(0)
    assert written(quic, 0) == [RequestOk(-1)]
    events = on_stream(session, 0, fin=True)  # FIN cancels a namespace subscription
    assert messages(events) == [UnsubscribeNamespace(NS[:1])] and 0 in quic.finished


def test_track_properties_only_in_track_status_ok() -> None:
    session, quic = d18_client()
    session.publish_namespace(NS)
    [stream_id] = [s for s in quic.stream_data if s != CLIENT_CONTROL]
    answer = RequestOk(-1, track_extensions=(KeyValuePair(0x4, 10),))
    assert terminated(on_stream(session, stream_id, answer)).error is PV


def test_the_drafts_gone_messages_cannot_be_sent() -> None:
    session, _ = d18_client()
    subscription = session.subscribe(NS, b"raw")
    with pytest.raises(LocalError, match="no SUBSCRIBE_UPDATE"):
        session.subscribe_update(subscription, start_location=Location(1, 0))
    assert session.peer_max_request_id > 2**61  # no MAX_REQUEST_ID: QUIC's stream limit is the bound
    session.grant_requests(10)  # nothing to send
    assert isinstance(ControlMessageReceived(RequestOk(0)), MoqtEvent)


# -- fuzz: any mix of stream octets, FINs, resets and STOP_SENDING ends cleanly ---------------------------

_starts = st.one_of(
    st.binary(max_size=24),
    st.builds(lambda body: Subscribe(0, NS, b"raw").encode(D18) + body, st.binary(max_size=24)),
    st.builds(lambda body: SubscribeTracks(4, NS[:1]).encode(D18) + body, st.binary(max_size=24)),
    st.builds(lambda body: RequestOk(-1).encode(D18) + body, st.binary(max_size=24)),
    st.builds(lambda body: SubscribeOk(-1, 1).encode(D18) + body, st.binary(max_size=24)))
_events = st.tuples(st.sampled_from([0, 1, 4, 5, 8, 2, 6]), _starts, st.sampled_from(["data", "fin", "reset", "stop"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(_events, max_size=10))
def test_fuzz_request_streams(events: list[tuple[int, bytes, str]]) -> None:
    """Our requests on streams 1 and 5, the peer's on 0, 4, 8; whatever arrives ends with the session
    open or in one close with a draft code -- never INTERNAL_ERROR (a bug of ours, such as a write on
    a stream already closed), never an exception out of ``handle_event``."""
    session, quic = d18_server()
    session.subscribe(NS, b"ours")
    session.publish_namespace(NS)
    seen: list[MoqtEvent] = []
    ended: set[int] = set()
    for stream_id, data, what in events:
        if stream_id in ended:
            continue  # QUIC delivers nothing after a FIN or reset
        if what == "reset" and not stream_id & 0x2:
            seen += session.handle_event(StreamReset(error_code=1, stream_id=stream_id))
            ended.add(stream_id)
        elif what == "stop" and not stream_id & 0x2:
            seen += session.handle_event(StopSendingReceived(error_code=1, stream_id=stream_id))
        else:
            seen += session.handle_event(StreamDataReceived(data, what == "fin", stream_id))
            if what == "fin":
                ended.add(stream_id)
        for request_id in (0, 4):  # answer what the peer asked, when it may be answered
            with contextlib.suppress(LocalError):
                session.subscribe_error(request_id)
    ends = only(seen, SessionTerminated)
    if quic.close_args is None:
        assert not ends and not session.is_closed
    else:
        assert len(ends) == 1 and ends[0].error in set(SessionError) - {SessionError.INTERNAL_ERROR}, ends
