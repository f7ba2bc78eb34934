"""Development PKI (decision D1): certificates usable for mutual TLS 1.3 with URI identities."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from kvsp.errors import ValidationError
from kvsp.pki import RoleSpec, make_dev_pki, uri_identities


def test_issues_ca_and_roles(tmp_path: Path) -> None:
    issued = make_dev_pki(tmp_path, [RoleSpec.parse("is=https://127.0.0.1:8443/kvsp/"),
                                     RoleSpec.parse("h1=https://localhost:9443/")])
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    for role in issued:
        cert = x509.load_pem_x509_certificate(role.cert_path.read_bytes())
        assert uri_identities(cert) == [role.uri]
        assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
        assert cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
        cert.verify_directly_issued_by(ca)
        assert stat.S_IMODE(role.key_path.stat().st_mode) == 0o600


def test_ca_is_reused(tmp_path: Path) -> None:
    make_dev_pki(tmp_path, [RoleSpec.parse("a=https://a.test/")])
    before = (tmp_path / "ca.pem").read_bytes()
    make_dev_pki(tmp_path, [RoleSpec.parse("b=https://b.test/")])
    assert (tmp_path / "ca.pem").read_bytes() == before


@pytest.mark.parametrize("remove", ["ca.key", "ca.pem"])
def test_half_a_ca_is_refused_not_replaced(tmp_path: Path, remove: str) -> None:
    make_dev_pki(tmp_path, [RoleSpec.parse("a=https://a.test/")])
    kept = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != remove}
    (tmp_path / remove).unlink()
    with pytest.raises(ValidationError, match="is missing while"):
        make_dev_pki(tmp_path, [RoleSpec.parse("b=https://b.test/")])
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == kept  # nothing written


def test_a_ca_key_that_is_not_the_certificates_is_refused(tmp_path: Path) -> None:
    make_dev_pki(tmp_path / "one", [RoleSpec.parse("a=https://a.test/")])
    make_dev_pki(tmp_path / "two", [RoleSpec.parse("a=https://a.test/")])
    (tmp_path / "one" / "ca.key").write_bytes((tmp_path / "two" / "ca.key").read_bytes())
    with pytest.raises(ValidationError, match="is not the key of"):
        make_dev_pki(tmp_path / "one", [RoleSpec.parse("b=https://b.test/")])


@pytest.mark.parametrize("text", ["noequals", "=https://x/", "a=http://x/", "a b=https://x/", "a=ftp://x"])
def test_bad_role_specs(text: str) -> None:
    with pytest.raises(ValidationError):
        RoleSpec.parse(text)


def test_duplicate_role_names(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        make_dev_pki(tmp_path, [RoleSpec.parse("a=https://a/"), RoleSpec.parse("a=https://b/")])


def test_mutual_tls13_handshake_with_issued_certs(tmp_path: Path) -> None:
    make_dev_pki(tmp_path, [RoleSpec.parse("server=https://127.0.0.1:1/"),
                            RoleSpec.parse("client=https://client.test/")],
                 now=dt.datetime.now(dt.UTC))
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    server_ctx.load_verify_locations(tmp_path / "ca.pem")
    server_ctx.load_cert_chain(tmp_path / "server.pem", tmp_path / "server.key")
    client_ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    client_ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    client_ctx.load_cert_chain(tmp_path / "client.pem", tmp_path / "client.key")

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    seen: list[object] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            seen.append(tls.getpeercert())
            seen.append(tls.version())

    thread = threading.Thread(target=serve)
    thread.start()
    with socket.create_connection(("127.0.0.1", port)) as raw, \
            client_ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        assert tls.version() == "TLSv1.3"
    thread.join(10)
    listener.close()
    peer = seen[0]
    assert isinstance(peer, dict)
    assert ("URI", "https://client.test/") in peer["subjectAltName"]
    assert seen[1] == "TLSv1.3"
