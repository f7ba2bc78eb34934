"""Draft-18's request streams: one record per bidirectional stream, the first answer each kind of
request takes, and what the peer's reset of a request's stream means, as neutral messages.

Why apart from the strategy: ``d18.RequestStreams18Shape`` decides where a message goes; this module
holds the per-stream state (which half is open, the updates awaiting answers, the namespaces told)
and the two tables of translation, each small enough to check against the draft's text in one look.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from moqt.errors import LocalError, ProtocolViolation
from moqt.kinds import MessageKind, PublishDoneStatus, RequestError, StreamReset
from moqt.messages import (
    ControlMessage,
    ControlStreamParser,
    FetchCancel,
    FetchOk,
    NamespaceDone,
    NamespaceNotice,
    PublishDone,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishNamespaceOk,
    PublishOk,
    RequestErrorReply,
    RequestOk,
    SubscribeNamespaceOk,
    SubscribeOk,
    TrackStatusOk,
    Unsubscribe,
    UnsubscribeNamespace,
    request_stream_parser,
)
from moqt.session.request_state import RequestKind
from moqt.session.shapes.control import ERRORS, PV
from moqt.wire import Namespace

if TYPE_CHECKING:
    from moqt.session.requests import Request
    from moqt.session.state import SessionState

_K = RequestKind
_M = MessageKind

#: The neutral requests that open a stream, and the kind of request each is.
OPENING_KINDS: Final[dict[MessageKind, RequestKind]] = {
    _M.SUBSCRIBE: _K.SUBSCRIBE, _M.FETCH: _K.FETCH, _M.PUBLISH: _K.PUBLISH, _M.TRACK_STATUS: _K.TRACK_STATUS,
    _M.PUBLISH_NAMESPACE: _K.PUBLISH_NAMESPACE, _M.SUBSCRIBE_NAMESPACE: _K.SUBSCRIBE_NAMESPACE,
    _M.SUBSCRIBE_TRACKS: _K.SUBSCRIBE_NAMESPACE,
}


@dataclass(slots=True, eq=False)
class ControlIn:
    """The peer's unidirectional stream while its type is read, then its control stream's parser."""

    head: bytearray = field(default_factory=bytearray)
    parser: ControlStreamParser | None = None


@dataclass(slots=True, eq=False)
class RequestStream:
    """One request's bidirectional stream, either side's. ``kind`` None: a companion SUBSCRIBE_TRACKS
    sent beside our SUBSCRIBE_NAMESPACE for Subscribe Options BOTH."""

    stream_id: int
    local: bool  # we sent the request
    parser: ControlStreamParser
    request_id: int | None = None
    kind: RequestKind | None = None
    prefix: Namespace = ()
    answered: bool = False  # the request's first answer has been read (ours: sent, as the table says)
    send_closed: bool = False  # our half: FIN or RESET_STREAM sent (or reset by aioquic on STOP_SENDING)
    recv_closed: bool = False  # the peer's half: FIN or RESET_STREAM received
    stopped: bool = False  # we sent STOP_SENDING: what still arrives is dropped
    cancelled_by_us: bool = False
    goaway_seen: bool = False
    companion: RequestStream | None = None
    pending_updates: deque[int] = field(default_factory=deque)  # our REQUEST_UPDATEs, oldest first
    announced: set[Namespace] = field(default_factory=set)  # NAMESPACE told, no NAMESPACE_DONE yet

    @classmethod
    def opened_here(cls, core: SessionState, stream_id: int, request_id: int,
                    kind: RequestKind | None) -> RequestStream:
        parser = request_stream_parser(core.profile, peer_opened=False, request_id=request_id,
                                       max_message_length=core.limits.max_control_message_length)
        return cls(stream_id, True, parser, request_id, kind)

    @classmethod
    def opened_by_peer(cls, core: SessionState, stream_id: int) -> RequestStream:
        return cls(stream_id, False, cls._peer_parser(core))

    @staticmethod
    def _peer_parser(core: SessionState) -> ControlStreamParser:
        return request_stream_parser(core.profile, peer_opened=True,
                                     max_message_length=core.limits.max_control_message_length)

    def fresh_parser(self, core: SessionState) -> ControlStreamParser:
        if self.local:
            return request_stream_parser(core.profile, peer_opened=False, request_id=self.request_id,
                                         max_message_length=core.limits.max_control_message_length)
        parser = self._peer_parser(core)
        parser.request_id = self.request_id
        return parser

    def opened_by(self, message: ControlMessage) -> None:
        """The peer's request that opened the stream."""
        self.request_id = getattr(message, "request_id")  # noqa: B009 -- every opening message has one
        self.kind = OPENING_KINDS[message.KIND]
        self.prefix = getattr(message, "track_namespace_prefix", ())

    # -- our half --------------------------------------------------------------------------------
    def write(self, core: SessionState, message: ControlMessage) -> None:
        """Write on our half; after the peer stopped it (or we closed it) nothing more is said."""
        if not self.send_closed:
            core.send_stream(self.stream_id, message.encode(core.profile))

    def finish(self, core: SessionState) -> None:
        if not self.send_closed:
            self.send_closed = True
            core.send_stream(self.stream_id, b"", True)

    def stop(self, core: SessionState, code: StreamReset) -> None:
        if not self.recv_closed and not self.stopped:
            self.stopped = True
            core.stop_receiving(self.stream_id, code)

    def abort(self, core: SessionState, code: StreamReset) -> None:
        """Cancel: "abruptly terminating any directions of a stream that are still open"."""
        if not self.send_closed:
            self.send_closed = True
            with contextlib.suppress(ValueError):  # finished and discarded by aioquic: nothing to reset
                core.quic.reset_stream(self.stream_id, core.profile.stream_resets.code(code))
        self.stop(core, code)

    def check_suffix(self, message: NamespaceNotice | NamespaceDone, *, local: bool) -> None:
        """NAMESPACE_DONE only after its NAMESPACE: ours raise ``LocalError``, the peer's close the session."""
        suffix = message.track_namespace_suffix
        if isinstance(message, NamespaceNotice):
            self.announced.add(suffix)
        elif suffix in self.announced:
            self.announced.discard(suffix)
        elif local:
            raise LocalError("NAMESPACE_DONE before its NAMESPACE")
        else:
            raise ProtocolViolation(PV, "NAMESPACE_DONE before its NAMESPACE")


