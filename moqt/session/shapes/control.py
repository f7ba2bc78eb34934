"""The draft-14 strategy, ``ControlShape``, which is also the interface every draft's strategy keeps.

Why one base class with do-nothing defaults: the session core (``connection``, ``state``,
``inbound``, ``outbound``) calls these methods at the points where drafts differ in shape -- which
stream carries control, what a unidirectional stream or a bidirectional one is, what a stream's
close means, how a request ends, how Request IDs are counted -- and never asks which draft it speaks.
Draft-14 needs nothing at most of them: every message goes on the one bidirectional control stream
as the session wrote it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Final

from moqt.errors import LocalError, ProtocolViolation
from moqt.kinds import MessageKind, RequestError, SessionError, SubscribeOptions
from moqt.messages import (
    ClientSetup,
    ControlMessage,
    FetchError,
    GoAway,
    PublishError,
    PublishNamespaceError,
    RequestErrorMessage,
    SubscribeError,
    SubscribeNamespaceError,
    TrackStatusError,
)
from moqt.session.request_ids import RequestIds
from moqt.session.request_state import RequestKind

if TYPE_CHECKING:
    from moqt.session.requests import Request
    from moqt.session.state import SessionState

PV: Final = SessionError.PROTOCOL_VIOLATION
_K = RequestKind

#: The neutral error message each kind of request is refused with.
ERRORS: Final[dict[RequestKind, type[RequestErrorMessage]]] = {
    _K.SUBSCRIBE: SubscribeError, _K.FETCH: FetchError, _K.PUBLISH: PublishError,
    _K.TRACK_STATUS: TrackStatusError, _K.PUBLISH_NAMESPACE: PublishNamespaceError,
    _K.SUBSCRIBE_NAMESPACE: SubscribeNamespaceError,
}


class ControlShape:
    """Draft-14: one bidirectional stream carries every control message, each as the session wrote it."""

    #: How this draft counts Request IDs (draft-14/16: MAX_REQUEST_ID flow control).
    REQUEST_IDS: ClassVar[type[RequestIds]] = RequestIds

    def __init__(self, core: SessionState) -> None:
        self._core = core

    # -- out -------------------------------------------------------------------------------------
    def send(self, message: ControlMessage) -> None:
        """Send a neutral message the way the draft carries it."""
        if isinstance(message, ClientSetup) and self._core.control_stream_id is None:
            self._core.control_stream_id = self._core.quic.get_next_available_stream_id()
        self._core.write_control(message)

    def check_sendable(self, message: ControlMessage) -> None:
        """Raise (``ValueError``) if the draft cannot say ``message``; run before its Request ID is taken."""
        message.encode(self._core.profile)

    def error_code(self, message: MessageKind, error: RequestError | int) -> int:
        """The wire code of ``error`` in the neutral ``message`` (SUBSCRIBE_ERROR, ...)."""
        return self._core.profile.request_error_code(message, error)

    def goaway_message(self, new_session_uri: str, timeout: float | None) -> GoAway:
        """The GOAWAY to send (``timeout`` in seconds: draft-14 has no field for it)."""
        return GoAway(new_session_uri)

    def send_on_request_stream(self, request_id: int, message: ControlMessage) -> None:
        """A message that travels on a request's own stream (NAMESPACE, NAMESPACE_DONE, PUBLISH_BLOCKED)."""
        raise LocalError(f"draft-{self._core.profile.draft} has no {message.KIND.value}")

    def request_over(self, request: Request) -> None:
        """The request has left the request table (answered for good, ended or cancelled)."""

    def overlapping(self, a: SubscribeOptions, b: SubscribeOptions) -> bool:
        """Whether two namespace subscriptions with these options share an overlap space (draft-14
        and 16: every SUBSCRIBE_NAMESPACE does; draft-18: SUBSCRIBE_TRACKS has a space of its own)."""
        return True

    # -- in: the control stream ------------------------------------------------------------------
    def control_bidi(self, stream_id: int) -> bool:
        """Whether a bidirectional stream with data is the control stream (a server adopts the first
        client-initiated one it sees)."""
        core = self._core
        if core.control_stream_id is None and not core.is_client and stream_id % 4 == 0:
            core.control_stream_id = stream_id
        return stream_id == core.control_stream_id

    def receive(self, message: ControlMessage) -> ControlMessage | None:
        """The neutral message a control-stream message stands for (None: nothing left to handle)."""
        return message

    # -- in: unidirectional streams --------------------------------------------------------------
    def uni_stream(self, stream_id: int, data: bytes, end_stream: bool) -> tuple[bytes | None, list[ControlMessage]]:
        """Octets of a peer's unidirectional stream: (those for the data receiver or None, control
        messages read). Draft-14: every unidirectional stream is a data stream."""
        return data, []

    def uni_stream_reset(self, stream_id: int) -> bool:
        """The peer reset a unidirectional stream; True when the shape dealt with it (not data)."""
        return False

    # -- in: request streams ---------------------------------------------------------------------
    def owns(self, stream_id: int) -> bool:
        """Whether a bidirectional stream other than the control stream is a request's."""
        return False

    def early_request_stream(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        """A request stream before setup completed: the drafts let us reset it rather than buffer it."""
        self._core.stop_receiving(stream_id)

    def established(self) -> list[ControlMessage]:
        """Setup completed: what was held until then, as neutral messages."""
        return []

    def request_stream(self, stream_id: int, data: bytes, end_stream: bool) -> list[ControlMessage]:
        raise ProtocolViolation(PV, f"bidirectional stream {stream_id} besides the control stream")

    def request_stream_ended(self, stream_id: int) -> list[ControlMessage]:
        """The peer's FIN on a request stream, after the messages that came with it were handled."""
        return []

    def request_stream_closed(self, stream_id: int, error_code: int, *, ours: bool) -> list[ControlMessage]:
        """The peer reset its half of a request stream (``ours``: it sent STOP_SENDING for our half;
        aioquic has reset it): what that means, as neutral messages."""
        return []
