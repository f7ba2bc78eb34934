"""Exceptions of the publisher/subscriber API, each carrying the MOQT code that caused it.

Why typed: a caller reacts differently to a refusal (the peer answered FETCH_ERROR or SUBSCRIBE_ERROR:
try elsewhere, maybe log the authorization failure) and to a broken transfer (the connection or the
stream went away mid-way: the data received so far is incomplete). Refusals carry the request error
code of the draft (``FetchErrorCode``/``SubscribeErrorCode``...); transfer failures carry the stream
reset code or the session termination code. Transfer failures are also ``ConnectionError`` (so also
``OSError``), like aiohttp's client errors, so code that only knows the standard library still
catches them. Errors are mapped from MOQT events in one place (``moqt.api.endpoint``).
"""

from __future__ import annotations

from moqt.errors import MoqtError
from moqt.profile import FetchErrorCode, SubscribeErrorCode

UNAUTHORIZED_REQUEST = 0x1  # the same value in every request error code space of draft-14


class MoqtApiError(MoqtError):
    """Root of the publisher/subscriber API's errors."""


class RequestRefused(MoqtApiError):
    """The peer answered a request with an error message; ``code`` is its Error Code."""

    kind = "request"

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(f"{self.kind} refused (code 0x{code:x}){': ' + reason if reason else ''}")
        self.code = int(code)
        self.reason = reason

    @property
    def unauthorized(self) -> bool:
        """True for UNAUTHORIZED (0x1), which has the same value for FETCH, SUBSCRIBE and namespaces."""
        return self.code == UNAUTHORIZED_REQUEST


class FetchRefused(RequestRefused):
    """FETCH_ERROR (codes in ``moqt.FetchErrorCode``)."""

    kind = "FETCH"

    @property
    def not_found(self) -> bool:
        """The track, or the requested objects, are not there: a miss rather than a failure."""
        return self.code in (FetchErrorCode.TRACK_DOES_NOT_EXIST, FetchErrorCode.NO_OBJECTS,
                             FetchErrorCode.INVALID_RANGE)


class SubscribeRefused(RequestRefused):
    """SUBSCRIBE_ERROR (codes in ``moqt.SubscribeErrorCode``)."""

    kind = "SUBSCRIBE"

    @property
    def not_found(self) -> bool:
        return self.code == SubscribeErrorCode.TRACK_DOES_NOT_EXIST


class NamespaceRefused(RequestRefused):
    """PUBLISH_NAMESPACE_ERROR (codes in ``moqt.PublishNamespaceErrorCode``)."""

    kind = "PUBLISH_NAMESPACE"


class SubscriptionEnded(RequestRefused):
    """PUBLISH_DONE with a status other than TRACK_ENDED/SUBSCRIPTION_ENDED (``moqt.PublishDoneCode``)."""

    kind = "subscription"


class TransferError(MoqtApiError, ConnectionError):
    """Objects stopped arriving: the stream was reset (``code`` = its reset code), the session ended
    (``code`` = its termination code) or the track broke the draft's rules."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{reason} (code 0x{code:x})")
        self.code = int(code)
        self.reason = reason


class StreamResetError(TransferError):
    """The publisher reset the data stream before all objects arrived."""


class SessionLostError(TransferError):
    """The MOQT session (and its QUIC connection) ended while the request was open."""


class MalformedTrackError(TransferError):
    """The objects broke the track rules (order, duplicates); the session cancelled the request."""


class ReceiveBufferFull(TransferError):
    """The consumer fell behind by more than the inbox bound; the request was cancelled."""


class SetupRefused(MoqtApiError, ConnectionError):
    """The server refused the session (e.g. UNAUTHORIZED, 0x2); ``code`` is the termination code."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"MOQT session refused (code 0x{code:x}): {reason}")
        self.code = int(code)
        self.reason = reason
