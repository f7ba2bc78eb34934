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
the adapter (moqt/quic/connection.py) closes a failing connection with MOQT ``UNAUTHORIZED`` (0x2).

The module also holds :class:`PeerAuthentication`, the identity surface a connection exposes
(certificate or AUTHORIZATION_TOKEN). It needs no aioquic: reading the peer's chain out of aioquic's
TLS state is moqt/quic/aioquic_hooks.py's job.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, TypeAlias

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


AuthMethod: TypeAlias = Literal["certificate", "token", "server-name"]
"""``server-name``: a server we dialled whose certificate was checked by the QUIC stack for its chain and
the host name only (picoquic clients, docs/moqt-picoquic.md); ``peer_identity`` is then the ``moqt://``
URI dialled, never a certificate identity, so a policy naming identities grants it nothing."""


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
        :class:`~moqt.auth.AuthError`: close or reject the setup with its ``error``.
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
