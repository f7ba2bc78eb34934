"""The front end role over real sockets: its public completions API, and its mutual-TLS side against a
PC and instance double that scripts a failover (spec section 6.8).

The double answers ``POST requests`` with instance ii1 at epoch 1; ii1 streams five tokens and then its
stream breaks without an end line; the PC then names ii2 at epoch 2, whose stream repeats an index
already delivered and carries a stray lower-epoch line with a different token before going on.  The
client must see each index once, with the tokens of the uninterrupted run.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from control.deploy.pki import DevPki
from control.deploy.ports import free_port
from control.up.layout import bytes_model_descriptor
from kvsp.records.generation import GenerateRequest
from kvsp.service.policy import Policy
from kvsp.service.tls import server_context
from tests.support.servers import role_config, running

REFERENCE = [72, 101, 108, 108, 111, 0xE2, 0x82, 0xAC, 33, 10]  # "Hello€!\n" as bytes tokens
BREAK_AFTER = 5
SCOPE = "5a" * 16
API_KEY = "sk-test-0123456789abcdef"


@dataclass
class Double:
    """The PC and two instances in one mTLS server, with the failover scripted."""

    base: str
    requests: list[GenerateRequest] = field(default_factory=list)
    broken: set[str] = field(default_factory=set)
    refuse: bool = False
    strand: bool = False  # after the break the PC cannot place the session (no checkpoint with output)
    sessions: list[str] = field(default_factory=list)
    hold: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.hold.set()

    def info(self, session: str) -> dict[str, object]:
        if self.strand and session in self.broken:
            return {"session": session, "instance": None, "epoch": 2, "output_offset": 0, "state": "stranded"}
        if self.strand and session != self.sessions[0]:  # a resubmission: placed on ii2
            return {"session": session, "instance": self.base + "ii2/", "epoch": 1, "output_offset": 0,
                    "state": "running"}
        moved = session in self.broken
        return {"session": session, "instance": self.base + ("ii2/" if moved else "ii1/"), "epoch": 2 if moved else 1,
                "output_offset": 0, "state": "running"}

    async def post_requests(self, request: web.Request) -> web.Response:
        if self.refuse:
            return web.json_response({"type": "about:blank", "status": 503, "title": "No placement"}, status=503,
                                     content_type="application/problem+json")
        self.requests.append(GenerateRequest.from_bytes(await request.read()))
        self.sessions.append(str(uuid.uuid4()))
        return web.json_response(self.info(self.sessions[-1]), content_type="application/kvsp+json")

    async def get_session(self, request: web.Request) -> web.Response:
        return web.json_response(self.info(request.match_info["s"]), content_type="application/kvsp+json")

    async def tokens(self, request: web.Request) -> web.StreamResponse:
        session, start = request.match_info["s"], int(request.query["from"])
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)

        def line(index: int, epoch: int, token: int) -> bytes:
            return json.dumps({"index": index, "epoch": epoch, "token": token}).encode() + b"\n"

        if request.match_info["ii"] == "ii1":
            await self.hold.wait()
            for i in range(start, BREAK_AFTER):
                await resp.write(line(i, 1, REFERENCE[i]))
            self.broken.add(session)  # ... and the stream ends without an end line: the owner died
            return resp
        if start > 0:
            await resp.write(line(start - 1, 2, REFERENCE[start - 1]))  # a repeated index
        await resp.write(line(start + 1, 1, 999 % 256))  # a stale epoch-1 line with another token
        for i in range(start, len(REFERENCE)):
            await resp.write(line(i, 2, REFERENCE[i]))
        await resp.write(b'{"end": true, "reason": "max_tokens", "epoch": 2}\n')
        return resp

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/pc/requests", self.post_requests)
        app.router.add_get("/pc/sessions/{s}", self.get_session)
        app.router.add_get("/{ii}/sessions/{s}/tokens", self.tokens)
        return app


@dataclass
class Setup:
    url: str
    double: Double
    pki: DevPki
    http: aiohttp.ClientSession


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    pki = DevPki.make(tmp_path, ["pc", "fe", "scraper"])
    (tmp_path / "model.json").write_text(json.dumps(bytes_model_descriptor().to_json()))
    (tmp_path / "acme.key").write_text(API_KEY)
    port = free_port()
    base = pki.uri("pc").removesuffix("pc/")
    double = Double(base)
    runner = web.AppRunner(double.app())
    await runner.setup()
    pc_port = int(pki.uri("pc").split(":")[2].split("/")[0])
    await web.TCPSite(runner, "127.0.0.1", pc_port, ssl_context=server_context(pki.files("pc"))).start()
    section = {"pc": pki.uri("pc"), "listen": f"127.0.0.1:{port}", "descriptor": "model.json",
               "tenants": {"public": "00" * 16, "acme": SCOPE}, "api_keys": {"acme": "acme.key"},
               "anonymous_tenant": "public", "max_prompt_tokens": 256, "max_tokens_limit": 64, "stall_ms": 300,
               "body_limit_octets": 4096, "max_concurrent": 1,
               "stranded_retry_ms": 300}
    config = role_config(pki, "fe", ("frontend",), Policy(), {"frontend": section}, tmp_path)
    try:
        async with running(config), aiohttp.ClientSession() as http:
            yield Setup(f"http://127.0.0.1:{port}", double, pki, http)
    finally:
        await runner.cleanup()


async def complete(s: Setup, body: dict[str, object], headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with s.http.post(s.url + "/v1/completions", json=body, headers=headers) as resp:
        return resp.status, await resp.read()


async def test_a_stream_follows_the_failover_without_repeated_or_altered_tokens(setup: Setup) -> None:
    status, raw = await complete(setup, {"model": "kvsp-test", "prompt": "Hi there", "max_tokens": 10,
                                         "temperature": 0, "stream": True})
    assert status == 200
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    tokens, final = chunks[:-1], chunks[-1]
    assert [c["kvsp"]["index"] for c in tokens] == list(range(10))
    assert [c["kvsp"]["token"] for c in tokens] == REFERENCE
    assert [c["kvsp"]["epoch"] for c in tokens] == [1] * BREAK_AFTER + [2] * 5
    assert tokens[0]["kvsp"]["instance"].endswith("/ii1/") and tokens[BREAK_AFTER]["kvsp"]["instance"].endswith("/ii2/")
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello€!\n"
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["kvsp"]["moves"] == 1 and len(final["kvsp"]["resume_ms"]) == 1
    assert final["kvsp"]["discarded"] >= 2  # the repeated index and the stale epoch
    request = setup.double.requests[0]
    assert request.prompt == tuple(b"Hi there") and request.sampler.method == "greedy"
    assert request.scope_id == bytes(16) and request.max_tokens == 10  # the anonymous tenant's scope


async def test_a_non_streamed_completion_has_the_same_tokens_and_usage(setup: Setup) -> None:
    status, raw = await complete(setup, {"model": "kvsp-test", "prompt": [1, 2, 3], "max_tokens": 10},
                                 {"Authorization": f"Bearer {API_KEY}"})
    assert status == 200
    doc = json.loads(raw)
    assert doc["choices"][0]["text"] == "Hello€!\n"
    assert doc["kvsp"]["tokens"] == REFERENCE
    assert doc["usage"] == {"prompt_tokens": 3, "completion_tokens": 10, "total_tokens": 13}
    request = setup.double.requests[0]
    assert request.scope_id.hex() == SCOPE and request.sampler.method == "top-p"  # the key's tenant


@pytest.mark.parametrize(("body", "headers", "status"), [
    (b"{broken", {"Content-Type": "application/json"}, 400),
    (json.dumps({"model": "other", "prompt": "x"}).encode(), {"Content-Type": "application/json"}, 404),
    (json.dumps({"model": "kvsp-test", "prompt": "x" * 257}).encode(), {"Content-Type": "application/json"}, 413),
    (json.dumps({"model": "kvsp-test", "prompt": "x" * 5000}).encode(), {"Content-Type": "application/json"}, 413),
    (json.dumps({"model": "kvsp-test", "prompt": "x", "max_tokens": 65}).encode(),
     {"Content-Type": "application/json"}, 400),
    (b"model=kvsp-test", {"Content-Type": "application/x-www-form-urlencoded"}, 415),
    (json.dumps({"model": "kvsp-test", "prompt": "x"}).encode(),
     {"Content-Type": "application/json", "Authorization": "Bearer sk-wrong-key-000000000"}, 401),
])
async def test_bad_input_gets_a_clear_4xx_and_the_front_end_keeps_serving(
        setup: Setup, body: bytes, headers: dict[str, str], status: int) -> None:
    async with setup.http.post(setup.url + "/v1/completions", data=body, headers=headers) as resp:
        assert resp.status == status
        assert resp.content_type == "application/problem+json"
        doc = await resp.json(content_type=None)
    assert doc["status"] == status and doc["detail"] and doc["error"]["message"]
    assert "sk-wrong" not in json.dumps(doc)
    assert setup.double.requests == []  # nothing reached the PC
    ok, raw = await complete(setup, {"model": "kvsp-test", "prompt": "x", "max_tokens": 10, "temperature": 0})
    assert ok == 200 and json.loads(raw)["kvsp"]["tokens"] == REFERENCE


async def test_unknown_routes_and_methods_are_problem_details(setup: Setup) -> None:
    for method, path, status in (("GET", "/v1/completions", 405), ("GET", "/v2/nothing", 404)):
        async with setup.http.request(method, setup.url + path) as resp:
            assert resp.status == status and resp.content_type == "application/problem+json"


async def test_a_refusal_by_the_pc_is_a_503_before_any_event(setup: Setup) -> None:
    setup.double.refuse = True
    status, raw = await complete(setup, {"model": "kvsp-test", "prompt": "x", "stream": True})
    assert status == 503
    assert json.loads(raw)["error"]["type"] == "server_error"


async def test_health_models_and_metrics(setup: Setup) -> None:
    await complete(setup, {"model": "kvsp-test", "prompt": "x", "max_tokens": 10, "temperature": 0})
    async with setup.http.get(setup.url + "/health") as resp:
        assert resp.status == 200 and (await resp.json())["status"] == "ok"
    async with setup.http.get(setup.url + "/v1/models") as resp:
        assert [m["id"] for m in (await resp.json())["data"]] == ["kvsp-test"]
    ctx: ssl.SSLContext = setup.pki.client_ssl("scraper")
    fe = setup.pki.uri("fe")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as mtls:
        async with mtls.get(fe + "health") as resp:
            body = await resp.json(content_type=None)
            assert resp.status == 200 and body["roles"] == ["frontend"] and body["frontend"] == {"in_flight": 0}
        async with mtls.get(fe + "metrics") as resp:
            text = await resp.text()
    assert 'kvsp_frontend_requests_total{status="200"} 1.0' in text
    assert "kvsp_frontend_tokens_total 10.0" in text
    assert "kvsp_frontend_session_moves_total 1.0" in text


async def test_a_request_past_max_concurrent_gets_429_and_the_first_still_completes(setup: Setup) -> None:
    setup.double.hold.clear()  # ii1 holds its stream: the first request stays in flight
    first = asyncio.create_task(complete(setup, {"model": "kvsp-test", "prompt": "x", "max_tokens": 10,
                                                 "temperature": 0}))
    for _ in range(100):
        async with setup.http.get(setup.url + "/health") as resp:
            if (await resp.json())["in_flight"] == 1:
                break
        await asyncio.sleep(0.02)
    status, raw = await complete(setup, {"model": "kvsp-test", "prompt": "y"})
    assert status == 429 and json.loads(raw)["error"]["type"] == "rate_limit_error"
    setup.double.hold.set()
    status, raw = await first
    assert status == 200 and json.loads(raw)["kvsp"]["tokens"] == REFERENCE


async def test_a_client_that_leaves_mid_stream_is_counted_and_nothing_breaks(setup: Setup) -> None:
    setup.double.hold.clear()
    body = {"model": "kvsp-test", "prompt": "x", "max_tokens": 10, "temperature": 0, "stream": True}
    async with setup.http.post(setup.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200  # headers are sent before the first token
    setup.double.hold.set()  # tokens flow to a client that has gone
    mtls = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=setup.pki.client_ssl("scraper")))
    async with mtls:
        for _ in range(100):
            async with mtls.get(setup.pki.uri("fe") + "metrics") as m:
                if 'kvsp_frontend_requests_total{status="499"} 1.0' in await m.text():
                    break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the abandoned stream was not counted")
    status, raw = await complete(setup, {"model": "kvsp-test", "prompt": "x", "max_tokens": 10, "temperature": 0})
    assert status == 200 and json.loads(raw)["kvsp"]["tokens"] == REFERENCE


async def test_a_stranded_session_without_output_is_submitted_again_and_skips_what_was_delivered(
        setup: Setup) -> None:
    setup.double.strand = True
    status, raw = await complete(setup, {"model": "kvsp-test", "prompt": "x", "max_tokens": 10, "temperature": 0,
                                         "stream": True})
    assert status == 200
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in raw.split(b"\n\n") if e and e != b"data: [DONE]"]
    assert [c["kvsp"]["index"] for c in chunks[:-1]] == list(range(10))
    assert [c["kvsp"]["token"] for c in chunks[:-1]] == REFERENCE
    assert chunks[-1]["kvsp"]["submissions"] == 2
    assert len(setup.double.requests) == 2 and setup.double.requests[0] == setup.double.requests[1]
