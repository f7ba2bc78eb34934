"""The asyncio adapter between UDP sockets, aioquic's ``QuicConnection`` and a sans-I/O MOQT session.

It moves datagrams, arms timers and authenticates peers; everything MOQT lives in the session, an
object with ``handle_event(quic_event) -> list[event]`` that writes into the ``QuicConnection`` as
aioquic's ``H3Connection`` does. Compared with ``aioquic.asyncio`` it reads up to ``recv_batch``
datagrams per socket wake-up and builds packets once per batch (aioquic.asyncio builds after every
datagram: about a third of receiver CPU); schedules a transmit whenever anything writes into the
connection; bounds each stream's send buffer (``write``/``drain``); asks for 4 MiB socket buffers;
picks the datagram size per peer (64 KiB on loopback: ``HookedQuicConnection`` writes STREAM frames
longer than aioquic's 16383-octet limit) and clamps it (:data:`MAX_DATAGRAM_SIZE`); can send runs of
datagrams with UDP GSO (``QuicSettings.gso``, moqt/udp.py); and passes
``now = max(loop.time(), deadline)`` to fired timers, so 1 ms timer granularity (uvloop) cannot make
aioquic's pacer spin. After the handshake it verifies the peer certificate (``moqt/tls.py``) before
the session exists, and surfaces the peer identity.

Closes use MOQT Session Termination codes (draft-14 section 3.4) in the application CONNECTION_CLOSE:
``UNAUTHORIZED`` (0x2) for a certificate that fails verification or no credentials by the auth
deadline, ``INTERNAL_ERROR`` (0x1) when the session or an event handler raises.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Generic, Protocol, TypeAlias, TypeVar, cast
from urllib.parse import urlsplit

from aioquic._buffer import Buffer
from aioquic.quic import events as qe
from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE, QuicConfiguration
from aioquic.quic.connection import NetworkAddress
from aioquic.quic.packet import QuicPacketType, encode_quic_version_negotiation, pull_quic_header
from cryptography.hazmat.primitives.asymmetric import ec

from moqt.auth import AuthError
from moqt.errors import MoqtError
from moqt.tls import (
    HookedQuicConnection,
    LocalCredentials,
    PeerAuthentication,
    PeerCertificateError,
    PeerTrust,
    peer_certificate_chain,
    send_buffered,
)
from moqt.udp import DatagramSender, udp_socket

log = logging.getLogger(__name__)

ALPN: Final = "moq-00"
DEFAULT_PORT: Final = 443
NO_ERROR: Final = 0x0
INTERNAL_ERROR: Final = 0x1
UNAUTHORIZED: Final = 0x2
MAX_DATAGRAM_SIZE: Final = 65507
"""Largest usable ``max_datagram_size``: the largest UDP payload over IPv4. aioquic alone writes a STREAM
frame's Length in 14 bits (at most 16383 octets), which capped packets at 16000; ``HookedQuicConnection``
writes it in 30 bits and keeps handshake packets at 16000 (moqt/tls.py)."""
LOOPBACK_DATAGRAM_SIZE: Final = 65488
"""Loopback MTU (65536) less IPv6 and UDP headers: the largest datagram that crosses ``lo`` unfragmented
for both address families."""
_MAX_REASON: Final = 200
_MAX_PENDING_EVENTS: Final = 64
_MAX_SEND_BACKLOG: Final = 4096
_RECV_SIZE: Final = 65536
_CID_LENGTH: Final = 8  # aioquic's default connection_id_length, which our configurations keep

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


# -- configuration ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MoqtUri:
    """``moqt://host[:port]/path[?query]`` (draft-14 section 3.1); ``path`` goes in the PATH parameter."""

    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, uri: str) -> MoqtUri:
        try:
            parts = urlsplit(uri)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"{uri!r} is not a valid URI: {exc}") from exc
        if parts.scheme != "moqt":
            raise ValueError(f"{uri!r}: scheme must be moqt")
        if not parts.hostname or parts.username is not None or parts.fragment:
            raise ValueError(f"{uri!r}: needs a host, no userinfo and no fragment")
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        return cls(parts.hostname, DEFAULT_PORT if port is None else port, path)

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"moqt://{self.authority}{self.path}"


