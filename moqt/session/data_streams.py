"""Receiving side of data streams and datagrams: parse, map to a request, deliver objects.

Why objects are delivered the way they are: an object that arrived inside one QUIC event is handed
over as a view of that event's octets (no copy); one that spans events is assembled once into a
buffer of exactly ``payload_length`` octets (bounded by ``max_object_size``). A subgroup stream can
outrun the SUBSCRIBE_OK or PUBLISH that names its Track Alias; its parsed events are held (bounded by
``max_held_bytes`` for the whole session) and replayed when the alias becomes known.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from moqt.data import (
    DataEvent,
    DataStreamParser,
    FetchHeader,
    FetchRangeEnd,
    ObjectDatagram,
    ObjectHeader,
    PayloadChunk,
    StreamFinished,
    SubgroupHeader,
    is_padding_datagram,
)
from moqt.errors import ProtocolViolation
from moqt.events import (
    DataStreamEnded,
    DataStreamReset,
    MalformedTrack,
    ObjectChunkReceived,
    ObjectReceived,
    ObjectSource,
)
from moqt.kinds import GroupOrder, SessionError
from moqt.messages import FetchCancel, Unsubscribe
from moqt.session.request_state import Origin, RequestKind
from moqt.session.requests import Request
from moqt.session.state import InboundStream, SessionState
from moqt.wire import Location

_PV: Final = SessionError.PROTOCOL_VIOLATION
_EMPTY: Final = memoryview(b"")


class DataReceiver:
    """Turns inbound data-stream octets and datagrams into ``ObjectReceived`` (and friends)."""

    def __init__(self, core: SessionState, *, partial: bool) -> None:
        self._core = core
        self.partial = partial

    # -- entry points ----------------------------------------------------------------------------
    def receive(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        core = self._core
        stream = core.inbound.get(stream_id)
        if stream is None:
            stream = InboundStream(stream_id, DataStreamParser(
                max_object_size=core.limits.max_object_size,
                max_extensions_length=core.limits.max_extensions_length, profile=core.profile,
                fetch_order=self._fetch_order))
            core.inbound[stream_id] = stream
        if stream.ignored:
            if end_stream:
                del core.inbound[stream_id]
            return
        events = stream.parser.feed(data, end_stream)
        if stream.held is not None:
            self._hold(stream, events)
        else:
            self._deliver(stream, events)
        if end_stream and stream.ignored:
            core.inbound.pop(stream_id, None)

    def reset(self, stream_id: int, error_code: int) -> None:
        core = self._core
        stream = core.inbound.pop(stream_id, None)
        if stream is None:
            return
        self._release_held(stream)
        request = core.requests.get(stream.request_id) if stream.request_id is not None else None
        if request is not None and request.kind == RequestKind.FETCH:
            self._fetch_stream_over(request)
        if not stream.ignored:
            core.events.append(DataStreamReset(stream_id, stream.request_id, error_code))

    def _fetch_order(self, request_id: int) -> GroupOrder:
        """The group order of our FETCH ``request_id`` (draft-18's fetch streams run their Group ID
        deltas that way; omitted from the FETCH: ascending)."""
        request = self._core.requests.get(request_id)
        return GroupOrder.ASCENDING if request is None else request.group_order

    def datagram(self, data: bytes) -> None:
        core = self._core
        if is_padding_datagram(data, core.profile):  # draft-18: "MUST discard all data"
            return
        datagram = ObjectDatagram.decode(data, max_extensions_length=core.limits.max_extensions_length,
                                         profile=core.profile)
        request_id = core.inbound_aliases.get(datagram.track_alias)
        if request_id is None:  # the draft allows dropping datagrams of an unknown alias
            return
        payload = datagram.payload if isinstance(datagram.payload, memoryview) else memoryview(datagram.payload)
        core.events.append(ObjectReceived(
            ObjectSource.DATAGRAM, request_id, datagram.track_alias, None, datagram.group_id, None,
            datagram.object_id, datagram.publisher_priority, datagram.extensions, datagram.status, payload,
            end_of_group=datagram.end_of_group))

    def alias_known(self, alias: int) -> None:
        """Replay the streams that were waiting for ``alias``."""
        request_id = self._core.inbound_aliases.get(alias)
        for stream in list(self._core.inbound.values()):
            if stream.held is not None and stream.track_alias == alias and request_id is not None:
                held = stream.held
                self._release_held(stream)
                self._attach(stream, request_id)
                self._deliver(stream, held)

    def drop_request_streams(self, request_id: int) -> None:
        """Stop reading every stream of a request we no longer want."""
        for stream in list(self._core.inbound.values()):
            if stream.request_id == request_id and not stream.ignored:
                self._ignore(stream)

    # -- internals -------------------------------------------------------------------------------
    def _ignore(self, stream: InboundStream) -> None:
        self._release_held(stream)
        stream.ignored = True
        self._core.stop_receiving(stream.stream_id)

    def _release_held(self, stream: InboundStream) -> None:
        self._core.held_bytes -= stream.held_bytes
        stream.held = None
        stream.held_bytes = 0

    def _hold(self, stream: InboundStream, events: Sequence[DataEvent]) -> None:
        core = self._core
        size = sum(len(e.data) for e in events if isinstance(e, PayloadChunk)) + 16 * len(events)
        if core.held_bytes + size > core.limits.max_held_bytes:
            self._ignore(stream)  # the draft lets us abandon a stream whose alias we do not know
            return
        assert stream.held is not None
        stream.held.extend(events)
        stream.held_bytes += size
        core.held_bytes += size

    def _deliver(self, stream: InboundStream, events: Sequence[DataEvent]) -> None:
        for index, event in enumerate(events):
            if stream.ignored:
                return
            if stream.held is not None:
                self._hold(stream, events[index:])
                return
            if isinstance(event, SubgroupHeader):
                self._on_subgroup_header(stream, event)
            elif isinstance(event, FetchHeader):
                self._on_fetch_header(stream, event)
            elif isinstance(event, ObjectHeader):
                fin_next = index + 1 < len(events) and isinstance(events[index + 1], StreamFinished)
                self._on_object(stream, event, fin_next)
            elif isinstance(event, PayloadChunk):
                fin_next = index + 1 < len(events) and isinstance(events[index + 1], StreamFinished)
                self._on_chunk(stream, event, fin_next)
            elif isinstance(event, FetchRangeEnd):
                self._on_range_end(stream, event)
            else:
                self._on_finished(stream)

    def _on_subgroup_header(self, stream: InboundStream, header: SubgroupHeader) -> None:
        core = self._core
        stream.header = header
        stream.track_alias = header.track_alias
        request_id = core.inbound_aliases.get(header.track_alias)
        if request_id is not None:
            self._attach(stream, request_id)
        elif header.track_alias in core.retired_aliases:
            self._ignore(stream)  # a late stream of a subscription that is over
        else:
            stream.held = []

    def _attach(self, stream: InboundStream, request_id: int) -> None:
        core = self._core
        stream.request_id = request_id
        request = core.requests.get(request_id)
        if request is not None:
            request.streams_seen += 1
        if stream.track_alias is not None:
            core.stream_seen(stream.track_alias)

    def _on_fetch_header(self, stream: InboundStream, header: FetchHeader) -> None:
        core = self._core
        stream.header = header
        request = core.requests.get(header.request_id)
        if request is None and core.ids.issued_locally(header.request_id):
            self._ignore(stream)  # a FETCH of ours that was cancelled or has failed
            return
        if request is None or not request.local or request.kind != RequestKind.FETCH:
            raise ProtocolViolation(_PV, f"FETCH_HEADER for Request ID {header.request_id}, not a FETCH of ours")
        if request.cancelled:
            self._ignore(stream)
            return
        if request.fetch_stream_done or any(s.request_id == header.request_id
                                            for s in core.inbound.values() if s is not stream):
            raise ProtocolViolation(_PV, f"a second fetch stream for Request ID {header.request_id}")
        stream.request_id = header.request_id

    def _fetched(self, stream: InboundStream, location: Location) -> bool:
        """Check a fetch stream's next Location against the promised order; False: malformed (handled)."""
        request = self._core.requests.get(stream.request_id) if stream.request_id is not None else None
        if isinstance(stream.header, FetchHeader) and request is not None:
            problem = _fetch_order_problem(request, location)
            if problem is not None:
                self._malformed(stream, request, problem)
                return False
            request.last_location = location
        return True

    def _on_range_end(self, stream: InboundStream, end: FetchRangeEnd) -> None:
        """Draft-16 End of Range: nothing to deliver (the objects up to it are absent or unknown), but
        it moves the fetch on like an object. Not yet surfaced to the application."""
        self._fetched(stream, Location(end.group_id, end.object_id))

    def _on_object(self, stream: InboundStream, header: ObjectHeader, fin_next: bool) -> None:
        if not self._fetched(stream, Location(header.group_id, header.object_id)):
            return
        stream.current = header
        stream.assembly = None
        if header.payload_length == 0:
            if self.partial:
                self._emit_chunk(stream, header, PayloadChunk(_EMPTY, 0, True))
            else:
                self._emit_object(stream, header, _EMPTY, fin_next)

    def _on_chunk(self, stream: InboundStream, chunk: PayloadChunk, fin_next: bool) -> None:
        header = stream.current
        assert header is not None
        if self.partial:
            self._emit_chunk(stream, header, chunk)
            return
        if chunk.offset == 0 and chunk.end_of_object:
            self._emit_object(stream, header, chunk.data, fin_next)
            return
        if stream.assembly is None:
            stream.assembly = bytearray(header.payload_length)
        stream.assembly[chunk.offset : chunk.offset + len(chunk.data)] = chunk.data
        if chunk.end_of_object:
            payload = memoryview(stream.assembly)
            stream.assembly = None
            self._emit_object(stream, header, payload, fin_next)

    def _on_finished(self, stream: InboundStream) -> None:
        core = self._core
        core.inbound.pop(stream.stream_id, None)
        if stream.request_id is None:
            return
        end_of_group = isinstance(stream.header, SubgroupHeader) and stream.header.end_of_group
        core.events.append(DataStreamEnded(stream.stream_id, stream.request_id, end_of_group))
        request = core.requests.get(stream.request_id)
        if request is not None and request.kind == RequestKind.FETCH:
            self._fetch_stream_over(request)

    def _fetch_stream_over(self, request: Request) -> None:
        request.fetch_stream_done = True
        if request.answered:
            self._core.remove_request(request)

    def _source(self, stream: InboundStream) -> ObjectSource:
        return ObjectSource.FETCH if isinstance(stream.header, FetchHeader) else ObjectSource.SUBGROUP

    def _emit_object(self, stream: InboundStream, header: ObjectHeader, payload: memoryview, fin_next: bool) -> None:
        assert stream.request_id is not None
        end_of_group = fin_next and isinstance(stream.header, SubgroupHeader) and stream.header.end_of_group
        self._core.events.append(ObjectReceived(
            self._source(stream), stream.request_id, stream.track_alias, stream.stream_id, header.group_id,
            header.subgroup_id, header.object_id, header.publisher_priority, header.extensions, header.status,
            payload, fin_next, end_of_group))

    def _emit_chunk(self, stream: InboundStream, header: ObjectHeader, chunk: PayloadChunk) -> None:
        assert stream.request_id is not None
        self._core.events.append(ObjectChunkReceived(
            self._source(stream), stream.request_id, stream.track_alias, stream.stream_id, header.group_id,
            header.subgroup_id, header.object_id, header.publisher_priority, header.extensions, header.status,
            header.payload_length, chunk.offset, chunk.data, chunk.end_of_object))

    def _malformed(self, stream: InboundStream, request: Request, reason: str) -> None:
        """The draft: cancel the request, and tell the application."""
        core = self._core
        self._ignore(stream)
        cancel = FetchCancel(request.request_id) if request.kind == RequestKind.FETCH \
            else Unsubscribe(request.request_id)
        core.send_control(cancel)
        if request.allows(Origin.LOCAL, cancel.KIND):
            request.step(Origin.LOCAL, cancel.KIND)
        if not request.cancelled:  # a cancelled request stays until the answer still on its way
            core.remove_request(request)
        core.events.append(MalformedTrack(request.request_id, reason))


def _fetch_order_problem(request: Request, at: Location) -> str | None:
    """Malformed-track rules 1-3 for a fetch response (objects in the promised order)."""
    last = request.last_location
    if last is None:
        return None
    if at.group == last.group:
        return None if at.object > last.object else "fetched Object IDs do not increase within a group"
    if request.group_order == GroupOrder.ASCENDING and at.group < last.group:
        return "ascending fetch went back a group"
    if request.group_order == GroupOrder.DESCENDING and at.group > last.group:
        return "descending fetch went forward a group"
    return None
