"""A PC and an instance in one mutual-TLS server whose token streams hold until released: what a front end
needs to keep many completions in flight at once, for tests and benchmarks of its admission caps.

``POST {pc}requests`` places every session on the one instance (``{root}ii/``) at epoch 1;
``GET {pc}sessions/{s}`` says the same; ``GET {root}ii/sessions/{s}/tokens`` waits until `release` is
set, then streams ``tokens`` tokens and the end line.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from aiohttp import web

from control.deploy.pki import DevPki
from kvsp.service.tls import server_context

JSON = "application/kvsp+json"


@dataclass
class HeldStreams:
    pc: str  # the PC's base URI; the instance is ``ii/`` beside it
    tokens: int = 4
    release: asyncio.Event = field(default_factory=asyncio.Event)
    placed: int = 0  # sessions posted
    open_streams: int = 0  # token streams waiting or streaming now

    @property
    def instance(self) -> str:
        return self.pc.rstrip("/").rsplit("/", 1)[0] + "/ii/"

    def _info(self, session: str) -> web.Response:
        body = {"session": session, "instance": self.instance, "epoch": 1, "output_offset": 0, "state": "running"}
        return web.json_response(body, content_type=JSON)

    async def _requests(self, request: web.Request) -> web.Response:
        await request.read()
        self.placed += 1
        return self._info(str(uuid.uuid4()))

    async def _session(self, request: web.Request) -> web.Response:
        return self._info(request.match_info["s"])

    async def _tokens(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        self.open_streams += 1
        try:
            await self.release.wait()
            start = int(request.query.get("from", "0"))
            for i in range(start, self.tokens):
                await resp.write(json.dumps({"index": i, "epoch": 1, "token": 65 + i % 26}).encode() + b"\n")
            await resp.write(b'{"end": true, "reason": "max_tokens", "epoch": 1}\n')
        finally:
            self.open_streams -= 1
        return resp

    def app(self) -> web.Application:
        pc = urlsplit(self.pc).path
        ii = urlsplit(self.instance).path
        app = web.Application()
        app.router.add_post(pc + "requests", self._requests)
        app.router.add_get(pc + "sessions/{s}", self._session)
        app.router.add_get(ii + "sessions/{s}/tokens", self._tokens)
        return app


@asynccontextmanager
async def held_streams(pki: DevPki, name: str = "pc", tokens: int = 4) -> AsyncIterator[HeldStreams]:
    """Serve the double at ``pki.uri(name)`` with that name's certificate for the block; released at its end."""
    double = HeldStreams(pki.uri(name), tokens)
    runner = web.AppRunner(double.app(), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", pki.port(name), ssl_context=server_context(pki.files(name))).start()
        yield double
    finally:
        double.release.set()
        await runner.cleanup()
