"""Which objects a FETCH or a new subscription covers: range checks and End Locations (draft-14 9.16)."""

from __future__ import annotations

from moqt.kinds import FilterType, RequestError
from moqt.messages.subscribe import filter_start, location_after
from moqt.wire import VARINT_MAX, Location


def fetch_stop(end: Location) -> Location:
    """The exclusive bound of a FETCH's End Location ("plus 1"; object 0 means the whole group).

    The last group the wire can name has no next group: the whole of it stops at the largest Location
    (leaving out its object 2**62-1 alone), so that a peer's FETCH up to it is a range, not an error.
    """
    if end.object:
        return end
    return Location(end.group + 1, 0) if end.group < VARINT_MAX else Location(VARINT_MAX, VARINT_MAX)


def check_fetch(start: Location, end: Location, largest: Location | None) -> RequestError | None:
    """The FETCH_ERROR for a standalone FETCH of a track whose largest object is ``largest``."""
    if largest is None:
        return RequestError.NO_OBJECTS
    if start > largest or fetch_stop(end) <= start:
        return RequestError.INVALID_RANGE
    return None


def fetch_ok_end(end: Location, largest: Location) -> Location:
    """FETCH_OK's End Location: the request's, or just past ``largest`` when it asked beyond it."""
    after_largest = location_after(largest)
    return after_largest if fetch_stop(end) > after_largest else end


def subscription_start(filter_type: FilterType, start: Location | None, largest: Location | None) -> Location:
    """Where a new subscription starts, given the track's largest object (None: nothing yet)."""
    return filter_start(filter_type, start, largest) or Location(0, 0)
