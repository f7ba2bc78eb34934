"""Block GET throughput of the holder against a bare aiohttp handler, same machine, same TLS.

The servers run in a child process (its own core and event loop); the client runs here.  Both sides use
TLS 1.3 with client certificates from one development CA.  The block is 2 MiB of layer data in
32 layers (bf16, 8 KV heads x 128 dims x 16 tokens: 64 KiB per layer) plus its 532-octet header.

* ``get-full-2MiB-host``: the whole block from the host tier through every holder layer (mTLS
  identity, policy, store lookup, Repr-Digest and Cache-Control headers, streamed views) against a
  bare handler that returns the same octets from memory with ``web.Response(body=...)``.
  Goal: throughput >= 0.8x the bare handler (ratio >= 0.8).
* ``get-layers-0-15-host`` (reported): half the layers; the holder builds a range header per request and
  hashes the range for Repr-Digest once (then remembers it), the bare handler returns prebuilt octets.
* ``get-full-2MiB-local-storage`` (reported): the whole block read from the encrypted disk tier
  (pread + AES-GCM in a worker thread, page cache warm), against the bare in-memory handler.  On a
  machine with few cores this competes with the event loop and the client for CPU.

Each repetition fetches ``requests`` blocks with ``concurrency`` requests in flight over one
keep-alive connection pool.  Run: ``python -m benchmarks.bench_holder [--quick]``; prints JSON.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from benchmarks.timing import case, measure
from control.deploy.pki import loopback_uri
from control.http import BLOCK_MEDIA_TYPE
from control.serve import build_app
from kvsp.container import decode_container, encode_container
from kvsp.descriptor import CompatDescriptor
from kvsp.pki import RoleSpec, make_dev_pki
from kvsp.registry import Codec
from kvsp.service.config import RoleConfig, ServerConfig
from kvsp.service.policy import Policy, ScopeGrant
from kvsp.service.tls import TlsFiles, client_context, server_context

MiB = 1 << 20
SCOPE = bytes(range(16))
KEY = bytes(range(32))
DESCRIPTOR = CompatDescriptor(model="bench-model", model_digest=bytes(32), tokenizer_digest=bytes(32), layers=32,
                              kv_heads=8, head_dim=128, kv_dtype="bf16", positional="rope", block_tokens=16)
ROLES = ("holder", "disk", "bare", "client")


@dataclass(frozen=True)
class Setup:
    dir: Path
    uris: dict[str, str]

    def files(self, name: str) -> TlsFiles:
        return TlsFiles(self.dir / f"{name}.pem", self.dir / f"{name}.key", self.dir / "ca.pem")

    def port(self, name: str) -> int:
        return int(self.uris[name].split(":")[2].split("/")[0])

    def block_path(self, role: str) -> str:
        c = DESCRIPTOR.compat_id.hex()
        return f"{self.uris[role]}blocks/{c}/{SCOPE.hex()}/{KEY.hex()}"


def _block() -> bytes:
    section = DESCRIPTOR.section_length(DESCRIPTOR.block_tokens)
    data = np.random.default_rng(7).bytes(2 * section * DESCRIPTOR.layers)
    layers = [(data[2 * i * section : (2 * i + 1) * section], data[(2 * i + 1) * section : (2 * i + 2) * section])
              for i in range(DESCRIPTOR.layers)]
    return encode_container(Codec.RAW, 0, DESCRIPTOR.block_tokens, layers)


def _config(setup: Setup, role: str, holder: dict[str, object]) -> RoleConfig:
    policy = Policy(scopes={SCOPE: ScopeGrant(read=frozenset({"*"}), store=frozenset({"*"}))})
    section = {"descriptors": [str(setup.dir / "descriptor.json")], **holder}
    return RoleConfig(("holder",), ServerConfig(setup.uris[role], "127.0.0.1", setup.port(role)),
                      setup.files(role), policy, setup.dir, {"holder": section})


# -- the server process ----------------------------------------------------------------------------


async def _serve(setup: Setup, conn: Any) -> None:
    body = _block()
    ranged = decode_container(body).slice_bytes(0, 15)
    runners = []
    holders: tuple[tuple[str, dict[str, object]], ...] = (
        ("holder", {"host_capacity_octets": 64 * MiB}),
        ("disk", {"host_capacity_octets": 0, "storage_dir": "disk-blocks"}))
    for role, holder in holders:
        runner = web.AppRunner(build_app(_config(setup, role, holder)), access_log=None)
        runners.append((runner, role))

    async def bare(request: web.Request) -> web.Response:
        return web.Response(body=ranged if request.query.get("layers") else body, content_type=BLOCK_MEDIA_TYPE)

    app = web.Application()
    app.router.add_get("/bare/block", bare)
    runners.append((web.AppRunner(app, access_log=None), "bare"))
    for runner, role in runners:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", setup.port(role), ssl_context=server_context(setup.files(role))).start()
    conn.send("ready")
    await asyncio.get_running_loop().run_in_executor(None, conn.recv)
    for runner, _ in runners:
        await runner.cleanup()


def _serve_main(directory: str, uris: dict[str, str], conn: Any) -> None:
    asyncio.run(_serve(Setup(Path(directory), uris), conn))


# -- the client ------------------------------------------------------------------------------------


async def _fetch_many(http: aiohttp.ClientSession, url: str, requests: int, concurrency: int, size: int) -> None:
    queue = iter(range(requests))

    async def worker() -> None:
        for _ in queue:
            async with http.get(url) as r:
                data = await r.read()
                if r.status != 200 or len(data) != size:
                    raise RuntimeError(f"GET {url}: {r.status}, {len(data)} octets")

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _store(http: aiohttp.ClientSession, url: str, body: bytes) -> None:
    async with http.put(url, data=body, headers={"If-None-Match": "*", "Content-Type": BLOCK_MEDIA_TYPE}) as r:
        if r.status != 201:
            raise RuntimeError(f"PUT {url}: {r.status} {await r.text()}")


def _measure_cases(setup: Setup, quick: bool) -> list[dict[str, object]]:
    body = _block()
    range_size = len(decode_container(body).slice_bytes(0, 15))
    loop = asyncio.new_event_loop()
    requests, concurrency, reps = (16, 4, 5) if quick else (64, 8, 9)
    try:
        http = loop.run_until_complete(_session(setup))
        for role in ("holder", "disk"):
            loop.run_until_complete(_store(http, setup.block_path(role), body))

        def timed(url: str, size: int) -> Any:
            return measure(lambda: loop.run_until_complete(_fetch_many(http, url, requests, concurrency, size)),
                           reps=reps, warmup=2)

        bare = setup.uris["bare"] + "block"
        rows = []
        for name, url, bare_url, size, goal, bound in (
                ("get-full-2MiB-host", setup.block_path("holder"), bare, len(body),
                 "throughput >= 0.8x bare aiohttp handler, same TLS (ratio >= 0.8)", 0.8),
                ("get-layers-0-15-host", setup.block_path("holder") + "?layers=0-15", bare + "?layers=1",
                 range_size, "informative (range header per request, range Repr-Digest remembered)", None),
                ("get-full-2MiB-local-storage", setup.block_path("disk"), bare, len(body),
                 "informative (pread + AES-GCM decrypt per request)", None)):
            ours = timed(url, size)
            base = timed(bare_url, size)
            row = case(name, ours, base, goal, unit="s per batch", higher_is_better=True, goal_min_ratio=bound)
            row["mib_per_s"] = round(requests * size / MiB / ours.median_s, 1)
            row["baseline_mib_per_s"] = round(requests * size / MiB / base.median_s, 1)
            rows.append(row)
        loop.run_until_complete(http.close())
        return rows
    finally:
        loop.close()


async def _session(setup: Setup) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(ssl=client_context(setup.files("client")), limit=64)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False)


def run(quick: bool = False) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="kvsp-bench-holder-") as tmp:
        directory = Path(tmp)
        uris = {name: loopback_uri(name) for name in ROLES}
        make_dev_pki(directory, [RoleSpec(n, u) for n, u in uris.items()])
        (directory / "descriptor.json").write_text(json.dumps(DESCRIPTOR.to_json()))
        setup = Setup(directory, uris)
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        server = ctx.Process(target=_serve_main, args=(tmp, uris, child), daemon=True)
        server.start()
        try:
            if not parent.poll(60) or parent.recv() != "ready":
                raise RuntimeError("the benchmark servers did not start")
            cases = _measure_cases(setup, quick)
        finally:
            parent.send("stop")
            server.join(10)
            if server.is_alive():
                server.kill()
    return {"name": "holder", "params": {"block_octets": len(_block()), "layers": DESCRIPTOR.layers,
                                         "server": "child process", "tls": "1.3, client certificates"},
            "cases": cases}


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
