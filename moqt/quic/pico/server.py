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
from typing import Any

from moqt.kinds import SessionError
from moqt.quic.config import EndpointConfig
from moqt.quic.connection import E
from moqt.quic.listener import Listener
from moqt.quic.pico.config import PicoquicUnsupportedError, aiopquic_modules, ip_family, pem_files, pico_configuration
from moqt.quic.pico.connection import PicoConnection, PicoEventHandler, PicoSessionFactory

log = logging.getLogger(__name__)


class PicoServer(Listener[PicoConnection[E], E]):
    """The connections of one aiopquic engine (see the module docstring); ``close`` stops it."""

    def __init__(self, port: int, config: EndpointConfig, session_factory: PicoSessionFactory[E],
                 on_event: PicoEventHandler[E] | None) -> None:
        super().__init__(config, session_factory)
        self.port = port
        self._on_event = on_event
        self._loop = asyncio.get_running_loop()
        self._engine: Any = None

    def _start(self, engine: Any) -> None:
        self._engine = engine
        self._loop.add_reader(engine.eventfd, engine.drain_and_route)

    def _create_protocol(self, quic: Any, stream_handler: object = None) -> PicoConnection[E]:
        """aiopquic's ``create_protocol``: called on a new connection's first event. picoquic has already
        accepted it (no hook comes before), so one over ``max_connections_per_client`` is closed here."""
        conn = PicoConnection(quic, self.config, self._counted, self, on_event=self._on_event)
        peer = str(conn.address[0])
        over_cap = self._over_cap(peer)
        self._added(conn, peer)
        if not self._accepting:
            conn.close(SessionError.NO_ERROR, "server shutting down")
        elif over_cap:
            self._refused(conn.address)
            conn.close(SessionError.INTERNAL_ERROR, "too many connections from this address")
        return conn

    def connection_terminated(self, conn: PicoConnection[Any]) -> None:
        self._removed(conn)

    def _release(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            self._loop.remove_reader(engine.eventfd)
            engine.close()  # joins picoquic's thread

    async def wait_closed(self) -> None:
        await super().wait_closed()
        if not self._accepting:
            self._release()


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
