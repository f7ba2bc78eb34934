"""The front end's admission caps over real sockets: per client address and per tenant in front of
``max_concurrent`` (control/frontend/admission.py), and its public listener guarded like every other.

The front end runs in this process against `HeldStreams` (a PC and instance double whose token streams
hold until released), so completions stay in flight as long as the test wants.  Clients get distinct
loopback addresses (127.0.0.2, 127.0.0.3, ...) by binding their sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from control.deploy.frontend_double import HeldStreams, held_streams
from control.deploy.pki import DevPki
from control.deploy.ports import free_port
from control.up.layout import bytes_model_descriptor
from kvsp.service.config import ListenerLimits
from kvsp.service.metrics import metrics_of
from kvsp.service.policy import Policy
from tests.support.servers import role_config, running

pytestmark = pytest.mark.loopback

API_KEY = "sk-test-0123456789abcdef"
BODY = {"model": "kvsp-test", "prompt": "hi", "max_tokens": 4, "stream": True}
BOUND_S = 15.0


@dataclass
class FrontEnd:
    url: str
    port: int
    double: HeldStreams
    app: web.Application
    stack: contextlib.AsyncExitStack

    def refused(self, limit: str) -> float:
        return metrics_of(self.app).registry.get_sample_value("kvsp_frontend_refused_total", {"limit": limit}) or 0.0

    async def client(self, address: str) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(local_addr=(address, 0), limit=0)
        return await self.stack.enter_async_context(aiohttp.ClientSession(connector=connector))

    async def stream(self, http: aiohttp.ClientSession, key: str | None = None) -> aiohttp.ClientResponse:
        """Start a streaming completion and keep its response open (unread); its status is known."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        resp = await asyncio.wait_for(http.post(self.url + "/v1/completions", json=BODY, headers=headers), BOUND_S)
        self.stack.push_async_callback(_drain, resp)
        return resp


async def _drain(resp: aiohttp.ClientResponse) -> None:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        await asyncio.wait_for(resp.read(), BOUND_S)
    resp.release()


Start = Callable[..., Awaitable[FrontEnd]]


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Start]:
    pki = DevPki.make(tmp_path, ["pc", "fe"])
    (tmp_path / "model.json").write_text(json.dumps(bytes_model_descriptor().to_json()))
    (tmp_path / "acme.key").write_text(API_KEY)
    async with contextlib.AsyncExitStack() as stack:

        async def launch(limits: ListenerLimits | None = None, **frontend: object) -> FrontEnd:
            double = await stack.enter_async_context(held_streams(pki))
            port = free_port()
            section = {"pc": pki.uri("pc"), "listen": f"127.0.0.1:{port}", "descriptor": "model.json",
                       "tenants": {"public": "00" * 16, "acme": "5a" * 16}, "api_keys": {"acme": "acme.key"},
                       "anonymous_tenant": "public", **frontend}
            config = role_config(pki, "fe", ("frontend",), Policy(), {"frontend": section}, tmp_path)
            if limits is not None:
                config = replace(config, server=replace(config.server, limits=limits))
            app = await stack.enter_async_context(running(config))
            inner = contextlib.AsyncExitStack()
            stack.push_async_callback(inner.aclose)  # the clients close before the servers
            stack.callback(double.release.set)
            return FrontEnd(f"http://127.0.0.1:{port}", port, double, app, inner)

        yield launch


async def test_one_anonymous_client_holding_streams_leaves_room_for_another_tenant(start: Start) -> None:
    fe = await start()  # max_concurrent 64: 32 per tenant, 16 per client address (derived)
    greedy = await fe.client("127.0.0.2")
    statuses = [(await fe.stream(greedy)).status for _ in range(20)]
    assert statuses == [200] * 16 + [429] * 4 and fe.refused("client") == 4
    acme = await fe.client("127.0.0.3")
    resp = await fe.stream(acme, API_KEY)
    assert resp.status == 200 and fe.double.placed == 17
    fe.double.release.set()
    text = await asyncio.wait_for(resp.text(), BOUND_S)
    assert text.rstrip().endswith("data: [DONE]")


async def test_the_429_says_which_cap_is_full_and_when_to_retry(start: Start) -> None:
    fe = await start(max_concurrent=8, max_concurrent_per_client=1)
    http = await fe.client("127.0.0.2")
    assert (await fe.stream(http)).status == 200
    resp = await fe.stream(http)
    body = await resp.json()
    assert resp.status == 429 and resp.headers["Retry-After"] == "1"
    assert body["error"]["type"] == "rate_limit_error" and "this client address" in body["error"]["message"]


async def test_a_tenant_is_capped_across_addresses_and_other_tenants_still_get_in(start: Start) -> None:
    fe = await start(max_concurrent=8)  # 4 per tenant, 2 per address
    statuses = []
    for i in range(2, 5):  # three addresses of the anonymous tenant, two streams each
        http = await fe.client(f"127.0.0.{i}")
        statuses += [(await fe.stream(http)).status for _ in range(2)]
    assert statuses == [200] * 4 + [429] * 2 and fe.refused("tenant") == 2
    acme = await fe.client("127.0.0.9")
    assert (await fe.stream(acme, API_KEY)).status == 200


async def test_the_global_cap_stays_behind_the_others(start: Start) -> None:
    fe = await start(max_concurrent=3, max_concurrent_per_tenant=8, max_concurrent_per_client=8)
    http = await fe.client("127.0.0.2")
    statuses = [(await fe.stream(http)).status for _ in range(3)]
    acme = await fe.client("127.0.0.3")
    assert statuses == [200] * 3 and (await fe.stream(acme, API_KEY)).status == 429 and fe.refused("global") == 1
    fe.double.release.set()  # the streams end, their slots come back
    for _ in range(int(BOUND_S / 0.05)):
        if metrics_of(fe.app).registry.get_sample_value("kvsp_frontend_requests_in_flight") == 0:
            break
        await asyncio.sleep(0.05)
    assert (await fe.stream(acme, API_KEY)).status == 200


async def test_the_public_listener_has_the_server_timeouts(start: Start) -> None:
    fe = await start(ListenerLimits(header_timeout_ms=300))
    reader, writer = await asyncio.open_connection("127.0.0.1", fe.port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # ... and never the blank line
    data = await asyncio.wait_for(reader.read(), BOUND_S)
    assert data.startswith(b"HTTP/1.1 408 ")
    sample = metrics_of(fe.app).registry.get_sample_value
    assert sample("kvsp_listener_timeouts_total", {"listener": "public", "reason": "header_timeout"}) == 1
    writer.close()


async def test_the_public_listener_has_its_own_connection_cap(start: Start) -> None:
    fe = await start(max_connections_per_client=2)  # [server]'s cap (1024) is the mutual-TLS listener's
    held = [await asyncio.open_connection("127.0.0.1", fe.port) for _ in range(3)]
    assert await asyncio.wait_for(held[2][0].read(), BOUND_S) == b""  # the third is closed at once
    sample = metrics_of(fe.app).registry.get_sample_value
    assert sample("kvsp_listener_refused_total", {"listener": "public", "reason": "per_client_cap"}) == 1
    held[0][1].write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (await asyncio.wait_for(held[0][0].read(), BOUND_S)).startswith(b"HTTP/1.1 200 ")
    for _, w in held:
        w.close()
