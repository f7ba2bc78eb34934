"""MoqtSession, part 2: namespaces, TRACK_STATUS, token aliases, data streams, control stream rules.

Part 1 (test_moqt_session.py) has setup, SUBSCRIBE, FETCH, request IDs, GOAWAY and PUBLISH."""


from __future__ import annotations

import pytest
from aioquic.quic.events import StopSendingReceived, StreamDataReceived, StreamReset

from moqt import (
    ControlMessageReceived,
    DataStreamEnded,
    DataStreamReset,
    DataStreamStopped,
    GroupOrder,
    KeyValuePair,
    LocalError,
    Location,
    MoqtEvent,
    MoqtSession,
    ObjectReceived,
    ResolvedToken,
    SessionError,
    SessionEstablished,
    SessionTerminated,
    SetupParameters,
    StreamClosedError,
)
from moqt.data import SubgroupHeader, SubgroupWriter
from moqt.kinds import AliasType
from moqt.messages import (
    FetchCancel,
    FetchOk,
    PublishDone,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishNamespaceOk,
    ServerSetup,
    Subscribe,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
    SubscribeOk,
    TrackStatus,
    TrackStatusOk,
    UnsubscribeNamespace,
)
from moqt.params import AuthToken, RequestParameters
from moqt.testing import (
    MoqtPair,
    RecordingQuic,
    client_setup_bytes,
    established_client,
    established_server,
    feed_control,
    only,
    recording_session,
    terminated,
)
from moqt.testing import (
    received_messages as messages,
)
from tests.support.moqt_session import BLOCK_NS, PV, V14, pair

__all__ = ["pair"]  # the fixture

# --- namespaces and TRACK_STATUS (sections 9.20-9.31) --------------------------------------------------------

def test_namespace_discovery(pair: MoqtPair) -> None:
    client, server = pair.client.moqt, pair.server.moqt
    pn = server.publish_namespace(BLOCK_NS[:4])
    sn = client.subscribe_namespace(BLOCK_NS[:2])
    pair.pump()
    assert messages(pair.client.take()) == [PublishNamespace(pn, BLOCK_NS[:4])]
    assert messages(pair.server.take()) == [SubscribeNamespace(sn, BLOCK_NS[:2])]
    client.publish_namespace_ok(pn)
    server.subscribe_namespace_ok(sn)
    overlapping = client.subscribe_namespace(BLOCK_NS[:1])  # a prefix of an active one
    pair.pump()
    assert messages(pair.server.take()) == [PublishNamespaceOk(pn)]  # the overlap never reaches the application
    assert messages(pair.client.take()) == [
        SubscribeNamespaceOk(sn), SubscribeNamespaceError(overlapping, 5, "overlapping prefix")]
    client.publish_namespace_cancel(BLOCK_NS[:4], reason="expired")
    client.unsubscribe_namespace(BLOCK_NS[:2])
    pair.pump()
    assert messages(pair.server.take()) == [PublishNamespaceCancel(BLOCK_NS[:4], 0, "expired"),
                                            UnsubscribeNamespace(BLOCK_NS[:2])]
    pn2 = server.publish_namespace(BLOCK_NS[:3])
    pair.pump()
    pair.client.take()
    client.publish_namespace_ok(pn2)
    server.publish_namespace_done(BLOCK_NS[:3])
    pair.pump()
    assert messages(pair.client.take()) == [PublishNamespaceDone(BLOCK_NS[:3])]


def test_track_status(pair: MoqtPair) -> None:
    rid = pair.client.moqt.track_status(BLOCK_NS, b"raw")
    pair.pump()
    assert isinstance(messages(pair.server.take())[0], TrackStatus)
    pair.server.moqt.track_status_ok(rid, largest_location=Location(0, 31))
    pair.pump()
    assert messages(pair.client.take()) == [TrackStatusOk(rid, 0, 0, GroupOrder.ASCENDING, Location(0, 31))]


