"""Shared pieces of the instance tests: a deployment on loopback (the real IS, a real holder, two real
instance+holder processes-in-one-loop) and a PC double under mutual TLS that records status and
checkpoint PUTs and answers them as the contract says.

(A module of helpers, named like a test module so that it sits with the instance tests; it has no tests.)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from control.deploy.doubles import PcDouble, pc_double
from control.deploy.fixtures import DESCRIPTOR, GEOMETRY, SCOPE, SCOPE_KEY, VOCAB, reference_tokens
from control.deploy.pki import DevPki
from control.holder.app import HOLDER
from control.holder.service import Holder
from control.instance.app import INSTANCE
from control.instance.records import EndLine, TokenLine, parse_token_line
from control.instance.role import InstanceRole
from kvsp.client.holder import HolderClient
from kvsp.client.http import KvspSession
from kvsp.client.index import IndexClient
from kvsp.container import decode_container, encode_container, replica_digest
from kvsp.engine import DeterministicTestEngine
from kvsp.keys import block_keys
from kvsp.records import LookupRequest, ReplicaRecord, Residency, Sampler
from kvsp.registry import Codec, Tier
from kvsp.service.policy import Policy, Quotas, ScopeGrant
from kvsp.service.tls import server_context
from tests.support.servers import role_config, running

__all__ = ["DESCRIPTOR", "GEOMETRY", "SCOPE", "SCOPE_KEY", "VOCAB", "PcDouble", "pc_double", "reference_tokens"]

COMPAT = DESCRIPTOR.compat_id
B = DESCRIPTOR.block_tokens
NAMES = ["pc", "is", "h1", "ii1", "ii2", "fe", "other", "slow"]
PROMPT = (128000, 791, 6460, 374, 264, 1296, 315, 279, 11, 12)  # two blocks and a tail of two


# -- reference computations ------------------------------------------------------------------------
def reference_block(tokens: Sequence[int], block: int) -> bytes:
    kv = DeterministicTestEngine(GEOMETRY).reference_kv(tokens, block)
    return encode_container(Codec.RAW, 0, B, [(lk.k, lk.v) for lk in kv], geometry=DESCRIPTOR.geometry())


def keys_of(tokens: Sequence[int]) -> list[bytes]:
    return block_keys(SCOPE_KEY, COMPAT, B, tokens)


# -- a holder that never answers -----------------------------------------------------------------------
@asynccontextmanager
async def stalled_holder(pki: DevPki, name: str = "slow") -> AsyncIterator[str]:
    """A peer (identity ``name``) that accepts TLS connections and requests, and never answers them."""

    async def stall(request: web.Request) -> web.Response:
        await asyncio.sleep(60)
        return web.Response(status=500)

    uri = pki.uri(name)
    port = int(uri.split(":")[2].split("/")[0])
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", stall)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_context(pki.files(name)))
    await site.start()
    try:
        yield uri
    finally:
        await runner.cleanup()


def replica_record(key: bytes, holder: str, container: bytes) -> ReplicaRecord:
    """The record a holder would publish for ``container`` under ``key``."""
    c = decode_container(container)
    digests = c.layer_digests()
    return ReplicaRecord(key, COMPAT, SCOPE, holder, Codec.RAW, len(container), replica_digest(digests),
                         (Residency(Tier.HOST, (0, c.layer_count - 1)),), 60_000, digests)


# -- the deployment ----------------------------------------------------------------------------------
def policy(pki: DevPki, quotas: Quotas | None = None) -> Policy:
    u = pki.uri
    everyone = frozenset({u("pc"), u("ii1"), u("ii2"), u("fe"), u("h1"), u("slow")})
    grant = ScopeGrant(lookup=everyone, read=everyone, store=everyone)
    return Policy(pc=u("pc"), scopes={SCOPE: grant}, quotas=quotas or Quotas())


def write_files(tmp: Path) -> tuple[str, str]:
    model = tmp / "model.json"
    model.write_text(json.dumps(DESCRIPTOR.to_json()))
    key = tmp / "scope.key"
    key.write_text(SCOPE_KEY.secret().hex())
    return str(model), str(key)


@dataclass
class World:
    pki: DevPki
    pc: PcDouble
    apps: dict[str, web.Application]
    http: dict[str, aiohttp.ClientSession]  # clients by identity name
    session: KvspSession  # a client with the "fe" identity for the IS and holders

    def role(self, name: str) -> InstanceRole:
        return self.apps[name][INSTANCE]

    def holder(self, name: str) -> Holder:
        return self.apps[name][HOLDER]

    def url(self, name: str, path: str) -> str:
        return self.pki.uri(name) + path

    async def call(self, who: str, method: str, url: str, body: object | None = None) -> tuple[int, object]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/kvsp+json"} if data is not None else {}
        async with self.http[who].request(method, url, data=data, headers=headers) as resp:
            raw = await resp.read()
            return resp.status, (json.loads(raw) if raw else None)

    async def lookup(self, keys: Sequence[bytes]) -> list[list[ReplicaRecord]]:
        response = await IndexClient(self.session, self.pki.uri("is")).lookup(LookupRequest(SCOPE, COMPAT,
                                                                                              tuple(keys)))
        return [list(group) for group in response.replicas]

    async def wait_for(self, check: Callable[[], object], what: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}")

    async def wait_published(self, keys: Sequence[bytes], holder: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            groups = await self.lookup(keys)
            if len(groups) == len(keys) and all(any(r.holder == holder for r in g) for g in groups):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{holder} did not publish {len(keys)} blocks")

    async def put_blocks(self, tokens: Sequence[int], blocks: Sequence[int], holder: str = "h1") -> list[bytes]:
        """PUT the reference KV of ``blocks`` of ``tokens`` into ``holder`` (as the front end), published."""
        client = HolderClient(self.session)
        keys = keys_of(tokens)
        for i in blocks:
            await client.put_block(self.pki.uri(holder), COMPAT, SCOPE, keys[i], reference_block(tokens, i))
        await self.wait_published([keys[i] for i in blocks if i < len(keys)], self.pki.uri(holder))
        return keys

    async def stream(self, instance: str, session: str, start: int = 0, *, who: str = "fe",
                     timeout: float = 20.0) -> list[TokenLine]:
        """Read GET sessions/{session}/tokens?from=start to its end (end line or connection close)."""
        url = self.url(instance, f"sessions/{session}/tokens?from={start}")
        out: list[TokenLine] = []
        async with asyncio.timeout(timeout), self.http[who].get(url) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.content_type == "application/x-ndjson"
            while line := await resp.content.readline():
                out.append(parse_token_line(line))
        return out

    async def metric(self, name: str, text: str) -> float:
        async with self.http["pc"].get(self.url(name, "metrics")) as resp:
            body = await resp.text()
        for line in body.splitlines():
            if line.startswith(text + " "):
                return float(line.split()[-1])
        return 0.0


def instance_section(pki: DevPki, model: str, key: str, **overrides: object) -> dict[str, object]:
    section: dict[str, object] = {"pc": pki.uri("pc"), "index": pki.uri("is"), "engine": "test",
                                  "vocab_size": VOCAB, "scope_keys": {SCOPE.hex(): key}, "status_ttl_ms": 3000,
                                  "peers": [pki.uri("ii1"), pki.uri("ii2")], "load_timeout_ms": 3000,
                                  "final_ack_timeout_ms": 5000}
    section.update(overrides)
    return section


@asynccontextmanager
async def world(pki: DevPki, tmp: Path, *, quotas: Quotas | None = None, instance: dict[str, object] | None = None,
                roles: tuple[str, ...] = ("instance", "holder")) -> AsyncIterator[World]:
    model, key = write_files(tmp)
    pol = policy(pki, quotas)
    holder = {"index": pki.uri("is"), "descriptors": [model], "replica_ttl_ms": 60_000}
    configs = {
        "is": role_config(pki, "is", ("is",), pol, {"is": {"descriptors": [model]}}, tmp),
        "h1": role_config(pki, "h1", ("holder",), pol, {"holder": holder}, tmp),
    }
    for name in ("ii1", "ii2"):
        section = instance_section(pki, model, key, **(instance or {}))
        sections = {"holder": holder, "instance": section} if "holder" in roles else {
            "instance": {**section, "descriptors": [model]}}
        configs[name] = role_config(pki, name, roles, pol, sections, tmp)
    async with AsyncExitStack() as stack:
        double = await stack.enter_async_context(pc_double(pki))
        apps = {name: await stack.enter_async_context(running(cfg)) for name, cfg in configs.items()}
        http = {}
        for who in ("pc", "fe", "other"):
            connector = aiohttp.TCPConnector(ssl=pki.client_ssl(who))
            http[who] = await stack.enter_async_context(aiohttp.ClientSession(connector=connector))
        session = await stack.enter_async_context(pki.session("fe"))
        yield World(pki, double, apps, http, session)


def start_body(session: str, sampler: Sampler, *, prompt: Sequence[int] = PROMPT, max_tokens: int = 12,
               epoch: int = 1) -> dict[str, object]:
    return {"session": session, "epoch": epoch, "scope_id": SCOPE.hex(), "compat_id": COMPAT.hex(),
            "prompt": list(prompt), "max_tokens": max_tokens, "sampler": sampler.to_json()}


def tokens_of(lines: Sequence[TokenLine]) -> list[tuple[int, int, int]]:
    return [(t.index, t.epoch, t.token) for t in lines if not isinstance(t, EndLine)]
