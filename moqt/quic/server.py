"""``serve`` and `MoqtServer`: a UDP listener that routes datagrams to connections by connection ID."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any, Final

from aioquic.buffer import Buffer  # type: ignore[attr-defined]  # re-exported without __all__
from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE, QuicConfiguration
from aioquic.quic.connection import NetworkAddress
from aioquic.quic.packet import QuicHeader, QuicPacketType, encode_quic_version_negotiation, pull_quic_header

from moqt.quic.aioquic_hooks import HookedQuicConnection
from moqt.quic.config import EndpointConfig
from moqt.quic.connection import E, EventHandler, MoqtConnection, SessionFactory
from moqt.quic.endpoint import UdpEndpoint
from moqt.quic.listener import Listener
from moqt.quic.refusal import connection_refused
from moqt.quic.udp import udp_socket

log = logging.getLogger(__name__)

_CID_LENGTH: Final = 8  # aioquic's default connection_id_length, which our configurations keep


class MoqtServer(UdpEndpoint, Listener[MoqtConnection[E], E]):
    """A UDP listener that accepts QUIC connections and gives each a session once authenticated.

    Routes by destination connection ID like ``aioquic.asyncio.QuicServer``, without Retry (a LAN
    service; aioquic's anti-amplification limit applies until the address is validated). A client
    Initial from an IP address that already has ``max_connections_per_client`` connections is answered
    with CONNECTION_REFUSED at once, without a connection (moqt/quic/refusal.py); ``refused`` counts them.
    """

    def __init__(self, sock: socket.socket, config: EndpointConfig, session_factory: SessionFactory[E],
                 on_event: EventHandler[E] | None) -> None:
        if config.credentials is None:
            raise ValueError("a MOQT server needs a certificate and key (EndpointConfig.credentials)")
        UdpEndpoint.__init__(self, sock, config.settings)
        Listener.__init__(self, config, session_factory)
        self._on_event = on_event
        self._routes: dict[bytes, MoqtConnection[E]] = {}
        self._configurations: dict[int, QuicConfiguration] = {}
        self._versions = QuicConfiguration(is_client=False).supported_versions

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
                if self._over_cap(str(address[0])):
                    self._refuse(header, address)
                    return None
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
        conn = MoqtConnection(quic, self, address, self.config, self._counted, on_event=self._on_event)
        self._routes[original_cid] = self._routes[quic.host_cid] = conn
        self._added(conn, str(address[0]))
        return conn

    def _refuse(self, header: QuicHeader, address: NetworkAddress) -> None:
        self._refused(address)
        self.send([(connection_refused(header, "too many connections from this address"), address)])

    def connection_id_issued(self, cid: bytes, conn: MoqtConnection[Any]) -> None:
        self._routes[cid] = conn

    def connection_id_retired(self, cid: bytes) -> None:
        self._routes.pop(cid, None)

    def connection_terminated(self, conn: MoqtConnection[Any]) -> None:
        for cid in [cid for cid, c in self._routes.items() if c is conn]:
            del self._routes[cid]
        self._removed(conn)

    def _release(self) -> None:
        self.close_socket()


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
