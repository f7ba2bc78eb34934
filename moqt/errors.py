"""The MOQT layer's exceptions: one root, remote (wire) errors apart from local (API misuse) errors.

Why two families: a peer's bad input must never escape the session as an exception -- it becomes a
connection close carrying the draft's error code, in exactly one place (``MoqtSession.handle_event``).
A caller's mistake (answering a request twice, sending on a closed stream) is a bug in the caller and
is raised to it, h11-style, without touching the connection.
"""

from __future__ import annotations

from moqt.kinds import SessionError


class MoqtError(Exception):
    """Root of every exception raised by the ``moqt`` package."""


class NeedMoreData(MoqtError):
    """The input ends before the structure being read does.

    Incremental parsers catch it and wait for more bytes; a decoder reading a complete, length-framed
    payload turns it into a ``ProtocolViolation`` (the length did not match the content).
    ``at_least`` is how many octets (from where reading started) the read needs; a parser retries only
    once it has that many, so a large header trickling in is parsed once, not once per fragment.
    """

    def __init__(self, at_least: int = 0) -> None:
        super().__init__(f"need at least {at_least} octets")
        self.at_least = at_least


class ProtocolViolation(MoqtError):
    """The peer broke the protocol; ``error`` names the Session Termination code to close with (the
    session's profile gives its number, so codecs raise it without knowing the draft)."""

    def __init__(self, error: SessionError, reason: str) -> None:
        super().__init__(f"{reason} ({error.value})")
        self.error = error
        self.reason = reason


class LocalError(MoqtError):
    """The local application asked for something the protocol or the session state forbids."""


class SessionClosedError(LocalError):
    """The session is closed (or closing); nothing more can be sent."""


class RequestsBlockedError(LocalError):
    """No Request ID is available: the peer's Maximum Request ID has been reached.

    The session has sent REQUESTS_BLOCKED (once per maximum); retry after a MAX_REQUEST_ID arrives.
    """

    def __init__(self, maximum_request_id: int) -> None:
        super().__init__(f"peer's Maximum Request ID {maximum_request_id} reached")
        self.maximum_request_id = maximum_request_id


class GoingAwayError(LocalError):
    """The peer sent GOAWAY; the draft says not to start new requests on this session."""


class StreamClosedError(LocalError):
    """The data stream was finished, reset, or stopped by the peer."""
