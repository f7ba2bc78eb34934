"""The relay's decisions without I/O: namespace routing, the object cache, per-subscriber send queues, stats.

Why apart from the asyncio layer: these are the rules worth testing one input at a time -- which
session a request for a namespace goes to (longest matching prefix, draft-14 "Namespace Prefix
Matching"), when a FETCH can be answered from cache and with which End Location, which cached track
goes first when the byte bound is reached (LRU) or its time is up (TTL), and when a subscriber has
fallen so far behind that it must be ended with TOO_FAR_BEHIND. Time enters only as ``now`` arguments.
Payloads are kept as the views they arrived in; nothing here copies or re-encodes an object.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

from moqt.kinds import PublishDoneStatus
from moqt.profiles import Profile
from moqt.tracks import MoqtObject, fetch_stop
from moqt.wire import VARINT_MAX, Location, Namespace

T = TypeVar("T")
TrackKey = tuple[Namespace, bytes]
END_OF_TIME: Final = Location(VARINT_MAX, VARINT_MAX)


# -- routing ---------------------------------------------------------------------------------------------
def is_prefix(prefix: Namespace, namespace: Namespace) -> bool:
    """Field-by-field prefix match (``("foo",)`` matches ``("foo", "bar")``, not ``("foobar",)``)."""
    return len(prefix) <= len(namespace) and namespace[: len(prefix)] == prefix


class NamespaceTable(Generic[T]):
    """Which sessions published which namespaces (PUBLISH_NAMESPACE); requests go to the longest match.

    Several owners may publish the same namespace (draft-14 "Multiple Publishers"): ``route`` answers
    them all, longest prefix first and, for one prefix, in the order they arrived.
    """

    def __init__(self) -> None:
        self._owners: dict[Namespace, list[T]] = {}

    def add(self, namespace: Namespace, owner: T) -> None:
        owners = self._owners.setdefault(namespace, [])
        if owner not in owners:
            owners.append(owner)

    def remove(self, namespace: Namespace, owner: T) -> bool:
        """Forget one owner of ``namespace``; True when nobody publishes it any more."""
        owners = self._owners.get(namespace)
        if owners is None:
            return False
        if owner in owners:
            owners.remove(owner)
        if owners:
            return False
        del self._owners[namespace]
        return True

    def remove_owner(self, owner: T) -> list[Namespace]:
        """Forget every namespace of ``owner`` (its session ended); returns those now unpublished."""
        gone = []
        for namespace in [ns for ns, owners in self._owners.items() if owner in owners]:
            if self.remove(namespace, owner):
                gone.append(namespace)
        return gone

    def route(self, namespace: Namespace) -> list[T]:
        """The owners of the longest published prefixes of ``namespace`` first."""
        out: list[T] = []
        for length in range(len(namespace), 0, -1):
            out.extend(self._owners.get(namespace[:length], ()))
        return out

    def under(self, prefix: Namespace) -> list[Namespace]:
        """Published namespaces that ``prefix`` matches (SUBSCRIBE_NAMESPACE)."""
        return [ns for ns in self._owners if is_prefix(prefix, ns)]

    def owner_count(self) -> int:
        return len({id(owner) for owners in self._owners.values() for owner in owners})


# -- the object cache -------------------------------------------------------------------------------------
@dataclass(slots=True)
class CachedTrack:
    """What the cache knows of one track: objects by location, the ranges known complete, its end."""

    objects: dict[Location, MoqtObject] = field(default_factory=dict)
    covered: list[tuple[Location, Location]] = field(default_factory=list)  # [start, stop), merged
    end_of_track: Location | None = None  # exclusive: nothing exists at or after it
    octets: int = 0
    expires: float = 0.0

    def cover(self, start: Location, stop: Location) -> None:
        spans = sorted([*self.covered, (start, stop)])
        merged: list[tuple[Location, Location]] = []
        for lo, hi in spans:
            if merged and lo <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        self.covered = merged

    def covers(self, start: Location, stop: Location) -> bool:
        return any(lo <= start and stop <= hi for lo, hi in self.covered)


@dataclass(frozen=True, slots=True)
class CacheHit:
    """A FETCH answered from cache: FETCH_OK's fields and the objects, in ascending order."""

    end_location: Location
    end_of_track: bool
    objects: tuple[MoqtObject, ...]


