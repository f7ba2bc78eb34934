"""An aiohttp site whose connections are guarded by `control.listener.core` (docs/hardening.md).

aiohttp has a keep-alive timeout but no header or body read timeout, no per-client cap, and asyncio
drops the TLS alert OpenSSL queued for a refused handshake (`SSLProtocol` aborts the socket before
the alert is flushed), so a client refused for TLS 1.2, a missing certificate or a foreign CA sees an
EOF or a reset.  `GuardedSite` listens without ``ssl=`` and builds each connection's stack itself:

    socket transport -> _TlsGate (asyncio's SSLProtocol; absent on a plain listener) -> _Connection
        -> aiohttp's RequestHandler

- ``_Connection`` counts the client address at accept (`PeerTable`: over the cap it is closed at
  once), keeps the connection's `ConnectionClock` on one timer, sees every octet that arrives and
  every request start and end (the server's request handler is wrapped), and closes what expires,
  with a ``408`` where a request had begun and nothing of an answer was sent;
- ``_TlsGate`` is asyncio's own SSLProtocol, except that a handshake it refuses is finished by us: the
  queued alert is written (plain HTTP on the TLS port, for which OpenSSL has none, gets a plain
  ``400``), then a FIN, then what the client still sends is read and dropped for a moment (closing
  with unread input would reset the connection and lose the alert), and one INFO line says who was
  refused and why (`kvsp.service.logs.peer_fault`: rate-limited per reason).

This relies on two internals of asyncio's SSLProtocol that Python 3.11 to 3.13 share: the hook
``_on_handshake_complete`` and the outgoing BIO ``_outgoing`` (read through ``getattr``: where it is
missing the refusal still closes and is logged, only without the alert).

Every role's mutual-TLS listener (control/serve.py) and the front end's public one use it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
from asyncio import sslproto
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

from aiohttp import web
from prometheus_client import Counter, Gauge
from yarl import URL

from control.http import CONTINUE_DEFERRED
from control.listener.core import (
    IDLE_TIMEOUT,
    ConnectionClock,
    Io,
    PeerTable,
    Phase,
    Timeouts,
    Verdict,
    classify_tls,
)
from kvsp.service.config import ListenerLimits
from kvsp.service.logs import peer_fault
from kvsp.service.metrics import Metrics

log = logging.getLogger("kvsp.listener")
REQUEST_TIMEOUT = (b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n"
                   b"Cache-Control: no-store\r\n\r\n")
# OpenSSL sends no alert to a client that is not speaking TLS; one speaking plain HTTP is told in HTTP.
PLAIN_HTTP = (b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 31\r\n"
              b"\r\nthis port speaks HTTPS (TLS).\r\n")
LINGER_S = 2.0  # a refused or expired connection: time for the alert or the 408 to leave before the abort
TIMER_SLACK_S = 0.01  # event loops may run a timer a little early; a check that finds nothing due re-arms
HANDSHAKE_BACKSTOP_S = 5.0  # asyncio's own handshake timeout, behind ours
TLS_VERSIONS = {ssl.TLSVersion.TLSv1_2: "TLS 1.2", ssl.TLSVersion.TLSv1_3: "TLS 1.3"}
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class ListenerMetrics:
    connections: Gauge  # label: listener
    refused: Counter  # labels: listener, reason ("per_client_cap")
    closed: Counter  # labels: listener, reason (one of core.EXPIRY_REASONS)
    tls_refused: Counter  # labels: listener, reason (one of core.TLS_REFUSAL_LABELS)

    @classmethod
    def register(cls, metrics: Metrics) -> ListenerMetrics:
        return cls(
            connections=metrics.gauge("kvsp_listener_connections", "Open connections (TLS handshake included)",
                                      ("listener",)),
            refused=metrics.counter("kvsp_listener_refused_total", "Connections closed at accept",
                                    ("listener", "reason")),
            closed=metrics.counter("kvsp_listener_timeouts_total", "Connections closed for taking too long",
                                   ("listener", "reason")),
            tls_refused=metrics.counter("kvsp_listener_tls_refusals_total", "TLS handshakes refused",
                                        ("listener", "reason")),
        )


def _peer_of(transport: asyncio.BaseTransport) -> tuple[str, str]:
    """The client address (the per-client key) and ``address:port`` for a log line."""
    peer = transport.get_extra_info("peername")
    if not isinstance(peer, tuple) or len(peer) < 2:
        return "?", "?"
    host = str(peer[0])
    return host, (f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}")


class Listener:
    """The guard of one listening socket: its limits, its counts, and the protocol factory."""

    def __init__(self, server: web.Server, limits: ListenerLimits, metrics: ListenerMetrics, name: str,
                 ssl_context: ssl.SSLContext | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.server = server
        self.timeouts = Timeouts.of(limits)
        self.peers = PeerTable(limits.max_connections_per_client)
        self.metrics = metrics
        self.name = name
        self.ssl_context = ssl_context
        self.minimum_tls = TLS_VERSIONS.get(ssl_context.minimum_version, "TLS 1.2") if ssl_context else ""
        self.connections: set[_Connection] = set()
        self.by_handler: dict[web.RequestHandler, _Connection] = {}
        server.request_handler = self._watch(server.request_handler)

    def _watch(self, inner: Handler) -> Handler:
        """``inner`` telling the connection when each request's handler starts (its headers are in) and ends."""
        async def watched(request: web.BaseRequest) -> web.StreamResponse:
            conn = self.by_handler.get(request.protocol)
            if conn is not None:
                conn.request_started(request)
            try:
                return await inner(request)
            finally:
                if conn is not None:
                    conn.request_ended()
        return watched

    def protocol(self) -> asyncio.BaseProtocol:
        """A new connection's protocol (the factory of ``loop.create_server``)."""
        conn = _Connection(self)
        if self.ssl_context is None:
            return conn
        return _TlsGate(self.loop, conn, self.ssl_context, self.timeouts.handshake_s + HANDSHAKE_BACKSTOP_S)

    def admit(self, conn: _Connection) -> bool:
        if not self.peers.admit(conn.peer):
            self.metrics.refused.labels(self.name, "per_client_cap").inc()
            peer_fault(log, "listener.per_client_cap", "%s listener: connection from %s closed: %d connections "
                       "from that address already (max_connections_per_client)", self.name, conn.peer_text,
                       self.peers.cap)
            return False
        self.connections.add(conn)
        self.by_handler[conn.handler] = conn
        self.metrics.connections.labels(self.name).inc()
        return True

    def release(self, conn: _Connection) -> None:
        self.peers.release(conn.peer)
        self.connections.discard(conn)
        self.by_handler.pop(conn.handler, None)
        self.metrics.connections.labels(self.name).dec()

    def abort_unserved(self) -> None:
        """At shutdown: connections aiohttp does not know yet (in their handshake, or refused and lingering)."""
        for conn in list(self.connections):
            if not conn.served:
                conn.abort()


