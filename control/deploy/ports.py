"""Free loopback ports for role listeners, and the port of a base URI."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port(kind: socket.SocketKind = socket.SOCK_STREAM, host: str = LOOPBACK) -> int:
    """A port free on ``host`` right now (TCP by default; ``SOCK_DGRAM`` for QUIC listeners)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def free_udp_port(host: str = LOOPBACK) -> int:
    """A UDP port free on ``host`` (``"0.0.0.0"``: on every interface) right now."""
    return free_port(socket.SOCK_DGRAM, host)


def port_of(uri: str) -> int:
    """The explicit port of ``scheme://host:port/...``."""
    return int(uri.split(":")[2].split("/", maxsplit=1)[0])
