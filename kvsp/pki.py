"""Development PKI (decision D1): a CA and one ECDSA P-256 certificate per role.

Each role certificate carries the role's base URI as a URI SubjectAltName (its KVSP identity) and
the URI's host as a DNS or IP SubjectAltName, so the same certificate serves TLS server verification
and client authentication.  Production deployments bring their own CA.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kvsp.errors import ValidationError
from kvsp.identifiers import NAMESPACE_PREFIX, check_base_uri
from moqt.auth import issue_token

CA_CERT: Final = "ca.pem"
CA_KEY: Final = "ca.key"
_ROLE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
ROLE_URI_SCHEMES: Final = frozenset({"https", "moqt"})


@dataclass(frozen=True, slots=True)
class RoleSpec:
    name: str
    uri: str

    @classmethod
    def parse(cls, text: str) -> RoleSpec:
        """``NAME=URI`` as given on the command line."""
        name, eq, uri = text.partition("=")
        if not eq or not _ROLE_NAME.fullmatch(name):
            raise ValidationError("--role", f"{text!r} must be NAME=URI with NAME of [A-Za-z0-9_.-]")
        check_base_uri(uri, f"--role {name}", ROLE_URI_SCHEMES)
        return cls(name, uri)


@dataclass(frozen=True, slots=True)
class IssuedRole:
    name: str
    uri: str
    cert_path: Path
    key_path: Path


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _write_secret(path: Path, data: bytes) -> None:
    """Readable by the owner only (a private key, a bearer token)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    _write_secret(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))


def _load_ec_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValidationError(str(path), "must be an EC private key")
    return key


def _load_or_make_ca(directory: Path, now: dt.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = _load_ec_key(key_path)
        if cert.public_key() != key.public_key():
            raise ValidationError(str(key_path), f"is not the key of {cert_path}: restore the CA's own key")
        return cert, key
    # Half a CA is never replaced: a new CA would silently stop every certificate the old one issued
    # from being trusted by the roles that still have the old ca.pem.
    if cert_path.exists() or key_path.exists():
        present, missing = (cert_path, key_path) if cert_path.exists() else (key_path, cert_path)
        raise ValidationError(str(missing), f"is missing while {present} exists: restore it to issue certificates "
                                            f"from this CA, or remove {present} to create a new CA (every "
                                            "certificate of the old one stops being trusted)")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvsp development CA")])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _host_name(uri: str) -> x509.GeneralName:
    host = urlsplit(uri).hostname or ""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def issue_role_cert(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, role: RoleSpec,
                    now: dt.datetime, days: int = 365) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(role.uri), _host_name(role.uri)]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, role.name)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def make_dev_pki(directory: Path, roles: list[RoleSpec], now: dt.datetime | None = None) -> list[IssuedRole]:
    """Create (or reuse) the CA in ``directory`` and issue ``NAME.pem``/``NAME.key`` per role."""
    names = [r.name for r in roles]
    if len(set(names)) != len(names) or CA_CERT.removesuffix(".pem") in names:
        raise ValidationError("--role", "role names must be distinct and not 'ca'")
    now = now or _now()
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _load_or_make_ca(directory, now)
    issued = []
    for role in roles:
        cert, key = issue_role_cert(ca_cert, ca_key, role, now)
        cert_path, key_path = directory / f"{role.name}.pem", directory / f"{role.name}.key"
        _write_key(key_path, key)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.append(IssuedRole(role.name, role.uri, cert_path, key_path))
    return issued


def uri_identities(cert: x509.Certificate) -> list[str]:
    """The URI SubjectAltNames of a certificate: the KVSP identities it asserts."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


MOQT_ISSUER_KEY: Final = "moqt-issuer.key"
MOQT_ISSUER_PUB: Final = "moqt-issuer.pub.pem"
MOQT_TOKEN_SUFFIX: Final = ".moqt-token"


def _load_or_make_issuer(directory: Path) -> ec.EllipticCurvePrivateKey:
    """The issuer's key (made if absent); its public half is written from it each time, never kept apart."""
    path = directory / MOQT_ISSUER_KEY
    if path.exists():
        key = _load_ec_key(path)
    else:
        key = ec.generate_private_key(ec.SECP256R1())
        _write_key(path, key)
    (directory / MOQT_ISSUER_PUB).write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return key


def make_dev_moqt_tokens(directory: Path, roles: list[RoleSpec], now: dt.datetime | None = None,
                         days: int = 30) -> list[Path]:
    """Issue ``NAME.moqt-token`` per role: a D3 AUTHORIZATION_TOKEN for the role's identity covering every
    KVSP namespace (what the role may do is still its identity's policy), signed by ``moqt-issuer.key``
    (made, with ``moqt-issuer.pub.pem`` for the listeners' token keys, if absent). A role presents it
    where it has no certificate to present: MOQT over picoquic (docs/moqt.md "QUIC back-ends")."""
    now = now or _now()
    directory.mkdir(parents=True, exist_ok=True)
    issuer = _load_or_make_issuer(directory)
    stamp = int(now.timestamp())
    written = []
    for role in roles:
        token = issue_token(issuer, role.uri, namespaces=[(NAMESPACE_PREFIX,)], expires_at=stamp + days * 86400,
                            now=stamp)
        path = directory / f"{role.name}{MOQT_TOKEN_SUFFIX}"
        _write_secret(path, token)  # a bearer secret, like a key
        written.append(path)
    return written
