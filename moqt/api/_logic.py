"""The decisions of the publisher/subscriber API, without I/O: ranges, live groups, assembly, completion.

Why apart from the asyncio code: these are the parts with rules worth testing one input at a time --
which FETCH range a publisher answers and with what End Location, which live objects a subscriber
still needs after it joins, how object pieces become whole objects in a caller's buffer, and when a
request is over. The asyncio modules only wait, wake and move octets around them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from moqt._control import filter_start
from moqt.api.errors import (
    FetchRefused,
    MalformedTrackError,
    MoqtApiError,
    RequestRefused,
    StreamResetError,
    SubscribeRefused,
    SubscriptionEnded,
)
from moqt.api.objects import MoqtObject
from moqt.events import ObjectChunkReceived
from moqt.messages import ControlMessage
from moqt.profile import FetchErrorCode, FilterType, PublishDoneCode
from moqt.wire import VARINT_MAX, Location

Allocator = Callable[[int, int, int], "memoryview | None"]
"""``(group, object_id, payload_length) -> writable view of exactly that many octets``: where the
subscriber assembles an object (e.g. the slot of a layer in a block buffer). None refuses the object:
the request then fails with `MalformedTrackError` (an object the caller did not expect)."""

NORMAL_END: Final = frozenset({PublishDoneCode.TRACK_ENDED, PublishDoneCode.SUBSCRIPTION_ENDED})


# -- FETCH ranges (draft-14 section 9.16) -------------------------------------------------------------
def fetch_stop(end: Location) -> Location:
    """The exclusive bound of a FETCH's End Location ("plus 1"; object 0 means the whole group)."""
    return Location(end.group + 1, 0) if end.object == 0 else end


def check_fetch(start: Location, end: Location, largest: Location | None) -> int | None:
    """The FETCH_ERROR code for a standalone FETCH of a track whose largest object is ``largest``."""
    if largest is None:
        return FetchErrorCode.NO_OBJECTS
    if start > largest or fetch_stop(end) <= start:
        return FetchErrorCode.INVALID_RANGE
    return None


def fetch_ok_end(end: Location, largest: Location) -> Location:
    """FETCH_OK's End Location: the request's, or just past ``largest`` when it asked beyond it."""
    after_largest = Location(largest.group, largest.object + 1)
    return after_largest if fetch_stop(end) > after_largest else end


def subscription_start(filter_type: FilterType, start: Location | None, largest: Location | None) -> Location:
    """Where a new subscription starts, given the track's largest object (None: nothing yet)."""
    return filter_start(filter_type, start, largest) or Location(0, 0)


# -- live groups ---------------------------------------------------------------------------------------
@dataclass(slots=True, eq=False)
class LiveGroup:
    """The objects of one group of a live track so far; ``ended`` once the group is complete."""

    group: int
    objects: list[MoqtObject] = field(default_factory=list)
    ended: bool = False

    @property
    def octets(self) -> int:
        return sum(o.payload.nbytes for o in self.objects)


class GroupLog:
    """The recent groups of a live track: what late subscribers and FETCHes can still be served.

    Objects are appended in ascending order; a new group ends the previous one. At most
    ``retain_groups`` groups are kept (the payloads are the producer's views, not copies).
    """

    __slots__ = ("closed", "groups", "retain_groups")

    def __init__(self, retain_groups: int = 1) -> None:
        if retain_groups < 1:
            raise ValueError("retain_groups must be at least 1")
        self.retain_groups = retain_groups
        self.groups: deque[LiveGroup] = deque()
        self.closed = False

    @property
    def largest(self) -> Location | None:
        for group in reversed(self.groups):
            if group.objects:
                return group.objects[-1].location
        return None

    def append(self, obj: MoqtObject) -> None:
        if self.closed:
            raise ValueError("the track is closed")
        current = self.groups[-1] if self.groups else None
        if current is not None and obj.group < current.group:
            raise ValueError(f"group {obj.group} is before the current group {current.group}")
        if current is None or obj.group > current.group:
            if current is not None:
                current.ended = True
            current = LiveGroup(obj.group)
            self.groups.append(current)
            while len(self.groups) > self.retain_groups:
                self.groups.popleft()
        elif current.ended:
            raise ValueError(f"group {obj.group} has ended")
        elif current.objects and obj.object_id <= current.objects[-1].object_id:
            raise ValueError(f"object {obj.object_id} does not follow {current.objects[-1].object_id}")
        current.objects.append(obj)

    def end_group(self) -> None:
        if self.groups:
            self.groups[-1].ended = True

    def close(self) -> None:
        self.end_group()
        self.closed = True

    def next_group(self, cursor: Location) -> tuple[LiveGroup, int] | None:
        """The group a subscriber at ``cursor`` works on next and the index of its first object there.

        A cursor in a group that is no longer retained moves to the oldest retained one after it.
        None: nothing at or after the cursor yet (wait, unless the log is closed).
        """
        for group in self.groups:
            if group.group < cursor.group:
                continue
            if group.group > cursor.group:
                return group, 0
            index = next((i for i, o in enumerate(group.objects) if o.object_id >= cursor.object),
                         len(group.objects))
            return group, index
        return None

    def read(self, start: Location, stop: Location) -> list[MoqtObject]:
        """Retained objects in ``[start, stop)``."""
        return [o for g in self.groups for o in g.objects if start <= o.location < stop]


