"""UDP sockets for the QUIC endpoints: large buffers, and UDP GSO (generic segmentation offload) on Linux.

Why GSO: aioquic hands the adapter a list of datagrams per transmit, and one ``sendto`` each costs a
system call per datagram. With ``UDP_SEGMENT`` (Linux >= 4.18) a run of equal-sized datagrams to one
address leaves in one ``sendmsg``: the buffers are passed as they are (scatter-gather, no join) and
the kernel cuts them into datagrams of ``segment`` octets (the last may be shorter). It can only matter
for small datagrams (1452 on Ethernet, 8952 on jumbo frames); on loopback with 64 KiB datagrams there is
nothing to batch (and no gain was measured at 1452 either: docs/moqt-performance.md, so it is off by
default). Where the kernel or the device refuses (``EIO``, ``EINVAL``, ``ENOPROTOOPT``,
``EOPNOTSUPP``), :class:`DatagramSender` turns GSO off for that socket and sends datagram by datagram.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import struct
import sys
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Final

from aioquic.quic.connection import NetworkAddress

log = logging.getLogger(__name__)

SOL_UDP: Final = 17
UDP_SEGMENT: Final = 103  # linux/udp.h; Python 3.11's socket module does not name it
GSO_MAX_SEGMENTS: Final = 64  # UDP_MAX_SEGMENTS of older kernels (newer allow 128)
GSO_MAX_OCTETS: Final = 65000  # one GSO send is one skb: under the 64 KiB IP datagram limit
GSO_UNSUPPORTED: Final = frozenset({errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP})
GSO_AVAILABLE: Final = sys.platform == "linux"


def udp_socket(family: int, address: tuple[str, int], buffer_bytes: int) -> socket.socket:
    """A non-blocking UDP socket with large buffers (bursts at 100+ MB/s overflow the defaults)."""
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, buffer_bytes)
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) < buffer_bytes:
            log.info("UDP receive buffer capped below %d octets: raise net.core.rmem_max", buffer_bytes)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def gso_batches(datagrams: Sequence[tuple[bytes, NetworkAddress]]
                ) -> Iterator[tuple[list[bytes], int, NetworkAddress]]:
    """Split ``datagrams`` (in order) into runs one GSO send can carry: ``(buffers, segment, address)``.

    A run has one address, every datagram but the last exactly ``segment`` octets and the last at most
    that, at most :data:`GSO_MAX_SEGMENTS` datagrams and :data:`GSO_MAX_OCTETS` in all. A run of one is
    a plain datagram.
    """
    run: list[bytes] = []
    segment, total, address = 0, 0, None
    for data, to in datagrams:
        size = len(data)
        if run and (to != address or len(run[-1]) < segment or size > segment or len(run) == GSO_MAX_SEGMENTS
                    or total + size > GSO_MAX_OCTETS):
            assert address is not None
            yield run, segment, address
            run = []
        if not run:
            segment, total, address = size, 0, to
        run.append(data)
        total += size
    if run:
        assert address is not None
        yield run, segment, address


def send_gso(sock: socket.socket, buffers: list[bytes], segment: int, address: NetworkAddress) -> None:
    """One ``sendmsg`` for ``buffers`` cut into ``segment``-octet datagrams (raises like ``sendto``)."""
    sock.sendmsg(buffers, [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", segment))], 0, address)


class DatagramSender:
    """The sending side of one non-blocking UDP socket: ``sendto`` per datagram, or GSO runs with
    ``gso`` (Linux; turned off for good at the first refusal), and a backlog of at most ``max_backlog``
    datagrams while the socket buffer is full (beyond it datagrams drop: QUIC sees a loss)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, *, gso: bool, max_backlog: int) -> None:
        self._loop, self._sock, self._max_backlog = loop, sock, max_backlog
        self.gso = gso and GSO_AVAILABLE
        self._backlog: deque[tuple[bytes, NetworkAddress]] = deque()
        self._open = True

    def send(self, datagrams: Sequence[tuple[bytes, NetworkAddress]]) -> None:
        if not self.gso or len(datagrams) < 2 or self._backlog or not self._open:
            for item in datagrams:
                self._send_one(item)
            return
        for buffers, segment, address in gso_batches(datagrams):
            if len(buffers) == 1 or not self.gso:
                for data in buffers:
                    self._send_one((data, address))
                continue
            try:
                send_gso(self._sock, buffers, segment, address)
            except (BlockingIOError, InterruptedError):
                self._defer([(data, address) for data in buffers])
            except OSError as exc:
                if exc.errno not in GSO_UNSUPPORTED:
                    log.debug("UDP send to %s failed: %s", address, exc)
                    continue
                log.info("UDP GSO unavailable (%s); sending datagram by datagram", exc)
                self.gso = False  # the kernel or the route cannot segment
                for data in buffers:
                    self._send_one((data, address))

    def close(self) -> None:
        if self._open and self._backlog:
            self._loop.remove_writer(self._sock.fileno())
        self._open = False
        self._backlog.clear()

    def _send_one(self, item: tuple[bytes, NetworkAddress]) -> None:
        if not self._open:
            return
        if self._backlog:
            if len(self._backlog) < self._max_backlog:
                self._backlog.append(item)
            return
        try:
            self._sock.sendto(*item)
        except (BlockingIOError, InterruptedError):
            self._defer([item])
        except OSError as exc:
            log.debug("UDP send to %s failed: %s", item[1], exc)

    def _defer(self, items: list[tuple[bytes, NetworkAddress]]) -> None:
        if not self._backlog:
            self._loop.add_writer(self._sock.fileno(), self._writable)
        self._backlog.extend(items[: self._max_backlog - len(self._backlog)])

    def _writable(self) -> None:
        while self._backlog:
            try:
                self._sock.sendto(*self._backlog[0])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("UDP send failed: %s", exc)
            self._backlog.popleft()
        self._loop.remove_writer(self._sock.fileno())
