"""Two draft-16 sessions in memory (real aioquic and TLS, ALPN "moqt-16"), and draft-16's session rules
checked byte by byte on a recording transport.

The pair runs what a KVSP holder and client do -- setup, SUBSCRIBE with objects, FETCH,
PUBLISH_NAMESPACE -- plus what draft-16 changed in shape: REQUEST_UPDATE (answered), REQUEST_OK /
REQUEST_ERROR in place of the per-kind answers, and SUBSCRIBE_NAMESPACE on a stream of its own.
"""

from __future__ import annotations

from typing import Any

import pytest
from aioquic.quic.events import StreamDataReceived, StreamReset

from moqt import DRAFT_14, LocalError, Location, MoqtSession, RequestError, SessionError
from moqt.events import ControlMessageReceived, MoqtEvent, ObjectReceived, SessionEstablished
from moqt.kinds import FilterType, MessageKind
from moqt.messages import (
    ClientSetup,
    ControlMessage,
    ControlStreamParser,
    Fetch,
    FetchError,
    FetchOk,
    NamespaceDone,
    NamespaceNotice,
    PublishDone,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishNamespaceOk,
    RequestErrorReply,
    RequestOk,
    RequestUpdate,
    ServerSetup,
    Subscribe,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
    SubscribeOk,
    TrackStatusOk,
    UnsubscribeNamespace,
)
from moqt.params import RequestParameters, SetupParameters, SubscriptionFilter
from moqt.profiles import DRAFT_16
from moqt.session.request_state import UpdateState
from moqt.testing import MoqtPair, RecordingQuic, feed_control, only, recording_session, terminated
from moqt.testing import received_messages as messages

D16 = DRAFT_16
V16 = 0xFF000010
NS = (b"kvsp", b"5ed5c2f2")
PV = SessionError.PROTOCOL_VIOLATION


def d16_pair(**server: Any) -> MoqtPair:
    pair = MoqtPair(client_options={"path": "/kvsp"}, server_options={"path": "/kvsp", **server}, profile=D16)
    assert pair.client.moqt.is_established and pair.server.moqt.is_established
    return pair


# -- two peers -----------------------------------------------------------------------------------------

def test_setup_negotiated_by_alpn() -> None:
    pair = d16_pair()
    [client_up] = only(pair.client.take(), SessionEstablished)
    [server_up] = only(pair.server.take(), SessionEstablished)
    assert client_up.version == server_up.version == V16 == pair.client.moqt.version
    assert pair.client.quic.tls.alpn_negotiated == "moqt-16"
    assert server_up.peer_parameters.path == "/kvsp" and client_up.peer_parameters.max_request_id == 199


def test_subscribe_objects_and_publish_done() -> None:
    pair = d16_pair()
    client, server = pair.client.moqt, pair.server.moqt
    pair.client.take(), pair.server.take()
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
    pair.pump()  # SUBSCRIBE_OK first: a datagram that outruns it has an unknown alias and is dropped
    server.send_datagram(request_id, 1, 0, b"dgram")
    pair.pump()  # and before PUBLISH_DONE, which retires the alias
    server.publish_done(request_id)
    pair.pump()
    events = pair.client.take()
    [ok, done] = messages(events)
    assert isinstance(ok, SubscribeOk) and ok.largest_location == Location(0, 1)
    assert isinstance(done, PublishDone) and done.status_code == 0x2 and done.stream_count == 1  # TRACK_ENDED
    objects = only(events, ObjectReceived)
    assert [bytes(o.payload) for o in objects] == [b"layer0", b"layer1", b"layer2", b"dgram"]
    assert objects[2].end_of_group and objects[2].end_of_stream


