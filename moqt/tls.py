"""Peer authentication for MOQT over raw QUIC (decisions D1, D3).

QUIC connections are mutually authenticated like the HTTPS listeners: each side presents a certificate
issued by the deployment CA whose URI SubjectAltName is its identity. aioquic 1.7.2 does only part of
this by itself:

* A client can verify the server chain and name during the handshake (pyOpenSSL + service_identity),
  but service_identity raises on any URI SAN with a port or a path, i.e. on every kvsp certificate
  ("moqt://127.0.0.1:4433/relay" -> "Certificate extensions could not be parsed"), so the adapter
  turns that check off (``verify_mode=CERT_NONE``) and relies on the one here.
* A server never asks for a client certificate unless ``tls.Context._request_client_certificate`` is set
  (marked "for test purposes only"), and when it gets one it checks only *possession* (the
  CertificateVerify signature), never the chain. A client may also answer with an empty Certificate.

So the chain check is ours, with ``cryptography``'s X.509 verifier (RFC 5280 path building plus the
CA/B-style profile: validity, basic constraints, key usage, EKU clientAuth/serverAuth, SAN matching).
It runs on both sides right after ``HandshakeCompleted`` and before any MOQT byte reaches the session;
the adapter (``moqt/quic.py``) closes a failing connection with MOQT ``UNAUTHORIZED`` (0x2).

The module also holds :class:`PeerAuthentication`, the identity surface a connection exposes
(certificate or AUTHORIZATION_TOKEN), and, at the end, the only code that reaches into aioquic's
private state (peer certificate, client-certificate request, send-buffer size, datagram size, ACK
delay, STREAM frame writing).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias

from aioquic.buffer import Buffer, size_uint_var  # type: ignore[attr-defined]  # re-exported without __all__
from aioquic.quic.congestion.base import QuicCongestionControl
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicFrameType, pull_quic_transport_parameters
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.recovery import QuicPacketSpace
from aioquic.quic.stream import QuicStream
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.x509 import verification

from moqt.auth import AuthError, TokenClaims, verify_token

MAX_CHAIN_DEPTH: Final = 4

TlsPrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey | rsa.RSAPrivateKey
"""The key types aioquic's TLS stack can sign CertificateVerify with."""


class PeerCertificateError(AuthError):
    """The peer's certificate is missing, does not chain to the deployment CA, or names no identity."""


@dataclass(frozen=True, slots=True)
class VerifiedPeer:
    """A peer whose chain verified: ``identity`` is its first URI SAN (D1), as the HTTPS side uses."""

    identity: str
    identities: tuple[str, ...]
    certificate: x509.Certificate


def uri_sans(cert: x509.Certificate) -> tuple[str, ...]:
    """The URI SubjectAltNames of ``cert``: the identities it asserts."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    return tuple(san.get_values_for_type(x509.UniformResourceIdentifier))


def _subject(server_name: str) -> verification.Subject:
    try:
        return x509.IPAddress(ipaddress.ip_address(server_name))
    except ValueError:
        return x509.DNSName(server_name)


class PeerTrust:
    """The deployment CA(s) a peer's chain must lead to, and the two checks made against them.

    Verifiers are built per call because their validation time is fixed at build time; the store of
    roots is built once.
    """

    __slots__ = ("_store", "max_chain_depth", "roots")

    def __init__(self, roots: Sequence[x509.Certificate], max_chain_depth: int = MAX_CHAIN_DEPTH) -> None:
        if not roots:
            raise ValueError("PeerTrust needs at least one CA certificate")
        self.roots = tuple(roots)
        self.max_chain_depth = max_chain_depth
        self._store = verification.Store(list(self.roots))

    @classmethod
    def from_pem(cls, data: bytes) -> PeerTrust:
        return cls(x509.load_pem_x509_certificates(data))

    @classmethod
    def load(cls, path: Path) -> PeerTrust:
        """Read a PEM bundle of CA certificates (the deployment's ``ca.pem``)."""
        return cls.from_pem(path.read_bytes())

    def pem(self) -> bytes:
        """The roots as PEM, for aioquic's own in-handshake server check (``cadata``)."""
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in self.roots)

    def _builder(self, now: dt.datetime | None) -> verification.PolicyBuilder:
        return (verification.PolicyBuilder().store(self._store).max_chain_depth(self.max_chain_depth)
                .time(now or dt.datetime.now(dt.UTC)))

    def verify_client(self, chain: Sequence[x509.Certificate], now: dt.datetime | None = None) -> VerifiedPeer:
        """Chain to a root with EKU clientAuth; the identity is the leaf's first URI SAN."""
        if not chain:
            raise PeerCertificateError("no client certificate")
        try:
            self._builder(now).build_client_verifier().verify(chain[0], list(chain[1:]))
        except (verification.VerificationError, ValueError) as exc:
            raise PeerCertificateError(f"client certificate rejected: {exc}") from exc
        return _verified(chain[0])

    def verify_server(self, chain: Sequence[x509.Certificate], server_name: str,
                      now: dt.datetime | None = None) -> VerifiedPeer:
        """Chain to a root with EKU serverAuth and a DNS/IP SAN matching ``server_name``."""
        if not chain:
            raise PeerCertificateError("no server certificate")
        try:
            verifier = self._builder(now).build_server_verifier(_subject(server_name))
            verifier.verify(chain[0], list(chain[1:]))
        except (verification.VerificationError, ValueError) as exc:
            raise PeerCertificateError(f"server certificate rejected: {exc}") from exc
        return _verified(chain[0])


