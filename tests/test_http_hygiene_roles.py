"""HTTP hygiene of the mutual-TLS roles, in the one place that answers for all of them (`control.http`):
integers in queries, ``Allow`` on 405, 403 for a certificate without a role identity, and
``Expect: 100-continue`` answered only after the request is authorized (RFC 9110 sections 10.1.1,
15.5.2, 15.5.6).  A holder and an Index Service on loopback; the 100-continue exchange over a raw
TLS socket, since aiohttp's client hides interim responses."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from yarl import URL

from control.deploy.pki import DevPki
from control.deploy.ports import free_port
from control.http import INSECURE_IDENTITY_HEADER, make_app
from kvsp.pki import CA_CERT, CA_KEY
from kvsp.problems import PROBLEM_MEDIA_TYPE
from kvsp.service.config import RoleConfig
from kvsp.service.tls import TlsFiles, client_context
from tests.support.holder import block_id, container, restricted_policy, write_descriptor
from tests.support.servers import FakeClock, role_config, running
from tests.test_holder_http import PUT_HEADERS, D, config

# Integers int() mishandles: a superscript (isdigit, then ValueError), fullwidth and Arabic-Indic digits
# (accepted by int()), signs, whitespace, separators, and more digits than int() converts.
BAD_INTEGERS = ["%C2%B2", "%EF%BC%91", "%D9%A3", "%2B1", "-1", "%201", "1%20", "1_0", "0x1", "", "9" * 5000]


def short_id(value: str) -> str:
    return value if len(value) < 20 else f"{len(value)}-digits"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    pki = DevPki.make(tmp_path_factory.mktemp("pki"), ["holder", "client", "other", "is"])
    _issue_without_uri_san(pki.dir, "nameless")
    return pki


def _issue_without_uri_san(directory: Path, name: str) -> None:
    """A certificate of the deployment CA, valid for client auth, with an IP SAN but no URI SAN."""
    ca = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
    ca_key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (directory / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / f"{name}.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def _ssl(pki: DevPki, name: str) -> ssl.SSLContext:
    return client_context(TlsFiles(pki.dir / f"{name}.pem", pki.dir / f"{name}.key", pki.dir / CA_CERT))


def is_config(pki: DevPki, tmp: Path) -> RoleConfig:
    section: dict[str, object] = {"descriptors": [str(write_descriptor(D, tmp / "is-d.json"))]}
    return role_config(pki, "is", ("is",), restricted_policy(pki), {"is": section}, tmp)


@dataclass
class Roles:
    pki: DevPki
    holder: str
    index: str

    def block_url(self, n: int, query: str = "") -> str:
        b = block_id(D, n)
        return f"{self.holder}blocks/{b.compat_id.hex()}/{b.scope_id.hex()}/{b.block_key.hex()}{query}"

    async def request(self, who: str, method: str, url: str, body: bytes | None = None,
                      headers: dict[str, str] | None = None) -> tuple[int, aiohttp.typedefs.LooseHeaders, bytes]:
        connector = aiohttp.TCPConnector(ssl=_ssl(self.pki, who))
        async with aiohttp.ClientSession(connector=connector) as http, \
                http.request(method, URL(url, encoded=True), data=body, headers=headers) as resp:
            return resp.status, resp.headers, await resp.read()


@pytest.fixture
async def roles(pki: DevPki, tmp_path: Path) -> AsyncIterator[Roles]:
    async with running(config(pki, tmp_path), clock=FakeClock()), running(is_config(pki, tmp_path)):
        yield Roles(pki, pki.uri("holder"), pki.uri("is"))


def problem(status: int, headers: aiohttp.typedefs.LooseHeaders, body: bytes) -> dict[str, object]:
    assert headers["Content-Type"] == PROBLEM_MEDIA_TYPE, (status, body)  # type: ignore[index]
    doc = json.loads(body)
    assert isinstance(doc, dict) and doc["status"] == status
    return doc


# -- integers (query) ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", BAD_INTEGERS, ids=short_id)
async def test_a_codec_that_is_not_an_ascii_decimal_is_400_for_get_and_head(roles: Roles, value: str) -> None:
    assert (await roles.request("client", "PUT", roles.block_url(1), container(D, 1), PUT_HEADERS))[0] == 201
    for method in ("GET", "HEAD"):
        status, headers, body = await roles.request("client", method, roles.block_url(1, f"?codec={value}"))
        assert status == 400, (method, value, status)
        if method == "GET":
            assert "codec" in str(problem(status, headers, body)["detail"])
    assert (await roles.request("client", "GET", roles.block_url(1, "?codec=00001")))[0] == 200


# -- 405 Allow (RFC 9110 section 15.5.6) -----------------------------------------------------------------------
async def test_every_405_names_the_allowed_methods(roles: Roles) -> None:
    block = {"GET", "HEAD", "PUT"}
    cases = [("DELETE", roles.block_url(1), block), ("POST", roles.block_url(1), block),
             ("GET", roles.holder + "leases", {"POST"}), ("GET", roles.index + "lookup", {"POST"})]
    for method, url, allowed in cases:
        status, headers, body = await roles.request("client", method, url)
        assert status == 405, (method, url)
        problem(status, headers, body)
        assert {m.strip() for m in headers["Allow"].split(",")} == allowed, (method, url)  # type: ignore[index]
        assert headers["Cache-Control"] == "no-store"  # type: ignore[index]


# -- identity (RFC 9110 section 15.5.2) -------------------------------------------------------------------------
async def test_a_ca_certificate_without_a_uri_san_is_forbidden_not_unauthenticated(roles: Roles) -> None:
    for url in (roles.block_url(1), roles.index + "health", roles.index + "lookup"):
        status, headers, body = await roles.request("nameless", "GET", url)
        assert status == 403, (url, status)
        assert "WWW-Authenticate" not in headers
        assert "URI SubjectAltName" in str(problem(status, headers, body)["detail"])


# -- Expect: 100-continue (RFC 9110 section 10.1.1) ---------------------------------------------------------------
@dataclass
class Head:
    status: int
    fields: dict[str, str]


async def _read_head(reader: asyncio.StreamReader) -> Head:
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    line, *rest = raw.decode("latin-1").split("\r\n")
    fields = {}
    for item in rest:
        if item:
            name, _, value = item.partition(":")
            fields[name.strip().lower()] = value.strip()
    return Head(int(line.split()[1]), fields)


async def _expect_put(roles: Roles, who: str, n: int, body: bytes, *,
                      extra: dict[str, str] | None = None) -> tuple[Head, Head | None]:
    """PUT block ``n`` with Expect: 100-continue, sending the body only when invited.  The first
    head the server sends, and the final one when the first was 100."""
    url = urlsplit(roles.block_url(n))
    reader, writer = await asyncio.open_connection(url.hostname, url.port, ssl=_ssl(roles.pki, who),
                                                   server_hostname=url.hostname)
    try:
        fields = {"Host": url.netloc, "Content-Length": str(len(body)), "Expect": "100-continue"}
        fields |= PUT_HEADERS | (extra or {})
        writer.write(f"PUT {url.path} HTTP/1.1\r\n".encode() + b"".join(
            f"{k}: {v}\r\n".encode() for k, v in fields.items()) + b"\r\n")
        await writer.drain()
        first = await _read_head(reader)
        if first.status != 100:
            return first, None
        writer.write(body)
        await writer.drain()
        return first, await _read_head(reader)
    finally:
        writer.close()


async def test_an_authorized_put_is_invited_with_100_continue(roles: Roles) -> None:
    first, final = await _expect_put(roles, "client", 3, container(D, 3))
    assert first.status == 100 and final is not None and final.status == 201


async def test_a_refused_put_gets_its_final_status_without_100_continue(roles: Roles) -> None:
    assert (await roles.request("client", "PUT", roles.block_url(4), container(D, 4), PUT_HEADERS))[0] == 201
    cases = [
        ("other", 5, {}, 403),  # may not store in the scope
        ("nameless", 5, {}, 403),  # no role identity
        ("client", 4, {}, 412),  # the key is held
        ("client", 5, {"If-None-Match": "\"x\""}, 428),  # the precondition is missing
        ("client", 5, {"Content-Type": "text/plain"}, 415),
    ]
    for who, n, extra, expected in cases:
        first, _ = await _expect_put(roles, who, n, container(D, n), extra=extra)
        assert first.status == expected, (who, n, extra, first.status)
        assert first.fields.get("connection", "").lower() == "close"  # the body is not wanted after all
        assert first.fields.get("content-type") == PROBLEM_MEDIA_TYPE


async def test_a_put_over_the_body_limit_is_refused_before_it_is_invited(roles: Roles) -> None:
    limit = restricted_policy(roles.pki).quotas.block_body_limit_octets
    first, _ = await _expect_put(roles, "client", 6, b"", extra={"Content-Length": str(limit + 1)})
    assert first.status == 413


async def test_an_unknown_expectation_is_417_problem_details(roles: Roles) -> None:
    first, _ = await _expect_put(roles, "client", 7, container(D, 7), extra={"Expect": "something-else"})
    assert first.status == 417 and first.fields.get("content-type") == PROBLEM_MEDIA_TYPE


# -- an error after the status line -------------------------------------------------------------------------------
async def test_an_error_after_the_first_byte_cuts_the_stream_instead_of_writing_a_second_answer() -> None:
    async def fails_midway(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"first line\n")
        raise ValueError("a bug found after the answer began")

    app = make_app(json_limit=1024, allow_insecure=True)
    app.router.add_get("/stream", fails_midway)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET /stream HTTP/1.1\r\nHost: 127.0.0.1\r\n{INSECURE_IDENTITY_HEADER}: https://t/\r\n\r\n"
                     .encode())
        data = b""
        with contextlib.suppress(TimeoutError):  # to the connection's end, or what came in 2 s
            async with asyncio.timeout(2):
                while chunk := await reader.read(65536):
                    data += chunk
        writer.close()
    finally:
        await runner.cleanup()
    assert data.startswith(b"HTTP/1.1 200 ") and b"first line" in data
    assert data.count(b"HTTP/1.1") == 1  # no Problem Details answer written into the body
    assert not data.endswith(b"0\r\n\r\n")  # and no last chunk: the client sees a cut stream
