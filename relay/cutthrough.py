"""Cut-through forwarding: an upstream FETCH's objects go downstream piece by piece, as they arrive.

Why: a relay that waits for an object's last octet before sending its first adds one object's
transfer time per hop (a 64 KiB layer at every hop) and runs the two QUIC legs one after the other
instead of overlapping them. Here every ``ObjectChunkReceived`` piece of the upstream session is
written to the downstream fetch stream at once, synchronously, inside the upstream session's event
handling (``MoqtSession.begin_fetch_object``, then ``send_payload`` with the received views: no copy),
while the same pieces are still assembled into whole objects for the cache by the `ObjectAssembler`.

The downstream FETCH_OK (the upstream's End Location and End Of Track, draft-14) and fetch stream
are opened as soon as the upstream FETCH_OK has been seen: at the first piece that follows it, or
by the relay's FETCH task when no piece came. An object that began before that (the upstream's data
overtook its FETCH_OK) is sent whole when it is complete; objects that completed before are sent
then, in order. All objects leave in the order they arrived on the one upstream fetch stream.

The relay's FETCH task still reads every object (for the cache and the counters) and waits for the
downstream stream to drain after each: that wait fills the upstream inbox when the subscriber is slow,
which bounds what the relay holds for it (`moqt.api.ReceiveBufferFull` ends the request).
"""

from __future__ import annotations

from moqt.api import Endpoint, Link
from moqt.api.drafts import writable_status
from moqt.errors import MoqtError
from moqt.events import ObjectChunkReceived
from moqt.messages import FetchOk
from moqt.tracks import MoqtObject, ObjectAssembler, RequestTracker


class CutThrough:
    """Passes one upstream FETCH's pieces to the downstream FETCH ``request_id`` (see the module docstring)."""

    __slots__ = ("_downstream", "_forwarding", "_pending", "_request_id", "error", "forwarded_objects", "stream",
                 "upstream")

    def __init__(self, downstream: Endpoint, request_id: int) -> None:
        self._downstream = downstream
        self._request_id = request_id
        self.upstream: RequestTracker | None = None  # the upstream FETCH's tracker: has its FETCH_OK come?
        self.stream: int | None = None  # the downstream fetch stream, once FETCH_OK went out
        self.error: MoqtError | ConnectionError | None = None  # a downstream write failed: stop writing
        self.forwarded_objects = 0  # objects passed on piece by piece
        self._forwarding = False  # the object now arriving is being passed on
        self._pending: list[MoqtObject] = []  # complete before the downstream stream was open

    def open(self, ok: FetchOk) -> int:
        """FETCH_OK downstream with the upstream's fields, the fetch stream, and what was waiting for it."""
        if self.stream is None:
            session = self._downstream.session
            session.fetch_ok(self._request_id, ok.end_location, end_of_track=ok.end_of_track)
            self.stream = session.open_fetch_stream(self._request_id)
            pending, self._pending = self._pending, []
            for obj in pending:
                self._send_whole(obj)
            self._downstream.link.transmit_soon()
        return self.stream

    def on_chunk(self, event: ObjectChunkReceived) -> None:
        """One upstream piece (called synchronously from the upstream session's event handling)."""
        if event.offset == 0:
            self._first_piece()
            if not writable_status(self._downstream.session.profile, event.status, fetch=True):
                self._forwarding = False  # a marker the downstream's draft cannot carry on a fetch stream
        stream = self.stream
        if not self._forwarding or stream is None:
            return
        session = self._downstream.session
        try:
            if event.offset == 0:
                session.begin_fetch_object(stream, event.group_id, event.subgroup_id or 0, event.object_id,
                                           event.payload_length, publisher_priority=event.publisher_priority,
                                           extensions=event.extensions, status=event.status)
            if len(event.data):
                session.send_payload(stream, event.data)
        except (MoqtError, ConnectionError) as exc:
            self.error = exc
            return
        if not self.forwarded_objects:
            self._flush()

    def _flush(self) -> None:
        """The first object's pieces leave at once, not after the rest of the upstream datagrams read in
        the same batch (``QuicSettings.recv_batch``): first-object latency. Later pieces are sent at the
        end of the batch, fewer and fuller transmits."""
        flush(self._downstream.link)

    def _first_piece(self) -> None:
        ok = self.upstream.ok if self.upstream is not None else None
        if self.stream is None and self.error is None and isinstance(ok, FetchOk):
            try:
                self.open(ok)
            except (MoqtError, ConnectionError) as exc:
                self.error = exc
        self._forwarding = self.stream is not None and self.error is None

    def on_object(self, obj: MoqtObject) -> None:
        """A whole object (after its last piece): sent now unless it was passed on piece by piece."""
        forwarded, self._forwarding = self._forwarding, False
        if self.error is not None:
            return
        if forwarded:
            self.forwarded_objects += 1
        elif self.stream is None:
            self._pending.append(obj)
        else:
            try:
                self._send_whole(obj)
            except (MoqtError, ConnectionError) as exc:
                self.error = exc

    def _send_whole(self, obj: MoqtObject) -> None:
        assert self.stream is not None
        session = self._downstream.session
        if not writable_status(session.profile, obj.status, fetch=True):
            return  # END_OF_GROUP / END_OF_TRACK: FETCH_OK's End Location and the FIN say it downstream
        session.send_fetch_object(self.stream, obj.group, obj.subgroup, obj.object_id, obj.payload,
                                  extensions=obj.extensions, status=obj.status)


def flush(link: Link) -> None:
    """Send what ``link`` has queued now where the transport can (``MoqtConnection.transmit_now``), else at
    the end of this event-loop turn."""
    transmit_now = getattr(link, "transmit_now", None)
    if callable(transmit_now):
        transmit_now()
    else:
        link.transmit_soon()


class ForwardingAssembler(ObjectAssembler):
    """An `ObjectAssembler` that shows each piece, then each whole object, to a `CutThrough`."""

    __slots__ = ("cut",)

    def __init__(self, cut: CutThrough) -> None:
        super().__init__()
        self.cut = cut

    def chunk(self, event: ObjectChunkReceived) -> MoqtObject | None:
        self.cut.on_chunk(event)
        obj = super().chunk(event)
        if obj is not None:
            self.cut.on_object(obj)
        return obj