def _verified(leaf: x509.Certificate) -> VerifiedPeer:
    identities = uri_sans(leaf)
    if not identities:
        raise PeerCertificateError("certificate has no URI SubjectAltName (no KVSP identity)")
    return VerifiedPeer(identities[0], identities, leaf)


@dataclass(frozen=True, slots=True)
class LocalCredentials:
    """Our own certificate chain and key, presented to the peer in both roles."""

    chain: tuple[x509.Certificate, ...]
    private_key: TlsPrivateKey

    @classmethod
    def load(cls, cert_path: Path, key_path: Path) -> LocalCredentials:
        """Read a PEM certificate chain (leaf first) and its PEM private key."""
        chain = tuple(x509.load_pem_x509_certificates(cert_path.read_bytes()))
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, TlsPrivateKey):
            raise ValueError(f"{key_path}: unsupported private key type {type(key).__name__}")
        if chain[0].public_key() != key.public_key():
            raise ValueError(f"{key_path} does not match the certificate in {cert_path}")
        return cls(chain, key)

    @property
    def identity(self) -> str | None:
        ids = uri_sans(self.chain[0])
        return ids[0] if ids else None


AuthMethod: TypeAlias = Literal["certificate", "token"]


class PeerAuthentication:
    """Who the peer is and how we know it: the identity surface of a connection (D3).

    The adapter fills it from a verified certificate right after the handshake. For a peer without
    one, the session layer (which reads AUTHORIZATION_TOKEN from CLIENT_SETUP) calls
    :meth:`authenticate_with_token`, or sets ``peer_identity`` then ``authenticated_by`` itself
    after its own check. Subclasses learn of success through :meth:`_authenticated`.
    """

    def __init__(self, token_keys: Sequence[ec.EllipticCurvePublicKey] = ()) -> None:
        self.token_keys = tuple(token_keys)
        self.peer_certificate: VerifiedPeer | None = None
        self.token_claims: TokenClaims | None = None
        self._peer_identity: str | None = None
        self._authenticated_by: AuthMethod | None = None

    @property
    def peer_identity(self) -> str | None:
        """The peer's identity URI once authenticated (certificate URI SAN or token ``sub``), else None."""
        return self._peer_identity

    @peer_identity.setter
    def peer_identity(self, value: str | None) -> None:
        self._peer_identity = value
        if value is None:
            self._authenticated_by = None

    @property
    def authenticated_by(self) -> AuthMethod | None:
        return self._authenticated_by

    @authenticated_by.setter
    def authenticated_by(self, value: AuthMethod | None) -> None:
        if value is not None and self._peer_identity is None:
            raise ValueError("set peer_identity before authenticated_by")
        self._authenticated_by = value
        if value is not None:
            self._authenticated()

    def authenticate_with_token(self, token: bytes, now: float | None = None) -> TokenClaims:
        """Verify an AUTHORIZATION_TOKEN value (e.g. from ``SetupRequested.authorization``).

        On success the peer is authenticated by token (if a certificate already did it, the token must
        name the same subject) and ``token_claims`` says what it may use. Raises
        :class:`~moqt.auth.AuthError`: close or reject the setup with its ``session_code``.
        """
        claims = verify_token(token, self.token_keys, time.time() if now is None else now)
        if self._authenticated_by == "certificate" and claims.subject != self._peer_identity:
            raise PeerCertificateError(f"token subject {claims.subject} is not the certificate identity")
        self.token_claims = claims
        if self._authenticated_by is None:
            self.peer_identity = claims.subject
            self.authenticated_by = "token"
        return claims

    def _authenticated(self) -> None:
        """Hook: the peer has just been authenticated."""


