"""``MoqtSession``: MOQT (the draft its ``Profile`` names: 14, 16 or 18) over an aioquic
``QuicConnection``, sans-I/O (like ``H3Connection``). The draft is chosen before the session exists --
by the ALPN the QUIC handshake agreed (``moqt-18``, ``moqt-16``; ``moq-00`` is draft-14) -- and passed
in as ``profile``; where the drafts differ in shape the session asks its strategy (``shapes``).

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

from moqt.errors import LocalError, ProtocolViolation
from moqt.events import DataStreamStopped, MoqtEvent, SessionEstablished, SessionTerminated, SetupRequested
from moqt.kinds import SessionError
from moqt.messages import (
    ClientSetup,
    ControlMessage,
    ControlStreamParser,
    MaxRequestId,
    ServerSetup,
)
from moqt.params import ResolvedToken, SetupParameters
from moqt.profiles import DRAFT_14, Profile
from moqt.profiles.negotiation import profile_for_alpn
from moqt.session.data_streams import DataReceiver
from moqt.session.inbound import ControlHandler
from moqt.session.outbound import RequestApi
from moqt.session.request_state import RequestState
from moqt.session.sending import ObjectApi
from moqt.session.shapes import shape_class
from moqt.session.state import SessionLimits, SessionState
from moqt.session.tokens import TokenCache

Role = Literal["client", "server"]
_PV: Final = SessionError.PROTOCOL_VIOLATION


def _negotiated_profile(quic: QuicConnection) -> Profile:
    """The draft the handshake's ALPN agreed (``moqt-NN``); draft-14 (``moq-00``) when none is known yet."""
    tls = getattr(quic, "tls", None)
    return profile_for_alpn(getattr(tls, "alpn_negotiated", None)) or DRAFT_14


