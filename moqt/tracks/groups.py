"""The recent groups of a live track: what a late subscriber or a FETCH can still be served from."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from moqt.tracks.objects import MoqtObject
from moqt.wire import Location


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