def _clamp_datagram(name: str, value: int) -> int:
    if value < SMALLEST_MAX_DATAGRAM_SIZE:
        raise ValueError(f"{name} must be at least {SMALLEST_MAX_DATAGRAM_SIZE} (RFC 9000 section 14)")
    if value > MAX_DATAGRAM_SIZE:
        log.warning("%s=%d clamped to %d: the largest UDP payload over IPv4", name, value, MAX_DATAGRAM_SIZE)
        return MAX_DATAGRAM_SIZE
    return value


@dataclass(frozen=True, slots=True)
class QuicSettings:
    """QUIC knobs, with defaults for a datacenter LAN and loopback (where kvsp moves KV blocks).

    Datagram size is the main throughput lever for a Python QUIC stack (per-packet CPU dominates; see
    docs/moqt-performance.md and benchmarks/bench_quic.py): 65488 octets on loopback move a block with
    about half the CPU of 16000. Loopback peers get ``loopback_datagram_size``, others
    ``max_datagram_size`` (1452 = Ethernet MTU 1500 minus IPv6 and UDP headers; 8952 on a jumbo-frame
    fabric). aioquic has no path MTU discovery: a size the path cannot carry unfragmented works only
    where IP fragments get through. Handshake datagrams stay at 16000 at most (moqt/tls.py).
    """

    max_datagram_size: int = 1452
    loopback_datagram_size: int = LOOPBACK_DATAGRAM_SIZE
    max_data: int = 64 << 20  # connection flow-control window: octets the peer may send ahead
    max_stream_data: int = 16 << 20  # per-stream window: a few KV layers
    max_datagram_frame_size: int = 65535  # QUIC DATAGRAM (RFC 9221), which MOQT object datagrams need
    congestion_control: str = "cubic"
    idle_timeout_s: float = 30.0
    initial_rtt_s: float = 0.01  # RTT guess before the first sample: a LAN value, so early loss recovers fast
    socket_buffer_bytes: int = 4 << 20
    send_high_water: int = 4 << 20  # write() keeps at most this much unacknowledged per stream; resumes at 1/2
    recv_batch: int = 64  # datagrams read per socket wake-up before one transmit
    ack_delay_s: float = 0.001  # how long a receiver may hold an ACK back (aioquic's value; below 25 ms)
    max_flight_bytes: int | None = None  # congestion window cap (None: aioquic's unbounded slow start); see
    # moqt.tls.capped_congestion_control: avoids loopback bursts beyond the peer's socket buffer, no gain measured
    gso: bool = False  # UDP GSO on Linux (moqt/udp.py): no gain measured here (docs/moqt-performance.md)
    handshake_timeout_s: float = 10.0
    auth_timeout_s: float = 10.0  # how long a client without certificate has to present a valid token (D3)

    def __post_init__(self) -> None:
        for name in ("max_datagram_size", "loopback_datagram_size"):
            object.__setattr__(self, name, _clamp_datagram(name, getattr(self, name)))
        if min(self.max_data, self.max_stream_data, self.send_high_water, self.recv_batch) <= 0:
            raise ValueError("flow-control windows, send_high_water and recv_batch must be positive")
        if self.max_flight_bytes is not None and self.max_flight_bytes < 4 * self.loopback_datagram_size:
            raise ValueError("max_flight_bytes must allow at least 4 datagrams of loopback_datagram_size")
        if not 0 <= self.ack_delay_s < 0.025:
            raise ValueError("ack_delay_s must be within [0, 0.025): aioquic announces max_ack_delay 25 ms")
        if self.congestion_control not in ("reno", "cubic"):
            raise ValueError(f"congestion_control {self.congestion_control!r}: aioquic has reno and cubic")

    def datagram_size_for(self, address: NetworkAddress) -> int:
        """The datagram size to send to ``address``: the loopback size for 127/8, ::1, ::ffff:127/104."""
        try:
            ip = ipaddress.ip_address(str(address[0]).split("%")[0])
        except ValueError:
            return self.max_datagram_size
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        loopback = ip.is_loopback or (mapped is not None and mapped.is_loopback)
        return self.loopback_datagram_size if loopback else self.max_datagram_size


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """Who we are (``credentials``), whom we trust (``trust``, ``token_keys``) and the QUIC settings.

    ``credentials`` may be None only on a client that authenticates with a token instead (D3).
    A server with ``require_certificate`` closes certificate-less clients at once.
    """

    trust: PeerTrust
    credentials: LocalCredentials | None = None
    settings: QuicSettings = field(default_factory=QuicSettings)
    token_keys: tuple[ec.EllipticCurvePublicKey, ...] = ()
    require_certificate: bool = False

    @classmethod
    def from_files(cls, cert: Path | None, key: Path | None, ca: Path, settings: QuicSettings | None = None, *,
                   token_keys: Sequence[ec.EllipticCurvePublicKey] = (),
                   require_certificate: bool = False) -> EndpointConfig:
        """Load a role's PEM certificate/key (as written by ``kvsp certs``) and the deployment CA."""
        credentials = LocalCredentials.load(cert, key) if cert is not None and key is not None else None
        return cls(PeerTrust.load(ca), credentials, settings or QuicSettings(), tuple(token_keys),
                   require_certificate)

    def quic_configuration(self, *, is_client: bool, datagram_size: int,
                           server_name: str | None = None) -> QuicConfiguration:
        s = self.settings
        qc = QuicConfiguration(is_client=is_client, alpn_protocols=[ALPN], max_datagram_size=datagram_size,
                               max_data=s.max_data, max_stream_data=s.max_stream_data,
                               congestion_control_algorithm=s.congestion_control, idle_timeout=s.idle_timeout_s,
                               server_name=server_name, max_datagram_frame_size=s.max_datagram_frame_size)
        qc.initial_rtt = s.initial_rtt_s
        if self.credentials is not None:
            qc.certificate = self.credentials.chain[0]
            qc.certificate_chain = list(self.credentials.chain[1:])
            qc.private_key = self.credentials.private_key
        # aioquic's own client-side check (pyOpenSSL + service_identity) rejects every kvsp certificate:
        # service_identity cannot parse a URI SAN with a port or path ("moqt://h:4433/x"). So it is off,
        # and moqt/tls.py verifies chain, name and identity at HandshakeCompleted, before the session
        # exists. Our certificate may reach a server we then reject: it is public, and its
        # CertificateVerify signature is bound to this handshake's transcript.
        qc.verify_mode = ssl.CERT_NONE
        return qc


