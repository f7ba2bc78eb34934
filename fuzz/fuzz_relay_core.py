"""Fuzz target ``relay_core``: the relay's decisions without I/O (relay/core.py): namespace routing, the
object cache and the per-subscriber send queues, driven by arbitrary operation sequences.

Input: operations, each an octet and its fields: publish or withdraw a namespace for one of four
owners, drop an owner, route a namespace or list those under a prefix; store a completed FETCH's
objects, look a FETCH up, discard a track, move the clock; push an object or a track end onto a send
queue, pop one.  Locations range over small values and the varint extremes (a FETCH's End Location
may be the largest the wire allows).

Contract: no operation raises; routing answers what a reference model of the published namespaces
answers (owners of the longest prefixes first, in arrival order); the cache's octet count is the sum
of its tracks', within its bound after every store, and a hit returns only objects of the requested
range, in ascending order, each once; a send queue is FIFO, its octet count is what it holds, it holds
more than its bound only as a single item, and once too far behind it stays empty and refuses pushes.
"""

from __future__ import annotations

import sys
from collections import deque
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import Cursor, OpWriter, check, fuzz_main
from moqt.kinds import PublishDoneStatus
from moqt.tracks import MoqtObject, fetch_stop
from moqt.wire import VARINT_MAX, Location, Namespace
from relay.core import NamespaceTable, ObjectCache, QueueItem, SendQueue, TrackEnd, TrackKey, is_prefix

TARGET = "relay_core"
INSTRUMENT = ("relay.core", "moqt.tracks")
NAMESPACES: Final[tuple[Namespace, ...]] = ((b"kvsp",), (b"kvsp", b"a"), (b"kvsp", b"a", b"b"), (b"kvsp", b"b"),
                                            (b"other",), (b"kvsp", b"a", b"b", b"c"))
TRACKS: Final = (b"raw", b"other")
MAX_OCTETS: Final = 256
QUEUE_OCTETS: Final = 64
MAX_OPS: Final = 64
OPS: Final = 11


def location(cursor: Cursor) -> Location:
    """Mostly small numbers, so that ranges meet; 255 stands for the varint maximum."""
    group, obj = cursor.u8(), cursor.u8()
    return Location(VARINT_MAX if group == 255 else group % 6, VARINT_MAX if obj == 255 else obj % 6)


def key(cursor: Cursor) -> TrackKey:
    return NAMESPACES[cursor.choice(len(NAMESPACES))], TRACKS[cursor.choice(len(TRACKS))]


def moqt_object(cursor: Cursor) -> MoqtObject:
    loc = location(cursor)
    return MoqtObject(loc.group, loc.object, memoryview(bytes(cursor.u8() % 48)))


class Model:
    """The reference the table is checked against: namespace -> owners in arrival order."""

    def __init__(self) -> None:
        self.owners: dict[Namespace, list[int]] = {}

    def route(self, namespace: Namespace) -> list[int]:
        return [o for n in range(len(namespace), 0, -1) for o in self.owners.get(namespace[:n], [])]


class State:
    def __init__(self) -> None:
        self.table: NamespaceTable[int] = NamespaceTable()
        self.model = Model()
        self.cache = ObjectCache(MAX_OCTETS, ttl_s=1.0)
        self.queue = SendQueue(QUEUE_OCTETS)
        self.queued: deque[QueueItem] = deque()
        self.now = 0.0

    def check_cache(self) -> None:
        tracks = self.cache._tracks  # the invariant is internal: the count must match what is held
        check(self.cache.octets == sum(t.octets for t in tracks.values()), "cache octet count drifted")
        for track in tracks.values():
            check(track.octets == sum(o.payload.nbytes for o in track.objects.values()), "track octet count drifted")

    def check_queue(self) -> None:
        q = self.queue
        held = sum(i.payload.nbytes for i in self.queued if isinstance(i, MoqtObject))
        check(len(q) == len(self.queued) and q.octets == held, "send queue count drifted")
        check(q.octets <= q.max_octets or len(q) == 1, "send queue over its bound")
        if q.too_far_behind:
            check(len(q) == 0, "a queue too far behind still holds items")