# -- the only places that reach into aioquic's private state -----------------------------------
def peer_certificate_chain(quic: QuicConnection) -> list[x509.Certificate]:
    """The certificate chain the peer presented (leaf first), or ``[]`` if it presented none.

    aioquic 1.7.2 has no public accessor: ``tls.Context`` keeps the parsed leaf in
    ``_peer_certificate`` and the rest in ``_peer_certificate_chain`` (set by
    ``_set_peer_certificate`` when the Certificate message arrives, before CertificateVerify checks
    possession). This function is the one place that reads them; if a new aioquic renames them, it
    returns ``[]`` and every peer is treated as certificate-less, which fails closed.
    """
    tls = getattr(quic, "tls", None)
    leaf = getattr(tls, "_peer_certificate", None)
    if not isinstance(leaf, x509.Certificate):
        return []
    rest = getattr(tls, "_peer_certificate_chain", [])
    return [leaf, *(c for c in rest if isinstance(c, x509.Certificate))]


def send_buffered(quic: QuicConnection, stream_id: int) -> int:
    """Octets written to ``stream_id`` and not yet acknowledged by the peer (0 for unknown/reset streams).

    aioquic 1.7.2 exposes no public size for a stream's send buffer: ``QuicStreamSender`` keeps the
    unacknowledged bytes in ``_buffer`` between offsets ``_buffer_start`` (advanced as the peer ACKs)
    and ``_buffer_stop``. This is the one place that reads them (and ``QuicConnection._streams``);
    ``moqt/quic.py`` uses it for ``write()``/``drain()`` backpressure.
    """
    stream = quic._streams.get(stream_id)
    if stream is None or stream.sender._reset_error_code is not None:
        return 0
    return stream.sender._buffer_stop - stream.sender._buffer_start


HANDSHAKE_DATAGRAM_SIZE: Final = 16000
"""Largest datagram during the handshake (see :class:`HookedQuicConnection`)."""
_MAX_UDP_PAYLOAD: Final = 65527  # RFC 9000 section 18.2: the largest max_udp_payload_size
_STREAM_LENGTH_FIELD: Final = 4
"""Octets of a STREAM frame's Length varint when we write it: 4 (values up to 2**30 - 1), where
aioquic 1.7.2 always writes 2 (``push_uint16(len | 0x4000)``, at most 16383)."""


_CAPPED: dict[tuple[type[QuicCongestionControl], int], type[QuicCongestionControl]] = {}


def capped_congestion_control(base: type[QuicCongestionControl], cap: int) -> type[QuicCongestionControl]:
    """``base`` (aioquic's reno or cubic) whose congestion window never exceeds ``cap`` octets.

    aioquic's slow start grows the window without bound while nothing is lost (it has no app-limited
    check), so after a few blocks the sender bursts whole blocks at once. On loopback a burst larger
    than the receiver's socket buffer (about 7.8 MiB of 64 KiB datagrams with a 4 MiB SO_RCVBUF) drops
    datagrams, and a loss takes cubic down and out of slow start (seen after 8 concurrent 2 MiB
    fetches: a 2.5 MB window, ssthresh 131 kB). Keeping the window within the receiver's buffer avoids
    the loss; pacing follows the capped window. No throughput gain was measured on the project's
    machine, so ``QuicSettings.max_flight_bytes`` is off by default (docs/moqt-performance.md).
    """
    key = (base, cap)
    capped = _CAPPED.get(key)
    if capped is None:

        def get(self: Any) -> int:
            return int(self._capped_window)

        def set_(self: Any, value: int) -> None:
            self._capped_window = min(value, cap)

        capped = _CAPPED[key] = type(f"Capped{base.__name__}", (base,),
                                     {"congestion_window": property(get, set_), "__doc__": base.__doc__})
    return capped


