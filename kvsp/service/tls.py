"""TLS 1.3 with mutual authentication for every role (spec section 5, decision D1).

A role's identity is the URI SubjectAltName of its certificate.  Servers require client certificates
verified against the deployment CA; clients verify the server against the same CA.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from kvsp.errors import KvspError


class TlsConfigError(KvspError):
    """The TLS material of a role is missing or unusable."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path

    def check(self) -> None:
        for name, path in (("cert", self.cert), ("key", self.key), ("ca", self.ca)):
            if not path.is_file():
                raise TlsConfigError(f"tls.{name}: {path} is not a readable file")


def _base_context(purpose: int, files: TlsFiles) -> ssl.SSLContext:
    files.check()
    ctx = ssl.SSLContext(purpose)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    try:
        ctx.load_cert_chain(files.cert, files.key)
        ctx.load_verify_locations(cafile=files.ca)
    except (ssl.SSLError, OSError) as exc:
        raise TlsConfigError(f"cannot load TLS material {files}: {exc}") from exc
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """Server side: TLS 1.3 only, client certificate required and verified against the CA."""
    ctx = _base_context(ssl.PROTOCOL_TLS_SERVER, files)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """Client side: presents the role certificate, verifies server chain and host name."""
    ctx = _base_context(ssl.PROTOCOL_TLS_CLIENT, files)
    ctx.check_hostname = True
    return ctx


def check_identity(files: TlsFiles, base_uri: str, shared: str | None = None) -> None:
    """Refuse to serve as ``base_uri`` with a certificate that asserts neither it nor ``shared``.

    Peers authorize a role by the URI SAN of its certificate, while the role names itself (records,
    directives, the PC's registry) by its base URI: when the two differ, every check against the
    role fails at a distance, so the mismatch is an error at startup.  ``shared`` is the one identity
    that several processes present by design: the policy's ``pc``, which every PC replica's certificate
    asserts while each has its own base URI (D2, D7)."""
    files.check()
    try:
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    except (ValueError, OSError) as exc:
        raise TlsConfigError(f"tls.cert: {files.cert} is not a PEM certificate ({exc})") from exc
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    if base_uri not in uris and (shared is None or shared not in uris):
        raise TlsConfigError(f"server.base_uri: {base_uri} is not a URI SubjectAltName of tls.cert {files.cert} "
                             f"(it asserts {uris}); peers know this role by its certificate's URI, so the "
                             "two must be the same")


def identities_of(peercert: object) -> tuple[str, ...]:
    """URI SubjectAltNames of a peer certificate as returned by ``SSLSocket.getpeercert()``."""
    if not isinstance(peercert, dict):
        return ()
    san = peercert.get("subjectAltName", ())
    return tuple(value for kind, value in san if kind == "URI")