class _Connection(asyncio.Protocol):
    """One connection: the proxy in front of aiohttp's RequestHandler, with its clock and timer."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.handler = listener.server()
        self.clock: ConnectionClock | None = None
        self.peer, self.peer_text = "?", "?"
        self.raw: asyncio.BaseTransport | None = None
        self.transport: asyncio.Transport | None = None  # the HTTP stream's (after TLS)
        self.request: web.BaseRequest | None = None
        self.served = False  # aiohttp's handler has the connection
        self.admitted = False
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf

    # -- accept and the asyncio protocol ------------------------------------------------------------
    def accept(self, raw: asyncio.BaseTransport) -> bool:
        """The TCP connection is accepted: count its address (False: over the cap, close it)."""
        self.raw = raw
        self.peer, self.peer_text = _peer_of(raw)
        if not self.listener.admit(self):
            return False
        self.admitted = True
        loop = self.listener.loop
        self.clock = ConnectionClock(self.listener.timeouts, loop.time(), tls=self.listener.ssl_context is not None)
        self._arm()
        return True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.raw is None and not self.accept(transport):  # a plain listener: no gate before us
            transport.close()
            return
        assert self.clock is not None
        self.transport = cast(asyncio.Transport, transport)
        self.clock.ready(self.listener.loop.time())
        self.served = True
        self.handler.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.clock is not None and self.clock.received(self.listener.loop.time()):
            self._arm()
        self.handler.data_received(data)

    def eof_received(self) -> None:
        if self.served:
            self.handler.eof_received()  # aiohttp's returns None: the transport closes on EOF

    def connection_lost(self, exc: Exception | None) -> None:
        if self.served:
            self.served = False
            self.handler.connection_lost(exc)
        self.gone()

    def pause_writing(self) -> None:
        if self.clock is not None and self.transport is not None:
            self.clock.write_paused(self.listener.loop.time(), self.transport.get_write_buffer_size())
            self._arm()
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.clock is not None:
            self.clock.write_resumed()
        self.handler.resume_writing()

    # -- requests (from the wrapped request handler) ------------------------------------------------
    def request_started(self, request: web.BaseRequest) -> None:
        self.request = request
        if self.clock is not None:
            self.clock.request_started(self.listener.loop.time(), body_complete=request.content.is_eof())
            self._arm()

    def request_ended(self) -> None:
        self.request = None
        if self.clock is not None:
            self.clock.request_ended(self.listener.loop.time())
            self._arm()

    # -- the timer ----------------------------------------------------------------------------------
    def _io(self) -> Io:
        t, request = self.transport, self.request
        buffered = t.get_write_buffer_size() if t is not None and not t.is_closing() else 0
        reading = t.is_reading() if t is not None and not t.is_closing() else True
        if request is None:
            return Io(write_buffered=buffered, reading=reading)
        content = request.content
        invited = not request.get(CONTINUE_DEFERRED, False)  # before our 100 Continue the client must wait
        return Io(content.total_bytes, content.is_eof(), reading and invited, buffered)

    def _arm(self) -> None:
        """Make sure the timer fires by the clock's deadline (a later deadline: the early timer re-arms)."""
        deadline = self.clock.deadline() if self.clock is not None else None
        if deadline is None or deadline + TIMER_SLACK_S >= self._at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._at = deadline + TIMER_SLACK_S
        self._timer = self.listener.loop.call_at(self._at, self._check)

    def _check(self) -> None:
        self._timer, self._at = None, math.inf
        if self.clock is None or not self.admitted:
            return
        verdict = self.clock.expired(self.listener.loop.time(), self._io())
        if verdict is None:
            self._arm()
        else:
            self._expire(verdict)

    def _expire(self, verdict: Verdict) -> None:
        assert self.clock is not None
        self.listener.metrics.closed.labels(self.listener.name, verdict.reason).inc()
        if verdict.reason == IDLE_TIMEOUT:  # keep-alive housekeeping, not a fault
            log.debug("%s listener: idle connection from %s closed", self.listener.name, self.peer_text)
        else:
            peer_fault(log, f"listener.{verdict.reason}", "%s listener: connection from %s closed: %s in phase %s",
                       self.listener.name, self.peer_text, verdict.reason.replace("_", " "), self.clock.phase.value)
        if self.clock.phase is Phase.HANDSHAKE or self.transport is None:
            self.abort()
            return
        request = self.request
        if verdict.answer_408 and (request is None or request.writer.output_size == 0) \
                and not self.transport.is_closing():
            self.transport.write(REQUEST_TIMEOUT)
        self.clock = None  # nothing more to decide: the connection goes
        self.handler.force_close()
        self.listener.loop.call_later(LINGER_S, self.abort)

    # -- the end ----------------------------------------------------------------------------------
    def refused(self, raw: asyncio.Transport, alert: bytes, exc: ssl.SSLError) -> None:
        """The TLS handshake failed: send OpenSSL's alert, a FIN, drain the input a moment, and say why."""
        refusal = classify_tls(exc.reason, getattr(exc, "verify_message", None), self.listener.minimum_tls)
        self.listener.metrics.tls_refused.labels(self.listener.name, refusal.label).inc()
        peer_fault(log, f"tls.{refusal.label}", "%s listener: TLS refused from %s: %s%s", self.listener.name,
                   self.peer_text, refusal.reason, " (alert sent)" if alert else "")
        self.clock = None
        if self._timer is not None:
            self._timer.cancel()
        raw.set_protocol(_Drain(self))
        if alert or refusal.plain_http:
            raw.write(alert or PLAIN_HTTP)
        if raw.can_write_eof():
            raw.write_eof()
        self.listener.loop.call_later(LINGER_S, self.abort)

    def abort(self) -> None:
        raw = self.raw
        if raw is not None and not raw.is_closing():
            cast(asyncio.Transport, raw).abort()
        elif self.transport is not None:
            self.transport.abort()

    def gone(self) -> None:
        """The socket is closed (idempotent): the address's slot is free again."""
        self.clock = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.admitted:
            self.admitted = False
            self.listener.release(self)


