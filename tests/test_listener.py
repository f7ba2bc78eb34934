"""The guarded mutual-TLS listener (control/listener/site.py) over real sockets on loopback.

A role server (the IS, plus two routes of the test's own: one that reads a body, one that floods an
answer) runs with short limits; raw clients trickle headers and bodies, hold connections idle, stop
reading, open more connections than one address may, stall in the TLS handshake, and offer TLS 1.2,
no certificate or a foreign CA's.  Each case asserts what the client sees (a 408, an EOF, a TLS alert)
and the metric that counts it; every wait is bounded far above the limits (a loaded machine is slow,
never wrong).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from aiohttp import web

from control.deploy.pki import DevPki
from control.http import defer_continue, read_limited
from control.serve import build_app
from kvsp.service.config import ListenerLimits
from kvsp.service.metrics import metrics_of
from kvsp.service.policy import Policy
from kvsp.service.tls import client_context
from tests.support.servers import role_config, running

pytestmark = pytest.mark.loopback

SHORT = ListenerLimits(handshake_timeout_ms=400, header_timeout_ms=400, body_timeout_ms=400,
                       body_min_octets_per_s=1000, idle_timeout_ms=400, send_timeout_ms=400,
                       max_connections_per_client=64)
LONG = ListenerLimits(max_connections_per_client=4)  # the defaults: nothing expires during a test
BOUND_S = 15.0  # the longest any wait here may take


@dataclass
class Served:
    pki: DevPki
    other: DevPki  # another CA, with a client certificate of its own
    port: int
    app: web.Application

    def client_ssl(self, name: str = "cli") -> ssl.SSLContext:
        return client_context(self.pki.files(name))

    def sample(self, metric: str, **labels: str) -> float:
        value = metrics_of(self.app).registry.get_sample_value(metric, {"listener": "mtls", **labels})
        return value or 0.0

    async def open(self, *, local: str | None = None, ssl_context: ssl.SSLContext | None = None,
                   tls: bool = True) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        ctx = (ssl_context or self.client_ssl()) if tls else None
        return await asyncio.wait_for(asyncio.open_connection(
            "127.0.0.1", self.port, ssl=ctx, server_hostname="127.0.0.1" if ctx else None,
            local_addr=(local, 0) if local else None), BOUND_S)


async def echo(request: web.Request) -> web.Response:
    return web.json_response({"octets": len(await request.read())})


async def late_invite(request: web.Request) -> web.Response:
    await asyncio.sleep(1.0)  # longer than the body timeout: authorizing, checking preconditions ...
    return web.json_response({"octets": len(await read_limited(request, 1 << 20))})  # ... then the 100


async def flood(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    await resp.prepare(request)
    chunk = b"x" * (1 << 20)
    with contextlib.suppress(ConnectionError):
        for _ in range(1024):  # at most 1 GiB: the client stops reading long before
            await resp.write(chunk)
    return resp


Serve = Callable[[ListenerLimits], Awaitable[Served]]


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Serve]:
    """Start the server with the given limits (once per test)."""
    pki = DevPki.make(tmp_path, ["srv", "cli"])
    other = DevPki.make(tmp_path / "other", ["cli"])
    stack = contextlib.AsyncExitStack()

    async def start(limits: ListenerLimits) -> Served:
        config = role_config(pki, "srv", ("is",), Policy())
        config = replace(config, server=replace(config.server, limits=limits))
        app = build_app(config)
        app.router.add_post("/srv/echo", echo)
        app.router.add_get("/srv/flood", flood)
        app.router.add_post("/srv/late", late_invite, expect_handler=defer_continue)
        await stack.enter_async_context(running(config, app=app))
        return Served(pki, other, pki.port("srv"), app)

    async with stack:
        yield start


async def until_closed(reader: asyncio.StreamReader) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    start, data = time.monotonic(), b""
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        while chunk := await asyncio.wait_for(reader.read(65536), BOUND_S):
            data += chunk
    return data, time.monotonic() - start


async def trickle(writer: asyncio.StreamWriter, every_s: float, octets: int = 1) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        for _ in range(int(BOUND_S / every_s)):
            writer.write(b"x" * octets)
            await writer.drain()
            await asyncio.sleep(every_s)


async def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


# -- timeouts -------------------------------------------------------------------------------------------
async def test_trickled_headers_get_408_and_the_connection_closes(serve: Serve) -> None:
    s = await serve(SHORT)
    reader, writer = await s.open()
    writer.write(b"GET /srv/health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    task = asyncio.create_task(trickle(writer, 0.05))
    data, elapsed = await until_closed(reader)
    task.cancel()
    assert data.startswith(b"HTTP/1.1 408 "), data[:80]
    assert elapsed < BOUND_S and s.sample("kvsp_listener_timeouts_total", reason="header_timeout") == 1


async def test_a_connection_that_sends_nothing_is_closed_without_an_answer(serve: Serve) -> None:
    s = await serve(SHORT)
    reader, _ = await s.open()
    data, _ = await until_closed(reader)
    assert data == b"" and s.sample("kvsp_listener_timeouts_total", reason="header_timeout") == 1


async def test_a_trickled_body_gets_408_and_the_connection_closes(serve: Serve) -> None:
    s = await serve(SHORT)
    reader, writer = await s.open()
    writer.write(b"POST /srv/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100000\r\n\r\n")
    task = asyncio.create_task(trickle(writer, 0.02))  # 50 octets a second against a minimum of 1000
    data, _ = await until_closed(reader)
    task.cancel()
    assert data.startswith(b"HTTP/1.1 408 "), data[:80]
    assert s.sample("kvsp_listener_timeouts_total", reason="body_timeout") == 1


async def test_a_body_that_keeps_the_minimum_rate_gets_through_past_the_body_timeout(serve: Serve) -> None:
    s = await serve(replace(SHORT, body_timeout_ms=1000, header_timeout_ms=5000))
    reader, writer = await s.open()
    chunks, size = 40, 250  # 10000 octets in about 2 s: 5000 a second, twice the body timeout in all
    writer.write(b"POST /srv/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (chunks * size))
    for _ in range(chunks):
        writer.write(b"x" * size)
        await writer.drain()
        await asyncio.sleep(0.05)
    data, _ = await until_closed(reader)
    assert data.startswith(b"HTTP/1.1 200 ") and b'"octets":10000' in data.replace(b" ", b""), data[-200:]
    assert s.sample("kvsp_listener_timeouts_total", reason="body_timeout") == 0


async def test_a_body_not_yet_invited_by_100_continue_is_not_the_clients_time(serve: Serve) -> None:
    s = await serve(SHORT)
    reader, writer = await s.open()
    writer.write(b"POST /srv/late HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n")
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND_S)
    assert interim.startswith(b"HTTP/1.1 100 "), interim
    writer.write(b"hello")
    data, _ = await until_closed(reader)
    assert data.startswith(b"HTTP/1.1 200 ") and s.sample("kvsp_listener_timeouts_total", reason="body_timeout") == 0


async def test_a_kept_alive_connection_without_a_next_request_is_closed_after_the_idle_timeout(serve: Serve) -> None:
    s = await serve(SHORT)
    reader, writer = await s.open()
    writer.write(b"GET /srv/health HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND_S)
    fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:] if line)
    length = int(fields[b"content-length"])
    await asyncio.wait_for(reader.readexactly(length), BOUND_S)
    data, _ = await until_closed(reader)
    assert head.startswith(b"HTTP/1.1 200 ") and data == b""
    assert s.sample("kvsp_listener_timeouts_total", reason="idle_timeout") == 1


async def test_a_client_that_stops_reading_the_answer_is_closed_after_the_send_timeout(serve: Serve) -> None:
    s = await serve(replace(SHORT, idle_timeout_ms=60_000))
    reader, writer = await s.open()
    writer.write(b"GET /srv/flood HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND_S)  # ... and not one octet more
    await wait_for(lambda: s.sample("kvsp_listener_timeouts_total", reason="send_timeout") == 1, "the send timeout")
    writer.close()


async def test_a_tls_handshake_that_never_finishes_is_closed(serve: Serve) -> None:
    s = await serve(SHORT)
    reader, writer = await s.open(tls=False)
    writer.write(b"\x16\x03\x01\x02\x00\x01")  # the start of a ClientHello, and then nothing
    data, _ = await until_closed(reader)
    assert data == b"" and s.sample("kvsp_listener_timeouts_total", reason="handshake_timeout") == 1
    await wait_for(lambda: s.sample("kvsp_listener_connections") == 0, "the slot to be free")


# -- the per-client cap ---------------------------------------------------------------------------------
async def test_connections_over_the_per_client_cap_are_closed_at_once_and_other_addresses_get_in(
        serve: Serve) -> None:
    s = await serve(LONG)
    held = [await s.open() for _ in range(4)]
    with pytest.raises((ConnectionError, ssl.SSLError, asyncio.IncompleteReadError)):
        reader, _ = await s.open()  # the handshake meets a closed socket ...
        await asyncio.wait_for(reader.readexactly(1), BOUND_S)  # ... or, at the latest, the first read
    assert s.sample("kvsp_listener_refused_total", reason="per_client_cap") == 1
    reader, writer = await s.open(local="127.0.0.2")  # another address is not affected
    writer.write(b"GET /srv/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data, _ = await until_closed(reader)
    assert data.startswith(b"HTTP/1.1 200 ")
    held[0][1].close()
    await wait_for(lambda: s.sample("kvsp_listener_connections") == 4, "the closed connection's slot to be free")
    reader, writer = await s.open()
    writer.write(b"GET /srv/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data, _ = await until_closed(reader)
    assert data.startswith(b"HTTP/1.1 200 ")
    for _, w in held[1:]:
        w.close()


# -- TLS refusals -----------------------------------------------------------------------------------
def _tls12(s: Served) -> ssl.SSLContext:
    ctx = s.client_ssl()
    ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def _no_certificate(s: Served) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(s.pki.dir / "ca.pem"))


def _foreign_ca(s: Served) -> ssl.SSLContext:
    ctx = _no_certificate(s)
    files = s.other.files("cli")
    ctx.load_cert_chain(files.cert, files.key)
    return ctx


@pytest.mark.parametrize(("client", "alert", "label", "words"), [
    (_tls12, "PROTOCOL_VERSION", "protocol_version", "no TLS version in common"),
    (_no_certificate, "CERTIFICATE_REQUIRED", "no_certificate", "no client certificate"),
    (_foreign_ca, "UNKNOWN_CA", "certificate_rejected", "unable to get local issuer certificate"),
], ids=["tls1.2", "no-certificate", "foreign-ca"])
async def test_a_refused_tls_client_gets_the_alert_and_the_refusal_is_logged_with_its_address(
        serve: Serve, caplog: pytest.LogCaptureFixture, client: Callable[[Served], ssl.SSLContext], alert: str,
        label: str, words: str) -> None:
    s = await serve(LONG)
    caplog.set_level(logging.INFO, logger="kvsp.listener")
    with pytest.raises(ssl.SSLError) as err:
        reader, writer = await s.open(ssl_context=client(s))
        writer.write(b"GET /srv/health HTTP/1.1\r\nHost: x\r\n\r\n")  # TLS 1.3: the refusal comes after Finished
        await asyncio.wait_for(reader.read(1), BOUND_S)
    assert alert in str(err.value)
    assert s.sample("kvsp_listener_tls_refusals_total", reason=label) == 1
    lines = [r for r in caplog.records if r.name == "kvsp.listener" and r.levelno == logging.INFO]
    assert len(lines) == 1 and words in lines[0].getMessage() and "127.0.0.1:" in lines[0].getMessage()
    await wait_for(lambda: s.sample("kvsp_listener_connections") == 0, "the refused connection to be gone")


async def test_plain_http_on_the_tls_port_is_answered_in_plain_http(serve: Serve) -> None:
    s = await serve(LONG)
    reader, writer = await s.open(tls=False)
    writer.write(b"GET /srv/health HTTP/1.1\r\nHost: x\r\n\r\n")
    data, _ = await until_closed(reader)
    assert data.startswith(b"HTTP/1.1 400 ") and b"HTTPS" in data
    assert s.sample("kvsp_listener_tls_refusals_total", reason="not_tls") == 1
