"""Session state shared by inbound control, outbound requests, the data streams and the facade.

Why a plain state object: the session's parts (control dispatch, data streams, the public API) each
read and change the same few tables -- requests by ID, track aliases, data streams -- and keeping
those tables in one place, with the few primitive writes to QUIC beside them, lets each part live in
its own small module without reaching into another's privates.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from aioquic.quic.connection import QuicConnection

from moqt.data import (
    DEFAULT_MAX_EXTENSIONS_LENGTH,
    DEFAULT_MAX_OBJECT_SIZE,
    DataEvent,
    DataStreamParser,
    FetchWriter,
    ObjectHeader,
    StreamHeader,
    SubgroupWriter,
)
from moqt.errors import LocalError, ProtocolViolation, SessionClosedError
from moqt.events import MoqtEvent
from moqt.kinds import SessionError, StreamReset
from moqt.messages import ControlMessage
from moqt.profiles import Profile
from moqt.session.request_ids import RequestIds
from moqt.session.requests import Request
from moqt.session.shapes import ControlShape, shape_for
from moqt.wire import VARINT_MAX, Bytes

_RETIRED_ALIASES_KEPT: Final = 4096


@dataclass(slots=True, eq=False)
class OutboundStream:
    """A data stream we send on."""

    stream_id: int
    request_id: int
    writer: SubgroupWriter | FetchWriter
    closed: bool = False


@dataclass(slots=True, eq=False)
class InboundStream:
    """A data stream we receive on: its parser, the request it maps to, the object being assembled."""

    stream_id: int
    parser: DataStreamParser
    header: StreamHeader | None = None
    request_id: int | None = None
    track_alias: int | None = None
    current: ObjectHeader | None = None
    assembly: bytearray | None = None
    held: list[DataEvent] | None = None
    held_bytes: int = 0
    ignored: bool = False


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """Bounds on what a peer can make this session hold."""

    max_control_message_length: int = 0xFFFF
    max_object_size: int = DEFAULT_MAX_OBJECT_SIZE
    max_extensions_length: int = DEFAULT_MAX_EXTENSIONS_LENGTH
    max_held_bytes: int = 1024 * 1024
    max_deferred_messages: int = 64


class SessionState:
    """The tables and the primitive QUIC writes; no protocol decisions live here."""

    def __init__(self, quic: QuicConnection, *, profile: Profile, is_client: bool, limits: SessionLimits,
                 ids: RequestIds) -> None:
        self.quic = quic
        self.profile = profile
        self.is_client = is_client
        self.limits = limits
        self.ids = ids
        self.events: list[MoqtEvent] = []
        self.done = False
        self.established = False
        self.version: int | None = None
        self.control_stream_id: int | None = None
        self.requests: dict[int, Request] = {}
        self.inbound_aliases: dict[int, int] = {}
        self.retired_aliases: OrderedDict[int, None] = OrderedDict()
        self.draining: dict[int, int | None] = {}  # alias -> streams still expected after PUBLISH_DONE
        self.next_track_alias = 0
        self.outbound: dict[int, OutboundStream] = {}
        self.inbound: dict[int, InboundStream] = {}
        self.held_bytes = 0
        self.goaway_received = False
        self.goaway_sent = False
        self.shape: ControlShape = shape_for(self)  # the draft's strategy for what changed shape

    def check_open(self) -> SessionState:
        """This state, for a send the application asked for; raises unless the session is up."""
        if self.done:
            raise SessionClosedError("the session is closed")
        if not self.established:
            raise LocalError("the session is not established yet")
        return self

    def send_control(self, message: ControlMessage) -> None:
        """Send a draft-neutral message the way the draft carries it (``shape``)."""
        self.shape.send(message)

    def write_control(self, message: ControlMessage) -> None:
        """Write a message on the control stream as it is."""
        if self.control_stream_id is None:
            raise RuntimeError("no control stream yet")
        self.quic.send_stream_data(self.control_stream_id, message.encode(self.profile))

    def send_stream(self, stream_id: int, data: Bytes, end_stream: bool = False) -> None:
        """Hand octets to QUIC. aioquic appends them to its own send buffer (``bytearray += data``),
        which accepts any buffer, so payload views pass through without an extra copy here."""
        self.quic.send_stream_data(stream_id, data, end_stream)  # type: ignore[arg-type]

    def close(self, error: SessionError | int, reason: str) -> None:
        if not self.done:
            self.done = True
            self.quic.close(error_code=self.profile.session_errors.code(error), reason_phrase=reason)

    def stop_receiving(self, stream_id: int, code: StreamReset | int = StreamReset.CANCELLED) -> None:
        with contextlib.suppress(ValueError):  # already finished and discarded by aioquic: nothing to stop
            self.quic.stop_stream(stream_id, self.profile.stream_resets.code(code))

    def reset_sending(self, stream_id: int, code: StreamReset | int = StreamReset.CANCELLED) -> None:
        stream = self.outbound.get(stream_id)
        if stream is not None and not stream.closed:
            stream.closed = True
            self.quic.reset_stream(stream_id, self.profile.stream_resets.code(code))
            request = self.requests.get(stream.request_id)
            if request is not None:
                request.open_streams.discard(stream_id)
        self.outbound.pop(stream_id, None)

    def reset_request_streams(self, request: Request, code: StreamReset | int = StreamReset.CANCELLED) -> None:
        for stream_id in list(request.open_streams):
            self.reset_sending(stream_id, code)

    def allocate_track_alias(self) -> int:
        alias = self.next_track_alias
        self.next_track_alias += 1
        return alias

    def register_inbound_alias(self, alias: int, request_id: int) -> None:
        """A Track Alias for a subscription we receive; reusing an active one closes the session."""
        if alias in self.inbound_aliases and self.draining.pop(alias, 0) == 0:
            raise ProtocolViolation(SessionError.DUPLICATE_TRACK_ALIAS, f"Track Alias {alias} already in use")
        self.retired_aliases.pop(alias, None)
        self.inbound_aliases[alias] = request_id

    def retire_alias(self, alias: int | None) -> None:
        """Keep a bounded memory of ended aliases so late objects are dropped, not held."""
        if alias is None or self.inbound_aliases.pop(alias, None) is None:
            return
        self.draining.pop(alias, None)
        self.retired_aliases[alias] = None
        while len(self.retired_aliases) > _RETIRED_ALIASES_KEPT:
            self.retired_aliases.popitem(last=False)

    def finish_subscription(self, request: Request, stream_count: int) -> None:
        """PUBLISH_DONE: forget the subscription, but keep its alias until the streams the publisher
        says it opened have all been seen (they often open after PUBLISH_DONE arrives)."""
        self.requests.pop(request.request_id, None)
        self.shape.request_over(request)
        alias = request.track_alias
        if alias is None or self.inbound_aliases.get(alias) != request.request_id:
            return
        remaining = None if stream_count >= VARINT_MAX else stream_count - request.streams_seen
        if remaining is not None and remaining <= 0:
            self.retire_alias(alias)
        else:
            self.draining[alias] = remaining

    def stream_seen(self, alias: int) -> None:
        """A subgroup stream of ``alias`` arrived; a draining alias retires with its last stream."""
        if alias not in self.draining:
            return
        remaining = self.draining[alias]
        if remaining is not None:
            if remaining <= 1:
                self.retire_alias(alias)
            else:
                self.draining[alias] = remaining - 1

    def remove_request(self, request: Request) -> None:
        self.requests.pop(request.request_id, None)
        self.shape.request_over(request)
        if request.we_subscribe:
            self.retire_alias(request.track_alias)

    def existed(self, request_id: int) -> bool:
        """True for any Request ID that either side has used in this session."""
        return self.ids.issued_locally(request_id) or self.ids.issued_by_peer(request_id)
