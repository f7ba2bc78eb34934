"""Draft-18's strategy: a unidirectional control stream each way opened by SETUP, and every request
on a bidirectional stream of its own, where its replies travel without a Request ID and where a
stream reset or STOP_SENDING cancels it.

Why a strategy: the session keeps speaking the neutral messages of every draft -- CLIENT_SETUP /
SERVER_SETUP, SUBSCRIBE_ERROR, PUBLISH_NAMESPACE_OK, UNSUBSCRIBE, FETCH_CANCEL,
PUBLISH_NAMESPACE_DONE / _CANCEL, UNSUBSCRIBE_NAMESPACE -- and ``RequestStreams18Shape`` carries them
draft-18's way (SETUP, REQUEST_OK / REQUEST_ERROR on the request's stream, resets), and turns the
peer's messages and stream closes back into them, so ``inbound``, ``outbound``, ``moqt.api`` and the
relay need no draft-18 branch. The streams' bookkeeping lives in ``d18_streams``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar, Final

from moqt.data import UniStreamKind, uni_stream_kind
from moqt.errors import LocalError, ProtocolViolation
from moqt.events import ControlMessageReceived
from moqt.kinds import GroupOrder, MessageKind, RequestError, SessionError, StreamReset, SubscribeOptions
from moqt.messages import (
    ClientSetup,
    ControlMessage,
    FetchOk,
    GoAway,
    NamespaceDone,
    NamespaceNotice,
    PublishBlocked,
    PublishDone,
    PublishNamespaceOk,
    PublishOk,
    RequestErrorMessage,
    RequestErrorReply,
    RequestOk,
    RequestUpdate,
    ServerSetup,
    Setup,
    SubscribeNamespace,
    SubscribeNamespaceOk,
    SubscribeOk,
    SubscribeTracks,
    TrackStatusOk,
    UnsubscribeNamespace,
    control_stream_parser,
)
from moqt.session.request_ids import StreamRequestIds
from moqt.session.request_state import Origin, RequestKind
from moqt.session.shapes.control import PV, ControlShape
from moqt.session.shapes.d18_streams import (
    OPENING_KINDS,
    ControlIn,
    RequestStream,
    closed_by_peer,
    first_answer,
    on_publish_namespace_ok,
)

if TYPE_CHECKING:
    from moqt.session.requests import Request
    from moqt.session.state import SessionState

_K = RequestKind
#: Which overlap space each Subscribe Options value reaches (SUBSCRIBE_NAMESPACE and SUBSCRIBE_TRACKS
#: have independent ones, section "SUBSCRIBE_TRACKS").
_SPACES: Final = {SubscribeOptions.NAMESPACE: {1}, SubscribeOptions.PUBLISH: {2}, SubscribeOptions.BOTH: {1, 2}}


class RequestStreams18Shape(ControlShape):
    """Draft-18 (section "Session initialization"): SETUP on a control stream each way, every request
    on its own bidirectional stream, cancellation by RESET_STREAM / STOP_SENDING (or FIN for the
    namespace subscriptions)."""

    REQUEST_IDS: ClassVar[type[StreamRequestIds]] = StreamRequestIds

    def __init__(self, core: SessionState) -> None:
        super().__init__(core)
        self._streams: dict[int, RequestStream] = {}
        self._by_request: dict[int, RequestStream] = {}  # a request's stream by its Request ID
        self._answer_to: dict[int, RequestStream] = {}  # the peer's REQUEST_UPDATEs we owe an answer
        self._uni: dict[int, ControlIn | UniStreamKind] = {}  # the peer's unidirectional streams
        self._peer_control: int | None = None

    # -- out -------------------------------------------------------------------------------------
    def send(self, message: ControlMessage) -> None:
        core = self._core
        if isinstance(message, ClientSetup | ServerSetup):
            core.control_stream_id = core.quic.get_next_available_stream_id(is_unidirectional=True)
            params = dataclasses.replace(message.parameters, max_request_id=None)  # no such Setup Option
            core.write_control(Setup(params))
        elif isinstance(message, GoAway):
            core.write_control(message)
        elif type(message).KIND in OPENING_KINDS:
            self._open(message)
        elif isinstance(message, RequestUpdate):
            self._update(message)
        elif isinstance(message, RequestOk | RequestErrorReply) and message.request_id in self._answer_to:
            self._answer_to.pop(message.request_id).write(core, message)
        else:
            self._reply(message)

    def check_sendable(self, message: ControlMessage) -> None:
        for wire in self._wire_requests(message, 0):
            wire.encode(self._core.profile)

    def _wire_requests(self, message: ControlMessage, request_id: int) -> list[ControlMessage]:
        """The request(s) a neutral one goes out as: SUBSCRIBE_NAMESPACE asks for namespaces,
        SUBSCRIBE_TRACKS for the tracks (Subscribe Options BOTH: both, the second a companion)."""
        if not isinstance(message, SubscribeNamespace):
            return [message]
        prefix, params = message.track_namespace_prefix, message.parameters
        namespaces = SubscribeNamespace(message.request_id, prefix, params, SubscribeOptions.NAMESPACE)
        tracks = SubscribeTracks(message.request_id, prefix, params)
        if message.options is SubscribeOptions.NAMESPACE:
            return [namespaces]
        if message.options is SubscribeOptions.PUBLISH:
            return [tracks]
        return [namespaces, dataclasses.replace(tracks, request_id=request_id)]

    def _open(self, message: ControlMessage) -> None:
        core = self._core
        request_id: int = getattr(message, "request_id")  # noqa: B009 -- every opening message has one
        companion_id = core.ids.allocate() if getattr(message, "options", None) is SubscribeOptions.BOTH else 0
        wires = self._wire_requests(message, companion_id)
        main = self._open_stream(wires[0], _kind_of(message), request_id)
        if len(wires) > 1:
            main.companion = self._open_stream(wires[1], None, companion_id)
        if isinstance(message, SubscribeNamespace):
            main.prefix = message.track_namespace_prefix
        if main.kind is _K.TRACK_STATUS:
            main.finish(core)  # "the first and only message" on its stream

    def _open_stream(self, wire: ControlMessage, kind: RequestKind | None, request_id: int) -> RequestStream:
        core = self._core
        stream_id = core.quic.get_next_available_stream_id()
        stream = RequestStream.opened_here(core, stream_id, request_id, kind)
        self._streams[stream_id] = stream
        if kind is not None:
            self._by_request[request_id] = stream
        stream.write(core, wire)
        return stream

    def _update(self, message: RequestUpdate) -> None:
        stream = self._by_request.get(message.existing_request_id)
        if stream is None:
            raise LocalError(f"no stream for Request ID {message.existing_request_id}")
        stream.pending_updates.append(message.request_id)
        stream.write(self._core, message)

    def _reply(self, message: ControlMessage) -> None:
        """An answer to, or the end or cancellation of, a request: on (or to) the request's stream."""
        core = self._core
        request_id = getattr(message, "request_id", None)
        if isinstance(message, UnsubscribeNamespace):
            self._close_namespace(message)
            return
        stream = self._by_request.get(request_id) if isinstance(request_id, int) else None
        if stream is None:
            raise LocalError(f"draft-18 cannot send {message.KIND.value} outside a request's stream")
        kind = message.KIND
        if kind in _CANCELS:
            stream.cancelled_by_us = True  # a request still owed its answer is settled by the stream's close
            stream.abort(core, StreamReset.CANCELLED)
        elif isinstance(message, RequestErrorMessage):
            stream.write(core, RequestErrorReply(message.request_id, message.error_code, message.reason,
                                                 message.retry_interval, message.redirect))
            stream.finish(core)  # "send a REQUEST_ERROR and FIN the stream"
        elif isinstance(message, TrackStatusOk):
            stream.write(core, RequestOk(message.request_id, message.largest_location, message.parameters,
                                         message.track_extensions))
            stream.finish(core)  # "closed with a FIN after TRACK_STATUS_OK"
        elif isinstance(message, SubscribeNamespaceOk | PublishNamespaceOk):
            stream.write(core, RequestOk(message.request_id))
        elif isinstance(message, PublishDone):
            stream.write(core, message)
            stream.finish(core)  # "SHOULD send FIN ... immediately after sending PUBLISH_DONE"
        elif isinstance(message, SubscribeOk | FetchOk | PublishOk | NamespaceNotice | NamespaceDone):
            stream.write(core, message)
        else:
            raise LocalError(f"draft-18 has no {message.KIND.value}")

    def _close_namespace(self, message: UnsubscribeNamespace) -> None:
        for stream in self._streams.values():
            if stream.local and stream.kind is _K.SUBSCRIBE_NAMESPACE and stream.prefix == \
                    message.track_namespace_prefix and not stream.send_closed:
                stream.cancelled_by_us = True
                stream.finish(self._core)  # "cancelled by closing the stream with either a FIN or RESET_STREAM"
                if stream.companion is not None:
                    stream.companion.finish(self._core)
                return

    def send_on_request_stream(self, request_id: int, message: ControlMessage) -> None:
        stream = self._by_request.get(request_id)
        if stream is None or stream.local or stream.send_closed:
            raise LocalError(f"{request_id} is not a namespace subscription we serve")
        if isinstance(message, NamespaceDone | NamespaceNotice):
            stream.check_suffix(message, local=True)
        stream.write(self._core, message)

    def error_code(self, message: MessageKind, error: RequestError | int) -> int:
        """A neutral message draft-18 sends as a stream reset (PUBLISH_NAMESPACE_CANCEL) still takes
        its code from the REQUEST_ERROR table, for the application that reads it."""
        table = MessageKind.REQUEST_ERROR if message not in self._core.profile.request_errors else message
        return super().error_code(table, error)

    def goaway_message(self, new_session_uri: str, timeout: float | None) -> GoAway:
        ids = self._core.ids
        lowest = ids.lowest_unseen_peer if isinstance(ids, StreamRequestIds) else 0
        return GoAway(new_session_uri, round((timeout or 0) * 1000), lowest)

    def request_over(self, request: Request) -> None:
        """The request is over here: our half of its stream ends (FIN), and is forgotten once both are."""
        if request.kind is _K.UPDATE:
            return
        stream = self._by_request.get(request.request_id)
        if stream is None:
            return
        stream.finish(self._core)
        if stream.companion is not None:
            stream.companion.finish(self._core)
        self._forget_if_done(stream)

    def overlapping(self, a: SubscribeOptions, b: SubscribeOptions) -> bool:
        return bool(_SPACES[a] & _SPACES[b])

    # -- in: control streams ---------------------------------------------------------------------
    def control_bidi(self, stream_id: int) -> bool:
        return False  # control travels on unidirectional streams

    def receive(self, message: ControlMessage) -> ControlMessage | None:
        if isinstance(message, GoAway):
            if message.request_id is None:
                raise ProtocolViolation(PV, "GOAWAY on the control stream without a Request ID")
            if message.request_id % 2 != self._core.ids.next_local % 2:
                raise ProtocolViolation(SessionError.INVALID_REQUEST_ID,
                                        f"GOAWAY Request ID {message.request_id} has the peer's parity")
        return message

    def uni_stream(self, stream_id: int, data: bytes, end_stream: bool) -> tuple[bytes | None, list[ControlMessage]]:
        state = self._uni.get(stream_id)
        if state is None:  # its type is not known yet: the first octets are held (a few at most)
            state = self._uni[stream_id] = ControlIn()
        if isinstance(state, ControlIn) and state.parser is None:
            state.head += data
            kind = uni_stream_kind(bytes(state.head), self._core.profile)
            if kind is None:
                if end_stream:
                    raise ProtocolViolation(PV, "a unidirectional stream ended inside its type")
                return None, []
            data, state.head = bytes(state.head), bytearray()
            if kind is UniStreamKind.CONTROL:
                if self._peer_control is not None:
                    raise ProtocolViolation(PV, "a second control stream")
                self._peer_control = stream_id
                state.parser = control_stream_parser(self._core.profile,
                                                     max_message_length=self._core.limits.max_control_message_length)
            else:
                state = self._uni[stream_id] = kind
        if end_stream:
            if state is not UniStreamKind.DATA and state is not UniStreamKind.PADDING:
                raise ProtocolViolation(PV, "the control stream was closed")
            del self._uni[stream_id]
        if state is UniStreamKind.DATA:
            return data, []
        if state is UniStreamKind.PADDING or not isinstance(state, ControlIn) or state.parser is None:
            return None, []  # padding: "The receiver MUST discard all data"
        return None, [self._setup_in(m) for m in state.parser.feed(data)]

    def _setup_in(self, message: ControlMessage) -> ControlMessage:
        """SETUP read as the neutral setup message of the peer's role (the ALPN chose the version)."""
        if not isinstance(message, Setup):
            return message
        profile = self._core.profile
        if self._core.is_client:
            return ServerSetup(profile.version, message.parameters)
        return ClientSetup((profile.version,), message.parameters)

    def uni_stream_reset(self, stream_id: int) -> bool:
        state = self._uni.pop(stream_id, None)
        if stream_id == self._peer_control:
            raise ProtocolViolation(PV, "the control stream was reset")
        return state is not UniStreamKind.DATA  # a data stream's reset is the data receiver's

    # -- in: request streams ---------------------------------------------------------------------
    def owns(self, stream_id: int) -> bool:
        return True  # every bidirectional stream is a request's

    def early_request_stream(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        """Before setup: "it MAY reset such bidirectional streams" (both halves; what follows is dropped)."""
        if stream_id not in self._streams:
            stream = self._streams[stream_id] = RequestStream.opened_by_peer(self._core, stream_id)
            stream.abort(self._core, StreamReset.CANCELLED)
        if end_stream:
            self._recv_over(self._streams[stream_id])

    def request_stream(self, stream_id: int, data: bytes, end_stream: bool) -> list[ControlMessage]:
        core = self._core
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id % 2 == int(not core.is_client):  # one of ours, forgotten: nothing more to read
                return []
            stream = self._streams[stream_id] = RequestStream.opened_by_peer(core, stream_id)
        out: list[ControlMessage] = []
        if not stream.stopped:
            for message in stream.parser.feed(data):
                handled = self._on_local(stream, message) if stream.local else self._on_peer(stream, message)
                if handled is not None:
                    out.append(handled)
                if stream.stopped:
                    break
        if end_stream and stream.parser.buffered and not stream.stopped:
            raise ProtocolViolation(PV, "a request stream ended inside a message")
        return out

    def request_stream_ended(self, stream_id: int) -> list[ControlMessage]:
        stream = self._streams.get(stream_id)
        return [] if stream is None else self._peer_finished(stream)

    def _on_peer(self, stream: RequestStream, message: ControlMessage) -> ControlMessage | None:
        """A message on a stream the peer opened (we answer its request)."""
        core = self._core
        if stream.request_id is None:  # its request: the parser allowed only an opening message
            stream.opened_by(message)
            assert stream.request_id is not None
            self._by_request[stream.request_id] = stream
            if core.goaway_sent:  # "requests that arrive after the GOAWAY MUST be rejected ... GOING_AWAY"
                core.ids.accept_peer_request(stream.request_id)
                code = core.profile.request_error_code(MessageKind.REQUEST_ERROR, RequestError.GOING_AWAY)
                stream.write(core, RequestErrorReply(stream.request_id, code, "going away"))
                stream.finish(core)
                stream.stop(core, StreamReset.GOING_AWAY)
                return None
            if isinstance(message, SubscribeTracks):
                return SubscribeNamespace(message.request_id, message.track_namespace_prefix, message.parameters,
                                          SubscribeOptions.PUBLISH)
            return message
        if isinstance(message, RequestUpdate):
            self._answer_to[message.request_id] = stream
            return message
        if stream.kind is _K.PUBLISH and isinstance(message, PublishDone):
            return message  # the publisher ends its PUBLISH on the PUBLISH's stream
        return self._later(stream, message)

    def _on_local(self, stream: RequestStream, message: ControlMessage) -> ControlMessage | None:
        """A message on a stream we opened (the peer answers our request)."""
        if not stream.answered and not isinstance(message, GoAway):
            stream.answered = True
            if stream.kind is None:  # a companion SUBSCRIBE_TRACKS: its answer is not the application's
                return None
            return self._first_answer(stream, message)
        if stream.kind is _K.PUBLISH and isinstance(message, RequestUpdate):
            self._answer_to[message.request_id] = stream  # the subscriber updates our PUBLISH
            return message
        if stream.kind is _K.SUBSCRIBE and isinstance(message, PublishDone):
            return message
        if stream.kind is _K.SUBSCRIBE_NAMESPACE and isinstance(message, NamespaceNotice | NamespaceDone):
            stream.check_suffix(message, local=False)
            return message if stream.request_id in self._core.requests else None
        if stream.kind is None and isinstance(message, PublishBlocked):
            self._emit(message)
            return None
        return self._later(stream, message)

    def _first_answer(self, stream: RequestStream, message: ControlMessage) -> ControlMessage:
        answer = first_answer(stream, message)
        if isinstance(answer, FetchOk):
            request = self._core.requests.get(answer.request_id)
            if request is not None and request.group_order is not GroupOrder.PUBLISHER_DEFAULT:
                answer = dataclasses.replace(answer, group_order=request.group_order)  # FETCH_OK has none
        if stream.kind is _K.PUBLISH_NAMESPACE and isinstance(answer, RequestOk):
            return on_publish_namespace_ok(answer)
        return answer

    def _later(self, stream: RequestStream, message: ControlMessage) -> ControlMessage | None:
        """What either side may send on a request stream after its first messages."""
        if isinstance(message, RequestOk | RequestErrorReply):
            if not stream.pending_updates:
                raise ProtocolViolation(PV, f"{message.KIND.value} on stream {stream.stream_id}, "
                                            "which awaits no answer")
            if isinstance(message, RequestOk) and message.track_extensions:
                raise ProtocolViolation(PV, "Track Properties in REQUEST_UPDATE_OK")
            return dataclasses.replace(message, request_id=stream.pending_updates.popleft())
        if isinstance(message, GoAway):
            if stream.goaway_seen:
                raise ProtocolViolation(PV, "a second GOAWAY on one request stream")
            stream.goaway_seen = True
            self._emit(message)  # migrating one request: the application's to act on
            return None
        raise ProtocolViolation(PV, f"{message.KIND.value} on the stream of a {_name(stream)}")

    def _emit(self, message: ControlMessage) -> None:
        self._core.events.append(ControlMessageReceived(message, ()))

    def _peer_finished(self, stream: RequestStream) -> list[ControlMessage]:
        """The peer's FIN: a namespace subscriber's cancels; a responder's after its last answer ends
        the request on its side; a half-close otherwise."""
        core = self._core
        self._recv_over(stream)
        request = core.requests.get(stream.request_id) if stream.request_id is not None else None
        if request is None:
            return []
        if stream.cancelled_by_us or stream.stopped:
            self._settle(request)
            return []
        if stream.local and not stream.answered:
            raise ProtocolViolation(PV, f"the stream of a {_name(stream)} closed before its answer")
        if request.kind is _K.SUBSCRIBE_NAMESPACE:
            if not stream.local:
                stream.finish(core)
                self._unsubscribed(request)
                return []
            core.remove_request(request)  # the publisher ended it ("as though each ... NAMESPACE_DONE")
        elif request.kind is _K.SUBSCRIBE and stream.local:
            return closed_by_peer(core, stream, request, "the request stream ended without PUBLISH_DONE")
        return []

    def request_stream_closed(self, stream_id: int, error_code: int, *, ours: bool) -> list[ControlMessage]:
        """The peer reset its half, or sent STOP_SENDING for ours (aioquic has reset it): the request
        is cancelled; the rest of the stream is closed too."""
        core = self._core
        stream = self._streams.get(stream_id)
        if stream is None:
            return []
        if ours:
            stream.send_closed = True
        else:
            stream.parser = stream.fresh_parser(core)  # what was buffered is gone with the reset
        was_ours = stream.cancelled_by_us or stream.stopped
        stream.abort(core, StreamReset.CANCELLED)
        if not ours:
            self._recv_over(stream)
        request = core.requests.get(stream.request_id) if stream.request_id is not None else None
        if request is None:
            return []
        if was_ours:
            self._settle(request)
            return []
        if request.kind is _K.SUBSCRIBE_NAMESPACE and not stream.local:
            self._unsubscribed(request)
            return []
        return closed_by_peer(core, stream, request, f"the request stream was reset (0x{error_code:x})")

    def _unsubscribed(self, request: Request) -> None:
        """The peer ended its SUBSCRIBE_NAMESPACE (or SUBSCRIBE_TRACKS): this very request ends, not
        the first of the prefix that ``inbound`` would find by the neutral UNSUBSCRIBE_NAMESPACE."""
        request.step(Origin.PEER, MessageKind.UNSUBSCRIBE_NAMESPACE)
        self._core.remove_request(request)
        self._emit(UnsubscribeNamespace(request.namespace))

    def _settle(self, request: Request) -> None:
        """Our cancelled request whose stream is closed: no answer will come now."""
        if request.cancelled:
            self._core.remove_request(request)

    def _recv_over(self, stream: RequestStream) -> None:
        stream.recv_closed = True
        self._forget_if_done(stream)

    def _forget_if_done(self, stream: RequestStream) -> None:
        if not (stream.send_closed and stream.recv_closed):
            return
        self._streams.pop(stream.stream_id, None)
        if stream.request_id is not None and self._by_request.get(stream.request_id) is stream \
                and stream.request_id not in self._core.requests:
            del self._by_request[stream.request_id]
        for update_id in [u for u, s in self._answer_to.items() if s is stream]:
            del self._answer_to[update_id]


#: Neutral cancellations and ends that draft-18 says by resetting the request's stream.
_CANCELS: Final = frozenset({MessageKind.UNSUBSCRIBE, MessageKind.FETCH_CANCEL, MessageKind.PUBLISH_NAMESPACE_DONE,
                             MessageKind.PUBLISH_NAMESPACE_CANCEL})


def _kind_of(message: ControlMessage) -> RequestKind:
    return OPENING_KINDS[type(message).KIND]


def _name(stream: RequestStream) -> str:
    return "SUBSCRIBE_TRACKS" if stream.kind is None else stream.kind.value


__all__ = ["RequestStreams18Shape"]
