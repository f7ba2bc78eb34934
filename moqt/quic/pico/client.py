"""``pico_connect``: a client connection over picoquic to a ``moqt://`` URI (mirrors ``moqt.quic.connect``).

Each client connection has its own aiopquic transport, so its own picoquic thread and UDP socket,
stopped when the connection ends. The server is checked by picotls in the handshake (chain to
``config.trust``, name = URI host); its identity URI cannot be (aiopquic exposes no peer certificate),
so ``expected_identity`` is refused rather than ignored. The client presents no certificate: it
authenticates with a token in CLIENT_SETUP (the session factory puts it there).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from moqt.kinds import SessionError
from moqt.quic.config import EndpointConfig, MoqtUri
from moqt.quic.connection import E
from moqt.quic.pico.config import PicoquicUnsupportedError, aiopquic_modules, pem_files, pico_configuration
from moqt.quic.pico.connection import PicoConnection, PicoEventHandler, PicoSessionFactory


class _ClientTransport:
    """The one connection's aiopquic transport: its eventfd reader and its thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, quic: Any) -> None:
        self._loop, self._quic, self._running = loop, quic, True

    def connection_terminated(self, conn: PicoConnection[Any]) -> None:
        self._loop.call_soon(self.stop)  # not from inside aiopquic's own drain

    def stop(self) -> None:
        if self._running:
            self._running = False
            self._loop.remove_reader(self._quic.eventfd)
            self._quic.stop()  # joins picoquic's thread


async def pico_connect(uri: str, config: EndpointConfig, session_factory: PicoSessionFactory[E], *,
                       on_event: PicoEventHandler[E] | None = None,
                       expected_identity: str | None = None) -> PicoConnection[E]:
    """Connect to a ``moqt://`` URI; return once the handshake has completed and the session exists.
    Raises `PicoquicUnsupportedError` for ``expected_identity``, ``ConnectionClosedError`` (a server
    picotls refused, no common draft, a close) or ``TimeoutError``."""
    if expected_identity is not None:
        raise PicoquicUnsupportedError(f"expected_identity={expected_identity!r} cannot be checked over picoquic: "
                                       "aiopquic exposes no peer certificate (only its chain and host name are "
                                       "verified)")
    target = MoqtUri.parse(uri)
    _, connection = aiopquic_modules()
    loop = asyncio.get_running_loop()
    sockaddr = (await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_DGRAM))[0][4]
    with pem_files(config, server=False) as files:
        qc = pico_configuration(config, files, is_client=True, server_name=target.host)
        quic = connection.QuicConnection(configuration=qc)
        quic._start_transport(port=0)  # picoquic loads the roots here
    transport = _ClientTransport(loop, quic)
    conn = PicoConnection(quic, config, session_factory, transport, uri=target, on_event=on_event)
    loop.add_reader(quic.eventfd, conn._process_events)
    try:
        quic.connect((str(sockaddr[0]), int(sockaddr[1])))
        await asyncio.wait_for(conn.wait_ready(), config.settings.handshake_timeout_s)
    except BaseException:
        conn.close(SessionError.INTERNAL_ERROR, "connect failed")
        transport.stop()
        raise
    return conn
