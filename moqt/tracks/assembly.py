"""Object pieces (``ObjectChunkReceived``) made whole, in the caller's buffers when it gives them."""

from __future__ import annotations

from collections.abc import Callable

from moqt.events import ObjectChunkReceived
from moqt.tracks.errors import MalformedTrackError
from moqt.tracks.objects import MoqtObject

Allocator = Callable[[int, int, int], "memoryview | None"]
"""``(group, object_id, payload_length) -> writable view of exactly that many octets``: where the
subscriber assembles an object (e.g. the slot of a layer in a block buffer). None refuses the object:
the request then fails with `MalformedTrackError` (an object the caller did not expect)."""


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