@dataclass(slots=True)
class ConnectionStats:
    """Counters for tests and benchmarks: ``transmits`` per ``datagrams_received`` shows coalescing."""

    datagrams_received: int = 0
    octets_received: int = 0
    datagrams_sent: int = 0
    octets_sent: int = 0
    transmits: int = 0
    largest_datagram_sent: int = 0


# -- the connection --------------------------------------------------------------------------------
class MoqtConnection(PeerAuthentication, Generic[E]):
    """One QUIC connection, its session and its authenticated peer (``peer_identity`` and friends).

    Made by :func:`connect` or a :class:`MoqtServer`. The session factory runs once the handshake has
    completed *and* the peer certificate (if any) has verified, so no session sees an unverified peer.
    Session events go to ``on_event`` if given, else to a queue read with :meth:`next_event` (one
    consumer). A session with ``get_timer``/``handle_timer`` (GOAWAY timeout) has its timer armed too.
    """

    def __init__(self, quic: HookedQuicConnection, endpoint: _Endpoint, address: NetworkAddress,
                 config: EndpointConfig, session_factory: SessionFactory[E], *, uri: MoqtUri | None = None,
                 on_event: EventHandler[E] | None = None, expected_identity: str | None = None) -> None:
        self.quic, self.address, self.config, self.uri = quic, address, config, uri
        self.is_client: bool = quic.configuration.is_client
        self.stats = ConnectionStats()
        self._loop = asyncio.get_running_loop()
        self._endpoint, self._factory, self._on_event = endpoint, session_factory, on_event
        self._expected_identity = expected_identity
        self._session: SessionLike[E] | None = None
        self._timed: TimedSession[E] | None = None
        self._pending: list[qe.QuicEvent] = []
        self._events: deque[E] = deque()
        self._event_waiter: asyncio.Future[None] | None = None
        self._drainers: dict[int, asyncio.Future[None]] = {}
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._closed = asyncio.Event()
        self._close_event: qe.ConnectionTerminated | None = None
        self._rejected = False
        self._transmit_handle: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._auth_timer: asyncio.TimerHandle | None = None
        super().__init__(config.token_keys)
        quic.on_write = self.transmit_soon

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

    # -- events, sending -----------------------------------------------------------------------------
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
    async def wait_ready(self) -> None:
        """Handshake done, peer certificate verified (if any) and session created."""
        await asyncio.shield(self._ready)

    def close(self, error_code: int = NO_ERROR, reason: str = "") -> None:
        """Close with a MOQT Session Termination code (application CONNECTION_CLOSE)."""
        if not self.closed:
            self.quic.close(error_code=error_code, reason_phrase=reason[:_MAX_REASON])
            self._transmit()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> MoqtConnection[E]:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close(NO_ERROR if exc is None else INTERNAL_ERROR)
        await self.wait_closed()

    # -- driven by the endpoint and timers -----------------------------------------------------------
    def _receive(self, data: bytes, address: NetworkAddress, now: float) -> None:
        """Feed one datagram; the endpoint calls :meth:`_transmit` once per batch afterwards."""
        self.stats.datagrams_received += 1
        self.stats.octets_received += len(data)
        self.quic.receive_datagram(data, address, now=now)
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
        self._arm_timer()

    def _arm_timer(self) -> None:
        timer_at = self.quic.get_timer()
        session_at = self._timed.get_timer() if self._timed is not None else None
        if session_at is not None and (timer_at is None or session_at < timer_at):
            timer_at = session_at
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

    def _run_session(self, method: Callable[[Any], Sequence[E]], argument: object) -> None:
        """Call into the session and deliver its events; a raise is a bug there: close INTERNAL_ERROR."""
        try:
            for item in method(argument):
                if self._on_event is not None:
                    self._on_event(self, item)
                else:
                    self._events.append(item)
        except Exception:  # the session maps peer errors to closes itself; anything else is a bug
            log.exception("MOQT session or event handler failed; closing the connection")
            self._rejected = True
            self.close(INTERNAL_ERROR, "internal error")
        self._wake_event_waiter()

    def _wake_event_waiter(self) -> None:
        if self._event_waiter is not None and not self._event_waiter.done():
            self._event_waiter.set_result(None)

    def _handshake_completed(self) -> None:
        """Authenticate the peer, then create the session and replay what arrived before it."""
        try:
            self._authenticate_peer()
            self._session = self._factory(self)
        except AuthError as exc:
            log.info("peer %s rejected: %s", self.address, exc)
            self._rejected = True
            self._fail_ready(exc)
            self.close(exc.session_code, str(exc))
            return
        except Exception:
            log.exception("session factory failed; closing the connection")
            self._rejected = True
            self.close(INTERNAL_ERROR, "internal error")
            return
        if all(callable(getattr(self._session, name, None)) for name in ("get_timer", "handle_timer")):
            self._timed = cast(TimedSession[E], self._session)
        pending, self._pending = self._pending, []
        for event in pending:
            self._dispatch(event)
        if not self._ready.done():
            self._ready.set_result(None)

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
            self._auth_timer = self._loop.call_later(self.config.settings.auth_timeout_s, self._auth_deadline)
            return
        self.peer_certificate = peer
        self.peer_identity = peer.identity
        self.authenticated_by = "certificate"

    def _authenticated(self) -> None:
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None

    def _auth_deadline(self) -> None:
        self._auth_timer = None
        if self._authenticated_by is None:
            self.close(UNAUTHORIZED, "no client certificate and no valid authorization token")

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

    def _fail_ready(self, error: BaseException) -> None:
        if not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()  # marked retrieved: a server-side connection has nobody waiting

    def _closed_error(self) -> ConnectionClosedError:
        ev = self._close_event
        if ev is None:
            return ConnectionClosedError(NO_ERROR, "closed", True)
        return ConnectionClosedError(ev.error_code, ev.reason_phrase, ev.frame_type is None)

    def _check_open(self) -> None:
        if self.closed or self.quic.closing:
            raise self._closed_error()

    def _wake_drainers(self) -> None:
        if not self._drainers:
            return
        low_water = self.config.settings.send_high_water // 2
        for stream_id, waiter in self._drainers.items():
            if not waiter.done() and self.send_buffered(stream_id) <= low_water:
                waiter.set_result(None)


