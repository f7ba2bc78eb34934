"""One UDP socket and the connection behind it: batched reads, one transmit per connection per batch.

Compared with ``aioquic.asyncio`` it reads up to ``recv_batch`` datagrams per socket wake-up and
builds packets once per batch (aioquic.asyncio builds after every datagram: about a third of receiver
CPU), and sends through moqt/quic/udp.py (4 MiB socket buffers, optional UDP GSO). As is, it is a
client's endpoint: every datagram goes to its one connection; :class:`moqt.quic.MoqtServer` routes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any, Final

from aioquic.quic.connection import NetworkAddress

from moqt.quic.config import QuicSettings
from moqt.quic.connection import MoqtConnection
from moqt.quic.udp import DatagramSender

log = logging.getLogger(__name__)

_MAX_SEND_BACKLOG: Final = 4096
_RECV_SIZE: Final = 65536


class UdpEndpoint:
    """One UDP socket: batched reads, one transmit per connection per batch, sends (moqt/quic/udp.py).

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