def first_answer(stream: RequestStream, message: ControlMessage) -> ControlMessage:
    """The neutral answer the first message on our request's stream stands for ("any message other
    than a REQUEST_OK or a REQUEST_ERROR as the first message ... PROTOCOL_VIOLATION")."""
    kind = stream.kind
    assert kind is not None and stream.request_id is not None
    request_id = stream.request_id
    if isinstance(message, RequestErrorReply):
        return ERRORS[kind](request_id, message.error_code, message.reason, message.retry_interval, message.redirect)
    if kind is _K.SUBSCRIBE and isinstance(message, SubscribeOk):
        return message
    if kind is _K.FETCH and isinstance(message, FetchOk):
        return message
    if kind is _K.PUBLISH and isinstance(message, PublishOk):
        return message
    if isinstance(message, RequestOk):
        if kind is _K.PUBLISH:
            return PublishOk.from_request_ok(message)
        if kind is _K.TRACK_STATUS:
            return TrackStatusOk(request_id, 0, largest_location=message.largest_location,
                                 parameters=message.parameters, track_extensions=message.track_extensions)
        if message.track_extensions:
            raise ProtocolViolation(PV, f"Track Properties in the REQUEST_OK of a {kind.value}")
        if kind is _K.SUBSCRIBE_NAMESPACE:
            return SubscribeNamespaceOk(request_id)
        if kind is _K.PUBLISH_NAMESPACE:
            return message
    raise ProtocolViolation(PV, f"{message.KIND.value} as the first answer to a {kind.value}")


def on_publish_namespace_ok(message: RequestOk) -> PublishNamespaceOk:
    return PublishNamespaceOk(message.request_id)


def closed_by_peer(core: SessionState, stream: RequestStream, request: Request, reason: str) -> list[ControlMessage]:
    """What the peer's reset (or STOP_SENDING) of a request's stream means, as the neutral message
    that ends the request in every draft (section "Request Cancellation and Rejection")."""
    profile = core.profile
    request_id, kind = request.request_id, request.kind
    error = profile.request_error_code(_M.REQUEST_ERROR, RequestError.INTERNAL_ERROR)
    done = PublishDone(request_id, profile.publish_done.code(PublishDoneStatus.INTERNAL_ERROR), request.streams_seen,
                       reason)
    if kind is _K.UPDATE:
        return []
    if not stream.local:  # the requester cancelled
        return _cancelled_by_requester(core, request, done)
    if not request.answered and kind in ERRORS:  # the responder refused, without a REQUEST_ERROR
        return [ERRORS[kind](request_id, error, reason)]
    if kind is _K.SUBSCRIBE:
        return [done]
    if kind is _K.PUBLISH:
        return [Unsubscribe(request_id)]
    if kind is _K.PUBLISH_NAMESPACE:
        return [PublishNamespaceCancel(request.namespace, error, reason, request_id)]
    if kind is _K.SUBSCRIBE_NAMESPACE:
        core.remove_request(request)  # the publisher ended it
    return []  # an answered FETCH: its data stream's end ends it


def _cancelled_by_requester(core: SessionState, request: Request, done: PublishDone) -> list[ControlMessage]:
    request_id, kind = request.request_id, request.kind
    if kind is _K.SUBSCRIBE:
        return [Unsubscribe(request_id)]
    if kind is _K.FETCH:
        return [FetchCancel(request_id)]
    if kind is _K.PUBLISH:
        return [done]
    if kind is _K.PUBLISH_NAMESPACE:
        return [PublishNamespaceDone(request.namespace, request_id)]
    if kind is _K.SUBSCRIBE_NAMESPACE:
        return [UnsubscribeNamespace(request.namespace)]
    core.remove_request(request)  # a TRACK_STATUS: nobody waits for its answer now
    return []


__all__ = ["OPENING_KINDS", "ControlIn", "RequestStream", "closed_by_peer", "first_answer", "on_publish_namespace_ok"]