# -- UDP endpoints ---------------------------------------------------------------------------------
class _Endpoint:
    """One UDP socket: batched reads, one transmit per connection per batch, sends (moqt/udp.py).

    As is, it is a client's: every datagram goes to its one connection. :class:`MoqtServer` routes.
    """

    def __init__(self, sock: socket.socket, settings: QuicSettings) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock, self._settings = sock, settings
        self._sender = DatagramSender(self._loop, sock, gso=settings.gso, max_backlog=_MAX_SEND_BACKLOG)
        self._socket_open = True
        self.conn: MoqtConnection[Any] | None = None
        self._loop.add_reader(sock.fileno(), self._readable)

    @property
    def local_address(self) -> NetworkAddress:
        address: NetworkAddress = self._sock.getsockname()
        return address

    def route(self, data: bytes, address: NetworkAddress, now: float) -> MoqtConnection[Any] | None:
        """Feed one datagram to its connection and return that connection, if any."""
        if self.conn is None or self.conn.closed:
            return None
        self.conn._receive(data, address, now)
        return self.conn

    def connection_id_issued(self, cid: bytes, conn: MoqtConnection[Any]) -> None:
        """Only a server routes by connection ID."""

    def connection_id_retired(self, cid: bytes) -> None:
        """Only a server routes by connection ID."""

    def connection_terminated(self, conn: MoqtConnection[Any]) -> None:
        self._loop.call_soon(self.close_socket)

    def _readable(self) -> None:
        dirty: dict[int, MoqtConnection[Any]] = {}
        for _ in range(self._settings.recv_batch):
            if not self._socket_open:
                return
            try:
                data, address = self._sock.recvfrom(_RECV_SIZE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:  # e.g. ICMP port unreachable surfaced on the socket
                log.debug("UDP receive error: %s", exc)
                break
            conn = self.route(data, address, self._loop.time())
            if conn is not None:
                dirty[id(conn)] = conn
        for conn in dirty.values():
            if not conn.closed:
                conn._transmit()

    def send(self, datagrams: list[tuple[bytes, NetworkAddress]]) -> None:
        """Send now; on EAGAIN keep a bounded backlog (beyond it datagrams drop, QUIC sees a loss)."""
        self._sender.send(datagrams)

    def close_socket(self) -> None:
        if self._socket_open:
            self._socket_open = False
            self._loop.remove_reader(self._sock.fileno())
            self._sender.close()
            self._sock.close()


async def connect(uri: str, config: EndpointConfig, session_factory: SessionFactory[E], *,
                  on_event: EventHandler[E] | None = None, expected_identity: str | None = None) -> MoqtConnection[E]:
    """Connect to a ``moqt://`` URI; return once the server certificate has verified (chain to
    ``config.trust``, name = URI host, identity = ``expected_identity`` if given) and the session
    exists. Raises ``PeerCertificateError``, ``ConnectionClosedError`` or ``TimeoutError``."""
    target = MoqtUri.parse(uri)
    loop = asyncio.get_running_loop()
    family, _, _, _, sockaddr = (await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_DGRAM))[0]
    address: NetworkAddress = sockaddr
    bind = ("::", 0) if family == socket.AF_INET6 else ("0.0.0.0", 0)
    endpoint = _Endpoint(udp_socket(family, bind, config.settings.socket_buffer_bytes), config.settings)
    conn: MoqtConnection[E] | None = None
    try:
        qc = config.quic_configuration(is_client=True, datagram_size=config.settings.datagram_size_for(address),
                                       server_name=target.host)
        quic = HookedQuicConnection(configuration=qc, ack_delay_s=config.settings.ack_delay_s,
                                    max_flight_bytes=config.settings.max_flight_bytes)
        conn = MoqtConnection(quic, endpoint, address, config, session_factory,
                              uri=target, on_event=on_event, expected_identity=expected_identity)
        endpoint.conn = conn
        conn.quic.connect(address, now=loop.time())
        conn._transmit()
        await asyncio.wait_for(conn.wait_ready(), config.settings.handshake_timeout_s)
    except BaseException:
        if conn is not None:
            conn.close(INTERNAL_ERROR, "connect failed")
        endpoint.close_socket()
        raise
    return conn


