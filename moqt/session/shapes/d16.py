"""Draft-16's strategy: REQUEST_OK / REQUEST_ERROR answer every request, REQUEST_UPDATE is itself a
request, and each SUBSCRIBE_NAMESPACE runs on a bidirectional stream of its own.

Why a strategy: the session speaks in draft-neutral messages -- SUBSCRIBE_ERROR, FETCH_ERROR,
PUBLISH_NAMESPACE_OK, ... -- and ``RequestStreamsShape`` turns them into draft-16's on the way out,
and back on the way in by the kind of request the Request ID names, so the rest of the session, the
api and the relay see the same messages in every draft.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from moqt.errors import LocalError, ProtocolViolation
from moqt.kinds import GroupOrder
from moqt.messages import (
    ControlMessage,
    ControlStreamParser,
    FetchOk,
    NamespaceDone,
    NamespaceNotice,
    NamespaceSuffixMessage,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishNamespaceOk,
    RequestErrorMessage,
    RequestErrorReply,
    RequestOk,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
    TrackStatusOk,
    UnsubscribeNamespace,
)
from moqt.session.request_state import RequestKind
from moqt.session.shapes.control import ERRORS, PV, ControlShape
from moqt.wire import Namespace

if TYPE_CHECKING:
    from moqt.session.state import SessionState

_K = RequestKind


@dataclass(slots=True, eq=False)
class _RequestStream:
    """One SUBSCRIBE_NAMESPACE's bidirectional stream, either side's."""

    stream_id: int
    local: bool  # we sent the SUBSCRIBE_NAMESPACE
    parser: ControlStreamParser
    request_id: int | None = None
    prefix: Namespace = ()
    answered: bool = False
    fin_sent: bool = False
    announced: set[Namespace] = field(default_factory=set)  # suffixes NAMESPACE has named, not yet DONE


class RequestStreamsShape(ControlShape):
    """Draft-16: REQUEST_OK / REQUEST_ERROR answer every request, REQUEST_UPDATE is itself a request,
    and each SUBSCRIBE_NAMESPACE runs on its own bidirectional stream (its answer, NAMESPACE and
    NAMESPACE_DONE come back on it; closing the stream ends it)."""

    def __init__(self, core: SessionState) -> None:
        super().__init__(core)
        self._streams: dict[int, _RequestStream] = {}
        self._by_request: dict[int, int] = {}

    # -- out -------------------------------------------------------------------------------------
    def send(self, message: ControlMessage) -> None:
        core = self._core
        if isinstance(message, SubscribeNamespace):
            self._open(message)
        elif isinstance(message, UnsubscribeNamespace):
            self._close_local(message.track_namespace_prefix)
        elif isinstance(message, SubscribeNamespaceOk | SubscribeNamespaceError):
            self._answer_on_stream(message)
        elif isinstance(message, RequestErrorMessage) and not isinstance(message, RequestErrorReply):
            core.write_control(RequestErrorReply(message.request_id, message.error_code, message.reason,
                                                 message.retry_interval))
        elif isinstance(message, TrackStatusOk):
            core.write_control(RequestOk(message.request_id, message.largest_location, message.parameters))
        elif isinstance(message, PublishNamespaceOk):
            core.write_control(RequestOk(message.request_id))
        else:
            super().send(message)

    def _open(self, message: SubscribeNamespace) -> None:
        core = self._core
        stream_id = core.quic.get_next_available_stream_id()
        stream = _RequestStream(stream_id, True, self._parser(), message.request_id, message.track_namespace_prefix)
        self._streams[stream_id] = stream
        self._by_request[message.request_id] = stream_id
        core.send_stream(stream_id, message.encode(core.profile))

    def _close_local(self, prefix: Namespace) -> None:
        for stream in self._streams.values():
            if stream.local and stream.prefix == prefix and not stream.fin_sent:
                self._finish(stream)
                return

    def _answer_on_stream(self, message: SubscribeNamespaceOk | SubscribeNamespaceError) -> None:
        stream = self._stream_of(message.request_id)
        if isinstance(message, SubscribeNamespaceOk):
            self._write(stream, RequestOk(message.request_id))
            return
        self._write(stream, RequestErrorReply(message.request_id, message.error_code, message.reason,
                                              message.retry_interval))
        self._finish(stream)  # "If it is an error, the stream will be immediately closed via FIN"

    def send_on_request_stream(self, request_id: int, message: ControlMessage) -> None:
        if not isinstance(message, NamespaceSuffixMessage):
            super().send_on_request_stream(request_id, message)
            return
        stream = self._stream_of(request_id)
        if stream.local or stream.fin_sent:
            raise LocalError(f"{request_id} is not a namespace subscription we serve")
        suffix = message.track_namespace_suffix
        if isinstance(message, NamespaceDone):
            if suffix not in stream.announced:
                raise LocalError("NAMESPACE_DONE before its NAMESPACE")
            stream.announced.discard(suffix)
        else:
            stream.announced.add(suffix)
        self._write(stream, dataclasses.replace(message, request_id=None))

    def _stream_of(self, request_id: int) -> _RequestStream:
        stream_id = self._by_request.get(request_id)
        if stream_id is None:
            raise LocalError(f"no SUBSCRIBE_NAMESPACE stream for Request ID {request_id}")
        return self._streams[stream_id]

    def _write(self, stream: _RequestStream, message: ControlMessage) -> None:
        self._core.send_stream(stream.stream_id, message.encode(self._core.profile))

    def _finish(self, stream: _RequestStream) -> None:
        if not stream.fin_sent:
            stream.fin_sent = True
            self._core.send_stream(stream.stream_id, b"", True)

    def _parser(self) -> ControlStreamParser:
        core = self._core
        return ControlStreamParser(core.profile, max_message_length=core.limits.max_control_message_length)

    # -- in: the control stream ------------------------------------------------------------------
    def receive(self, message: ControlMessage) -> ControlMessage | None:
        if isinstance(message, RequestOk | RequestErrorReply):
            return self._answer(message)
        if isinstance(message, NamespaceSuffixMessage):
            raise ProtocolViolation(PV, f"{message.KIND.value} on the control stream")
        if isinstance(message, PublishNamespaceDone | PublishNamespaceCancel) and message.request_id is not None:
            request = self._core.requests.get(message.request_id)
            if request is None:
                return message  # the handler tells a late end (ignored) from an unknown ID (violation)
            return dataclasses.replace(message, track_namespace=request.namespace)
        if isinstance(message, FetchOk):
            request = self._core.requests.get(message.request_id)
            if request is not None and request.group_order is not GroupOrder.PUBLISHER_DEFAULT:
                return dataclasses.replace(message, group_order=request.group_order)  # FETCH_OK has none
        return message

    def _answer(self, message: RequestOk | RequestErrorReply) -> ControlMessage:
        request = self._core.requests.get(message.request_id)
        if request is None:
            raise ProtocolViolation(PV, f"{message.KIND.value} for Request ID {message.request_id}, "
                                         "which awaits no answer")
        kind = request.kind
        if kind is _K.UPDATE:
            return message
        if kind is _K.SUBSCRIBE_NAMESPACE:
            raise ProtocolViolation(PV, "a SUBSCRIBE_NAMESPACE is answered on its own stream")
        if isinstance(message, RequestErrorReply):
            return ERRORS[kind](message.request_id, message.error_code, message.reason, message.retry_interval)
        if kind is _K.TRACK_STATUS:
            return TrackStatusOk(message.request_id, 0, largest_location=message.largest_location,
                                 parameters=message.parameters)
        if kind is _K.PUBLISH_NAMESPACE:
            return PublishNamespaceOk(message.request_id)
        raise ProtocolViolation(PV, f"REQUEST_OK does not answer {kind.value}")

    # -- in: SUBSCRIBE_NAMESPACE streams ---------------------------------------------------------
    def owns(self, stream_id: int) -> bool:
        """Ours (a SUBSCRIBE_NAMESPACE we sent), or any bidirectional stream the peer opens."""
        return stream_id in self._streams or (stream_id & 0x1) == int(self._core.is_client)

    def request_stream(self, stream_id: int, data: bytes, end_stream: bool) -> list[ControlMessage]:
        stream = self._streams.get(stream_id)
        if stream is None:
            stream = self._streams[stream_id] = _RequestStream(stream_id, False, self._parser())
        out: list[ControlMessage] = []
        for message in stream.parser.feed(data):
            handled = self._on_stream_message(stream, message)
            if handled is not None:
                out.append(handled)
        if end_stream:
            if stream.parser.buffered:
                raise ProtocolViolation(PV, "a SUBSCRIBE_NAMESPACE stream ended inside a message")
            out += self._ended(stream)
        return out

    def _on_stream_message(self, stream: _RequestStream, message: ControlMessage) -> ControlMessage | None:
        if not stream.local:
            if stream.request_id is not None or not isinstance(message, SubscribeNamespace):
                raise ProtocolViolation(PV, f"{message.KIND.value} on a SUBSCRIBE_NAMESPACE stream")
            stream.request_id, stream.prefix = message.request_id, message.track_namespace_prefix
            self._by_request[message.request_id] = stream.stream_id
            return message
        assert stream.request_id is not None
        if isinstance(message, RequestOk | RequestErrorReply):
            if stream.answered or message.request_id != stream.request_id:
                raise ProtocolViolation(PV, f"a second answer, or one for another request, on stream "
                                             f"{stream.stream_id}")
            stream.answered = True
            if isinstance(message, RequestOk):
                return SubscribeNamespaceOk(message.request_id)
            return SubscribeNamespaceError(message.request_id, message.error_code, message.reason,
                                           message.retry_interval)
        if isinstance(message, NamespaceNotice | NamespaceDone) and stream.answered:
            return self._suffix(stream, message)
        raise ProtocolViolation(PV, f"{message.KIND.value} on a SUBSCRIBE_NAMESPACE stream")

    def _suffix(self, stream: _RequestStream, message: NamespaceNotice | NamespaceDone) -> ControlMessage | None:
        suffix = message.track_namespace_suffix
        if isinstance(message, NamespaceNotice):
            stream.announced.add(suffix)
        elif suffix in stream.announced:
            stream.announced.discard(suffix)
        else:
            raise ProtocolViolation(PV, "NAMESPACE_DONE before its NAMESPACE")
        if stream.request_id not in self._core.requests:
            return None  # we have withdrawn the subscription; what was on its way no longer matters
        return dataclasses.replace(message, request_id=stream.request_id)

    def _ended(self, stream: _RequestStream) -> list[ControlMessage]:
        """The peer closed its side: a subscriber's FIN cancels the SUBSCRIBE_NAMESPACE (we close ours);
        a publisher's ends the subscription (after REQUEST_ERROR, or later)."""
        if stream.local and not stream.answered:
            raise ProtocolViolation(PV, "a SUBSCRIBE_NAMESPACE stream closed before its answer")
        del self._streams[stream.stream_id]
        if stream.request_id is not None:
            self._by_request.pop(stream.request_id, None)
        self._finish(stream)
        request = self._core.requests.get(stream.request_id) if stream.request_id is not None else None
        if request is None:
            return []
        if not stream.local:
            return [UnsubscribeNamespace(stream.prefix)]
        if request.answered:  # else the answer that came with the FIN, not yet handled, settles it
            self._core.remove_request(request)
        return []

    def request_stream_closed(self, stream_id: int, error_code: int, *, ours: bool) -> list[ControlMessage]:
        stream = self._streams.get(stream_id)
        if stream is None:
            return []
        stream.parser = self._parser()  # what was buffered is gone with the reset
        return self._ended(stream)