def test_answers_must_match_a_request() -> None:
    session, _ = established_client()
    rid = session.subscribe(BLOCK_NS, b"raw")
    assert terminated(feed_control(session, FetchOk(rid, Location(0, 0)).encode())).error == PV  # wrong kind
    session, _ = established_client()
    rid = session.subscribe(BLOCK_NS, b"raw")
    feed_control(session, SubscribeOk(rid, 1).encode())
    assert terminated(feed_control(session, SubscribeOk(rid, 2).encode())).error == PV  # answered twice
    session, _ = established_client()
    assert terminated(feed_control(session, PublishDone(40, 0, 0).encode())).error == PV  # never existed


def test_late_answer_after_unsubscribe_is_ignored() -> None:
    session, quic = established_client()
    rid = session.subscribe(BLOCK_NS, b"raw")
    session.unsubscribe(rid)
    assert feed_control(session, SubscribeOk(rid, 4).encode()) == []
    assert not session.is_closed and quic.close_args is None


# --- AUTHORIZATION TOKEN aliases (sections 9.2.1.1, 9.3.2.4, 9.3.2.5) ------------------------------------------

def register(alias: int, value: bytes) -> AuthToken:
    return AuthToken(AliasType.REGISTER, alias, 0, value)


def with_tokens(request_id: int, *tokens: AuthToken) -> bytes:
    return Subscribe(request_id, BLOCK_NS, f"t{request_id}".encode(),
                     parameters=RequestParameters(authorization_tokens=tokens)).encode()


def test_token_aliases_register_use_delete() -> None:
    session, quic = established_server(max_auth_token_cache_size=100)
    [setup] = [m for m in quic.control_messages(0) if isinstance(m, ServerSetup)]
    assert setup.parameters.max_auth_token_cache_size == 100
    [event] = feed_control(session, with_tokens(0, register(1, b"cwt-1")))
    assert isinstance(event, ControlMessageReceived) and event.authorization == (ResolvedToken(0, b"cwt-1"),)
    [event] = feed_control(session, with_tokens(2, AuthToken(AliasType.USE_ALIAS, 1)))
    assert isinstance(event, ControlMessageReceived) and event.authorization == (ResolvedToken(0, b"cwt-1"),)
    [event] = feed_control(session, with_tokens(4, AuthToken(AliasType.DELETE, 1), AuthToken.use_value(0, b"v")))
    assert isinstance(event, ControlMessageReceived) and event.authorization == (ResolvedToken(0, b"v"),)
    events = feed_control(session, with_tokens(6, AuthToken(AliasType.USE_ALIAS, 1)))
    assert terminated(events).error == SessionError.UNKNOWN_AUTH_TOKEN_ALIAS


@pytest.mark.parametrize(("tokens", "code"), [
    ((register(1, b"a"), register(1, b"b")), SessionError.DUPLICATE_AUTH_TOKEN_ALIAS),
    ((register(1, b"x" * 40), register(2, b"y" * 40)), SessionError.AUTH_TOKEN_CACHE_OVERFLOW),  # 56+56 > 100
    ((AuthToken(AliasType.DELETE, 9),), SessionError.UNKNOWN_AUTH_TOKEN_ALIAS),
])
def test_token_alias_violations(tokens: tuple[AuthToken, ...], code: SessionError) -> None:
    session, _ = established_server(max_auth_token_cache_size=100)
    assert terminated(feed_control(session, with_tokens(0, *tokens))).error == code


def test_client_setup_registration_over_the_limit_is_used_as_a_value() -> None:
    session, quic = recording_session(is_client=False)  # cache size 0: no aliases at all
    setup = client_setup_bytes(SetupParameters(max_request_id=9, authorization_tokens=(register(1, b"tok"),)))
    [established] = only(feed_control(session, setup), SessionEstablished)
    assert established.authorization == (ResolvedToken(0, b"tok"),)
    assert quic.close_args is None


# --- data streams before their Track Alias, resets, stop sending ---------------------------------------------

