"""How a QUIC peer is refused: TLS alert codes for certificates we reject, and a stateless CONNECTION_REFUSED.

Why these shapes:

* A certificate is verified after aioquic's handshake (moqt/tls.py; aioquic's own check cannot read
  kvsp's URI SANs), so the refusal cannot be an alert inside the handshake. It is the next best thing,
  a transport CONNECTION_CLOSE carrying the alert as a crypto error (``0x100 + alert``, RFC 9001
  section 4.8) -- ``certificate_required`` (0x174) for no certificate, ``unknown_ca`` (0x130) for a
  chain to a CA we do not trust, ``certificate_expired`` (0x12d), else ``bad_certificate`` (0x12a) -- so
  the peer sees what a TLS stack would have said, not an application code.
* A server over its per-address connection cap answers the client's first Initial with one Initial
  packet of its own holding only CONNECTION_CLOSE (CONNECTION_REFUSED, RFC 9000 section 20.1), built
  from the Initial keys every party can derive from the client's Destination Connection ID. No
  connection, TLS context or signature is made for it, so a flood from one address costs a packet each.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from typing import Final

from aioquic.quic.crypto import CryptoPair
from aioquic.quic.packet import QuicErrorCode, QuicFrameType, QuicHeader, QuicPacketType
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.tls import AlertDescription
from cryptography import x509
from cryptography.exceptions import InvalidSignature

REFUSAL_DATAGRAM_SIZE: Final = 1200  # what every path carries (RFC 9000 section 14); the close is far smaller
_CLOSE_CAPACITY: Final = 1 + 8 + 8 + 8  # frame type, error code, frame type, reason length (varints)
_MAX_REASON: Final = 200


def address_text(address: object) -> str:
    """``host:port`` (``[v6]:port``) of a UDP peer address, for log lines."""
    if isinstance(address, tuple) and len(address) >= 2:
        host = str(address[0])
        return f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"
    return str(address)


def certificate_alert(chain: Sequence[x509.Certificate], roots: Sequence[x509.Certificate],
                      now: dt.datetime | None = None) -> AlertDescription:
    """The TLS alert that names why ``chain`` (leaf first) was rejected against ``roots``."""
    if not chain:
        return AlertDescription.certificate_required
    if not any(_issued_by(cert, root) for cert in chain for root in roots):
        return AlertDescription.unknown_ca
    moment = now or dt.datetime.now(dt.UTC)
    if any(not cert.not_valid_before_utc <= moment <= cert.not_valid_after_utc for cert in chain):
        return AlertDescription.certificate_expired
    return AlertDescription.bad_certificate


def _issued_by(cert: x509.Certificate, root: x509.Certificate) -> bool:
    """Whether ``root`` signed ``cert`` (or is it): a name alone would not tell two dev CAs apart."""
    if cert == root:
        return True
    if cert.issuer != root.subject:
        return False
    try:
        cert.verify_directly_issued_by(root)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def crypto_error(alert: AlertDescription) -> int:
    """The QUIC transport error code that carries a TLS alert (RFC 9001 section 4.8)."""
    return int(QuicErrorCode.CRYPTO_ERROR) + int(alert)


def connection_refused(header: QuicHeader, reason: str) -> bytes:
    """One datagram answering the client Initial ``header`` with CONNECTION_CLOSE CONNECTION_REFUSED."""
    if header.version is None:
        raise ValueError("a long-header Initial has a version")
    crypto = CryptoPair()
    crypto.setup_initial(cid=header.destination_cid, is_client=False, version=header.version)
    builder = QuicPacketBuilder(host_cid=os.urandom(len(header.destination_cid) or 8), peer_cid=header.source_cid,
                                version=header.version, is_client=False, max_datagram_size=REFUSAL_DATAGRAM_SIZE)
    builder.start_packet(QuicPacketType.INITIAL, crypto)
    phrase = reason.encode()[:_MAX_REASON]
    buf = builder.start_frame(QuicFrameType.TRANSPORT_CLOSE, capacity=_CLOSE_CAPACITY + len(phrase))
    buf.push_uint_var(QuicErrorCode.CONNECTION_REFUSED)
    buf.push_uint_var(QuicFrameType.PADDING)  # no frame caused it
    buf.push_uint_var(len(phrase))
    buf.push_bytes(phrase)
    datagrams, _ = builder.flush()
    return datagrams[0]