def test_fetch_with_a_range_end_and_a_refused_fetch() -> None:
    pair = d16_pair()
    client, server = pair.client.moqt, pair.server.moqt
    pair.client.take(), pair.server.take()
    request_id = client.fetch(NS, b"raw", Location(0, 0), Location(0, 8))
    pair.pump()
    [fetch] = messages(pair.server.take())
    assert isinstance(fetch, Fetch)
    stream = server.open_fetch_stream(request_id)
    server.send_fetch_object(stream, 0, 0, 0, b"l0")
    server.send_fetch_range_end(stream, 0, 5)  # objects 1..5 do not exist
    server.send_fetch_object(stream, 0, 0, 6, b"l6", end_of_stream=True)
    server.fetch_ok(request_id, Location(0, 7))
    pair.pump()
    events = pair.client.take()
    assert [(o.object_id, bytes(o.payload)) for o in only(events, ObjectReceived)] == [(0, b"l0"), (6, b"l6")]
    assert messages(events) == [FetchOk(request_id, Location(0, 7))]
    assert client.request_state(request_id) is None  # answered and its stream done
    refused = client.fetch(NS, b"gone", Location(0, 0), Location(0, 1))
    pair.pump()
    pair.server.take()
    server.fetch_error(refused, RequestError.TRACK_DOES_NOT_EXIST, "no such block")
    pair.pump()
    [error] = messages(pair.client.take())
    assert error == FetchError(refused, 0x10, "no such block")  # REQUEST_ERROR DOES_NOT_EXIST, as FETCH_ERROR


def test_publish_namespace_accepted_withdrawn_and_cancelled() -> None:
    pair = d16_pair()
    client, server = pair.client.moqt, pair.server.moqt
    pair.client.take(), pair.server.take()
    request_id = client.publish_namespace(NS)
    pair.pump()
    assert messages(pair.server.take()) == [PublishNamespace(request_id, NS)]
    server.publish_namespace_ok(request_id)
    pair.pump()
    assert messages(pair.client.take()) == [PublishNamespaceOk(request_id)]
    client.publish_namespace_done(NS)
    pair.pump()
    assert messages(pair.server.take()) == [PublishNamespaceDone(NS, request_id)]  # the session named it back
    again = client.publish_namespace(NS)
    pair.pump()
    server.publish_namespace_ok(again)
    server.publish_namespace_cancel(NS, RequestError.UNAUTHORIZED, "token expired")
    pair.pump()
    assert messages(pair.client.take())[-1] == PublishNamespaceCancel(NS, 0x1, "token expired", again)
    assert client.request_state(again) is None and server.request_state(again) is None


def test_request_update_is_answered() -> None:
    pair = d16_pair()
    client, server = pair.client.moqt, pair.server.moqt
    pair.client.take(), pair.server.take()
    subscription = client.subscribe(NS, b"raw")
    pair.pump()
    pair.server.take()
    server.subscribe_ok(subscription, largest_location=Location(3, 9))
    pair.pump()
    pair.client.take()
    narrower = RequestParameters(forward=False, subscription_filter=SubscriptionFilter(
        FilterType.ABSOLUTE_RANGE, Location(4, 0), 6))
    update = client.request_update(subscription, narrower)
    assert client.request_state(update) is UpdateState.SENT
    pair.pump()
    assert messages(pair.server.take()) == [RequestUpdate(update, subscription, narrower)]
    assert server.request_state(update) is UpdateState.RECEIVED
    with pytest.raises(LocalError, match="Forward State is 0"):
        server.open_subgroup(subscription, 4)  # the update paused the subscription
    server.update_ok(update, largest_location=Location(3, 9))
    pair.pump()
    assert messages(pair.client.take()) == [RequestOk(update, Location(3, 9))]
    assert client.request_state(update) is None and server.request_state(update) is None
    refused = client.request_update(subscription, RequestParameters(subscriber_priority=1))
    pair.pump()
    pair.server.take()
    server.update_error(refused, RequestError.NOT_SUPPORTED, "no", retry_interval=1)
    pair.pump()
    assert messages(pair.client.take()) == [RequestErrorReply(refused, 0x3, "no", 1)]
    assert client.request_state(subscription) is not None  # the publisher ends it with PUBLISH_DONE, if at all