def test_stream_before_subscribe_ok_is_held_then_delivered() -> None:
    session, _ = established_client()
    rid = session.subscribe(BLOCK_NS, b"raw")
    writer = SubgroupWriter(SubgroupHeader.create(5, 0))
    octets = writer.encode_header() + b"".join(bytes(p) for p in writer.encode_object(0, b"held"))
    assert session.handle_event(StreamDataReceived(octets, True, 3)) == []
    events = feed_control(session, SubscribeOk(rid, 5).encode())
    [obj] = only(events, ObjectReceived)
    assert (obj.request_id, bytes(obj.payload), obj.end_of_stream) == (rid, b"held", True)
    assert only(events, DataStreamEnded) == [DataStreamEnded(3, rid)]


def test_streams_opening_after_publish_done_are_still_delivered() -> None:
    """PUBLISH_DONE often outruns late-opening streams; Stream Count says how many to wait for."""
    session, quic = established_client()
    rid = session.subscribe(BLOCK_NS, b"raw")
    feed_control(session, SubscribeOk(rid, 5).encode())
    feed_control(session, PublishDone(rid, 2, 2).encode())
    for stream_id, group in ((3, 0), (7, 1)):
        writer = SubgroupWriter(SubgroupHeader.create(5, group))
        octets = writer.encode_header() + b"".join(bytes(p) for p in writer.encode_object(0, b"late"))
        [obj] = only(session.handle_event(StreamDataReceived(octets, True, stream_id)), ObjectReceived)
        assert (obj.request_id, obj.group_id) == (rid, group)
    octets = SubgroupHeader.create(5, 2).encode()
    assert session.handle_event(StreamDataReceived(octets, False, 11)) == []  # a third stream: not expected
    assert 11 in quic.stops
    rid2 = session.subscribe(BLOCK_NS, b"again")
    assert not only(feed_control(session, SubscribeOk(rid2, 5).encode()), SessionTerminated)  # alias reusable


def test_unknown_stream_count_keeps_accepting_and_alias_can_be_reused() -> None:
    session, _ = established_client()
    rid = session.subscribe(BLOCK_NS, b"raw")
    feed_control(session, SubscribeOk(rid, 5).encode())
    feed_control(session, PublishDone(rid, 2, (1 << 62) - 1).encode())
    for stream_id in (3, 7, 11):
        octets = SubgroupHeader.create(5, stream_id).encode() + b"\x00\x01x"
        assert len(only(session.handle_event(StreamDataReceived(octets, True, stream_id)), ObjectReceived)) == 1
    rid2 = session.subscribe(BLOCK_NS, b"again")
    assert not only(feed_control(session, SubscribeOk(rid2, 5).encode()), SessionTerminated)


def test_stream_of_an_ended_subscription_is_stopped() -> None:
    session, quic = established_client()
    rid = session.subscribe(BLOCK_NS, b"raw")
    feed_control(session, SubscribeOk(rid, 5).encode())
    feed_control(session, PublishDone(rid, 2, 0).encode())  # no streams to wait for
    octets = SubgroupHeader.create(5, 0).encode() + b"\x00\x01x"
    assert session.handle_event(StreamDataReceived(octets, False, 3)) == []
    assert 3 in quic.stops


def test_reset_and_stop_sending_events() -> None:
    session, _ = established_client()
    rid = session.subscribe(BLOCK_NS, b"raw")
    feed_control(session, SubscribeOk(rid, 5).encode())
    session.handle_event(StreamDataReceived(SubgroupHeader.create(5, 0).encode(), False, 3))
    assert session.handle_event(StreamReset(error_code=2, stream_id=3)) == [DataStreamReset(3, rid, 2)]
    server, _ = established_server()
    feed_control(server, Subscribe(0, BLOCK_NS, b"raw").encode())
    server.subscribe_ok(0)
    stream = server.open_subgroup(0, 0)
    assert server.handle_event(StopSendingReceived(error_code=1, stream_id=stream)) == [
        DataStreamStopped(stream, 0, 1)]
    with pytest.raises(StreamClosedError):
        server.send_object(stream, 0, b"x")
    server.publish_done(0)  # the stopped stream no longer counts as open