class _Drain(asyncio.Protocol):
    """A refused TLS connection after the alert: what the client still sends is dropped until it closes."""

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # close: the client has read the alert and gone

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.gone()


def _retrieve(waiter: asyncio.Future[object]) -> None:
    if not waiter.cancelled():
        waiter.exception()  # retrieved: a refused handshake is reported by `_Connection.refused`, not by asyncio


class _TlsGate(sslproto.SSLProtocol):
    """asyncio's SSLProtocol between the socket and the connection, counting the address before the
    handshake and finishing a refused handshake itself (`_Connection.refused`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: _Connection, context: ssl.SSLContext,
                 handshake_timeout_s: float) -> None:
        waiter: asyncio.Future[object] = loop.create_future()
        waiter.add_done_callback(_retrieve)
        super().__init__(loop, conn, context, waiter, server_side=True,
                         ssl_handshake_timeout=handshake_timeout_s)  # type: ignore[arg-type]  # a float is fine
        self.conn = conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.conn.accept(transport):
            transport.close()
            return
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.conn.admitted:
            super().connection_lost(exc)
        self.conn.gone()

    def _on_handshake_complete(self, handshake_exc: BaseException | None) -> None:
        raw = self._transport
        if isinstance(handshake_exc, ssl.SSLError) and raw is not None:
            # asyncio would abort the socket with OpenSSL's alert still in the outgoing BIO.
            outgoing = getattr(self, "_outgoing", None)
            alert = outgoing.read() if isinstance(outgoing, ssl.MemoryBIO) else b""
            self._transport = None  # so that the base class does not abort: the refusal is finished by us
            self.conn.refused(cast(asyncio.Transport, raw), alert, handshake_exc)
        super()._on_handshake_complete(handshake_exc)


class GuardedSite(web.BaseSite):
    """A TCP site like `web.TCPSite` whose connections are guarded (module docstring).  One per runner:
    it wraps the runner's request handler."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, limits: ListenerLimits, metrics: Metrics,
                 name: str, ssl_context: ssl.SSLContext | None = None, backlog: int = 128) -> None:
        super().__init__(runner, backlog=backlog)  # BaseSite gets no ssl_context: the TLS layer is ours
        self._host, self._port = host, port
        self._limits, self._metrics, self._label = limits, ListenerMetrics.register(metrics), name
        self._tls = ssl_context
        self.listener: Listener | None = None

    @property
    def name(self) -> str:
        return str(URL.build(scheme="https" if self._tls else "http", host=self._host, port=self._port))

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None, "runner.setup() comes first"
        self.listener = Listener(server, self._limits, self._metrics, self._label, self._tls)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.listener.protocol, self._host, self._port, backlog=self._backlog)

    async def stop(self) -> None:
        await super().stop()
        if self.listener is not None:
            self.listener.abort_unserved()