# -- assembly (subscriber side) --------------------------------------------------------------------
class ObjectAssembler:
    """Turns ``ObjectChunkReceived`` pieces into `MoqtObject`s, in the caller's buffers when asked.

    Without an allocator, an object that arrived in one piece is handed out as a view of the received
    octets (no copy) and a split one is assembled once; with one, every object is assembled into the
    view it returns (one copy, the only one). ``group_of`` tells which group a data stream carried.
    """

    __slots__ = ("_allocate", "_partial", "group_of")

    def __init__(self, allocate: Allocator | None = None) -> None:
        self._allocate = allocate
        self._partial: dict[int, memoryview] = {}
        self.group_of: dict[int, int] = {}

    def chunk(self, event: ObjectChunkReceived) -> MoqtObject | None:
        """Take one piece; the whole object once its last piece arrived. Raises MalformedTrackError."""
        self.group_of[event.stream_id] = event.group_id
        length = event.payload_length
        if event.offset == 0:
            if event.end_of_object and self._allocate is None:
                return self._object(event, event.data)
            target = self._target(event.group_id, event.object_id, length)
            self._partial[event.stream_id] = target
        else:
            target = self._partial[event.stream_id]
        target[event.offset : event.offset + len(event.data)] = event.data
        if not event.end_of_object:
            return None
        del self._partial[event.stream_id]
        return self._object(event, target)

    def _target(self, group: int, object_id: int, length: int) -> memoryview:
        if self._allocate is None:
            return memoryview(bytearray(length))
        target = self._allocate(group, object_id, length)
        if target is None or target.nbytes != length or target.readonly:
            raise MalformedTrackError(0, f"object {group}/{object_id} of {length} octets was not expected")
        return target

    @staticmethod
    def _object(event: ObjectChunkReceived, payload: memoryview) -> MoqtObject:
        return MoqtObject(event.group_id, event.object_id, payload, event.extensions, event.subgroup_id,
                          event.status)

    def drop_stream(self, stream_id: int) -> None:
        self._partial.pop(stream_id, None)
        self.group_of.pop(stream_id, None)


# -- completion (subscriber side) -----------------------------------------------------------------
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
    done_code: int | None = None
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

    def on_refused(self, code: int, reason: str) -> None:
        self.answered = True
        kind: type[RequestRefused] = FetchRefused if self.kind is RequestKind.FETCH else SubscribeRefused
        self.fail(kind(code, reason))

    def on_stream_ended(self, group: int | None, end_of_group: bool) -> None:
        self.streams_ended += 1
        last_group = end_of_group and self.end_group is not None and group is not None and group >= self.end_group
        if self.kind is RequestKind.FETCH or last_group:
            self._finish()
        else:
            self._check_done()

    def on_stream_reset(self, code: int) -> None:
        self.fail(StreamResetError(code, f"{self.kind.value} data stream reset by the publisher"))

    def on_publish_done(self, code: int, stream_count: int, reason: str) -> None:
        self.done_code, self.done_count, self.done_reason = code, stream_count, reason
        self._check_done()

    def _check_done(self) -> None:
        if self.done_count is None or self.done_code is None:
            return
        if self.done_count < VARINT_MAX and self.streams_ended < self.done_count:
            return  # streams still on their way (PUBLISH_DONE often overtakes the data)
        if self.done_code in NORMAL_END:
            self._finish()
        else:
            self.fail(SubscriptionEnded(self.done_code, self.done_reason))

    def _finish(self) -> None:
        if not self.over:
            self.finished = True