# -- server ----------------------------------------------------------------------------------------
class MoqtServer(_Endpoint, Generic[E]):
    """A UDP listener that accepts QUIC connections and gives each a session once authenticated.

    Routes by destination connection ID like ``aioquic.asyncio.QuicServer``, without Retry (a LAN
    service; aioquic's anti-amplification limit applies until the address is validated).
    """

    def __init__(self, sock: socket.socket, config: EndpointConfig, session_factory: SessionFactory[E],
                 on_event: EventHandler[E] | None) -> None:
        if config.credentials is None:
            raise ValueError("a MOQT server needs a certificate and key (EndpointConfig.credentials)")
        super().__init__(sock, config.settings)
        self.config, self._factory, self._on_event = config, session_factory, on_event
        self._routes: dict[bytes, MoqtConnection[E]] = {}
        self._configurations: dict[int, QuicConfiguration] = {}
        self._versions = QuicConfiguration(is_client=False).supported_versions
        self._accepting = True
        self.connections: set[MoqtConnection[E]] = set()
        self._all_closed = asyncio.Event()
        self._all_closed.set()

    @property
    def port(self) -> int:
        return int(self.local_address[1])

    def route(self, data: bytes, address: NetworkAddress, now: float) -> MoqtConnection[Any] | None:
        if data and not data[0] & 0x80:  # short header (all 1-RTT data): the DCID follows the first byte
            conn = self._routes.get(data[1 : 1 + _CID_LENGTH])
        else:
            try:
                header = pull_quic_header(Buffer(data=data), host_cid_length=_CID_LENGTH)
            except ValueError:
                return None
            if (header.packet_type != QuicPacketType.VERSION_NEGOTIATION and header.version is not None
                    and header.version not in self._versions):
                self.send([(encode_quic_version_negotiation(source_cid=header.destination_cid,
                                                            destination_cid=header.source_cid,
                                                            supported_versions=self._versions), address)])
                return None
            conn = self._routes.get(header.destination_cid)
            if (conn is None and self._accepting and header.packet_type == QuicPacketType.INITIAL
                    and len(data) >= SMALLEST_MAX_DATAGRAM_SIZE):
                conn = self._accept(header.destination_cid, address)
        if conn is not None:
            conn._receive(data, address, now)
        return conn

    def _accept(self, original_cid: bytes, address: NetworkAddress) -> MoqtConnection[E]:
        size = self.config.settings.datagram_size_for(address)
        qc = self._configurations.get(size)
        if qc is None:
            qc = self._configurations[size] = self.config.quic_configuration(is_client=False, datagram_size=size)
        quic = HookedQuicConnection(configuration=qc, original_destination_connection_id=original_cid,
                                    ack_delay_s=self.config.settings.ack_delay_s,
                                    max_flight_bytes=self.config.settings.max_flight_bytes)
        quic.request_client_certificate = True
        conn = MoqtConnection(quic, self, address, self.config, self._factory, on_event=self._on_event)
        self._routes[original_cid] = self._routes[quic.host_cid] = conn
        self.connections.add(conn)
        self._all_closed.clear()
        return conn

    def connection_id_issued(self, cid: bytes, conn: MoqtConnection[Any]) -> None:
        self._routes[cid] = conn

    def connection_id_retired(self, cid: bytes) -> None:
        self._routes.pop(cid, None)

    def connection_terminated(self, conn: MoqtConnection[Any]) -> None:
        for cid in [cid for cid, c in self._routes.items() if c is conn]:
            del self._routes[cid]
        self.connections.discard(conn)
        if not self.connections:
            self._all_closed.set()
            if not self._accepting:
                self._loop.call_soon(self.close_socket)

    def close(self, error_code: int = NO_ERROR, reason: str = "server shutting down") -> None:
        """Stop accepting and close every connection; the socket closes once the last has ended."""
        self._accepting = False
        for conn in list(self.connections):
            conn.close(error_code, reason)
        if not self.connections:
            self.close_socket()

    async def wait_closed(self) -> None:
        await self._all_closed.wait()

    async def __aenter__(self) -> MoqtServer[E]:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()
        await self.wait_closed()


async def serve(host: str, port: int, config: EndpointConfig, session_factory: SessionFactory[E], *,
                on_event: EventHandler[E] | None = None) -> MoqtServer[E]:
    """Listen for MOQT over QUIC on ``host:port`` (port 0 picks one; see ``MoqtServer.port``)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    sock = udp_socket(family, (str(sockaddr[0]), int(sockaddr[1])), config.settings.socket_buffer_bytes)
    try:
        return MoqtServer(sock, config, session_factory, on_event)
    except BaseException:
        sock.close()
        raise