def test_control_stream_rules() -> None:
    session, _ = established_client()
    assert terminated(session.handle_event(StreamDataReceived(b"", True, 0))).error == PV  # FIN
    session, _ = established_client()
    assert terminated(session.handle_event(StreamReset(error_code=0, stream_id=0))).error == PV
    server, _ = established_server()
    assert terminated(server.handle_event(StreamDataReceived(b"\x00", False, 4))).error == PV  # 2nd bidi
    server, _ = recording_session(is_client=False)
    events = server.handle_event(StreamDataReceived(Subscribe(0, BLOCK_NS, b"x").encode(), False, 0))
    assert terminated(events).error == PV  # anything before CLIENT_SETUP
    client, _ = recording_session(is_client=True)
    events = client.handle_event(StreamDataReceived(client_setup_bytes(), False, 0))
    assert terminated(events).error == PV  # CLIENT_SETUP sent to a client
    client, _ = recording_session(is_client=True)
    events = client.handle_event(StreamDataReceived(ServerSetup(0xFF00000D).encode(), False, 0))
    assert terminated(events).error == SessionError.VERSION_NEGOTIATION_FAILED
    client, _ = recording_session(is_client=True)
    events = client.handle_event(StreamDataReceived(ServerSetup(V14, SetupParameters(path="/x")).encode(), False, 0))
    assert terminated(events).error == SessionError.INVALID_PATH


def test_local_misuse_raises() -> None:
    session, _ = recording_session(is_client=True)
    with pytest.raises(LocalError):
        session.subscribe(BLOCK_NS, b"raw")  # not established
    session, _ = established_client()
    with pytest.raises(LocalError):
        session.open_subgroup(0, 0)  # no such subscription
    with pytest.raises(LocalError):
        session.publish_done(0)
    session.subscribe(BLOCK_NS, b"raw")
    with pytest.raises(LocalError):
        session.subscribe(BLOCK_NS, b"raw")  # one subscription per track
    with pytest.raises(ValueError):
        session.subscribe((), b"raw")
    assert session.subscribe(BLOCK_NS, b"other") == 2  # the refused calls took no Request ID
    with pytest.raises(ValueError, match="role"):
        MoqtSession(RecordingQuic(is_client=True), role="server")  # type: ignore[arg-type]


def test_session_fed_one_byte_at_a_time() -> None:
    server, quic = recording_session(is_client=False)
    transcript = client_setup_bytes() + Subscribe(0, BLOCK_NS, b"raw").encode() + FetchCancel(0).encode()
    events: list[MoqtEvent] = []
    for i in range(len(transcript)):
        events += server.handle_event(StreamDataReceived(transcript[i : i + 1], False, 0))
    assert [type(e) for e in events] == [SessionEstablished, ControlMessageReceived, SessionTerminated]
    assert quic.close_args is not None and quic.close_args[0] == 3  # FETCH_CANCEL for a SUBSCRIBE

    client, _ = established_client()
    rid = client.subscribe(BLOCK_NS, b"raw")
    feed_control(client, SubscribeOk(rid, 3).encode())
    writer = SubgroupWriter(SubgroupHeader.create(3, 0, extensions_present=True))
    octets = writer.encode_header() + b"".join(
        bytes(p) for i in range(3) for p in writer.encode_object(i, bytes([i]) * 100, extensions=(KeyValuePair(2, i),)))
    events = []
    for i in range(len(octets)):
        events += client.handle_event(StreamDataReceived(octets[i : i + 1], i == len(octets) - 1, 3))
    objs = only(events, ObjectReceived)
    assert [(o.object_id, bytes(o.payload), o.extensions) for o in objs] == [
        (i, bytes([i]) * 100, (KeyValuePair(2, i),)) for i in range(3)]
    assert only(events, DataStreamEnded) == [DataStreamEnded(3, rid)]