class ObjectCache:
    """Tracks' objects keyed by Full Track Name and Location, bounded in octets (LRU) and in time (TTL).

    A FETCH is a hit only when the whole requested range is known: the relay stored it from an upstream
    FETCH that completed (``store``), so a range with gaps is never mistaken for one without objects.
    Duplicates keep the first copy (draft-14 "Caching Relays": a relay may ignore them). A track larger
    than the whole cache is not kept.
    """

    def __init__(self, max_octets: int, ttl_s: float) -> None:
        if max_octets < 0 or ttl_s <= 0:
            raise ValueError("the cache needs max_octets >= 0 and ttl_s > 0")
        self.max_octets = max_octets
        self.ttl_s = ttl_s
        self.octets = 0
        self._tracks: OrderedDict[TrackKey, CachedTrack] = OrderedDict()

    def __len__(self) -> int:
        return len(self._tracks)

    def __contains__(self, key: object) -> bool:
        return key in self._tracks

    def lookup(self, key: TrackKey, start: Location, end: Location, now: float) -> CacheHit | None:
        """The objects of FETCH ``[start, end]`` ("End Location plus 1") when all of it is cached."""
        entry = self._live(key, now)
        if entry is None:
            return None
        stop = fetch_stop(end)
        eot = entry.end_of_track
        effective = min(stop, eot) if eot is not None else stop
        if effective <= start or not entry.covers(start, effective):
            return None
        objects = tuple(obj for loc, obj in sorted(entry.objects.items()) if start <= loc < effective)
        if not objects:
            return None  # let the publisher say NO_OBJECTS / INVALID_RANGE
        self._tracks.move_to_end(key)
        beyond = eot is not None and stop >= eot
        return CacheHit(eot if beyond and eot is not None else end, beyond, objects)

    def store(self, key: TrackKey, start: Location, end: Location, objects: Iterable[MoqtObject], now: float, *,
              ok_end: Location, end_of_track: bool) -> bool:
        """Keep the objects of a completed upstream FETCH of ``[start, end]`` answered with FETCH_OK
        (``ok_end``, ``end_of_track``); False when they do not fit."""
        stop = min(fetch_stop(end), fetch_stop(ok_end))
        entry = self._live(key, now)
        if entry is None:
            entry = CachedTrack(expires=now + self.ttl_s)
        self._drop(key)  # its octets are counted again below, with the new objects
        for obj in objects:
            loc = obj.location
            if start <= loc < stop and loc not in entry.objects:
                entry.objects[loc] = obj
                entry.octets += obj.payload.nbytes
        if end_of_track:
            entry.end_of_track = fetch_stop(ok_end)
            stop = END_OF_TIME
        if start < stop:
            entry.cover(start, stop)
        if entry.octets > self.max_octets:
            return False
        self._tracks[key] = entry
        self.octets += entry.octets
        self._evict(now)
        return True

    def discard(self, key: TrackKey) -> None:
        self._drop(key)

    def _live(self, key: TrackKey, now: float) -> CachedTrack | None:
        entry = self._tracks.get(key)
        if entry is not None and now >= entry.expires:
            self._drop(key)
            return None
        return entry

    def _drop(self, key: TrackKey) -> None:
        entry = self._tracks.pop(key, None)
        if entry is not None:
            self.octets -= entry.octets

    def _evict(self, now: float) -> None:
        for key in [k for k, e in self._tracks.items() if now >= e.expires]:
            self._drop(key)
        while self.octets > self.max_octets and self._tracks:
            self._drop(next(iter(self._tracks)))


# -- per-subscriber send queues ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TrackEnd:
    """The upstream subscription is over: normally (``status`` None) or with a PUBLISH_DONE status (its
    name, or the upstream's code where the profile names none: passed on as it is)."""

    status: PublishDoneStatus | int | None = None
    reason: str = ""
    source: Profile | None = None  # the upstream's draft: a bare code is passed on only to the same draft


QueueItem = MoqtObject | TrackEnd


class SendQueue:
    """Objects waiting to be handed to one subscriber's QUIC stream, bounded in octets.

    The fan-out pushes every object to every subscriber's queue and never waits; the subscriber's
    sender takes them as its stream drains. A push beyond ``max_octets`` marks the queue
    ``too_far_behind`` (the relay then ends that subscription with TOO_FAR_BEHIND) and the object is
    not queued, so a stalled subscriber costs at most ``max_octets`` of references and nobody else waits.
    """

    __slots__ = ("_items", "max_octets", "octets", "too_far_behind")

    def __init__(self, max_octets: int) -> None:
        if max_octets <= 0:
            raise ValueError("max_octets must be positive")
        self.max_octets = max_octets
        self.octets = 0
        self.too_far_behind = False
        self._items: deque[QueueItem] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def push(self, item: QueueItem) -> bool:
        """Queue an item; False once the subscriber is too far behind (nothing more is queued)."""
        if self.too_far_behind:
            return False
        if isinstance(item, MoqtObject):
            size = item.payload.nbytes
            if self.octets + size > self.max_octets and self._items:
                self.too_far_behind = True
                self._items.clear()
                self.octets = 0
                return False
            self.octets += size
        self._items.append(item)
        return True

    def pop(self) -> QueueItem | None:
        if not self._items:
            return None
        item = self._items.popleft()
        if isinstance(item, MoqtObject):
            self.octets -= item.payload.nbytes
        return item


def objects_from(objects: Sequence[MoqtObject], start: Location) -> list[MoqtObject]:
    """The retained objects a subscription starting at ``start`` still needs."""
    return [obj for obj in objects if obj.location >= start]


# -- stats -----------------------------------------------------------------------------------------------
@dataclass(slots=True)
class RelayStats:
    """Counters of one relay (exported as Prometheus metrics and as JSON)."""

    objects_in: int = 0
    bytes_in: int = 0
    objects_out: int = 0
    bytes_out: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    upstream_fetches: int = 0
    upstream_subscribes: int = 0
    subscribers: int = 0
    too_far_behind: int = 0
    refused: int = 0
    publishers: int = 0
    cut_through: int = 0  # objects passed on piece by piece as they arrived (relay.cutthrough)

    def received(self, obj: MoqtObject) -> None:
        self.objects_in += 1
        self.bytes_in += obj.payload.nbytes

    def sent(self, obj: MoqtObject) -> None:
        self.objects_out += 1
        self.bytes_out += obj.payload.nbytes

    @property
    def cache_hit_ratio(self) -> float:
        total = self.cache_hits + self.cache_misses
        return self.cache_hits / total if total else 0.0

    def to_json(self) -> dict[str, float]:
        out: dict[str, float] = {name: getattr(self, name) for name in self.__slots__}
        out["cache_hit_ratio"] = self.cache_hit_ratio
        return out
