"""Events returned by ``MoqtSession.handle_event`` (and the few methods that process deferred input).

Why so few types: control messages are already decoded into typed frozen dataclasses, so the session
wraps each accepted one in ``ControlMessageReceived`` after checking it against the session state
(request IDs, duplicate answers, track aliases); applications ``match`` on the message. Data-plane and
lifecycle events get their own types because they carry session-derived context (request ID, stream).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from moqt.data import Extensions
from moqt.kinds import ObjectStatus, SessionError
from moqt.messages import ClientSetup, ControlMessage
from moqt.params import ResolvedToken, SetupParameters


class MoqtEvent:
    """Base class of every MOQT session event."""

    __slots__ = ()


class ObjectSource(Enum):
    """How an object arrived: its forwarding preference, or a fetch response."""

    SUBGROUP = "subgroup"
    DATAGRAM = "datagram"
    FETCH = "fetch"


@dataclass(frozen=True, slots=True)
class SetupRequested(MoqtEvent):
    """Server with ``auto_accept=False``: a valid CLIENT_SETUP arrived; call ``accept_setup`` or
    ``reject_setup`` (e.g. after checking ``authorization``, its tokens with aliases resolved)."""

    message: ClientSetup
    authorization: tuple[ResolvedToken, ...] = ()


@dataclass(frozen=True, slots=True)
class SessionEstablished(MoqtEvent):
    """Setup finished: the negotiated version, the peer's setup parameters and its tokens."""

    version: int
    peer_parameters: SetupParameters
    authorization: tuple[ResolvedToken, ...] = ()


@dataclass(frozen=True, slots=True)
class SessionTerminated(MoqtEvent):
    """The session is over. ``remote`` is True when the peer (or the transport) closed it; False when
    this session closed it because of the peer's input (the error code is the one we sent).
    ``error`` is the code's draft-neutral name (None for a code the profile does not define)."""

    error_code: int
    reason_phrase: str
    remote: bool
    error: SessionError | None = None


@dataclass(frozen=True, slots=True)
class ControlMessageReceived(MoqtEvent):
    """A control message from the peer that passed the session's state checks; ``authorization`` is
    its AUTHORIZATION TOKEN parameters as (Token Type, Token Value), registered aliases looked up."""

    message: ControlMessage
    authorization: tuple[ResolvedToken, ...] = ()


@dataclass(frozen=True, slots=True)
class ObjectReceived(MoqtEvent):
    """A complete object. ``payload`` is a view of the received octets when the object arrived in one
    piece, else of a buffer assembled once; ``end_of_stream`` is True when the stream's FIN followed it.

    ``request_id`` is the subscription (SUBSCRIBE or PUBLISH) or the FETCH; ``track_alias`` is None for
    fetched objects; ``stream_id`` and ``subgroup_id`` are None for datagrams. ``end_of_group`` is set
    by a datagram's type or by the last object before FIN of an end-of-group subgroup stream.
    """

    source: ObjectSource
    request_id: int
    track_alias: int | None
    stream_id: int | None
    group_id: int
    subgroup_id: int | None
    object_id: int
    publisher_priority: int
    extensions: Extensions
    status: ObjectStatus
    payload: memoryview
    end_of_stream: bool = False
    end_of_group: bool = False


@dataclass(frozen=True, slots=True)
class ObjectChunkReceived(MoqtEvent):
    """With ``deliver_partial_objects=True``: a piece of an object's payload as it arrives (a view of
    the received octets, never copied); the last piece has ``end_of_object``. Objects with an empty
    payload arrive as one chunk with empty ``data``."""

    source: ObjectSource
    request_id: int
    track_alias: int | None
    stream_id: int
    group_id: int
    subgroup_id: int
    object_id: int
    publisher_priority: int
    extensions: Extensions
    status: ObjectStatus
    payload_length: int
    offset: int
    data: memoryview
    end_of_object: bool


@dataclass(frozen=True, slots=True)
class DataStreamEnded(MoqtEvent):
    """A subgroup or fetch stream ended with FIN at an object boundary (all of it was received)."""

    stream_id: int
    request_id: int
    end_of_group: bool = False


@dataclass(frozen=True, slots=True)
class DataStreamReset(MoqtEvent):
    """The peer reset a data stream we were receiving (objects after the last delivered may exist)."""

    stream_id: int
    request_id: int | None
    error_code: int


@dataclass(frozen=True, slots=True)
class DataStreamStopped(MoqtEvent):
    """The peer sent STOP_SENDING on a data stream we were sending; the stream is reset."""

    stream_id: int
    request_id: int
    error_code: int


@dataclass(frozen=True, slots=True)
class MalformedTrack(MoqtEvent):
    """Objects of ``request_id`` broke the draft's track rules; the session cancelled the request
    (FETCH_CANCEL or UNSUBSCRIBE) and stopped its stream, as the draft requires."""

    request_id: int
    reason: str
