"""Where to connect and how: ``moqt://`` URIs, QUIC settings, and an endpoint's credentials and trust.

Plain values, built once and shared by every connection of an endpoint; ``EndpointConfig`` turns them
into the ``QuicConfiguration`` aioquic wants (one per datagram size).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE, QuicConfiguration
from aioquic.quic.connection import NetworkAddress
from cryptography.hazmat.primitives.asymmetric import ec

from moqt.backends import check_quic_backend
from moqt.profiles import Profile
from moqt.profiles.negotiation import alpns, profiles_for
from moqt.tls import LocalCredentials, PeerTrust

log = logging.getLogger(__name__)

ALPN: Final = "moq-00"  # draft-14's (and every draft's before 15); later drafts' ALPN is ``moqt-NN``
DEFAULT_PORT: Final = 443
_FRAGMENT: Final = re.compile(r"[a-z0-9-]+:.*", re.DOTALL)
MAX_DATAGRAM_SIZE: Final = 65507
"""Largest usable ``max_datagram_size``: the largest UDP payload over IPv4. aioquic alone writes a STREAM
frame's Length in 14 bits (at most 16383 octets), which capped packets at 16000; ``HookedQuicConnection``
writes it in 30 bits and keeps handshake packets at 16000 (moqt/quic/aioquic_hooks.py)."""
LOOPBACK_DATAGRAM_SIZE: Final = 65488
"""Loopback MTU (65536) less IPv6 and UDP headers: the largest datagram that crosses ``lo`` unfragmented
for both address families."""


@dataclass(frozen=True, slots=True)
class MoqtUri:
    """``moqt://host[:port]/path[?query][#type:value]`` (draft-18 "MOQT URI Scheme"; port 443 when
    omitted). ``path`` (with the query) goes in the PATH parameter; the fragment never leaves the
    client (it is processed locally after setup), and must begin with a fragment type identifier
    (``a-z``, ``0-9``, ``-``) and a colon."""

    host: str
    port: int
    path: str
    fragment: str = ""

    @classmethod
    def parse(cls, uri: str) -> MoqtUri:
        try:
            parts = urlsplit(uri)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"{uri!r} is not a valid URI: {exc}") from exc
        if parts.scheme != "moqt":
            raise ValueError(f"{uri!r}: scheme must be moqt")
        if not parts.hostname or parts.username is not None:
            raise ValueError(f"{uri!r}: needs a host and no userinfo")
        if parts.fragment and not _FRAGMENT.fullmatch(parts.fragment):
            raise ValueError(f"{uri!r}: a fragment must be <type>:<value>, the type of a-z, 0-9 and -")
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        return cls(parts.hostname, DEFAULT_PORT if port is None else port, path, parts.fragment)

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"moqt://{self.authority}{self.path}" + (f"#{self.fragment}" if self.fragment else "")


def _clamp_datagram(name: str, value: int) -> int:
    if value < SMALLEST_MAX_DATAGRAM_SIZE:
        raise ValueError(f"{name} must be at least {SMALLEST_MAX_DATAGRAM_SIZE} (RFC 9000 section 14)")
    if value > MAX_DATAGRAM_SIZE:
        log.warning("%s=%d clamped to %d: the largest UDP payload over IPv4", name, value, MAX_DATAGRAM_SIZE)
        return MAX_DATAGRAM_SIZE
    return value


@dataclass(frozen=True, slots=True)
class QuicSettings:
    """QUIC knobs, with defaults for a datacenter LAN and loopback (where kvsp moves KV blocks).

    Datagram size is the main throughput lever for a Python QUIC stack (per-packet CPU dominates; see
    docs/moqt-performance.md and benchmarks/bench_quic.py): 65488 octets on loopback move a block with
    about half the CPU of 16000. Loopback peers get ``loopback_datagram_size``, others
    ``max_datagram_size`` (1452 = Ethernet MTU 1500 minus IPv6 and UDP headers; 8952 on a jumbo-frame
    fabric). aioquic has no path MTU discovery: a size the path cannot carry unfragmented works only
    where IP fragments get through. Handshake datagrams stay at 16000 at most (moqt/quic/aioquic_hooks.py).

    Dead peers (moqt/quic/liveness.py, docs/moqt.md "Dead peers"): client connections PING after a
    third of the negotiated idle timeout without receiving anything (``keepalive``), so a live session
    never idles out and the idle timeout can be short; any connection that has waited
    ``liveness_timeout_s`` for an ACK of what it sent closes: a request to a vanished peer fails
    within that bound. A server refuses a new connection at once (CONNECTION_REFUSED) from an address
    that already has ``max_connections_per_client`` (None: no cap).

    Drafts (docs/moqt-drafts.md): a client offers the ALPN of every draft in ``drafts`` newest first
    (``moqt-16``, then ``moq-00`` for draft-14), a server accepts each of them on its one port and
    picks the newest the client offered; the connection's ``profile`` follows from the agreed ALPN.
    ``drafts`` pins a role to some drafts (e.g. ``(14,)`` for a peer that mis-handles newer ALPNs).
    """

    max_datagram_size: int = 1452
    loopback_datagram_size: int = LOOPBACK_DATAGRAM_SIZE
    max_data: int = 64 << 20  # connection flow-control window: octets the peer may send ahead
    max_stream_data: int = 16 << 20  # per-stream window: a few KV layers
    max_datagram_frame_size: int = 65535  # QUIC DATAGRAM (RFC 9221), which MOQT object datagrams need
    congestion_control: str = "cubic"
    idle_timeout_s: float = 5.0  # silent this long: closed (the smaller of both ends'; keepalive PINGs at 1/3)
    keepalive: bool = True  # client connections PING when silent for a third of the negotiated idle timeout
    liveness_timeout_s: float | None = 2.0  # ack-eliciting data unanswered this long: the peer is gone
    max_connections_per_client: int | None = 256  # a server's concurrent connections from one IP address
    initial_rtt_s: float = 0.01  # RTT guess before the first sample: a LAN value, so early loss recovers fast
    socket_buffer_bytes: int = 4 << 20
    send_high_water: int = 4 << 20  # write() keeps at most this much unacknowledged per stream; resumes at 1/2
    recv_batch: int = 64  # datagrams read per socket wake-up before one transmit
    ack_delay_s: float = 0.001  # how long a receiver may hold an ACK back (aioquic's value; below 25 ms)
    max_flight_bytes: int | None = None  # congestion window cap (None: aioquic's unbounded slow start); see
    # moqt.quic.aioquic_hooks.capped_congestion_control: avoids loopback bursts beyond the peer's socket
    # buffer, no gain measured
    gso: bool = False  # UDP GSO on Linux (moqt/quic/udp.py): no gain measured here (docs/moqt-performance.md)
    handshake_timeout_s: float = 10.0
    auth_timeout_s: float = 10.0  # how long a client without certificate has to present a valid token (D3)
    drafts: tuple[int, ...] | None = None  # MOQT drafts offered (client) / accepted (server); None: every one
    quic: str = "aioquic"  # the QUIC stack (moqt/quic/backend.py): "aioquic", or "picoquic" (Python >= 3.12)

    def __post_init__(self) -> None:
        check_quic_backend(self.quic)
        for name in ("max_datagram_size", "loopback_datagram_size"):
            object.__setattr__(self, name, _clamp_datagram(name, getattr(self, name)))
        if min(self.max_data, self.max_stream_data, self.send_high_water, self.recv_batch) <= 0:
            raise ValueError("flow-control windows, send_high_water and recv_batch must be positive")
        if self.max_flight_bytes is not None and self.max_flight_bytes < 4 * self.loopback_datagram_size:
            raise ValueError("max_flight_bytes must allow at least 4 datagrams of loopback_datagram_size")
        if not 0 <= self.ack_delay_s < 0.025:
            raise ValueError("ack_delay_s must be within [0, 0.025): aioquic announces max_ack_delay 25 ms")
        if not self.idle_timeout_s > 0 or (self.liveness_timeout_s is not None and not self.liveness_timeout_s > 0):
            raise ValueError("idle_timeout_s and liveness_timeout_s must be positive")
        if self.max_connections_per_client is not None and self.max_connections_per_client < 1:
            raise ValueError("max_connections_per_client must be at least 1 (or None: no cap)")
        if self.congestion_control not in ("reno", "cubic"):
            raise ValueError(f"congestion_control {self.congestion_control!r}: aioquic has reno and cubic")
        if self.drafts is not None:
            object.__setattr__(self, "drafts", tuple(p.draft for p in profiles_for(self.drafts)))

    @property
    def profiles(self) -> tuple[Profile, ...]:
        """The drafts' profiles, newest first: the ALPN list a client offers and a server accepts."""
        return profiles_for(self.drafts)

    def datagram_size_for(self, address: NetworkAddress) -> int:
        """The datagram size to send to ``address``: the loopback size for 127/8, ::1, ::ffff:127/104."""
        try:
            ip = ipaddress.ip_address(str(address[0]).split("%")[0])
        except ValueError:
            return self.max_datagram_size
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        loopback = ip.is_loopback or (mapped is not None and mapped.is_loopback)
        return self.loopback_datagram_size if loopback else self.max_datagram_size


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """Who we are (``credentials``), whom we trust (``trust``, ``token_keys``) and the QUIC settings.

    ``credentials`` may be None only on a client that authenticates with a token instead (D3).
    A server with ``require_certificate`` closes certificate-less clients at once.
    """

    trust: PeerTrust
    credentials: LocalCredentials | None = None
    settings: QuicSettings = field(default_factory=QuicSettings)
    token_keys: tuple[ec.EllipticCurvePublicKey, ...] = ()
    require_certificate: bool = False

    @classmethod
    def from_files(cls, cert: Path | None, key: Path | None, ca: Path, settings: QuicSettings | None = None, *,
                   token_keys: Sequence[ec.EllipticCurvePublicKey] = (),
                   require_certificate: bool = False) -> EndpointConfig:
        """Load a role's PEM certificate/key (as written by ``kvsp certs``) and the deployment CA."""
        credentials = LocalCredentials.load(cert, key) if cert is not None and key is not None else None
        return cls(PeerTrust.load(ca), credentials, settings or QuicSettings(), tuple(token_keys),
                   require_certificate)

    def quic_configuration(self, *, is_client: bool, datagram_size: int,
                           server_name: str | None = None) -> QuicConfiguration:
        s = self.settings
        qc = QuicConfiguration(is_client=is_client, alpn_protocols=alpns(s.profiles), max_datagram_size=datagram_size,
                               max_data=s.max_data, max_stream_data=s.max_stream_data,
                               congestion_control_algorithm=s.congestion_control, idle_timeout=s.idle_timeout_s,
                               server_name=server_name, max_datagram_frame_size=s.max_datagram_frame_size)
        qc.initial_rtt = s.initial_rtt_s
        if self.credentials is not None:
            qc.certificate = self.credentials.chain[0]
            qc.certificate_chain = list(self.credentials.chain[1:])
            qc.private_key = self.credentials.private_key
        # aioquic's own client-side check (pyOpenSSL + service_identity) rejects every kvsp certificate:
        # service_identity cannot parse a URI SAN with a port or path ("moqt://h:4433/x"). So it is off,
        # and the connection verifies chain, name and identity (moqt/tls.py) at HandshakeCompleted, before
        # the session exists. Our certificate may reach a server we then reject: it is public, and its
        # CertificateVerify signature is bound to this handshake's transcript.
        qc.verify_mode = ssl.CERT_NONE
        return qc
