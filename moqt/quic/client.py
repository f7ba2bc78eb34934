"""``connect``: a client connection to a ``moqt://`` URI, on a UDP socket of its own."""

from __future__ import annotations

import asyncio
import socket

from aioquic.quic.connection import NetworkAddress

from moqt.kinds import SessionError
from moqt.quic.aioquic_hooks import HookedQuicConnection
from moqt.quic.config import EndpointConfig, MoqtUri
from moqt.quic.connection import E, EventHandler, MoqtConnection, SessionFactory
from moqt.quic.endpoint import UdpEndpoint
from moqt.quic.udp import udp_socket


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
    endpoint = UdpEndpoint(udp_socket(family, bind, config.settings.socket_buffer_bytes), config.settings)
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
            conn.close(SessionError.INTERNAL_ERROR, "connect failed")
        endpoint.close_socket()
        raise
    return conn
