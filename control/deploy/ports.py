"""Free loopback ports for role listeners, and the port of a base URI.

A role's port is chosen before it listens (it is written into the other roles' configurations and
into its certificate's URI), so between the choice and the bind the port must stay free. A port the
kernel hands out for ``bind(0)`` lies in the ephemeral range, which is exactly where every outbound
connection's local port comes from: on a busy host (a test run opens thousands of connections) one
of them can take the chosen port before the listener binds, and the bind fails with EADDRINUSE.
So ports are chosen below the ephemeral range, where the kernel never auto-assigns, walking from a
random start so that one process never hands out the same port twice before the walk wraps, and
two processes rarely meet.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

LOOPBACK = "127.0.0.1"
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_EPHEMERAL = (32768, 60999)
LOWEST_PORT = 10000
MIN_SPAN = 1000  # below this many ports outside the ephemeral range, fall back to the kernel's choice


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's range for automatically assigned local ports (Linux's default where unknown)."""
    try:
        low, high = (int(v) for v in path.read_text().split())
    except (OSError, ValueError):
        return LINUX_DEFAULT_EPHEMERAL
    return low, high


def bindable(port: int, kind: socket.SocketKind, host: str) -> bool:
    """Whether ``host:port`` can be bound for ``kind`` right now."""
    with socket.socket(socket.AF_INET, kind) as s:
        if kind == socket.SOCK_STREAM:  # as aiohttp's listeners do: TIME_WAIT is no conflict. Not for UDP,
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # where it would share a bound port
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def kernel_port(kind: socket.SocketKind, host: str) -> int:
    """A port the kernel picks (in the ephemeral range)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class PortWalk:
    """Hands out ports in ``[low, high)`` that bind now, each once per walk, from a random start."""

    def __init__(self, low: int, high: int, rng: random.Random | None = None) -> None:
        self.low, self.high = low, high
        self._next = (rng or random.SystemRandom()).randrange(low, high) if high > low else low
        self._lock = threading.Lock()

    @classmethod
    def below_ephemeral(cls, path: Path = EPHEMERAL_RANGE_FILE) -> PortWalk:
        return cls(LOWEST_PORT, ephemeral_range(path)[0])

    @property
    def span(self) -> int:
        return max(0, self.high - self.low)

    def take(self, kind: socket.SocketKind = socket.SOCK_STREAM, host: str = LOOPBACK) -> int:
        if self.span < MIN_SPAN:
            return kernel_port(kind, host)
        with self._lock:
            for _ in range(self.span):
                port = self._next
                self._next = self.low + (port + 1 - self.low) % self.span
                if bindable(port, kind, host):
                    return port
        return kernel_port(kind, host)


_WALK = PortWalk.below_ephemeral()


def free_port(kind: socket.SocketKind = socket.SOCK_STREAM, host: str = LOOPBACK) -> int:
    """A port free on ``host`` now and outside the ephemeral range (TCP; ``SOCK_DGRAM`` for QUIC)."""
    return _WALK.take(kind, host)


def free_udp_port(host: str = LOOPBACK) -> int:
    """A UDP port free on ``host`` (``"0.0.0.0"``: on every interface) right now."""
    return free_port(socket.SOCK_DGRAM, host)


def port_of(uri: str) -> int:
    """The explicit port of ``scheme://host:port/...``."""
    return int(uri.split(":")[2].split("/", maxsplit=1)[0])