def test_subscribe_namespace_runs_on_its_own_stream() -> None:
    pair = d16_pair()
    client, server = pair.client.moqt, pair.server.moqt
    pair.client.take(), pair.server.take()
    request_id = client.subscribe_namespace(NS[:1])
    pair.pump()
    assert messages(pair.server.take()) == [SubscribeNamespace(request_id, NS[:1])]
    server.subscribe_namespace_ok(request_id)
    server.namespace(request_id, NS[1:])
    server.namespace_done(request_id, NS[1:])
    pair.pump()
    assert messages(pair.client.take()) == [SubscribeNamespaceOk(request_id), NamespaceNotice(NS[1:], request_id),
                                            NamespaceDone(NS[1:], request_id)]
    with pytest.raises(LocalError, match="before its NAMESPACE"):
        server.namespace_done(request_id, (b"other",))
    overlapping = client.subscribe_namespace(NS)
    pair.pump()
    assert messages(pair.client.take()) == [SubscribeNamespaceError(overlapping, 0x30, "overlapping prefix")]
    client.unsubscribe_namespace(NS[:1])  # FIN of its stream
    pair.pump()
    assert messages(pair.server.take()) == [UnsubscribeNamespace(NS[:1])]
    with pytest.raises(LocalError):
        server.namespace(request_id, NS[1:])
    assert client.is_established and server.is_established


# -- byte by byte on a recording transport ---------------------------------------------------------------

def d16_server(**options: Any) -> tuple[MoqtSession, RecordingQuic]:
    session, quic = recording_session(is_client=False, profile=D16, **options)
    feed_control(session, ClientSetup((V16,), SetupParameters(max_request_id=199)).encode(D16))
    assert session.is_established
    return session, quic


def d16_client(**options: Any) -> tuple[MoqtSession, RecordingQuic]:
    session, quic = recording_session(is_client=True, profile=D16, **options)
    feed_control(session, ServerSetup(V16, SetupParameters(max_request_id=200)).encode(D16))
    assert session.is_established
    return session, quic


def written(quic: RecordingQuic, stream_id: int = 0) -> list[ControlMessage]:
    return ControlStreamParser(D16).feed(bytes(quic.stream_data[stream_id]))


def feed(session: MoqtSession, *items: ControlMessage) -> list[MoqtEvent]:
    return feed_control(session, b"".join(item.encode(D16) for item in items))


def test_the_setup_messages_carry_no_versions() -> None:
    _, quic = recording_session(is_client=True, profile=D16, path="/kvsp")
    octets = bytes(quic.stream_data[0])
    assert octets[:3] == bytes.fromhex("20000b") and octets[3] == 2  # Number of Parameters, not of Versions
    _, server_quic = d16_server()
    assert bytes(server_quic.stream_data[0])[:4] == bytes.fromhex("21000401")  # one parameter: MAX_REQUEST_ID


def test_answers_travel_as_request_ok_and_request_error() -> None:
    session, quic = d16_server()
    feed(session, Subscribe(0, NS, b"raw"), PublishNamespace(2, NS), Subscribe(4, NS, b"other"))
    session.subscribe_error(0, RequestError.TRACK_DOES_NOT_EXIST, "gone")
    session.publish_namespace_ok(2)
    session.subscribe_error(4, RequestError.UNAUTHORIZED)
    assert written(quic)[1:] == [RequestErrorReply(0, 0x10, "gone"), RequestOk(2), RequestErrorReply(4, 0x1)]


def test_a_second_subscription_to_a_track_is_refused_not_fatal() -> None:
    session, quic = d16_server()
    events = feed(session, Subscribe(0, NS, b"raw"), Subscribe(2, NS, b"raw"))
    assert messages(events) == [Subscribe(0, NS, b"raw")] and session.is_established
    assert written(quic)[-1] == RequestErrorReply(2, 0x19, "already subscribed to this track")


def test_draft_14_closes_on_a_second_subscription() -> None:
    session, _ = recording_session(is_client=False)
    feed_control(session, ClientSetup((DRAFT_14.version,), SetupParameters(max_request_id=199)).encode())
    events = feed_control(session, Subscribe(0, NS, b"raw").encode() + Subscribe(2, NS, b"raw").encode())
    assert terminated(events).error is PV


