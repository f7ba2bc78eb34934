"""Every request's life as ONE table: (kind, state, who sent the message, message) -> next state.

Why a table (h2's ``stream.py``, our own lifecycle table): the draft's rules on which answer, update or
cancellation may follow which request are data here, not flags spread over handlers. A pair that is
absent is not a move the draft allows: from the peer it is a protocol violation (``next_state``
raises ``ProtocolViolation`` with PROTOCOL_VIOLATION, and the session closes with it); from the local
application it is a ``LocalError``.

The states say which side sent the request: SENT/RECEIVED until it is answered, then the state names
what the answer opened (SUBSCRIBED: we receive objects; PUBLISHING: we send them). CANCELLED is "we
ended it before the peer answered"; the peer's answer, still on its way, then closes it. Choices where
the draft is loose: PUBLISH_NAMESPACE_CANCEL and _DONE name a namespace, not a Request ID, so a
cancel of a namespace not yet answered is accepted, as an earlier version of this session did.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from moqt.errors import LocalError, ProtocolViolation
from moqt.kinds import MessageKind, SessionError


class RequestKind(enum.Enum):
    SUBSCRIBE = "SUBSCRIBE"
    TRACK_STATUS = "TRACK_STATUS"
    FETCH = "FETCH"
    PUBLISH = "PUBLISH"
    PUBLISH_NAMESPACE = "PUBLISH_NAMESPACE"
    SUBSCRIBE_NAMESPACE = "SUBSCRIBE_NAMESPACE"
    UPDATE = "REQUEST_UPDATE"  # draft-16: an update is a request, answered by REQUEST_OK / REQUEST_ERROR


class Origin(enum.Enum):
    """Who sent the message that moves the request."""

    PEER = "peer"
    LOCAL = "local"


class SubscribeState(enum.Enum):
    SENT = "sent"
    CANCELLED = "cancelled"  # UNSUBSCRIBE sent before SUBSCRIBE_OK/ERROR arrived
    RECEIVED = "received"
    SUBSCRIBED = "subscribed"  # ours, accepted: we receive objects
    PUBLISHING = "publishing"  # theirs, accepted: we send objects
    CLOSED = "closed"


class PublishState(enum.Enum):
    SENT = "sent"  # ours: we may already send objects
    CANCELLED = "cancelled"  # PUBLISH_DONE sent before PUBLISH_OK/ERROR arrived
    RECEIVED = "received"
    PUBLISHING = "publishing"  # ours, accepted
    SUBSCRIBED = "subscribed"  # theirs, accepted
    CLOSED = "closed"


class FetchState(enum.Enum):
    SENT = "sent"
    CANCELLED = "cancelled"  # FETCH_CANCEL sent before FETCH_OK/ERROR arrived
    RECEIVED = "received"
    RECEIVING = "receiving"  # ours, FETCH_OK arrived
    SERVING = "serving"  # theirs, FETCH_OK sent
    CLOSED = "closed"


class TrackStatusState(enum.Enum):
    SENT = "sent"
    RECEIVED = "received"
    CLOSED = "closed"


class UpdateState(enum.Enum):
    SENT = "sent"
    RECEIVED = "received"
    CLOSED = "closed"


class PublishNamespaceState(enum.Enum):
    SENT = "sent"
    CANCELLED = "cancelled"  # PUBLISH_NAMESPACE_DONE sent before the answer arrived
    RECEIVED = "received"
    ANNOUNCED = "announced"  # ours, accepted
    ACCEPTED = "accepted"  # theirs, accepted by us
    CLOSED = "closed"


class SubscribeNamespaceState(enum.Enum):
    SENT = "sent"
    CANCELLED = "cancelled"  # UNSUBSCRIBE_NAMESPACE sent before the answer arrived
    RECEIVED = "received"
    SUBSCRIBED = "subscribed"  # ours, accepted
    ACCEPTED = "accepted"  # theirs, accepted by us
    CLOSED = "closed"


RequestState = (SubscribeState | PublishState | FetchState | TrackStatusState | PublishNamespaceState
                | SubscribeNamespaceState | UpdateState)

STATES: Final[Mapping[RequestKind, type[enum.Enum]]] = MappingProxyType({
    RequestKind.SUBSCRIBE: SubscribeState, RequestKind.PUBLISH: PublishState, RequestKind.FETCH: FetchState,
    RequestKind.TRACK_STATUS: TrackStatusState, RequestKind.PUBLISH_NAMESPACE: PublishNamespaceState,
    RequestKind.SUBSCRIBE_NAMESPACE: SubscribeNamespaceState, RequestKind.UPDATE: UpdateState,
})

_K, _M, _P, _L = RequestKind, MessageKind, Origin.PEER, Origin.LOCAL
_S, _PB, _F, _T = SubscribeState, PublishState, FetchState, TrackStatusState
_PN, _SN, _U = PublishNamespaceState, SubscribeNamespaceState, UpdateState

TRANSITIONS: Final[Mapping[tuple[RequestKind, RequestState, Origin, MessageKind], RequestState]] = MappingProxyType({
    # SUBSCRIBE
    (_K.SUBSCRIBE, _S.SENT, _P, _M.SUBSCRIBE_OK): _S.SUBSCRIBED,
    (_K.SUBSCRIBE, _S.SENT, _P, _M.SUBSCRIBE_ERROR): _S.CLOSED,
    (_K.SUBSCRIBE, _S.CANCELLED, _P, _M.SUBSCRIBE_OK): _S.CLOSED,
    (_K.SUBSCRIBE, _S.CANCELLED, _P, _M.SUBSCRIBE_ERROR): _S.CLOSED,
    (_K.SUBSCRIBE, _S.SUBSCRIBED, _P, _M.PUBLISH_DONE): _S.CLOSED,
    (_K.SUBSCRIBE, _S.RECEIVED, _P, _M.UNSUBSCRIBE): _S.CLOSED,
    (_K.SUBSCRIBE, _S.PUBLISHING, _P, _M.UNSUBSCRIBE): _S.CLOSED,
    (_K.SUBSCRIBE, _S.RECEIVED, _P, _M.SUBSCRIBE_UPDATE): _S.RECEIVED,
    (_K.SUBSCRIBE, _S.PUBLISHING, _P, _M.SUBSCRIBE_UPDATE): _S.PUBLISHING,
    (_K.SUBSCRIBE, _S.RECEIVED, _L, _M.SUBSCRIBE_OK): _S.PUBLISHING,
    (_K.SUBSCRIBE, _S.RECEIVED, _L, _M.SUBSCRIBE_ERROR): _S.CLOSED,
    (_K.SUBSCRIBE, _S.PUBLISHING, _L, _M.PUBLISH_DONE): _S.CLOSED,
    (_K.SUBSCRIBE, _S.SENT, _L, _M.UNSUBSCRIBE): _S.CANCELLED,
    (_K.SUBSCRIBE, _S.SUBSCRIBED, _L, _M.UNSUBSCRIBE): _S.CLOSED,
    (_K.SUBSCRIBE, _S.SENT, _L, _M.SUBSCRIBE_UPDATE): _S.SENT,
    (_K.SUBSCRIBE, _S.SUBSCRIBED, _L, _M.SUBSCRIBE_UPDATE): _S.SUBSCRIBED,
    # PUBLISH: the publisher's SUBSCRIBE, turned round
    (_K.PUBLISH, _PB.SENT, _P, _M.PUBLISH_OK): _PB.PUBLISHING,
    (_K.PUBLISH, _PB.SENT, _P, _M.PUBLISH_ERROR): _PB.CLOSED,
    (_K.PUBLISH, _PB.CANCELLED, _P, _M.PUBLISH_OK): _PB.CLOSED,
    (_K.PUBLISH, _PB.CANCELLED, _P, _M.PUBLISH_ERROR): _PB.CLOSED,
    (_K.PUBLISH, _PB.PUBLISHING, _P, _M.UNSUBSCRIBE): _PB.CLOSED,
    (_K.PUBLISH, _PB.PUBLISHING, _P, _M.SUBSCRIBE_UPDATE): _PB.PUBLISHING,
    (_K.PUBLISH, _PB.RECEIVED, _P, _M.PUBLISH_DONE): _PB.CLOSED,
    (_K.PUBLISH, _PB.SUBSCRIBED, _P, _M.PUBLISH_DONE): _PB.CLOSED,
    (_K.PUBLISH, _PB.RECEIVED, _L, _M.PUBLISH_OK): _PB.SUBSCRIBED,
    (_K.PUBLISH, _PB.RECEIVED, _L, _M.PUBLISH_ERROR): _PB.CLOSED,
    (_K.PUBLISH, _PB.SUBSCRIBED, _L, _M.UNSUBSCRIBE): _PB.CLOSED,
    (_K.PUBLISH, _PB.SUBSCRIBED, _L, _M.SUBSCRIBE_UPDATE): _PB.SUBSCRIBED,
    (_K.PUBLISH, _PB.SENT, _L, _M.PUBLISH_DONE): _PB.CANCELLED,
    (_K.PUBLISH, _PB.PUBLISHING, _L, _M.PUBLISH_DONE): _PB.CLOSED,
    # FETCH (the end of the fetch stream is data-plane state, kept beside the request)
    (_K.FETCH, _F.SENT, _P, _M.FETCH_OK): _F.RECEIVING,
    (_K.FETCH, _F.SENT, _P, _M.FETCH_ERROR): _F.CLOSED,
    (_K.FETCH, _F.CANCELLED, _P, _M.FETCH_OK): _F.CLOSED,
    (_K.FETCH, _F.CANCELLED, _P, _M.FETCH_ERROR): _F.CLOSED,
    (_K.FETCH, _F.RECEIVED, _P, _M.FETCH_CANCEL): _F.CLOSED,
    (_K.FETCH, _F.SERVING, _P, _M.FETCH_CANCEL): _F.CLOSED,
    (_K.FETCH, _F.RECEIVED, _L, _M.FETCH_OK): _F.SERVING,
    (_K.FETCH, _F.RECEIVED, _L, _M.FETCH_ERROR): _F.CLOSED,
    (_K.FETCH, _F.SENT, _L, _M.FETCH_CANCEL): _F.CANCELLED,
    (_K.FETCH, _F.RECEIVING, _L, _M.FETCH_CANCEL): _F.CLOSED,
    # TRACK_STATUS: one answer, nothing after it
    (_K.TRACK_STATUS, _T.SENT, _P, _M.TRACK_STATUS_OK): _T.CLOSED,
    (_K.TRACK_STATUS, _T.SENT, _P, _M.TRACK_STATUS_ERROR): _T.CLOSED,
    (_K.TRACK_STATUS, _T.RECEIVED, _L, _M.TRACK_STATUS_OK): _T.CLOSED,
    (_K.TRACK_STATUS, _T.RECEIVED, _L, _M.TRACK_STATUS_ERROR): _T.CLOSED,
    # PUBLISH_NAMESPACE
    (_K.PUBLISH_NAMESPACE, _PN.SENT, _P, _M.PUBLISH_NAMESPACE_OK): _PN.ANNOUNCED,
    (_K.PUBLISH_NAMESPACE, _PN.SENT, _P, _M.PUBLISH_NAMESPACE_ERROR): _PN.CLOSED,
    (_K.PUBLISH_NAMESPACE, _PN.CANCELLED, _P, _M.PUBLISH_NAMESPACE_OK): _PN.CLOSED,
    (_K.PUBLISH_NAMESPACE, _PN.CANCELLED, _P, _M.PUBLISH_NAMESPACE_ERROR): _PN.CLOSED,
    (_K.PUBLISH_NAMESPACE, _PN.SENT, _P, _M.PUBLISH_NAMESPACE_CANCEL): _PN.CLOSED,
    (_K.PUBLISH_NAMESPACE, _PN.ANNOUNCED, _P, _M.PUBLISH_NAMESPACE_CANCEL): _PN.CLOSED,
    (_K.PUBLISH_NAMESPACE, _PN.RECEIVED, _P, _M.PUBLISH_NAMESPACE_DONE): _PN.CLOSED,
    (_K.PUBLISH_NAMESPACE, _PN.ACCEPTED, _P, _M.PUBLISH_NAMESPACE_DONE): _PN.CLOSED,
    (_K.PUBLISH_NAMESPACE, _PN.RECEIVED, _L, _M.PUBLISH_NAMESPACE_OK): _PN.ACCEPTED,
    (_K.PUBLISH_NAMESPACE, _PN.RECEIVED, _L, _M.PUBLISH_NAMESPACE_ERROR): _PN.CLOSED,
    (_K.PUBLISH_NAMESPACE, _PN.RECEIVED, _L, _M.PUBLISH_NAMESPACE_CANCEL): _PN.CLOSED,
    (_K.PUBLISH_NAMESPACE, _PN.ACCEPTED, _L, _M.PUBLISH_NAMESPACE_CANCEL): _PN.CLOSED,
    (_K.PUBLISH_NAMESPACE, _PN.SENT, _L, _M.PUBLISH_NAMESPACE_DONE): _PN.CANCELLED,
    (_K.PUBLISH_NAMESPACE, _PN.ANNOUNCED, _L, _M.PUBLISH_NAMESPACE_DONE): _PN.CLOSED,
    # SUBSCRIBE_NAMESPACE
    (_K.SUBSCRIBE_NAMESPACE, _SN.SENT, _P, _M.SUBSCRIBE_NAMESPACE_OK): _SN.SUBSCRIBED,
    (_K.SUBSCRIBE_NAMESPACE, _SN.SENT, _P, _M.SUBSCRIBE_NAMESPACE_ERROR): _SN.CLOSED,
    (_K.SUBSCRIBE_NAMESPACE, _SN.CANCELLED, _P, _M.SUBSCRIBE_NAMESPACE_OK): _SN.CLOSED,
    (_K.SUBSCRIBE_NAMESPACE, _SN.CANCELLED, _P, _M.SUBSCRIBE_NAMESPACE_ERROR): _SN.CLOSED,
    (_K.SUBSCRIBE_NAMESPACE, _SN.RECEIVED, _P, _M.UNSUBSCRIBE_NAMESPACE): _SN.CLOSED,
    (_K.SUBSCRIBE_NAMESPACE, _SN.ACCEPTED, _P, _M.UNSUBSCRIBE_NAMESPACE): _SN.CLOSED,
    (_K.SUBSCRIBE_NAMESPACE, _SN.RECEIVED, _L, _M.SUBSCRIBE_NAMESPACE_OK): _SN.ACCEPTED,
    (_K.SUBSCRIBE_NAMESPACE, _SN.RECEIVED, _L, _M.SUBSCRIBE_NAMESPACE_ERROR): _SN.CLOSED,
    (_K.SUBSCRIBE_NAMESPACE, _SN.SENT, _L, _M.UNSUBSCRIBE_NAMESPACE): _SN.CANCELLED,
    (_K.SUBSCRIBE_NAMESPACE, _SN.SUBSCRIBED, _L, _M.UNSUBSCRIBE_NAMESPACE): _SN.CLOSED,
    # REQUEST_UPDATE (draft-16): one answer; and which requests its sender may update, in which state
    (_K.UPDATE, _U.SENT, _P, _M.REQUEST_OK): _U.CLOSED,
    (_K.UPDATE, _U.SENT, _P, _M.REQUEST_ERROR): _U.CLOSED,
    (_K.UPDATE, _U.RECEIVED, _L, _M.REQUEST_OK): _U.CLOSED,
    (_K.UPDATE, _U.RECEIVED, _L, _M.REQUEST_ERROR): _U.CLOSED,
    **{(kind, state, origin, _M.REQUEST_UPDATE): state for kind, state, origin in (
        (_K.SUBSCRIBE, _S.SENT, _L), (_K.SUBSCRIBE, _S.SUBSCRIBED, _L),
        (_K.SUBSCRIBE, _S.RECEIVED, _P), (_K.SUBSCRIBE, _S.PUBLISHING, _P),
        (_K.PUBLISH, _PB.SUBSCRIBED, _L), (_K.PUBLISH, _PB.PUBLISHING, _P),
        (_K.FETCH, _F.SENT, _L), (_K.FETCH, _F.RECEIVING, _L), (_K.FETCH, _F.RECEIVED, _P), (_K.FETCH, _F.SERVING, _P),
        (_K.PUBLISH_NAMESPACE, _PN.SENT, _L), (_K.PUBLISH_NAMESPACE, _PN.ANNOUNCED, _L),
        (_K.PUBLISH_NAMESPACE, _PN.RECEIVED, _P), (_K.PUBLISH_NAMESPACE, _PN.ACCEPTED, _P),
        (_K.SUBSCRIBE_NAMESPACE, _SN.SENT, _L), (_K.SUBSCRIBE_NAMESPACE, _SN.SUBSCRIBED, _L),
        (_K.SUBSCRIBE_NAMESPACE, _SN.RECEIVED, _P), (_K.SUBSCRIBE_NAMESPACE, _SN.ACCEPTED, _P))},
})

#: The state a request starts in, by who sent it.
INITIAL: Final[Mapping[tuple[RequestKind, Origin], RequestState]] = MappingProxyType({
    (_K.SUBSCRIBE, _L): _S.SENT, (_K.SUBSCRIBE, _P): _S.RECEIVED,
    (_K.PUBLISH, _L): _PB.SENT, (_K.PUBLISH, _P): _PB.RECEIVED,
    (_K.FETCH, _L): _F.SENT, (_K.FETCH, _P): _F.RECEIVED,
    (_K.TRACK_STATUS, _L): _T.SENT, (_K.TRACK_STATUS, _P): _T.RECEIVED,
    (_K.PUBLISH_NAMESPACE, _L): _PN.SENT, (_K.PUBLISH_NAMESPACE, _P): _PN.RECEIVED,
    (_K.SUBSCRIBE_NAMESPACE, _L): _SN.SENT, (_K.SUBSCRIBE_NAMESPACE, _P): _SN.RECEIVED,
    (_K.UPDATE, _L): _U.SENT, (_K.UPDATE, _P): _U.RECEIVED,
})

#: Subscriptions whose objects we send / receive, by (kind, state).
WE_PUBLISH: Final[frozenset[tuple[RequestKind, RequestState]]] = frozenset({
    (_K.SUBSCRIBE, _S.RECEIVED), (_K.SUBSCRIBE, _S.PUBLISHING), (_K.PUBLISH, _PB.SENT), (_K.PUBLISH, _PB.PUBLISHING)})
WE_SUBSCRIBE: Final[frozenset[tuple[RequestKind, RequestState]]] = frozenset({
    (_K.SUBSCRIBE, _S.SENT), (_K.SUBSCRIBE, _S.CANCELLED), (_K.SUBSCRIBE, _S.SUBSCRIBED),
    (_K.PUBLISH, _PB.RECEIVED), (_K.PUBLISH, _PB.SUBSCRIBED)})
#: States that wait for the other side's answer (SENT, CANCELLED) or for ours (RECEIVED).
UNANSWERED: Final[frozenset[str]] = frozenset({"SENT", "CANCELLED", "RECEIVED"})


def next_state(kind: RequestKind, state: RequestState, origin: Origin, message: MessageKind,
               request_id: int | None = None) -> RequestState:
    """The state after ``message``; a move the table lacks raises (see the module docstring)."""
    try:
        return TRANSITIONS[(kind, state, origin, message)]
    except KeyError:
        pass
    what = f"{message.value} for {kind.value}{'' if request_id is None else f' {request_id}'} in state {state.value}"
    if origin is Origin.PEER:
        raise ProtocolViolation(SessionError.PROTOCOL_VIOLATION, what) from None
    raise LocalError(f"cannot send {what}") from None


def allowed(kind: RequestKind, state: RequestState, origin: Origin, message: MessageKind) -> bool:
    return (kind, state, origin, message) in TRANSITIONS
