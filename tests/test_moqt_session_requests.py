"""The request table (moqt.session.request_state), alone and through the session, pair by pair.

As with h2's stream state machine: every (kind, state, who, message) either follows the table or
raises the one error the table's absence means -- ProtocolViolation(PROTOCOL_VIOLATION) for the
peer's message, LocalError for ours -- and through a real session an absent pair closes the
connection with draft-14's PROTOCOL_VIOLATION code, never anything else.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moqt import DRAFT_14, LocalError, Location, MessageKind, MoqtSession, ProtocolViolation, SessionError
from moqt.events import SessionTerminated
from moqt.messages import (
    ControlMessage,
    FetchCancel,
    FetchError,
    FetchOk,
    Publish,
    PublishDone,
    PublishError,
    PublishNamespace,
    PublishNamespaceError,
    PublishNamespaceOk,
    PublishOk,
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
)
from moqt.messages.fetch import Fetch
from moqt.session.request_state import (
    INITIAL,
    STATES,
    TRANSITIONS,
    Origin,
    RequestKind,
    RequestState,
    next_state,
)
from moqt.testing import RecordingQuic, established_session, feed_control

NS = (b"kvsp", b"ns")
ALL_STATES = [(kind, state) for kind, states in STATES.items() for state in states]


# -- the table alone ----------------------------------------------------------------------------
def test_the_table_names_only_states_of_its_own_kind() -> None:
    for (kind, state, _, _), after in TRANSITIONS.items():
        assert isinstance(state, STATES[kind]) and isinstance(after, STATES[kind])
    for (kind, _), state in INITIAL.items():
        assert isinstance(state, STATES[kind])


def test_every_state_is_reachable_and_only_closed_is_final() -> None:
    for kind, states in STATES.items():
        seen: set[enum.Enum] = {INITIAL[(kind, Origin.LOCAL)], INITIAL[(kind, Origin.PEER)]}
        frontier = list(seen)
        while frontier:
            state = frontier.pop()
            for (k, s, _, _), after in TRANSITIONS.items():
                if k is kind and s is state and after not in seen:
                    seen.add(after)
                    frontier.append(after)
        assert seen == set(states), kind
        for member in states:
            exits = [key for key in TRANSITIONS if key[0] is kind and key[1] is member]
            assert (member.name == "CLOSED") == (not exits), (kind, member)


@given(st.sampled_from(ALL_STATES), st.sampled_from(Origin), st.sampled_from(MessageKind))
def test_any_pair_follows_the_table_or_raises_the_right_error(kind_state: tuple[RequestKind, RequestState],
                                                             origin: Origin, message: MessageKind) -> None:
    kind, state = kind_state
    expected = TRANSITIONS.get((kind, state, origin, message))
    try:
        after = next_state(kind, state, origin, message)
    except ProtocolViolation as exc:
        assert expected is None and origin is Origin.PEER
        assert exc.error is SessionError.PROTOCOL_VIOLATION
    except LocalError:
        assert expected is None and origin is Origin.LOCAL
    else:
        assert after is expected


@given(st.sampled_from(list(RequestKind)), st.sampled_from(Origin),
       st.lists(st.tuples(st.sampled_from(Origin), st.sampled_from(MessageKind)), max_size=6))
def test_random_walks_stay_in_the_table(kind: RequestKind, opener: Origin,
                                        moves: list[tuple[Origin, MessageKind]]) -> None:
    state = INITIAL[(kind, opener)]
    for origin, message in moves:
        try:
            state = next_state(kind, state, origin, message)
        except (ProtocolViolation, LocalError):
            continue
        assert isinstance(state, STATES[kind])


# -- through a session: bring a request into each state, then feed every peer message ----------
Setup = Callable[[MoqtSession, RecordingQuic], int]


def _peer(message: ControlMessage) -> Setup:
    def setup(session: MoqtSession, quic: RecordingQuic) -> int:
        feed_control(session, message.encode())
        return int(message.request_id)  # type: ignore[attr-defined]
    return setup


def _then(first: Setup, step: Callable[[MoqtSession, int], Any]) -> Setup:
    def setup(session: MoqtSession, quic: RecordingQuic) -> int:
        request_id = first(session, quic)
        step(session, request_id)
        return request_id
    return setup


def _local(call: Callable[[MoqtSession], int]) -> Setup:
    return lambda session, quic: call(session)


_sub = _local(lambda s: s.subscribe(NS, b"t"))
_pub = _local(lambda s: s.publish(NS, b"t"))
_fetch = _local(lambda s: s.fetch(NS, b"t", Location(0, 0), Location(0, 4)))
_pns = _local(lambda s: s.publish_namespace(NS))
_sns = _local(lambda s: s.subscribe_namespace(NS))
# the client's peer is the server: its Request IDs are odd, from 1
_their_sub = _peer(Subscribe(1, NS, b"t"))
_their_pub = _peer(Publish(1, NS, b"t", 5))
_their_fetch = _peer(Fetch.standalone_fetch(1, NS, b"t", Location(0, 0), Location(0, 4)))
_their_pns = _peer(PublishNamespace(1, NS))
_their_sns = _peer(SubscribeNamespace(1, NS))

SETUPS: dict[tuple[RequestKind, str], Setup] = {
    (RequestKind.SUBSCRIBE, "SENT"): _sub,
    (RequestKind.SUBSCRIBE, "CANCELLED"): _then(_sub, lambda s, r: s.unsubscribe(r)),
    (RequestKind.SUBSCRIBE, "SUBSCRIBED"): _then(_sub, lambda s, r: feed_control(s, SubscribeOk(r, 7).encode())),
    (RequestKind.SUBSCRIBE, "RECEIVED"): _their_sub,
    (RequestKind.SUBSCRIBE, "PUBLISHING"): _then(_their_sub, lambda s, r: s.subscribe_ok(r)),
    (RequestKind.PUBLISH, "SENT"): _pub,
    (RequestKind.PUBLISH, "CANCELLED"): _then(_pub, lambda s, r: s.publish_done(r)),
    (RequestKind.PUBLISH, "PUBLISHING"): _then(_pub, lambda s, r: feed_control(s, PublishOk(r).encode())),
    (RequestKind.PUBLISH, "RECEIVED"): _their_pub,
    (RequestKind.PUBLISH, "SUBSCRIBED"): _then(_their_pub, lambda s, r: s.publish_ok(r)),
    (RequestKind.FETCH, "SENT"): _fetch,
    (RequestKind.FETCH, "CANCELLED"): _then(_fetch, lambda s, r: s.fetch_cancel(r)),
    (RequestKind.FETCH, "RECEIVING"): _then(_fetch, lambda s, r: feed_control(s, FetchOk(r, Location(0, 4)).encode())),
    (RequestKind.FETCH, "RECEIVED"): _their_fetch,
    (RequestKind.FETCH, "SERVING"): _then(_their_fetch, lambda s, r: s.fetch_ok(r, Location(0, 4))),
    (RequestKind.TRACK_STATUS, "SENT"): _local(lambda s: s.track_status(NS, b"t")),
    (RequestKind.TRACK_STATUS, "RECEIVED"): _peer(TrackStatus(1, NS, b"t")),
    (RequestKind.PUBLISH_NAMESPACE, "SENT"): _pns,
    (RequestKind.PUBLISH_NAMESPACE, "CANCELLED"): _then(_pns, lambda s, r: s.publish_namespace_done(NS)),
    (RequestKind.PUBLISH_NAMESPACE, "ANNOUNCED"): _then(_pns, lambda s, r: feed_control(
        s, PublishNamespaceOk(r).encode())),
    (RequestKind.PUBLISH_NAMESPACE, "RECEIVED"): _their_pns,
    (RequestKind.PUBLISH_NAMESPACE, "ACCEPTED"): _then(_their_pns, lambda s, r: s.publish_namespace_ok(r)),
    (RequestKind.SUBSCRIBE_NAMESPACE, "SENT"): _sns,
    (RequestKind.SUBSCRIBE_NAMESPACE, "CANCELLED"): _then(_sns, lambda s, r: s.unsubscribe_namespace(NS)),
    (RequestKind.SUBSCRIBE_NAMESPACE, "SUBSCRIBED"): _then(_sns, lambda s, r: feed_control(
        s, SubscribeNamespaceOk(r).encode())),
    (RequestKind.SUBSCRIBE_NAMESPACE, "RECEIVED"): _their_sns,
    (RequestKind.SUBSCRIBE_NAMESPACE, "ACCEPTED"): _then(_their_sns, lambda s, r: s.subscribe_namespace_ok(r)),
}

# every peer message that names an existing request by its Request ID (the namespace messages name
# a namespace instead, and a namespace nobody has is not an error: they are left to the table test)
PEER_MESSAGES: dict[MessageKind, Callable[[int, int], ControlMessage]] = {
    MessageKind.SUBSCRIBE_OK: lambda r, n: SubscribeOk(r, 9),
    MessageKind.SUBSCRIBE_ERROR: lambda r, n: SubscribeError(r, 4, "no"),
    MessageKind.SUBSCRIBE_UPDATE: lambda r, n: SubscribeUpdate(n, r, Location(0, 0)),
    MessageKind.UNSUBSCRIBE: lambda r, n: Unsubscribe(r),
    MessageKind.PUBLISH_DONE: lambda r, n: PublishDone(r, 2, 0),
    MessageKind.PUBLISH_OK: lambda r, n: PublishOk(r),
    MessageKind.PUBLISH_ERROR: lambda r, n: PublishError(r, 4, "no"),
    MessageKind.FETCH_OK: lambda r, n: FetchOk(r, Location(0, 4)),
    MessageKind.FETCH_ERROR: lambda r, n: FetchError(r, 4, "no"),
    MessageKind.FETCH_CANCEL: lambda r, n: FetchCancel(r),
    MessageKind.TRACK_STATUS_OK: lambda r, n: TrackStatusOk(r, 0),
    MessageKind.TRACK_STATUS_ERROR: lambda r, n: TrackStatusError(r, 4, "no"),
    MessageKind.PUBLISH_NAMESPACE_OK: lambda r, n: PublishNamespaceOk(r),
    MessageKind.PUBLISH_NAMESPACE_ERROR: lambda r, n: PublishNamespaceError(r, 4, "no"),
    MessageKind.SUBSCRIBE_NAMESPACE_OK: lambda r, n: SubscribeNamespaceOk(r),
    MessageKind.SUBSCRIBE_NAMESPACE_ERROR: lambda r, n: SubscribeNamespaceError(r, 4, "no"),
}


def test_every_state_has_a_session_setup() -> None:
    # a REQUEST_UPDATE request exists only in draft-16 (its states: tests/test_moqt_draft16_session.py)
    assert set(SETUPS) == {(kind, state.name) for kind, state in ALL_STATES
                           if state.name != "CLOSED" and kind is not RequestKind.UPDATE}


@pytest.mark.parametrize("message", list(PEER_MESSAGES), ids=lambda m: m.value)
@pytest.mark.parametrize("where", list(SETUPS), ids=lambda w: f"{w[0].value}-{w[1]}")
def test_peer_message_in_each_state(where: tuple[RequestKind, str], message: MessageKind) -> None:
    kind, state_name = where
    session, quic = established_session(is_client=True)
    request_id = SETUPS[where](session, quic)
    state = session.request_state(request_id)
    assert state is not None and state.name == state_name
    next_peer_id = 3 if request_id == 1 else 1
    events = feed_control(session, PEER_MESSAGES[message](request_id, next_peer_id).encode())
    ends = [e for e in events if isinstance(e, SessionTerminated)]
    expected = TRANSITIONS.get((kind, state, Origin.PEER, message))
    if expected is None:
        assert len(ends) == 1 and ends[0].error is SessionError.PROTOCOL_VIOLATION, events
        assert quic.close_args is not None
        assert quic.close_args[0] == DRAFT_14.session_errors.code(SessionError.PROTOCOL_VIOLATION)
    else:
        assert ends == [] and session.is_established
        after = session.request_state(request_id)
        assert after is (None if expected.name == "CLOSED" else expected)
