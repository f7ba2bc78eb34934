"""``MoqtSession``: MOQT draft-14 over an aioquic ``QuicConnection``, sans-I/O (like ``H3Connection``).

Why this shape: the session never touches sockets, tasks or clocks. The caller feeds every QUIC event
to ``handle_event`` and gets MOQT events back; the request and publishing methods write to the
``QuicConnection``, and the caller then flushes ``quic.datagrams_to_send(now)`` as it already does.
Time enters only as ``now`` arguments (the GOAWAY timeout). A peer's input never raises: a violation
closes the connection with the draft's Session Termination code and yields ``SessionTerminated``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Final, Literal

from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import (
    ConnectionTerminated,
    DatagramFrameReceived,
    QuicEvent,
    StopSendingReceived,
    StreamDataReceived,
    StreamReset,
)

from moqt._control import ControlHandler
from moqt._core import OutboundStream, Request, RequestKind, SessionCore, SessionLimits
from moqt._datastreams import DataReceiver
from moqt._request_api import RequestApi
from moqt._requests import RequestIds
from moqt._tokens import ResolvedToken, TokenCache
from moqt.data import FetchHeader, FetchWriter, ObjectDatagram, Payload, SubgroupHeader, SubgroupWriter
from moqt.errors import LocalError, ProtocolViolation, StreamClosedError
from moqt.events import DataStreamStopped, MoqtEvent, SessionEstablished, SessionTerminated, SetupRequested
from moqt.messages import (
    ClientSetup,
    ControlMessage,
    ControlStreamParser,
    GoAway,
    MaxRequestId,
    ServerSetup,
)
from moqt.params import SetupParameters
from moqt.profile import DRAFT_14, ObjectStatus, Profile, SessionErrorCode, StreamResetCode
from moqt.wire import KeyValuePair

Role = Literal["client", "server"]
_PV: Final = SessionErrorCode.PROTOCOL_VIOLATION


class MoqtSession(RequestApi):
    """One MOQT session on one QUIC connection.

    :param quic: the connection (ALPN ``moq-00``, QUIC DATAGRAM negotiated).
    :param role: ``"client"`` or ``"server"``; must match ``quic.configuration.is_client``.
    :param path: client: the PATH setup parameter; server: the only PATH accepted (None: any).
    :param authority: client: the AUTHORITY parameter; server: the only AUTHORITY accepted when sent.
    :param setup_parameters: extra setup parameters (tokens, implementation name); the session sets
        PATH, AUTHORITY and MAX_REQUEST_ID itself.
    :param request_window: how many requests the peer may have in flight (initial MAX_REQUEST_ID).
    :param auto_grant_requests: refill the peer's window as it is used (off: call ``grant_requests``).
    :param auto_accept: server: answer a valid CLIENT_SETUP at once; off: emit ``SetupRequested``.
    :param deliver_partial_objects: emit ``ObjectChunkReceived`` pieces instead of whole objects.
    :param max_auth_token_cache_size: octets of token aliases the peer may register with us (0: none).
    """

    def __init__(self, quic: QuicConnection, *, role: Role | None = None, profile: Profile = DRAFT_14,
                 path: str | None = None, authority: str | None = None,
                 setup_parameters: SetupParameters | None = None, supported_versions: Sequence[int] | None = None,
                 request_window: int = 100, auto_grant_requests: bool = True, auto_accept: bool = True,
                 deliver_partial_objects: bool = False, max_auth_token_cache_size: int = 0,
                 limits: SessionLimits | None = None) -> None:
        is_client = quic.configuration.is_client
        if role is not None and (role == "client") != is_client:
            raise ValueError(f"role {role!r} does not match the QUIC connection")
        limits = limits or SessionLimits()
        local_first = profile.client_first_request_id if is_client else profile.server_first_request_id
        peer_first = profile.server_first_request_id if is_client else profile.client_first_request_id
        ids = RequestIds(local_first=local_first, peer_first=peer_first, window=request_window,
                         auto_grant=auto_grant_requests)
        self._core = SessionCore(quic, profile=profile, is_client=is_client, limits=limits, ids=ids)
        self._data = DataReceiver(self._core, partial=deliver_partial_objects)
        self._tokens = TokenCache(max_auth_token_cache_size)
        self._control = ControlHandler(self._core, self._data, self._tokens)
        self._parser = ControlStreamParser(profile, max_message_length=limits.max_control_message_length)
        self._path = path
        self._authority = authority
        self._setup_parameters = setup_parameters or SetupParameters()
        self._versions = tuple(supported_versions or (profile.version,))
        self._auto_accept = auto_accept
        self._deferred: list[ControlMessage] | None = None
        self._client_setup: ClientSetup | None = None
        self._client_authorization: tuple[ResolvedToken, ...] = ()
        self._peer_parameters: SetupParameters | None = None
        self._goaway_deadline: float | None = None
        if is_client:
            self._start_client()

    # -- state -----------------------------------------------------------------------------------
    @property
    def is_client(self) -> bool:
        return self._core.is_client

    @property
    def is_established(self) -> bool:
        return self._core.established and not self._core.done

    @property
    def is_closed(self) -> bool:
        return self._core.done

    @property
    def version(self) -> int | None:
        return self._core.version

    @property
    def peer_parameters(self) -> SetupParameters | None:
        """The peer's setup parameters, once its setup message arrived."""
        return self._peer_parameters

    @property
    def peer_max_request_id(self) -> int:
        """Our requests may use IDs below this (the peer's Maximum Request ID plus 1)."""
        return self._core.ids.peer_max

    @property
    def deliver_partial_objects(self) -> bool:
        """Whether objects come as ``ObjectChunkReceived`` pieces (else whole, as ``ObjectReceived``)."""
        return self._data.partial

    @deliver_partial_objects.setter
    def deliver_partial_objects(self, partial: bool) -> None:
        """Switch before any data stream arrives (an object already begun stays as it was being delivered)."""
        self._data.partial = partial

    @property
    def goaway_received(self) -> bool:
        return self._core.goaway_received

    def can_send_request(self) -> bool:
        """True when a new request would get a Request ID (the peer's maximum allows it, no GOAWAY)."""
        return self._core.ids.can_allocate() and not self._core.goaway_received

    def track_alias(self, request_id: int) -> int | None:
        """The Track Alias of an open subscription (either direction), if it has one yet."""
        request = self._core.requests.get(request_id)
        return None if request is None else request.track_alias

    # -- QUIC events in --------------------------------------------------------------------------
    def handle_event(self, event: QuicEvent) -> list[MoqtEvent]:
        """Consume one QUIC event; return the MOQT events it produced. Never raises on peer input."""
        core = self._core
        if core.done:
            return []
        try:
            if isinstance(event, StreamDataReceived):
                self._on_stream_data(event)
            elif isinstance(event, DatagramFrameReceived):
                if core.established:
                    self._data.datagram(event.data)
            elif isinstance(event, StreamReset):
                self._on_stream_reset(event)
            elif isinstance(event, StopSendingReceived):
                self._on_stop_sending(event)
            elif isinstance(event, ConnectionTerminated):
                core.done = True
                core.events.append(SessionTerminated(event.error_code, event.reason_phrase, remote=True))
        except ProtocolViolation as exc:
            self._fail(exc.error_code, exc.reason)
        except Exception as exc:  # a bug of ours must still end in a clean close, never escape to the loop
            self._fail(SessionErrorCode.INTERNAL_ERROR, f"internal error: {exc!r}"[:200])
        return self._take_events()

    def _take_events(self) -> list[MoqtEvent]:
        events, self._core.events = self._core.events, []
        return events

    def _fail(self, error_code: int, reason: str) -> None:
        if not self._core.done:
            self._core.close(error_code, reason)
            self._core.events.append(SessionTerminated(error_code, reason, remote=False))

    def _on_stream_data(self, event: StreamDataReceived) -> None:
        core = self._core
        stream_id = event.stream_id
        if stream_id & 0x2:  # unidirectional: a data stream (the peer's, QUIC checked the direction)
            self._data.receive(stream_id, event.data, event.end_stream)
            return
        if core.control_stream_id is None and not core.is_client and stream_id % 4 == 0:
            core.control_stream_id = stream_id
        if stream_id != core.control_stream_id:
            raise ProtocolViolation(_PV, f"bidirectional stream {stream_id} besides the control stream")
        for message in self._parser.feed(event.data):
            self._on_control(message)
        if event.end_stream:
            raise ProtocolViolation(_PV, "the control stream was closed")

    def _on_stream_reset(self, event: StreamReset) -> None:
        if event.stream_id == self._core.control_stream_id:
            raise ProtocolViolation(_PV, "the control stream was reset")
        self._data.reset(event.stream_id, event.error_code)

    def _on_stop_sending(self, event: StopSendingReceived) -> None:
        core = self._core
        if event.stream_id == core.control_stream_id:
            raise ProtocolViolation(_PV, "STOP_SENDING on the control stream")
        stream = core.outbound.pop(event.stream_id, None)
        if stream is None:
            return
        stream.closed = True  # aioquic has already reset it
        request = core.requests.get(stream.request_id)
        if request is not None:
            request.open_streams.discard(event.stream_id)
        core.events.append(DataStreamStopped(event.stream_id, stream.request_id, event.error_code))

    def _on_control(self, message: ControlMessage) -> None:
        if self._deferred is not None:
            if len(self._deferred) >= self._core.limits.max_deferred_messages:
                raise ProtocolViolation(_PV, "too many messages before SERVER_SETUP")
            self._deferred.append(message)
        elif not self._core.established:
            self._on_setup(message)
        elif isinstance(message, ClientSetup | ServerSetup):
            raise ProtocolViolation(_PV, f"a second {message.TYPE.name}")
        else:
            self._control.handle(message)

    # -- setup -----------------------------------------------------------------------------------
    def _start_client(self) -> None:
        core = self._core
        core.control_stream_id = core.quic.get_next_available_stream_id()
        params = dataclasses.replace(self._setup_parameters, path=self._path, authority=self._authority,
                                     max_request_id=core.ids.local_max,
                                     max_auth_token_cache_size=self._tokens.max_size or None)
        core.send_control(ClientSetup(self._versions, params))

    def _on_setup(self, message: ControlMessage) -> None:
        core = self._core
        if core.is_client:
            if not isinstance(message, ServerSetup):
                raise ProtocolViolation(_PV, f"{message.TYPE.name} before SERVER_SETUP")
            if message.selected_version not in self._versions:
                raise ProtocolViolation(SessionErrorCode.VERSION_NEGOTIATION_FAILED,
                                        f"server selected version 0x{message.selected_version:x}, not offered")
            if message.parameters.path is not None:
                raise ProtocolViolation(SessionErrorCode.INVALID_PATH, "PATH sent by the server")
            if message.parameters.authority is not None:
                raise ProtocolViolation(SessionErrorCode.INVALID_AUTHORITY, "AUTHORITY sent by the server")
            authorization = self._tokens.apply(message.parameters.authorization_tokens)
            self._established(message.selected_version, message.parameters, authorization)
            return
        if not isinstance(message, ClientSetup):
            raise ProtocolViolation(_PV, f"{message.TYPE.name} before CLIENT_SETUP")
        self._check_client_setup(message)
        self._client_setup = message
        self._client_authorization = self._tokens.apply(message.parameters.authorization_tokens,
                                                        in_client_setup=True)
        if self._auto_accept:
            self._send_server_setup(None)
        else:
            self._deferred = []
            core.events.append(SetupRequested(message, self._client_authorization))

    def _check_client_setup(self, message: ClientSetup) -> None:
        if not any(v in self._versions for v in message.supported_versions):
            raise ProtocolViolation(SessionErrorCode.VERSION_NEGOTIATION_FAILED,
                                    "no offered version is supported")
        params = message.parameters
        if self._path is not None and (params.path or "") != self._path:
            raise ProtocolViolation(SessionErrorCode.INVALID_PATH, f"path {params.path!r} is not served here")
        if self._authority is not None and params.authority not in (None, self._authority):
            raise ProtocolViolation(SessionErrorCode.INVALID_AUTHORITY, f"authority {params.authority!r}")

    def _send_server_setup(self, parameters: SetupParameters | None) -> None:
        core = self._core
        client = self._client_setup
        assert client is not None
        version = next(v for v in client.supported_versions if v in self._versions)
        params = dataclasses.replace(parameters or self._setup_parameters, path=None, authority=None,
                                     max_request_id=core.ids.local_max,
                                     max_auth_token_cache_size=self._tokens.max_size or None)
        core.send_control(ServerSetup(version, params))
        self._established(version, client.parameters, self._client_authorization)

    def _established(self, version: int, peer: SetupParameters, authorization: tuple[ResolvedToken, ...]) -> None:
        core = self._core
        core.ids.set_peer_initial(peer.max_request_id)
        core.established = True
        core.version = version
        self._peer_parameters = peer
        core.events.append(SessionEstablished(version, peer, authorization))

    def accept_setup(self, parameters: SetupParameters | None = None) -> list[MoqtEvent]:
        """Server with ``auto_accept=False``: send SERVER_SETUP and process what the client pipelined."""
        if self._core.is_client or self._deferred is None or self._core.done:
            raise LocalError("no CLIENT_SETUP awaits an answer")
        deferred, self._deferred = self._deferred, None
        self._send_server_setup(parameters)
        try:
            for message in deferred:
                self._on_control(message)
        except ProtocolViolation as exc:
            self._fail(exc.error_code, exc.reason)
        except Exception as exc:  # as in handle_event: the peer's input never raises out of the session
            self._fail(SessionErrorCode.INTERNAL_ERROR, f"internal error: {exc!r}"[:200])
        return self._take_events()

    def reject_setup(self, error_code: int = SessionErrorCode.UNAUTHORIZED, reason: str = "") -> None:
        """Server with ``auto_accept=False``: refuse the session (e.g. UNAUTHORIZED)."""
        if self._core.is_client or self._deferred is None:
            raise LocalError("no CLIENT_SETUP awaits an answer")
        self._deferred = None
        self._core.close(error_code, reason)

    # -- session-level sends ---------------------------------------------------------------------
    def grant_requests(self, count: int) -> None:
        """Let the peer send ``count`` more requests beyond those received (sends MAX_REQUEST_ID)."""
        core = self._check_open()
        value = core.ids.grant(count)
        if value is not None:
            core.send_control(MaxRequestId(value))

    def goaway(self, new_session_uri: str = "", *, now: float | None = None, timeout: float | None = None) -> None:
        """Send GOAWAY. With ``now`` and ``timeout`` (seconds), close with GOAWAY_TIMEOUT at that time
        unless the session ended first (drive it with ``get_timer``/``handle_timer``)."""
        core = self._check_open()
        if core.goaway_sent:
            raise LocalError("GOAWAY was already sent")
        if core.is_client and new_session_uri:
            raise LocalError("a client's GOAWAY carries no New Session URI")
        core.send_control(GoAway(new_session_uri))
        core.goaway_sent = True
        if now is not None and timeout is not None:
            self._goaway_deadline = now + timeout

    def get_timer(self) -> float | None:
        """When ``handle_timer`` must next be called (like ``QuicConnection.get_timer``), or None."""
        return None if self._core.done else self._goaway_deadline

    def handle_timer(self, now: float) -> list[MoqtEvent]:
        """Fire what is due at ``now`` (the GOAWAY timeout); returns the resulting events."""
        if self._goaway_deadline is not None and now >= self._goaway_deadline:
            self._goaway_deadline = None
            self._fail(SessionErrorCode.GOAWAY_TIMEOUT, "the peer did not leave after GOAWAY")
        return self._take_events()

    def close(self, error_code: int = SessionErrorCode.NO_ERROR, reason: str = "") -> None:
        """Close the session (and the QUIC connection) with a Session Termination code."""
        self._core.close(error_code, reason)

    # -- publishing objects ----------------------------------------------------------------------
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
        return self._open_stream(request, SubgroupWriter(header))

    def open_fetch_stream(self, request_id: int) -> int:
        """Open the (single) data stream answering the peer's FETCH; returns its stream ID."""
        core = self._check_open()
        request = core.requests.get(request_id)
        if request is None or request.local or request.kind != RequestKind.FETCH:
            raise LocalError(f"{request_id} is not an open FETCH from the peer")
        if request.streams_opened:
            raise LocalError("a FETCH is answered on one stream")
        return self._open_stream(request, FetchWriter(FetchHeader(request_id)))

    def _open_stream(self, request: Request, writer: SubgroupWriter | FetchWriter) -> int:
        core = self._core
        stream_id = core.quic.get_next_available_stream_id(is_unidirectional=True)
        core.send_stream(stream_id, writer.encode_header())
        core.outbound[stream_id] = OutboundStream(stream_id, request.request_id, writer)
        request.open_streams.add(stream_id)
        request.streams_opened += 1
        return stream_id

    def _outbound(self, stream_id: int) -> OutboundStream:
        self._check_open()
        stream = self._core.outbound.get(stream_id)
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

    def reset_stream(self, stream_id: int, error_code: int = StreamResetCode.CANCELLED) -> None:
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
        core.quic.send_datagram_frame(datagram.encode())
