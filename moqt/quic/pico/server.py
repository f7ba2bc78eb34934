"""``pico_serve`` and `PicoServer`: MOQT over picoquic on a UDP port, one aiopquic engine for all peers.

Mirrors ``moqt.quic.serve``/``MoqtServer``. picoquic demultiplexes connections in C on its network
thread; aiopquic's ``QuicEngine`` hands each new one to `PicoServer` (its ``create_protocol``), which
makes a `PicoConnection`. Refused at start, with one line each: ``require_certificate`` (a picoquic
server never asks for a client certificate), no ``token_keys`` (nobody could ever authenticate), no
credentials. aiopquic binds the wildcard address whatever ``host`` says (an IPv4 literal only pins the
family) and cannot report the port it bound, so port 0 becomes a port found free just before (a race
with another process binding it in between is possible: give roles fixed ports).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from types import TracebackType
from typing import Any, Generic

from moqt.kinds import SessionError
from moqt.quic.config import EndpointConfig
from moqt.quic.connection import E, SessionLike
from moqt.quic.pico.config import PicoquicUnsupportedError, aiopquic_modules, ip_family, pem_files, pico_configuration
from moqt.quic.pico.connection import PicoConnection, PicoEventHandler, PicoSessionFactory
from moqt.quic.refusal import address_text

log = logging.getLogger(__name__)


class PicoServer(Generic[E]):
    """The connections of one aiopquic engine (see the module docstring); ``close`` stops it."""

    def __init__(self, port: int, config: EndpointConfig, session_factory: PicoSessionFactory[E],
                 on_event: PicoEventHandler[E] | None) -> None:
        self.port, self.config = port, config
        self._factory, self._on_event = session_factory, on_event
        self._loop = asyncio.get_running_loop()
        self._engine: Any = None
        self._accepting = True
        self.connections: set[PicoConnection[E]] = set()
        self.refused = 0  # connections closed for max_connections_per_client
        #: Sessions started, by the draft their ALPN agreed.
        self.sessions_by_draft: dict[int, int] = {}
        self._all_closed = asyncio.Event()
        self._all_closed.set()

    @property
    def drafts(self) -> tuple[int, ...]:
        return tuple(p.draft for p in self.config.settings.profiles)

    def _start(self, engine: Any) -> None:
        self._engine = engine
        self._loop.add_reader(engine.eventfd, engine.drain_and_route)

    def _create_protocol(self, quic: Any, stream_handler: object = None) -> PicoConnection[E]:
        """aiopquic's ``create_protocol``: called on a new connection's first event."""
        conn = PicoConnection(quic, self.config, self._counted, self, on_event=self._on_event)
        self.connections.add(conn)
        self._all_closed.clear()
        if not self._accepting:
            conn.close(SessionError.NO_ERROR, "server shutting down")
        elif self._over_cap(conn):
            conn.close(SessionError.INTERNAL_ERROR, "too many connections from this address")
        return conn

    def _over_cap(self, conn: PicoConnection[E]) -> bool:
        """``max_connections_per_client`` as on aioquic, but after picoquic accepted the connection (it
        cannot be refused before): closed at its first event, counted in ``refused``."""
        cap = self.config.settings.max_connections_per_client
        host = conn.address[0]
        if cap is None or sum(1 for c in self.connections if c.address[0] == host) <= cap:
            return False
        self.refused += 1
        log.info("MOQT connection from %s refused: %s connections from that address already "
                 "(max_connections_per_client)", address_text(conn.address), cap,
                 extra={"kvsp_peer": "moqt.per-peer-cap"})
        return True

    def _counted(self, conn: PicoConnection[E]) -> SessionLike[E]:
        session = self._factory(conn)
        self.sessions_by_draft[conn.profile.draft] = self.sessions_by_draft.get(conn.profile.draft, 0) + 1
        return session

    def connection_terminated(self, conn: PicoConnection[Any]) -> None:
        self.connections.discard(conn)
        if not self.connections:
            self._all_closed.set()
            if not self._accepting:
                self._loop.call_soon(self._stop_engine)

    def close(self, error: SessionError | int = SessionError.NO_ERROR, reason: str = "server shutting down") -> None:
        """Stop accepting and close every connection; the engine stops once the last has ended."""
        self._accepting = False
        for conn in list(self.connections):
            conn.close(error, reason)
        if not self.connections:
            self._stop_engine()

    def _stop_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            self._loop.remove_reader(engine.eventfd)
            engine.close()  # joins picoquic's thread

    async def wait_closed(self) -> None:
        await self._all_closed.wait()
        if not self._accepting:
            self._stop_engine()

    async def __aenter__(self) -> PicoServer[E]:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()
        await self.wait_closed()


def free_udp_port() -> int:
    """A UDP port free on both the IPv4 and the IPv6 wildcard right now (aiopquic binds both)."""
    for _ in range(64):
        with contextlib.ExitStack() as stack:
            v4 = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
            v4.bind(("0.0.0.0", 0))
            port: int = v4.getsockname()[1]
            v6 = stack.enter_context(socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
            v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                v6.bind(("::", port))
            except OSError:
                continue
            return port
    raise OSError("no UDP port free on both the IPv4 and the IPv6 wildcard")


async def pico_serve(host: str, port: int, config: EndpointConfig, session_factory: PicoSessionFactory[E], *,
                     on_event: PicoEventHandler[E] | None = None) -> PicoServer[E]:
    """Listen for MOQT over picoquic on ``port`` (every interface; see the module docstring)."""
    if config.credentials is None:
        raise ValueError("a MOQT server needs a certificate and key (EndpointConfig.credentials)")
    if config.require_certificate:
        raise PicoquicUnsupportedError("require_certificate cannot be met over picoquic: its server never requests "
                                       "a client certificate; peers authenticate with tokens (D3) instead")
    if not config.token_keys:
        raise PicoquicUnsupportedError("a picoquic server needs token_keys: its peers can authenticate by token only")
    if port == 0:
        port = free_udp_port()
    _, connection = aiopquic_modules()
    server = PicoServer(port, config, session_factory, on_event)
    with pem_files(config, server=True) as files:
        qc = pico_configuration(config, files, is_client=False, family=ip_family(host))
        engine = connection.QuicEngine(configuration=qc, create_protocol=server._create_protocol)
        engine._start_transport(port=port)  # picoquic loads the certificate and key here
    server._start(engine)
    log.info("MOQT over picoquic listening on port %d of every interface (host %s: aiopquic binds wildcards)",
             port, host)
    return server