class HookedQuicConnection(QuicConnection):
    """The ``QuicConnection`` used by ``moqt/quic.py``, with three hooks aioquic lacks.

    * ``on_write`` runs whenever something is queued for sending or the connection is closed (by the
      session or the application), so the adapter can schedule a transmit; it is set right after
      construction, before any write.
    * ``request_client_certificate`` (servers) makes the TLS stack send a CertificateRequest. aioquic
      creates its ``tls.Context`` in ``_initialize`` when the first Initial arrives and handles the
      ClientHello in the same call, so the flag must be set right there; overriding ``_initialize``
      is the only hook in between. The request is not a demand: a client without a certificate
      answers with an empty Certificate, and the adapter then waits for AUTHORIZATION_TOKEN (D3).
    * STREAM frames longer than 16383 octets (:meth:`_write_stream_frame`), so a packet may be as large
      as the path allows (64 KiB on loopback) instead of ~16 KiB: aioquic's cost is per packet, so this
      is its main throughput lever (docs/moqt-performance.md).  Every QUIC receiver parses a varint
      of any length, so stock peers read these frames as they read aioquic's.

    Options: ``ack_delay_s`` (aioquic's fixed 1 ms otherwise) and ``max_flight_bytes``, a cap on the
    congestion window (:func:`capped_congestion_control`).
    """

    on_write: Callable[[], None]
    request_client_certificate = False
    closing = False  # close() was called: nothing more can be sent
    _peer_payload_limit = _MAX_UDP_PAYLOAD
    _data_datagram_size = 0  # the configured size, used once the handshake is over (0: not limited)

    def __init__(self, *args: Any, ack_delay_s: float | None = None, max_flight_bytes: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if ack_delay_s is not None:  # how long after the first unacknowledged packet aioquic sends an ACK
            self._ack_delay = ack_delay_s
        if max_flight_bytes is not None:
            cc = self._loss._cc
            self._loss._cc = capped_congestion_control(type(cc), max_flight_bytes)(
                max_datagram_size=self._configuration.max_datagram_size)
        # Handshake packets have long headers, whose Length aioquic writes in 14 bits, and CRYPTO frames
        # written by aioquic: keep them within HANDSHAKE_DATAGRAM_SIZE; congestion control and pacing
        # are sized for the configured (data) size from the start.
        if self._max_datagram_size > HANDSHAKE_DATAGRAM_SIZE:
            self._data_datagram_size = self._max_datagram_size
            self._max_datagram_size = HANDSHAKE_DATAGRAM_SIZE

    def handshake_done(self) -> None:
        """The handshake is over: send packets of the configured size (within the peer's limit)."""
        if self._data_datagram_size:
            self._max_datagram_size = min(self._data_datagram_size, self._peer_payload_limit)
            self._data_datagram_size = 0

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        if self.request_client_certificate:
            if not hasattr(self.tls, "_request_client_certificate"):
                raise RuntimeError("this aioquic cannot request client certificates; kvsp needs 1.7.x")
            self.tls._request_client_certificate = True

    def _parse_transport_parameters(self, data: bytes, from_session_ticket: bool = False) -> None:
        # aioquic validates the peer's max_udp_payload_size but never sends smaller packets for it:
        # a peer advertising 1440 (picoquic, so aiomoqt) silently drops our 16000-octet loopback
        # packets after the handshake.  Honour the limit (RFC 9000 section 18.2).
        super()._parse_transport_parameters(data, from_session_ticket)
        limit = pull_quic_transport_parameters(Buffer(data=data)).max_udp_payload_size
        if limit is not None:
            self._peer_payload_limit = limit
            self._max_datagram_size = min(self._max_datagram_size, limit)

    def send_stream_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        super().send_stream_data(stream_id, data, end_stream)
        self.on_write()

    def _write_stream_frame(self, builder: QuicPacketBuilder, space: QuicPacketSpace, stream: QuicStream,
                            max_offset: int) -> int:
        # aioquic's version with one change: the Length field is a 4-octet varint (RFC 9000 section 16)
        # instead of a 2-octet one, so one frame can fill a packet of up to 2**30 octets.
        sender, stream_id = stream.sender, stream.stream_id
        assert stream_id is not None  # only the crypto streams, not written here, have none
        overhead = (1 + size_uint_var(stream_id) + _STREAM_LENGTH_FIELD
                    + (size_uint_var(sender.next_offset) if sender.next_offset else 0))
        previous_highest = sender.highest_offset
        frame = sender.get_frame(builder.remaining_flight_space - overhead, max_offset)
        if frame is None:
            return 0
        frame_type = QuicFrameType.STREAM_BASE | 2 | (4 if frame.offset else 0) | (1 if frame.fin else 0)
        buf = builder.start_frame(frame_type, capacity=overhead, handler=sender.on_data_delivery,
                                  handler_args=(frame.offset, frame.offset + len(frame.data), frame.fin))
        buf.push_uint_var(stream_id)
        if frame.offset:
            buf.push_uint_var(frame.offset)
        buf.push_uint32(len(frame.data) | 0x80000000)
        buf.push_bytes(frame.data)
        if self._quic_logger is not None and builder.quic_logger_frames is not None:
            builder.quic_logger_frames.append(self._quic_logger.encode_stream_frame(frame, stream_id=stream_id))
        return sender.highest_offset - previous_highest

    def reset_stream(self, stream_id: int, error_code: int) -> None:
        super().reset_stream(stream_id, error_code)
        self.on_write()

    def stop_stream(self, stream_id: int, error_code: int) -> None:
        super().stop_stream(stream_id, error_code)
        self.on_write()

    def send_datagram_frame(self, data: bytes) -> None:
        super().send_datagram_frame(data)
        self.on_write()

    def send_ping(self, uid: int) -> None:
        super().send_ping(uid)
        self.on_write()

    def close(self, error_code: int = 0, frame_type: int | None = None, reason_phrase: str = "") -> None:
        super().close(error_code, frame_type, reason_phrase)
        self.closing = True
        self.on_write()