def table_op(s: State, op: int, cursor: Cursor) -> None:
    namespace, owner = NAMESPACES[cursor.choice(len(NAMESPACES))], cursor.choice(4)
    owners = s.model.owners
    if op == 0:
        s.table.add(namespace, owner)
        if owner not in owners.setdefault(namespace, []):
            owners[namespace].append(owner)
    elif op == 1:
        gone = s.table.remove(namespace, owner)
        if namespace in owners and owner in owners[namespace]:
            owners[namespace].remove(owner)
        check(gone == (namespace in owners and not owners[namespace]), "remove() answered wrongly")
        if namespace in owners and not owners[namespace]:
            del owners[namespace]
    elif op == 2:
        unpublished = s.table.remove_owner(owner)
        expected = [ns for ns, o in owners.items() if o == [owner]]
        for ns in list(owners):
            if owner in owners[ns]:
                owners[ns].remove(owner)
                if not owners[ns]:
                    del owners[ns]
        check(sorted(unpublished) == sorted(expected), "remove_owner() answered wrongly")
    elif op == 3:
        check(s.table.route(namespace) == s.model.route(namespace), "route() differs from the model")
    else:
        check(sorted(s.table.under(namespace)) == sorted(ns for ns in owners if is_prefix(namespace, ns)),
              "under() differs from the model")
    check(s.table.owner_count() == len({o for v in owners.values() for o in v}), "owner_count() drifted")


def cache_op(s: State, op: int, cursor: Cursor) -> None:
    track = key(cursor)
    if op == 5:
        start, end, ok_end = location(cursor), location(cursor), location(cursor)
        objects = [moqt_object(cursor) for _ in range(cursor.u8() % 8)]
        if s.cache.store(track, start, end, objects, s.now, ok_end=ok_end, end_of_track=cursor.flag()):
            check(s.cache.octets <= s.cache.max_octets, "the cache kept more than its bound")
    elif op == 6:
        start, end = location(cursor), location(cursor)
        hit = s.cache.lookup(track, start, end, s.now)
        if hit is not None:
            stop = fetch_stop(end)
            locations = [o.location for o in hit.objects]
            check(locations == sorted(set(locations)), "a cache hit is not in ascending order, each once")
            check(all(start <= loc < stop for loc in locations), "a cache hit returned objects outside the range")
            check(hit.end_of_track or hit.end_location == end, "a hit changed the End Location without End of Track")
    elif op == 7:
        s.cache.discard(track)
        check(track not in s.cache, "discard() kept the track")
    s.check_cache()


def queue_op(s: State, op: int, cursor: Cursor) -> None:
    q = s.queue
    if op == 9:
        item: QueueItem = TrackEnd(PublishDoneStatus.TRACK_ENDED, "end") if cursor.flag() else moqt_object(cursor)
        was_behind = q.too_far_behind
        if q.push(item):
            s.queued.append(item)
        elif not was_behind:
            check(q.too_far_behind, "a refused push did not mark the queue too far behind")
            s.queued.clear()
        else:
            check(len(q) == 0 and q.octets == 0, "a push to a queue too far behind changed it")
    else:
        popped = q.pop()
        expected = s.queued.popleft() if s.queued else None
        check(popped is expected, "the send queue is not FIFO")
    s.check_queue()


def test_one_input(data: bytes) -> None:
    cursor = Cursor(data)
    s = State()
    for _ in range(MAX_OPS):
        if not cursor.remaining:
            break
        op = cursor.choice(OPS)
        if op <= 4:
            table_op(s, op, cursor)
        elif op <= 7:
            cache_op(s, op, cursor)
        elif op == 8:
            s.now += cursor.u8() / 128
        else:
            queue_op(s, op, cursor)


def seeds() -> list[bytes]:
    table = OpWriter()
    for ns, owner in ((0, 0), (1, 1), (2, 2), (1, 3)):
        table.u8(0).u8(ns).u8(owner)
    table.u8(3).u8(5).u8(0).u8(4).u8(0).u8(0).u8(1).u8(1).u8(1).u8(2).u8(0).u8(2).u8(3).u8(2).u8(0)
    cache = OpWriter()
    cache.u8(5).u8(0).u8(0).u8(0).u8(0).u8(1).u8(0).u8(0).u8(1).u8(0).u8(3)  # store [0/0, 1/0], 3 objects
    for group, obj, size in ((0, 0, 10), (0, 1, 20), (0, 2, 0)):
        cache.u8(group).u8(obj).u8(size)
    cache.u8(1)  # end of track
    cache.u8(6).u8(0).u8(0).u8(0).u8(0).u8(0).u8(0).u8(5)  # lookup [0/0, 0/5]
    cache.u8(6).u8(0).u8(0).u8(0).u8(0).u8(255).u8(0)  # lookup up to the largest group
    cache.u8(8).u8(200).u8(6).u8(0).u8(0).u8(0).u8(0).u8(1).u8(0).u8(7).u8(0).u8(0)
    queue = OpWriter()
    for size in (20, 20, 20, 30):
        queue.u8(9).u8(0).u8(0).u8(0).u8(size)
    queue.u8(10).u8(9).u8(1).u8(10).u8(10)
    return [table.getvalue(), cache.getvalue(), queue.getvalue()]


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT, max_len=1024)
