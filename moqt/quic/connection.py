"""One QUIC connection between aioquic's ``QuicConnection`` and a sans-I/O MOQT session.

It feeds the session every QUIC event, arms timers and authenticates the peer; everything MOQT lives
in the session, an object with ``handle_event(quic_event) -> list[event]`` that writes into the
``QuicConnection`` as aioquic's ``H3Connection`` does. The UDP socket behind it is an endpoint
(moqt/quic/endpoint.py) that feeds it datagrams in batches and calls :meth:`MoqtConnection._transmit`
once per batch. It schedules a transmit whenever anything writes into the connection; bounds each
stream's send buffer (``write``/``drain``); and passes ``now = max(loop.time(), deadline)`` to fired
timers, so 1 ms timer granularity (uvloop) cannot make aioquic's pacer spin. After the handshake it
verifies the peer certificate (moqt/tls.py) before the session exists, and surfaces the peer identity.

Closes use MOQT Session Termination codes in the application CONNECTION_CLOSE, named
(`moqt.kinds.SessionError`) and numbered by the connection's profile: ``UNAUTHORIZED`` for a
certificate that fails verification or no credentials by the auth deadline, ``INTERNAL_ERROR`` when
the session or an event handler raises.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Generic, Protocol, Self, TypeAlias, TypeVar, cast

from aioquic.quic import events as qe
from aioquic.quic.connection import NetworkAddress
from aioquic.quic.packet import QuicFrameType

from moqt.auth import AuthError
from moqt.errors import MoqtError
from moqt.kinds import SessionError
from moqt.profiles import DRAFT_14, Profile
from moqt.profiles.negotiation import profile_for_alpn
from moqt.quic.aioquic_hooks import (
    HookedQuicConnection,
    ack_eliciting_in_flight,
    negotiated_idle_timeout,
    peer_certificate_chain,
    send_buffered,
)
from moqt.quic.config import EndpointConfig, MoqtUri
from moqt.quic.liveness import Liveness, Verdict
from moqt.quic.refusal import address_text, certificate_alert, crypto_error
from moqt.quic.token_deadline import TokenDeadline
from moqt.tls import PeerCertificateError

log = logging.getLogger(__name__)

_MAX_REASON: Final = 200
_MAX_PENDING_EVENTS: Final = 64

E = TypeVar("E")
E_co = TypeVar("E_co", covariant=True)


class SessionLike(Protocol[E_co]):
    """What the adapter needs from a session: every QUIC event in, session events out."""

    def handle_event(self, event: qe.QuicEvent) -> Sequence[E_co]: ...


class TimedSession(SessionLike[E_co], Protocol[E_co]):
    """Optional: a session with its own deadlines (MoqtSession's GOAWAY timeout)."""

    def get_timer(self) -> float | None: ...

    def handle_timer(self, now: float) -> Sequence[E_co]: ...


SessionFactory: TypeAlias = Callable[["MoqtConnection[E]"], SessionLike[E]]
EventHandler: TypeAlias = Callable[["MoqtConnection[E]", E], None]


class ConnectionClosedError(MoqtError, ConnectionError):
    """The QUIC connection is closed. ``application`` is False for transport/TLS errors (e.g. an alert)."""

    def __init__(self, error_code: int, reason: str, application: bool) -> None:
        super().__init__(f"connection closed (code 0x{error_code:x}{'' if application else ', transport'}): {reason}")
        self.error_code, self.reason, self.application = error_code, reason, application


class DatagramEndpoint(Protocol):
    """What a connection needs from the UDP endpoint it lives on (moqt/quic/endpoint.py)."""

    def send(self, datagrams: list[tuple[bytes, NetworkAddress]]) -> None: ...

    def connection_id_issued(self, cid: bytes, conn: MoqtConnection[Any]) -> None: ...

    def connection_id_retired(self, cid: bytes) -> None: ...

    def connection_terminated(self, conn: MoqtConnection[Any]) -> None: ...


@dataclass(slots=True)
class ConnectionStats:
    """Counters for tests and benchmarks: ``transmits`` per ``datagrams_received`` shows coalescing."""

    datagrams_received: int = 0
    octets_received: int = 0
    datagrams_sent: int = 0
    octets_sent: int = 0
    transmits: int = 0
    largest_datagram_sent: int = 0
    keepalive_pings: int = 0


class SessionEvents(TokenDeadline, Generic[E]):
    """What the connections of both QUIC back-ends share (this module's `MoqtConnection`, picoquic's
    ``moqt.quic.pico.connection.PicoConnection``): the session's events, delivered to ``on_event`` or
    queued for one :meth:`next_event` consumer, the closed state and the error it raises, ``wait_ready``
    and ``async with``. The subclass calls `_init_events` in its ``__init__`` and provides ``close``,
    ``address``, ``profile`` and the two transport questions at the end."""

    address: NetworkAddress
    profile: Profile
    _loop: asyncio.AbstractEventLoop
    _on_event: Callable[[Any, E], None] | None

    def _init_events(self) -> None:
        self._session: SessionLike[E] | None = None
        self._events: deque[E] = deque()
        self._event_waiter: asyncio.Future[None] | None = None
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._closed = asyncio.Event()
        self._close_event: qe.ConnectionTerminated | None = None
        self._rejected = False

    @property
    def session(self) -> SessionLike[E] | None:
        return self._session

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def close_event(self) -> qe.ConnectionTerminated | None:
        """Why the connection ended (code, reason; ``frame_type`` None = application close)."""
        return self._close_event if self.closed else None

    async def next_event(self) -> E:
        """The next session event; raises :class:`ConnectionClosedError` once closed and drained."""
        while not self._events:
            if self.closed:
                raise self._closed_error()
            if self._event_waiter is not None:
                raise RuntimeError("next_event() already has a consumer")
            self._event_waiter = self._loop.create_future()
            try:
                await self._event_waiter
            finally:
                self._event_waiter = None
        return self._events.popleft()

    async def events(self) -> AsyncIterator[E]:
        """Session events until the connection closes."""
        while True:
            try:
                yield await self.next_event()
            except ConnectionClosedError:
                return

    async def wait_ready(self) -> None:
        """Handshake done, the peer checked as far as the back-end can, and the session created."""
        await asyncio.shield(self._ready)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close(SessionError.NO_ERROR if exc is None else SessionError.INTERNAL_ERROR)
        await self.wait_closed()

    def _run_session(self, method: Callable[[Any], Sequence[E]], argument: object) -> None:
        """Call into the session and deliver its events; a raise is a bug there: close INTERNAL_ERROR."""
        try:
            for item in method(argument):
                if self._on_event is not None:
                    self._on_event(self, item)
                else:
                    self._events.append(item)
        except Exception as exc:  # the session maps peer errors to closes itself; anything else is a bug
            self._rejected = True
            if self._transport_closing() and isinstance(exc, (MoqtError, ConnectionError)):
                # The session had closed for the peer's fault (e.g. a FIN with its CLIENT_SETUP) before a
                # handler answered an event of the same batch: the peer's doing, one line (kvsp/service/logs.py).
                log.info("MOQT peer %s: the session closed before its events were answered (%s)",
                         address_text(self.address), exc, extra={"kvsp_peer": "moqt.closed-early"})
            else:
                log.exception("MOQT session or event handler failed; closing the connection")
                self.close(SessionError.INTERNAL_ERROR, "internal error")
        self._wake_event_waiter()

    def _wake_event_waiter(self) -> None:
        if self._event_waiter is not None and not self._event_waiter.done():
            self._event_waiter.set_result(None)

    def _fail_ready(self, error: BaseException) -> None:
        if not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()  # marked retrieved: a server-side connection has nobody waiting

    def _closed_error(self) -> ConnectionClosedError:
        ev = self._close_event
        if ev is None:
            return ConnectionClosedError(self.profile.session_errors.code(SessionError.NO_ERROR), "closed", True)
        return ConnectionClosedError(ev.error_code, ev.reason_phrase, self._closed_by_application(ev))

    def _check_open(self) -> None:
        if self.closed or self._transport_closing():
            raise self._closed_error()

    def _transport_closing(self) -> bool:
        """Whether the QUIC connection is closing or closed (the session can no longer write)."""
        raise NotImplementedError

    def _closed_by_application(self, event: qe.ConnectionTerminated) -> bool:
        """Whether the close was the application's (a session's), not the transport's."""
        raise NotImplementedError


class MoqtConnection(SessionEvents[E]):
    """One QUIC connection, its session and its authenticated peer (``peer_identity`` and friends).

    Made by :func:`moqt.quic.connect` or a :class:`moqt.quic.MoqtServer`. The session factory runs once
    the handshake has completed *and* the peer certificate (if any) has verified, so no session sees an
    unverified peer.
    Session events go to ``on_event`` if given, else to a queue read with :meth:`next_event` (one
    consumer). A session with ``get_timer``/``handle_timer`` (GOAWAY timeout) has its timer armed too.
    """

    def __init__(self, quic: HookedQuicConnection, endpoint: DatagramEndpoint, address: NetworkAddress,
                 config: EndpointConfig, session_factory: SessionFactory[E], *, uri: MoqtUri | None = None,
                 on_event: EventHandler[E] | None = None, expected_identity: str | None = None) -> None:
        self.quic, self.address, self.config, self.uri = quic, address, config, uri
        self.is_client: bool = quic.configuration.is_client
        self.stats = ConnectionStats()
        self._loop = asyncio.get_running_loop()
        self._endpoint, self._factory, self._on_event = endpoint, session_factory, on_event
        self._expected_identity = expected_identity
        self._init_events()
        # The draft the handshake's ALPN chose (set at HandshakeCompleted): the session speaks it and it
        # numbers this connection's closes; draft-14 numbers a close before the handshake has completed.
        self.profile: Profile = DRAFT_14
        self._timed: TimedSession[E] | None = None
        self._pending: list[qe.QuicEvent] = []
        self._drainers: dict[int, asyncio.Future[None]] = {}
        self._transmit_handle: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._auth_timer: asyncio.TimerHandle | None = None
        self._liveness: Liveness | None = None  # from the end of the handshake (moqt/quic/liveness.py)
        self._pings = 0
        super().__init__(config.token_keys)
        quic.on_write = self.transmit_soon

    # -- events, sending -----------------------------------------------------------------------------
    def send_buffered(self, stream_id: int) -> int:
        """Octets written to ``stream_id`` that the peer has not acknowledged yet."""
        return send_buffered(self.quic, stream_id)

    async def drain(self, stream_id: int) -> None:
        """Wait until ``stream_id`` has at most half of ``send_high_water`` unacknowledged octets."""
        self._check_open()
        if self.send_buffered(stream_id) <= self.config.settings.send_high_water // 2:
            return
        if stream_id in self._drainers:
            raise RuntimeError(f"stream {stream_id} already has a writer waiting in drain()")
        waiter = self._drainers[stream_id] = self._loop.create_future()
        try:
            await waiter
        finally:
            self._drainers.pop(stream_id, None)

    async def write(self, stream_id: int, data: bytes | bytearray | memoryview, end_stream: bool = False) -> None:
        """Send ``data`` on a stream, never holding more than ``send_high_water`` octets in aioquic.

        Slices of ``data`` are handed over without an extra copy (aioquic appends them to its buffer).
        """
        view = memoryview(data).cast("B")
        high_water, pos = self.config.settings.send_high_water, 0
        while True:
            self._check_open()
            chunk = view[pos : pos + max(high_water - self.send_buffered(stream_id), 0)]
            pos += len(chunk)
            last = pos >= len(view)
            if chunk or (last and end_stream):
                # QuicStreamSender.write only takes len() and appends to a bytearray: any buffer works.
                self.quic.send_stream_data(stream_id, cast(bytes, chunk), end_stream and last)
            if last:
                return
            await self.drain(stream_id)

    def transmit_soon(self) -> None:
        """Send what is queued at the end of this event-loop turn (called automatically on writes)."""
        if self._transmit_handle is None and not self.closed:
            self._transmit_handle = self._loop.call_soon(self._transmit)

    def transmit_now(self) -> None:
        """Send what is queued now (a publisher's first object, ahead of the ones it queues next)."""
        if not self.closed:
            self._transmit()

    # -- lifecycle -----------------------------------------------------------------------------------
    def close(self, error: SessionError | int = SessionError.NO_ERROR, reason: str = "") -> None:
        """Close with a MOQT Session Termination (application CONNECTION_CLOSE); a name is numbered by
        the connection's profile, an integer passes through (e.g. a code relayed from elsewhere)."""
        if not self.closed:
            self.quic.close(error_code=self.profile.session_errors.code(error), reason_phrase=reason[:_MAX_REASON])
            self._transmit()

    # -- driven by the endpoint and timers -----------------------------------------------------------
    def _receive(self, data: bytes, address: NetworkAddress, now: float) -> None:
        """Feed one datagram; the endpoint calls :meth:`_transmit` once per batch afterwards."""
        self.stats.datagrams_received += 1
        self.stats.octets_received += len(data)
        self.quic.receive_datagram(data, address, now=now)
        if self._liveness is not None:
            self._liveness.received(now)
        self._process_events()

    def _transmit(self, now: float | None = None) -> None:
        if self._transmit_handle is not None:
            self._transmit_handle.cancel()
            self._transmit_handle = None
        stats = self.stats
        stats.transmits += 1
        datagrams = self.quic.datagrams_to_send(now=self._loop.time() if now is None else now)
        for data, _ in datagrams:
            stats.datagrams_sent += 1
            stats.octets_sent += len(data)
            stats.largest_datagram_sent = max(stats.largest_datagram_sent, len(data))
        self._endpoint.send(datagrams)
        live = self._liveness
        if live is not None and datagrams and live.watching and ack_eliciting_in_flight(self.quic):
            live.sent(self._loop.time() if now is None else now)
        self._arm_timer()

    def _arm_timer(self) -> None:
        timer_at = self.quic.get_timer()
        session_at = self._timed.get_timer() if self._timed is not None else None
        if session_at is not None and (timer_at is None or session_at < timer_at):
            timer_at = session_at
        live_at = self._liveness.next_check if self._liveness is not None else None
        if live_at is not None and (timer_at is None or live_at < timer_at):
            timer_at = live_at
        if self._timer is not None and self._timer_at != timer_at:
            self._timer.cancel()
            self._timer = None
        if self._timer is None and timer_at is not None:
            self._timer = self._loop.call_at(timer_at, self._on_timer)
        self._timer_at = timer_at

    def _on_timer(self) -> None:
        # An early wake-up (uvloop rounds to 1 ms) would find nothing due and re-arm the same deadline
        # forever; treating the deadline as reached keeps the pacer and loss timers moving.
        now = max(self._loop.time(), self._timer_at or 0.0)
        self._timer = self._timer_at = None
        self.quic.handle_timer(now=now)
        self._process_events()
        live = self._liveness
        if live is not None and not self.closed and live.next_check is not None and now >= live.next_check:
            self._check_liveness(live, now)
        timed = self._timed
        if timed is not None and not self._rejected and (due := timed.get_timer()) is not None and now >= due:
            self._run_session(timed.handle_timer, now)
        if not self.closed:
            self._transmit(now)

    def _process_events(self) -> None:
        while (event := self.quic.next_event()) is not None:
            if isinstance(event, qe.ConnectionIdIssued):
                self._endpoint.connection_id_issued(event.connection_id, self)
            elif isinstance(event, qe.ConnectionIdRetired):
                self._endpoint.connection_id_retired(event.connection_id)
            elif isinstance(event, qe.HandshakeCompleted):
                self.quic.handshake_done()
                self._handshake_completed()
            self._dispatch(event)
            if isinstance(event, qe.ConnectionTerminated):
                self._terminated(event)
        self._wake_drainers()

    def _dispatch(self, event: qe.QuicEvent) -> None:
        if self._rejected:
            return
        if self._session is None:
            if len(self._pending) < _MAX_PENDING_EVENTS:
                self._pending.append(event)
            return
        self._run_session(self._session.handle_event, event)

    def _handshake_completed(self) -> None:
        """Authenticate the peer, then create the session and replay what arrived before it."""
        if not self._choose_profile():
            return
        try:
            self._authenticate_peer()
            self._session = self._factory(self)
        except PeerCertificateError as exc:
            self._refuse_certificate(exc)
            return
        except AuthError as exc:
            log.info("peer %s rejected: %s", self.address, exc)
            self._rejected = True
            self._fail_ready(exc)
            self.close(exc.error, str(exc))
            return
        except Exception:
            log.exception("session factory failed; closing the connection")
            self._rejected = True
            self.close(SessionError.INTERNAL_ERROR, "internal error")
            return
        if all(callable(getattr(self._session, name, None)) for name in ("get_timer", "handle_timer")):
            self._timed = cast(TimedSession[E], self._session)
        pending, self._pending = self._pending, []
        for event in pending:
            self._dispatch(event)
        self._start_liveness()
        if not self._ready.done():
            self._ready.set_result(None)

    def _choose_profile(self) -> bool:
        """The session's draft from the agreed ALPN; none (a server that ignored our list): close."""
        alpn = self.quic.tls.alpn_negotiated
        profile = profile_for_alpn(alpn, self.config.settings.profiles)
        if profile is None:
            log.info("MOQT peer %s: no MOQT draft agreed (ALPN %r)", address_text(self.address), alpn,
                     extra={"kvsp_peer": "moqt.no-draft"})
            self._rejected = True
            self._fail_ready(ConnectionError(f"no MOQT draft agreed (ALPN {alpn!r})"))
            self.close(SessionError.PROTOCOL_VIOLATION, "no MOQT draft agreed")
            return False
        self.profile = profile
        log.debug("MOQT peer %s: draft-%d (ALPN %s)", address_text(self.address), profile.draft, alpn)
        return True

    def _refuse_certificate(self, exc: PeerCertificateError) -> None:
        """A certificate we reject: a transport close carrying the TLS alert (moqt/quic/refusal.py)."""
        alert = certificate_alert(peer_certificate_chain(self.quic), self.config.trust.roots)
        log.info("MOQT peer %s refused in the TLS handshake (%s): %s", address_text(self.address), alert.name, exc,
                 extra={"kvsp_peer": "moqt.tls-refused"})  # one rate-limited line (kvsp/service/logs.py)
        self._rejected = True
        self._fail_ready(exc)
        if not self.closed:
            self.quic.close(error_code=crypto_error(alert), frame_type=QuicFrameType.CRYPTO,
                            reason_phrase=str(exc)[:_MAX_REASON])
            self._transmit()

    def _start_liveness(self) -> None:
        """Keepalive (clients) and the liveness bound, once the peer's idle timeout is known."""
        s = self.config.settings
        interval = negotiated_idle_timeout(self.quic) / 3 if s.keepalive and self.is_client else None
        if interval is not None or s.liveness_timeout_s is not None:
            self._liveness = Liveness(interval, s.liveness_timeout_s, self._loop.time())

    def _check_liveness(self, live: Liveness, now: float) -> None:
        verdict = live.check(now, ack_eliciting_in_flight(self.quic))
        if verdict is Verdict.PING:
            self._pings += 1
            self.stats.keepalive_pings += 1
            self.quic.send_ping(self._pings)
        elif verdict is Verdict.DEAD:
            log.info("MOQT peer %s sent nothing for %.1f s while owing an ACK: closing", address_text(self.address),
                     live.timeout_s, extra={"kvsp_peer": "moqt.peer-unresponsive"})
            self.close(SessionError.INTERNAL_ERROR, f"peer unresponsive for {live.timeout_s:g} s")

    def _authenticate_peer(self) -> None:
        chain, trust = peer_certificate_chain(self.quic), self.config.trust
        if self.uri is not None:  # client: the server must match the URI's host (and identity, if given)
            peer = trust.verify_server(chain, self.uri.host)
            if self._expected_identity is not None and self._expected_identity not in peer.identities:
                raise PeerCertificateError(f"server is {peer.identity}, expected {self._expected_identity}")
        elif chain:
            peer = trust.verify_client(chain)
        elif self.config.require_certificate:
            raise PeerCertificateError("a client certificate is required")
        else:  # D3: a client without certificate has auth_timeout_s to present a valid token
            self._start_auth_deadline(self.config.settings.auth_timeout_s)
            return
        self.peer_certificate = peer
        self.peer_identity = peer.identity
        self.authenticated_by = "certificate"

    def _terminated(self, event: qe.ConnectionTerminated) -> None:
        self._close_event = event
        self._closed.set()
        for handle in (self._timer, self._auth_timer, self._transmit_handle):
            if handle is not None:
                handle.cancel()
        self._timer = self._auth_timer = self._transmit_handle = None
        error = self._closed_error()
        self._fail_ready(error)
        for waiter in self._drainers.values():
            if not waiter.done():
                waiter.set_exception(error)
        self._wake_event_waiter()  # next_event() returns what is queued, then raises
        self._endpoint.connection_terminated(self)

    def _transport_closing(self) -> bool:
        return bool(self.quic.closing)

    def _closed_by_application(self, event: qe.ConnectionTerminated) -> bool:
        return event.frame_type is None

    def _wake_drainers(self) -> None:
        if not self._drainers:
            return
        low_water = self.config.settings.send_high_water // 2
        for stream_id, waiter in self._drainers.items():
            if not waiter.done() and self.send_buffered(stream_id) <= low_water:
                waiter.set_result(None)

