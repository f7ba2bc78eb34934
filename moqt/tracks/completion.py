"""When one of our FETCH or SUBSCRIBE requests is over, and whether it ended well or with which error."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from moqt.kinds import PublishDoneStatus, RequestError, StreamReset
from moqt.messages import ControlMessage
from moqt.tracks.errors import (
    FetchRefused,
    MoqtApiError,
    RequestRefused,
    StreamResetError,
    SubscribeRefused,
    SubscriptionEnded,
)
from moqt.wire import VARINT_MAX

NORMAL_END: Final[frozenset[PublishDoneStatus | int]] = frozenset({PublishDoneStatus.TRACK_ENDED,
                                                                  PublishDoneStatus.SUBSCRIPTION_ENDED})


class RequestKind(Enum):
    FETCH = "FETCH"
    SUBSCRIBE = "SUBSCRIBE"


@dataclass(slots=True)
class RequestTracker:
    """When one of our requests is over, and how: success (``finished``) or ``error``.

    FETCH: over when its one data stream ended. SUBSCRIBE: over when PUBLISH_DONE arrived and as many
    subgroup streams as it counted have ended, or when a stream ending group ``end_group`` ended.
    """

    kind: RequestKind
    end_group: int | None = None
    answered: bool = False
    accepted: bool = False  # answered with FETCH_OK / SUBSCRIBE_OK (not refused)
    streams_ended: int = 0
    done_count: int | None = None
    done_status: PublishDoneStatus | int | None = None  # the name, or the code the profile does not name
    done_reason: str = ""
    finished: bool = False
    error: MoqtApiError | None = None
    ok: ControlMessage | None = None  # the FETCH_OK / SUBSCRIBE_OK, once answered (a relay forwards its fields)

    @property
    def over(self) -> bool:
        return self.finished or self.error is not None

    def fail(self, error: MoqtApiError) -> None:
        if not self.over:
            self.error = error

    def on_ok(self, message: ControlMessage | None = None) -> None:
        self.answered = self.accepted = True
        self.ok = message

    def on_refused(self, error: RequestError | int, reason: str) -> None:
        self.answered = True
        kind: type[RequestRefused[RequestError]] = FetchRefused if self.kind is RequestKind.FETCH else SubscribeRefused
        self.fail(kind(error, reason))

    def on_stream_ended(self, group: int | None, end_of_group: bool) -> None:
        self.streams_ended += 1
        last_group = end_of_group and self.end_group is not None and group is not None and group >= self.end_group
        if self.kind is RequestKind.FETCH or last_group:
            self._finish()
        else:
            self._check_done()

    def on_stream_reset(self, error: StreamReset | int) -> None:
        self.fail(StreamResetError(error, f"{self.kind.value} data stream reset by the publisher"))

    def on_publish_done(self, status: PublishDoneStatus | int, stream_count: int, reason: str) -> None:
        self.done_status, self.done_count, self.done_reason = status, stream_count, reason
        self._check_done()

    def _check_done(self) -> None:
        if self.done_count is None or self.done_status is None:
            return
        if self.done_count < VARINT_MAX and self.streams_ended < self.done_count:
            return  # streams still on their way (PUBLISH_DONE often overtakes the data)
        if self.done_status in NORMAL_END:
            self._finish()
        else:
            self.fail(SubscriptionEnded(self.done_status, self.done_reason))

    def _finish(self) -> None:
        if not self.over:
            self.finished = True