def test_track_status_answered_by_request_ok() -> None:
    session, _ = d16_client()
    request_id = session.track_status(NS, b"raw")
    events = feed(session, RequestOk(request_id, Location(2, 5)))
    assert messages(events) == [TrackStatusOk(request_id, 0, largest_location=Location(2, 5))]


@pytest.mark.parametrize(("case", "answer"), [
    ("REQUEST_OK does not answer SUBSCRIBE", RequestOk),
    ("an answer for no request", lambda r: RequestOk(r + 2)),
    ("a REQUEST_UPDATE of a request that never was", lambda r: RequestUpdate(1, r + 40)),
    ("NAMESPACE on the control stream", lambda r: NamespaceNotice((b"x",))),
])
def test_what_closes_a_draft_16_session(case: str, answer: Any) -> None:
    session, _ = d16_client()
    request_id = session.subscribe(NS, b"raw")
    assert terminated(feed(session, answer(request_id))).error is PV


def test_an_update_must_suit_the_request_it_updates() -> None:
    session, _ = d16_server()
    feed(session, Fetch.standalone_fetch(0, NS, b"raw", Location(0, 0), Location(0, 4)))
    with_filter = RequestUpdate(2, 0, RequestParameters(subscription_filter=SubscriptionFilter(
        FilterType.LARGEST_OBJECT)))
    assert "cannot carry subscription_filter" in terminated(feed(session, with_filter)).reason_phrase


def test_an_update_of_a_finished_request_is_refused_by_the_session() -> None:
    session, quic = d16_server()
    feed(session, Subscribe(0, NS, b"raw"))
    session.subscribe_error(0)
    events = feed(session, RequestUpdate(2, 0, RequestParameters(forward=False)))
    assert messages(events) == [] and session.is_established
    assert written(quic)[-1] == RequestErrorReply(2, 0x10, "that request is over")


def test_namespace_streams_byte_by_byte() -> None:
    session, quic = d16_client()
    request_id = session.subscribe_namespace(NS[:1])
    [stream_id] = [s for s in quic.stream_data if s != 0]
    assert stream_id % 4 == 0 and written(quic, stream_id) == [SubscribeNamespace(request_id, NS[:1])]
    answer = RequestOk(request_id).encode(D16) + NamespaceDone((b"x",)).encode(D16)
    events = session.handle_event(StreamDataReceived(answer, False, stream_id))
    assert terminated(events).reason_phrase == "NAMESPACE_DONE before its NAMESPACE"


def test_a_reset_namespace_stream_ends_the_subscription() -> None:
    session, quic = d16_server()
    octets = SubscribeNamespace(0, NS[:1]).encode(D16)
    events = session.handle_event(StreamDataReceived(octets, False, 4))
    assert messages(events) == [SubscribeNamespace(0, NS[:1])]
    session.subscribe_namespace_ok(0)
    assert written(quic, 4) == [RequestOk(0)]
    events = session.handle_event(StreamReset(error_code=0, stream_id=4))
    assert messages(events) == [UnsubscribeNamespace(NS[:1])] and session.request_state(0) is None
    assert 4 in quic.finished


def test_the_drafts_own_requests_are_refused_in_the_other() -> None:
    session, _ = d16_client()
    subscription = session.subscribe(NS, b"raw")
    with pytest.raises(LocalError, match="no SUBSCRIBE_UPDATE"):
        session.subscribe_update(subscription, start_location=Location(1, 0))
    with pytest.raises(LocalError, match="NO_OBJECTS"):
        DRAFT_16.request_error_code(MessageKind.FETCH_ERROR, RequestError.NO_OBJECTS)
    old, _ = recording_session(is_client=True)
    feed_control(old, ServerSetup(DRAFT_14.version, SetupParameters(max_request_id=200)).encode())
    old_subscription = old.subscribe(NS, b"raw")
    with pytest.raises(LocalError, match="no REQUEST_UPDATE"):
        old.request_update(old_subscription, RequestParameters(forward=False))
    assert isinstance(ControlMessageReceived(RequestOk(0)), MoqtEvent)