class MoqtSession(RequestApi, ObjectApi):
    """One MOQT session on one QUIC connection.

    :param quic: the connection (ALPN ``profile.alpn``, QUIC DATAGRAM negotiated).
    :param role: ``"client"`` or ``"server"``; must match ``quic.configuration.is_client``.
    :param profile: the draft to speak; None: the one the QUIC handshake's ALPN agreed (draft-14 if none).
    :param path: client: the PATH setup parameter; server: the only PATH accepted (None: any).
    :param authority: client: the AUTHORITY parameter; server: the only AUTHORITY accepted when sent.
    :param setup_parameters: extra setup parameters (tokens, implementation name); the session sets
        PATH, AUTHORITY and MAX_REQUEST_ID itself.
    :param request_window: how many requests the peer may have in flight (initial MAX_REQUEST_ID;
        draft-18 has none: QUIC's bidirectional stream limit bounds the peer's requests).
    :param auto_grant_requests: refill the peer's window as it is used (off: call ``grant_requests``).
    :param auto_accept: server: answer a valid CLIENT_SETUP at once; off: emit ``SetupRequested``.
    :param deliver_partial_objects: emit ``ObjectChunkReceived`` pieces instead of whole objects.
    :param max_auth_token_cache_size: octets of token aliases the peer may register with us (0: none).
    """

    def __init__(self, quic: QuicConnection, *, role: Role | None = None, profile: Profile | None = None,
                 path: str | None = None, authority: str | None = None,
                 setup_parameters: SetupParameters | None = None, supported_versions: Sequence[int] | None = None,
                 request_window: int = 100, auto_grant_requests: bool = True, auto_accept: bool = True,
                 deliver_partial_objects: bool = False, max_auth_token_cache_size: int = 0,
                 limits: SessionLimits | None = None) -> None:
        is_client = quic.configuration.is_client
        if role is not None and (role == "client") != is_client:
            raise ValueError(f"role {role!r} does not match the QUIC connection")
        limits = limits or SessionLimits()
        profile = profile or _negotiated_profile(quic)
        local_first = profile.client_first_request_id if is_client else profile.server_first_request_id
        peer_first = profile.server_first_request_id if is_client else profile.client_first_request_id
        ids = shape_class(profile).REQUEST_IDS(local_first=local_first, peer_first=peer_first,
                                               window=request_window, auto_grant=auto_grant_requests)
        self._core = SessionState(quic, profile=profile, is_client=is_client, limits=limits, ids=ids)
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
    def profile(self) -> Profile:
        """The draft this session speaks; its tables turn draft-neutral names into wire codes."""
        return self._core.profile

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

    def request_state(self, request_id: int) -> RequestState | None:
        """Where an open request stands in the request table (None: over, or never opened)."""
        request = self._core.requests.get(request_id)
        return None if request is None else request.state

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
                core.events.append(SessionTerminated(event.error_code, event.reason_phrase, remote=True,
                                                     error=core.profile.session_errors.name(event.error_code)))
        except ProtocolViolation as exc:
            self._fail(exc.error, exc.reason)
        except Exception as exc:  # a bug of ours must still end in a clean close, never escape to the loop
            self._fail(SessionError.INTERNAL_ERROR, f"internal error: {exc!r}"[:200])
        return self._take_events()

    def _take_events(self) -> list[MoqtEvent]:
        events, self._core.events = self._core.events, []
        return events

    def _fail(self, error: SessionError, reason: str) -> None:
        core = self._core
        if not core.done:
            code = core.profile.session_errors.code(error)
            core.close(code, reason)
            core.events.append(SessionTerminated(code, reason, remote=False, error=error))

    def _on_stream_data(self, event: StreamDataReceived) -> None:
        core = self._core
        stream_id = event.stream_id
        if stream_id & 0x2:  # unidirectional (the peer's, QUIC checked): data, or draft-18 control / padding
            data, messages = core.shape.uni_stream(stream_id, event.data, event.end_stream)
            for message in messages:
                self._on_control(message)
            if data is not None:
                self._data.receive(stream_id, data, event.end_stream)
            return
        if not core.shape.control_bidi(stream_id):
            self._on_request_stream(event)
            return
        for message in self._parser.feed(event.data):
            self._on_control(message)
        if event.end_stream:
            raise ProtocolViolation(_PV, "the control stream was closed")

    def _on_request_stream(self, event: StreamDataReceived) -> None:
        """A bidirectional stream besides the control stream: a request's own (draft-16
        SUBSCRIBE_NAMESPACE), which the shape reads; draft-14 has none (PROTOCOL_VIOLATION)."""
        core = self._core
        shape = core.shape
        if not shape.owns(event.stream_id):
            raise ProtocolViolation(_PV, f"bidirectional stream {event.stream_id} besides the control stream")
        if not core.established:  # the draft lets us reset such a stream rather than buffer it
            shape.early_request_stream(event.stream_id, event.data, event.end_stream)
            return
        for message in shape.request_stream(event.stream_id, event.data, event.end_stream):
            self._control.handle(message)
        if event.end_stream:
            for message in shape.request_stream_ended(event.stream_id):
                self._control.handle(message)

    def _on_stream_reset(self, event: StreamReset) -> None:
        if event.stream_id == self._core.control_stream_id:
            raise ProtocolViolation(_PV, "the control stream was reset")
        if not event.stream_id & 0x2:  # bidirectional: a request's stream
            self._request_stream_closed(event.stream_id, event.error_code, ours=False)
            return
        if not self._core.shape.uni_stream_reset(event.stream_id):
            self._data.reset(event.stream_id, event.error_code)

    def _request_stream_closed(self, stream_id: int, error_code: int, *, ours: bool) -> None:
        for message in self._core.shape.request_stream_closed(stream_id, error_code, ours=ours):
            self._control.handle(message)

    def _on_stop_sending(self, event: StopSendingReceived) -> None:
        core = self._core
        if event.stream_id == core.control_stream_id:
            raise ProtocolViolation(_PV, "STOP_SENDING on the control stream")
        if not event.stream_id & 0x2:
            self._request_stream_closed(event.stream_id, event.error_code, ours=True)
            return
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
            raise ProtocolViolation(_PV, f"a second {message.KIND.value}")
        else:
            neutral = self._core.shape.receive(message)  # draft-16 answers turned into the neutral ones
            if neutral is not None:
                self._control.handle(neutral)

    # -- setup -----------------------------------------------------------------------------------
    def _start_client(self) -> None:
        core = self._core
        params = dataclasses.replace(self._setup_parameters, path=self._path, authority=self._authority,
                                     max_request_id=core.ids.local_max,
                                     max_auth_token_cache_size=self._tokens.max_size or None)
        core.send_control(ClientSetup(self._versions, params))

    def _on_setup(self, message: ControlMessage) -> None:
        core = self._core
        if core.is_client:
            if not isinstance(message, ServerSetup):
                raise ProtocolViolation(_PV, f"{message.KIND.value} before SERVER_SETUP")
            if message.selected_version not in self._versions:
                raise ProtocolViolation(SessionError.VERSION_NEGOTIATION_FAILED,
                                        f"server selected version 0x{message.selected_version:x}, not offered")
            if message.parameters.path is not None:
                raise ProtocolViolation(SessionError.INVALID_PATH, "PATH sent by the server")
            if message.parameters.authority is not None:
                raise ProtocolViolation(SessionError.INVALID_AUTHORITY, "AUTHORITY sent by the server")
            authorization = self._tokens.apply(message.parameters.authorization_tokens)
            self._established(message.selected_version, message.parameters, authorization)
            return
        if not isinstance(message, ClientSetup):
            raise ProtocolViolation(_PV, f"{message.KIND.value} before CLIENT_SETUP")
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
            raise ProtocolViolation(SessionError.VERSION_NEGOTIATION_FAILED,
                                    "no offered version is supported")
        params = message.parameters
        if self._path is not None and (params.path or "") != self._path:
            raise ProtocolViolation(SessionError.INVALID_PATH, f"path {params.path!r} is not served here")
        if self._authority is not None and params.authority not in (None, self._authority):
            raise ProtocolViolation(SessionError.INVALID_AUTHORITY, f"authority {params.authority!r}")

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
        for message in core.shape.established():
            self._control.handle(message)

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
            self._fail(exc.error, exc.reason)
        except Exception as exc:  # as in handle_event: the peer's input never raises out of the session
            self._fail(SessionError.INTERNAL_ERROR, f"internal error: {exc!r}"[:200])
        return self._take_events()

    def reject_setup(self, error_code: SessionError | int = SessionError.UNAUTHORIZED, reason: str = "") -> None:
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
        core.send_control(core.shape.goaway_message(new_session_uri, timeout))
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
            self._fail(SessionError.GOAWAY_TIMEOUT, "the peer did not leave after GOAWAY")
        return self._take_events()

    def close(self, error_code: SessionError | int = SessionError.NO_ERROR, reason: str = "") -> None:
        """Close the session (and the QUIC connection) with a Session Termination code."""
        self._core.close(error_code, reason)
