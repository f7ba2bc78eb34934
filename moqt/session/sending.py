"""Objects out: the data streams and datagrams of the subscriptions and fetches we serve.

Why apart from the control half: this is the send hot path (one call per object, payloads handed to
QUIC as views, no copy); it only reads the request table -- whether a subscription is ours to
publish, its Track Alias and Forward State -- and never changes a request's state except to count
the streams PUBLISH_DONE reports and to close a FETCH whose stream and answer are both done.
"""

from __future__ import annotations

from collections.abc import Sequence

from moqt.data import FetchHeader, FetchWriter, ObjectDatagram, Payload, SubgroupHeader, SubgroupWriter
from moqt.errors import LocalError, StreamClosedError
from moqt.kinds import GroupOrder, ObjectStatus, StreamReset
from moqt.session.request_state import RequestKind
from moqt.session.requests import Request
from moqt.session.state import OutboundStream, SessionState
from moqt.wire import KeyValuePair


class ObjectApi:
    """Opening data streams, sending objects (whole or in parts), finishing and resetting streams."""

    _core: SessionState

    def _check_open(self) -> SessionState:
        return self._core.check_open()

    def open_subgroup(self, request_id: int, group_id: int, subgroup_id: int = 0, *, publisher_priority: int = 128,
                      extensions_present: bool = False, end_of_group: bool = False) -> int:
        """Open a subgroup stream for a subscription we publish; returns its stream ID."""
        core = self._check_open()
        request = core.requests.get(request_id)
        if request is None or not request.we_publish or request.track_alias is None:
            raise LocalError(f"{request_id} is not an accepted subscription to us")
        if not request.forward:
            raise LocalError("the subscription's Forward State is 0")
        header = SubgroupHeader.create(request.track_alias, group_id, subgroup_id, publisher_priority,
                                       extensions_present=extensions_present, end_of_group=end_of_group)
        return self._open_stream(request, SubgroupWriter(header, core.profile))

    def open_fetch_stream(self, request_id: int) -> int:
        """Open the (single) data stream answering the peer's FETCH; returns its stream ID."""
        core = self._check_open()
        request = core.requests.get(request_id)
        if request is None or request.local or request.kind != RequestKind.FETCH:
            raise LocalError(f"{request_id} is not an open FETCH from the peer")
        if request.streams_opened:
            raise LocalError("a FETCH is answered on one stream")
        order = GroupOrder.DESCENDING if request.group_order is GroupOrder.DESCENDING else GroupOrder.ASCENDING
        return self._open_stream(request, FetchWriter(FetchHeader(request_id), core.profile, order))

    def _open_stream(self, request: Request, writer: SubgroupWriter | FetchWriter) -> int:
        core = self._core
        stream_id = core.quic.get_next_available_stream_id(is_unidirectional=True)
        core.send_stream(stream_id, writer.encode_header())
        core.outbound[stream_id] = OutboundStream(stream_id, request.request_id, writer)
        request.open_streams.add(stream_id)
        request.streams_opened += 1
        return stream_id

    def _outbound(self, stream_id: int) -> OutboundStream:
        core = self._core
        if core.done or not core.established:  # checked inline: this runs once per object sent
            core.check_open()
        stream = core.outbound.get(stream_id)
        if stream is None or stream.closed:
            raise StreamClosedError(f"stream {stream_id} is not open for objects")
        return stream

    def send_object(self, stream_id: int, object_id: int, payload: Payload = b"", *,
                    extensions: Sequence[KeyValuePair] = (), status: ObjectStatus = ObjectStatus.NORMAL,
                    end_of_stream: bool = False) -> None:
        """Send one object on a subgroup stream; the payload is handed to QUIC without a copy."""
        stream = self._outbound(stream_id)
        if not isinstance(stream.writer, SubgroupWriter):
            raise LocalError("use send_fetch_object on a fetch stream")
        self._send_parts(stream, stream.writer.encode_object(object_id, payload, extensions=extensions,
                                                             status=status), end_of_stream)

    def send_fetch_object(self, stream_id: int, group_id: int, subgroup_id: int, object_id: int,
                          payload: Payload = b"", *, publisher_priority: int = 128,
                          extensions: Sequence[KeyValuePair] = (), status: ObjectStatus = ObjectStatus.NORMAL,
                          end_of_stream: bool = False) -> None:
        """Send one object on a fetch stream (in the order the FETCH asked for)."""
        stream = self._outbound(stream_id)
        if not isinstance(stream.writer, FetchWriter):
            raise LocalError("use send_object on a subgroup stream")
        parts = stream.writer.encode_object(group_id, subgroup_id, object_id, payload,
                                            publisher_priority=publisher_priority, extensions=extensions,
                                            status=status)
        self._send_parts(stream, parts, end_of_stream)

    def send_fetch_range_end(self, stream_id: int, group_id: int, object_id: int, *, unknown: bool = False) -> None:
        """Draft-16 End of Range on a fetch stream: the objects after the last one sent, up to and
        including (group_id, object_id), do not exist (``unknown``: their status is unknown)."""
        stream = self._outbound(stream_id)
        if not isinstance(stream.writer, FetchWriter):
            raise LocalError("an End of Range goes on a fetch stream")
        try:
            head = stream.writer.encode_range_end(group_id, object_id, unknown=unknown)
        except ValueError as exc:
            raise LocalError(str(exc)) from exc
        self._core.send_stream(stream_id, head)

    def begin_object(self, stream_id: int, object_id: int, payload_length: int, *,
                     extensions: Sequence[KeyValuePair] = (), status: ObjectStatus = ObjectStatus.NORMAL) -> None:
        """Send one object's fields on a subgroup stream; its ``payload_length`` octets follow through
        `send_payload` (a relay passes an object on while it is still arriving: cut-through)."""
        stream = self._outbound(stream_id)
        if not isinstance(stream.writer, SubgroupWriter):
            raise LocalError("use begin_fetch_object on a fetch stream")
        try:
            head = stream.writer.encode_object_header(object_id, payload_length, extensions=extensions, status=status)
        except ValueError as exc:
            raise LocalError(str(exc)) from exc
        self._core.send_stream(stream_id, head)

    def begin_fetch_object(self, stream_id: int, group_id: int, subgroup_id: int, object_id: int,
                           payload_length: int, *, publisher_priority: int = 128,
                           extensions: Sequence[KeyValuePair] = (), status: ObjectStatus = ObjectStatus.NORMAL) -> None:
        """As `begin_object`, on a fetch stream."""
        stream = self._outbound(stream_id)
        if not isinstance(stream.writer, FetchWriter):
            raise LocalError("use begin_object on a subgroup stream")
        try:
            head = stream.writer.encode_object_header(group_id, subgroup_id, object_id, payload_length,
                                                      publisher_priority=publisher_priority, extensions=extensions,
                                                      status=status)
        except ValueError as exc:
            raise LocalError(str(exc)) from exc
        self._core.send_stream(stream_id, head)

    def send_payload(self, stream_id: int, part: Payload, *, end_of_stream: bool = False) -> None:
        """The next part of the payload of the object begun on ``stream_id`` (handed to QUIC without a
        copy); ``end_of_stream`` only once the object is complete."""
        stream = self._outbound(stream_id)
        size = part.nbytes if isinstance(part, memoryview) else len(part)
        if end_of_stream and size < stream.writer.remaining:
            raise LocalError(f"the object still owes {stream.writer.remaining} octets, the part has {size}: "
                             "no FIN before it is complete")
        try:
            stream.writer.payload_part(part)  # raises (and keeps its count) when the part is too long
        except ValueError as exc:
            raise LocalError(str(exc)) from exc
        self._send_parts(stream, [part], end_of_stream)

    def payload_owed(self, stream_id: int) -> int:
        """Octets the object begun on ``stream_id`` still owes (0: none begun, or complete)."""
        return self._outbound(stream_id).writer.remaining

    def _send_parts(self, stream: OutboundStream, parts: list[Payload], end_of_stream: bool) -> None:
        for index, part in enumerate(parts):
            self._core.send_stream(stream.stream_id, part, end_of_stream and index == len(parts) - 1)
        if end_of_stream:
            self._stream_finished(stream)

    def finish_stream(self, stream_id: int) -> None:
        """End a data stream with FIN (for an end-of-group subgroup: the group ends here)."""
        stream = self._outbound(stream_id)
        if stream.writer.remaining:
            raise LocalError(f"the object begun still owes {stream.writer.remaining} octets")
        self._core.send_stream(stream_id, b"", True)
        self._stream_finished(stream)

    def _stream_finished(self, stream: OutboundStream) -> None:
        core = self._core
        stream.closed = True
        core.outbound.pop(stream.stream_id, None)
        request = core.requests.get(stream.request_id)
        if request is None:
            return
        request.open_streams.discard(stream.stream_id)
        if request.kind == RequestKind.FETCH:
            request.fetch_stream_done = True
            if request.answered:
                core.remove_request(request)

    def reset_stream(self, stream_id: int, error_code: StreamReset | int = StreamReset.CANCELLED) -> None:
        """Abandon a data stream (RESET_STREAM with a Data Stream Reset code)."""
        self._outbound(stream_id)
        self._core.reset_sending(stream_id, error_code)

    def send_datagram(self, request_id: int, group_id: int, object_id: int, payload: bytes = b"", *,
                      publisher_priority: int = 128, extensions: tuple[KeyValuePair, ...] = (),
                      status: ObjectStatus = ObjectStatus.NORMAL, end_of_group: bool = False) -> None:
        """Send one object as an OBJECT_DATAGRAM (dropped by QUIC if it does not fit a datagram)."""
        core = self._check_open()
        request = core.requests.get(request_id)
        if request is None or not request.we_publish or request.track_alias is None:
            raise LocalError(f"{request_id} is not an accepted subscription to us")
        datagram = ObjectDatagram(request.track_alias, group_id, object_id, publisher_priority, payload,
                                  extensions, status, end_of_group)
        core.quic.send_datagram_frame(datagram.encode(core.profile))
