"""Exceptions of the publisher/subscriber API, each naming the MOQT error that caused it.

Why typed: a caller reacts differently to a refusal (the peer answered FETCH_ERROR or SUBSCRIBE_ERROR:
try elsewhere, maybe log the authorization failure) and to a broken transfer (the connection or the
stream went away mid-way: the data received so far is incomplete). Refusals carry the draft-neutral
``RequestError`` (``SubscriptionEnded`` the ``PublishDoneStatus``); transfer failures the
``StreamReset`` or the ``SessionError``. The wire numbers are the session profile's business: the
endpoint names each code once, and a code the profile does not name stays the integer (so a relay
still passes it on unchanged). Transfer failures are also ``ConnectionError`` (so also ``OSError``),
like aiohttp's client errors, so code that only knows the standard library still catches them. Errors
are mapped from MOQT events in one place (``moqt.api.endpoint``).
"""

from __future__ import annotations

import enum
from typing import Generic, TypeVar

from moqt.errors import MoqtError
from moqt.kinds import PublishDoneStatus, RequestError, SessionError, StreamReset

E = TypeVar("E", RequestError, PublishDoneStatus)


def _describe(error: enum.Enum | int | None) -> str:
    if error is None:
        return "no code"
    return error.name if isinstance(error, enum.Enum) else f"code 0x{error:x}"


class MoqtApiError(MoqtError):
    """Root of the publisher/subscriber API's errors."""


class RequestRefused(MoqtApiError, Generic[E]):
    """The peer answered a request with an error message; ``error`` names its Error Code (a
    ``RequestError``; for `SubscriptionEnded` the ``PublishDoneStatus``)."""

    kind = "request"

    def __init__(self, error: E | int, reason: str = "") -> None:
        super().__init__(f"{self.kind} refused ({_describe(error)}){': ' + reason if reason else ''}")
        self.error: E | int = error
        self.reason = reason

    @property
    def unauthorized(self) -> bool:
        return isinstance(self.error, enum.Enum) and self.error.name == "UNAUTHORIZED"  # in both tables


class FetchRefused(RequestRefused[RequestError]):
    """FETCH_ERROR."""

    kind = "FETCH"

    @property
    def not_found(self) -> bool:
        """The track, or the requested objects, are not there: a miss rather than a failure."""
        return self.error in (RequestError.TRACK_DOES_NOT_EXIST, RequestError.NO_OBJECTS, RequestError.INVALID_RANGE)


class SubscribeRefused(RequestRefused[RequestError]):
    """SUBSCRIBE_ERROR."""

    kind = "SUBSCRIBE"

    @property
    def not_found(self) -> bool:
        return self.error is RequestError.TRACK_DOES_NOT_EXIST


class NamespaceRefused(RequestRefused[RequestError]):
    """PUBLISH_NAMESPACE_ERROR."""

    kind = "PUBLISH_NAMESPACE"


class SubscriptionEnded(RequestRefused[PublishDoneStatus]):
    """PUBLISH_DONE with a status other than TRACK_ENDED/SUBSCRIPTION_ENDED; ``status`` names it."""

    kind = "subscription"

    @property
    def status(self) -> PublishDoneStatus | int:
        return self.error


class TransferError(MoqtApiError, ConnectionError):
    """Objects stopped arriving: the stream was reset, the session ended or the track broke the
    draft's rules; ``error`` names why where the peer said (None where this side gave up)."""

    def __init__(self, error: StreamReset | SessionError | int | None, reason: str) -> None:
        super().__init__(f"{reason} ({_describe(error)})")
        self.error = error
        self.reason = reason


class StreamResetError(TransferError):
    """The publisher reset the data stream before all objects arrived (``error``: its reset code)."""

    def __init__(self, error: StreamReset | int, reason: str) -> None:
        super().__init__(error, reason)


class SessionLostError(TransferError):
    """The MOQT session (and its QUIC connection) ended while the request was open."""

    def __init__(self, error: SessionError | int, reason: str) -> None:
        super().__init__(error, reason)


class MalformedTrackError(TransferError):
    """The objects broke the track rules (order, duplicates); the session cancelled the request."""


class ReceiveBufferFull(TransferError):
    """The consumer fell behind by more than the inbox bound; the request was cancelled."""


class SetupRefused(MoqtApiError, ConnectionError):
    """The server refused the session (e.g. UNAUTHORIZED); ``error`` names the termination code."""

    def __init__(self, error: SessionError | int, reason: str) -> None:
        super().__init__(f"MOQT session refused ({_describe(error)}): {reason}")
        self.error = error
        self.reason = reason
