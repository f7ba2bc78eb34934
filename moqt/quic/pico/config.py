"""``EndpointConfig`` as aiopquic wants it, and what the picoquic back-end refuses to pretend.

picoquic reads certificates, keys and roots from PEM files when its transport starts (one transport
per server, one per client connection), so `pem_files` writes ours to a private temporary directory
for just that moment. Settings with no picoquic counterpart (datagram sizes: picoquic runs path MTU
discovery; ``initial_rtt_s``, ``ack_delay_s``, ``recv_batch``, ``max_flight_bytes``, ``gso``,
``liveness_timeout_s``, ``max_connections_per_client``) are not applied; settings that would weaken
authentication if ignored are refused at start (`PicoquicUnsupportedError`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography.hazmat.primitives import serialization

from moqt.profiles.negotiation import alpns
from moqt.quic.config import EndpointConfig

AIOPQUIC_VERSION: Final = "0.6.1"  # what docs/moqt-picoquic.md verified and the shim relies on


class PicoquicUnsupportedError(ValueError):
    """A setting or check the picoquic back-end cannot honour; refused rather than silently dropped."""


def aiopquic_modules() -> tuple[Any, Any]:
    """aiopquic's ``QuicConfiguration`` and ``quic.connection`` module, or one clear error without it.
    Imported here, not at the top: aiopquic exists for Python >= 3.12 only (and ships no py.typed)."""
    try:
        aiopquic = importlib.import_module("aiopquic")
        connection = importlib.import_module("aiopquic.quic.connection")
        configuration = importlib.import_module("aiopquic.quic.configuration")
    except ImportError as exc:
        raise PicoquicUnsupportedError(f"the picoquic back-end needs aiopquic=={AIOPQUIC_VERSION} (Python >= 3.12): "
                                       f"{exc}") from exc
    if aiopquic.__version__ != AIOPQUIC_VERSION:
        raise PicoquicUnsupportedError(f"the picoquic back-end is checked against aiopquic {AIOPQUIC_VERSION}, "
                                       f"not {aiopquic.__version__}")
    # aiopquic logs every close with a code and every peer reset at WARNING: routine for MOQT (a refused
    # token, FETCH_CANCEL), and our connection logs the ones that matter itself. Left alone if configured.
    noisy = logging.getLogger("aiopquic.quic.connection")
    if noisy.level == logging.NOTSET:
        noisy.setLevel(logging.ERROR)
    return configuration.QuicConfiguration, connection


@dataclass(frozen=True, slots=True)
class PemFiles:
    certificate: str | None = None
    private_key: str | None = None
    roots: str | None = None


@contextlib.contextmanager
def pem_files(config: EndpointConfig, *, server: bool) -> Iterator[PemFiles]:
    """A server's chain and key, or a client's roots (the deployment CA), as PEM files readable by us only,
    removed on exit (picoquic has loaded them by then). A client presents no certificate: a picoquic
    server would never ask for it, and an aioquic one accepts its token instead."""
    with tempfile.TemporaryDirectory(prefix="kvsp-pico-") as directory:
        base = Path(directory)
        os.chmod(base, 0o700)
        cert = key = ca = None
        creds = config.credentials
        if server and creds is not None:
            cert, key = str(base / "cert.pem"), str(base / "key.pem")
            Path(cert).write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in creds.chain))
            Path(key).write_bytes(creds.private_key.private_bytes(serialization.Encoding.PEM,
                                                                   serialization.PrivateFormat.PKCS8,
                                                                   serialization.NoEncryption()))
        if not server:
            ca = str(base / "ca.pem")
            Path(ca).write_bytes(config.trust.pem())
        yield PemFiles(cert, key, ca)


def ip_family(host: str) -> int | None:
    """aiopquic binds wildcards only: an IPv4 literal pins IPv4, anything else binds both families."""
    with contextlib.suppress(OSError):
        socket.inet_pton(socket.AF_INET, host)
        return socket.AF_INET
    return None


def pico_configuration(config: EndpointConfig, files: PemFiles, *, is_client: bool, server_name: str | None = None,
                       family: int | None = None) -> Any:
    """aiopquic's ``QuicConfiguration`` for ``config``'s settings (see the module docstring)."""
    quic_configuration, _ = aiopquic_modules()
    s = config.settings
    keepalive = s.idle_timeout_s / 3 if s.keepalive and is_client else None
    return quic_configuration(
        is_client=is_client, alpn_protocols=alpns(s.profiles), idle_timeout=s.idle_timeout_s,
        keep_alive_interval=keepalive, max_data=s.max_data, max_stream_data=s.max_stream_data,
        max_datagram_frame_size=s.max_datagram_frame_size, congestion_control_algorithm=s.congestion_control,
        socket_buffer_size=s.socket_buffer_bytes, server_name=server_name, certificate_file=files.certificate,
        private_key_file=files.private_key, cafile=files.roots, ip_family=family)
