"""Block fetch over MOQT against HTTPS GET of the same blocks, from the same holder process, on loopback.

The server is a child process (its own core and event loop, uvloop as ``kvsp serve`` runs it): the real
holder role with its MOQT publisher (``[holder] moqt_listen``), plus a bare aiohttp handler that writes
a block layer by layer (one ``write`` + drain per layer), the HTTPS baseline for time to first layer.
The client runs here on uvloop. Both transports use mutual authentication with one development CA
(TLS 1.3 over TCP; QUIC's TLS 1.3 over UDP) and both clients verify everything section 6.7 asks
(HTTPS: Repr-Digest, layer digests, replica digest; MOQT: every object against its layer digest,
then the replica digest). The blocks are 2 MiB of layer data in 32 layers (bf16, 8 KV heads x 128 dims
x 16 tokens: 64 KiB per layer) plus a 532-octet header, stored in the holder's host tier.

* ``fetch-2MiB-c{1,4}``: ``requests`` whole-block fetches, ``concurrency`` in flight over one connection
  (MOQT: one session; HTTPS: a keep-alive pool), MOQT ``MoqtBlockClient.fetch_block`` against
  ``HolderClient.get_block``. Goal: throughput >= 1.0x HTTPS (ratio = HTTPS time / MOQT time).
* ``first-layer-2MiB``: one fetch at a time; the time until the first verified layer is in the
  caller's hands, against the same for HTTPS from the per-layer-writing handler. Goals: no later than
  HTTPS with per-layer writes (ratio >= 1.0), and at most 1/8 of the whole-block time over MOQT
  (``first_over_whole`` <= 0.125).

``profile`` holds a cProfile summary of both ends over ``profile_fetches`` MOQT fetches (see
docs/moqt.md). Run: ``python -m benchmarks.bench_moqt [--quick]``; prints JSON.
"""

from __future__ import annotations

import asyncio
import cProfile
import functools
import hashlib
import json
import multiprocessing
import pstats
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import uvloop
from aiohttp import web

from benchmarks._timing import Sample, case
from control.config import RoleConfig, ServerConfig
from control.http import BLOCK_MEDIA_TYPE
from control.policy import Policy, ScopeGrant
from control.serve import build_app
from control.tls import TlsFiles, client_context, server_context
from kvsp.client.holder import BlockMiss, HolderClient
from kvsp.client.http import KvspSession
from kvsp.client.moqt import MoqtBlockClient
from kvsp.client.verify import format_repr_digest
from kvsp.container import decode_container, encode_container
from kvsp.descriptor import CompatDescriptor
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.pki import RoleSpec, make_dev_pki
from kvsp.records import ReplicaRecord, Residency
from kvsp.registry import Codec, Tier

MiB = 1 << 20
SCOPE = bytes(range(16))
BLOCKS = 4
DESCRIPTOR = CompatDescriptor(model="bench-model", model_digest=bytes(32), tokenizer_digest=bytes(32), layers=32,
                              kv_heads=8, head_dim=128, kv_dtype="bf16", positional="rope", block_tokens=16)
ROLES = ("holder", "layered", "client")


def key(i: int) -> bytes:
    return hashlib.sha256(b"bench-moqt %d" % i).digest()


@functools.cache
def block(i: int) -> bytes:
    section = DESCRIPTOR.section_length(DESCRIPTOR.block_tokens)
    data = np.random.default_rng(i).bytes(2 * section * DESCRIPTOR.layers)
    layers = [(data[2 * n * section : (2 * n + 1) * section], data[(2 * n + 1) * section : (2 * n + 2) * section])
              for n in range(DESCRIPTOR.layers)]
    return encode_container(Codec.RAW, 0, DESCRIPTOR.block_tokens, layers)


def _free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Setup:
    dir: Path
    uris: dict[str, str]
    moqt_port: int

    @property
    def moqt_uri(self) -> str:
        return f"moqt://127.0.0.1:{self.moqt_port}/holder"

    def files(self, name: str) -> TlsFiles:
        return TlsFiles(self.dir / f"{name}.pem", self.dir / f"{name}.key", self.dir / "ca.pem")

    def port(self, name: str) -> int:
        return int(self.uris[name].split(":")[2].split("/")[0])

    def record(self, i: int, *, moqt: bool) -> ReplicaRecord:
        return _record(self.uris["holder"], self.moqt_uri if moqt else None, i)


@functools.cache
def _record(holder: str, moqt_uri: str | None, i: int) -> ReplicaRecord:
    digests = decode_container(block(i)).layer_digests()
    namespace = TrackNamespace(DESCRIPTOR.compat_id, SCOPE, role_id(holder), key(i)) if moqt_uri else None
    return ReplicaRecord(key(i), DESCRIPTOR.compat_id, SCOPE, moqt_uri or holder, Codec.RAW, len(block(i)),
                         hashlib.sha256(b"".join(digests)).digest(),
                         (Residency(Tier.HOST, (0, DESCRIPTOR.layers - 1)),), 600_000, digests, namespace)


# -- the server process ----------------------------------------------------------------------------
def _holder_config(setup: Setup) -> RoleConfig:
    policy = Policy(scopes={SCOPE: ScopeGrant(read=frozenset({"*"}), store=frozenset({"*"}))})
    section = {"descriptors": [str(setup.dir / "descriptor.json")], "host_capacity_octets": 64 * MiB,
               "moqt_listen": f"127.0.0.1:{setup.moqt_port}", "moqt_uri": setup.moqt_uri}
    return RoleConfig(("holder",), ServerConfig(setup.uris["holder"], "127.0.0.1", setup.port("holder")),
                      setup.files("holder"), policy, setup.dir, {"holder": section})


def _layered_app() -> web.Application:
    """HTTPS baseline: the container written header first, then one write (and drain) per layer."""
    bodies = {key(i).hex(): (block(i), hashlib.sha256(block(i)).digest()) for i in range(BLOCKS)}

    async def get(request: web.Request) -> web.StreamResponse:
        body, digest = bodies[request.match_info["key"]]
        container = decode_container(body)
        response = web.StreamResponse(headers={"Repr-Digest": format_repr_digest(digest)})
        response.content_type = BLOCK_MEDIA_TYPE
        response.content_length = len(body)
        await response.prepare(request)
        await response.write(body[: container.header_length])
        for view in container.layers:
            await response.write(view.payload)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/layered/blocks/{compat}/{scope}/{key}", get)
    return app


async def _serve(setup: Setup, pipe: Any) -> None:
    runners = [(web.AppRunner(build_app(_holder_config(setup)), access_log=None), "holder"),
               (web.AppRunner(_layered_app(), access_log=None), "layered")]
    for runner, role in runners:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", setup.port(role), ssl_context=server_context(setup.files(role))).start()
    pipe.send("ready")
    loop = asyncio.get_running_loop()
    profiler: cProfile.Profile | None = None
    while (command := await loop.run_in_executor(None, pipe.recv)) != "stop":
        if command == "profile-on":
            profiler = cProfile.Profile()
            profiler.enable()
            pipe.send("on")
        elif command == "profile-off" and profiler is not None:
            profiler.disable()
            pipe.send(summarize(profiler))
    for runner, _ in runners:
        await runner.cleanup()


def _serve_main(directory: str, uris: dict[str, str], moqt_port: int, pipe: Any) -> None:
    uvloop.run(_serve(Setup(Path(directory), uris, moqt_port), pipe))


# -- profiles --------------------------------------------------------------------------------------
AREAS = (("aioquic packet/crypto (C)", ("aioquic/_crypto", "aioquic/_buffer", "{method 'encrypt", "{method 'decrypt",
                                        "{built-in method aioquic")),
         ("aioquic connection (Python)", ("aioquic/",)),
         ("moqt session and codecs", ("moqt/_", "moqt/data", "moqt/wire", "moqt/session", "moqt/messages")),
         ("moqt adapter and API", ("moqt/quic", "moqt/api", "moqt/tls")),
         ("kvsp (binding, holder, verify)", ("kvsp/", "control/")),
         ("sha256 (hashlib)", ("_hashlib", "sha256")),
         ("socket send/recv", ("sendto", "recvfrom", "'send'", "'recv", "sock_")),
         ("aiohttp/TLS", ("aiohttp", "ssl")),
         ("event loop (uvloop; client: includes waiting)", ("asyncio/runners.py", "uvloop", "asyncio/")),
         ("rest", ("",)))


def _short(label: str) -> str:
    """A profile row's file path relative to site-packages or to this repository."""
    for root in ("site-packages/", str(Path(__file__).resolve().parents[1]) + "/"):
        label = label.rpartition(root)[2] or label
    return label


def summarize(profiler: cProfile.Profile, top: int = 12) -> dict[str, object]:
    """Total time per area (self time of the functions in it), the top functions by self time, and the
    API's and binding's own functions (``moqt/api``, ``kvsp``, ``control``) by self time."""
    stats = pstats.Stats(profiler)
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, object]] = stats.stats  # type: ignore[attr-defined]
    areas: dict[str, float] = {name: 0.0 for name, _ in AREAS}
    rows = []
    for (filename, line, name), (_, calls, tottime, cumtime, _) in raw.items():
        label = f"{filename}:{line}({name})"
        area = next(a for a, needles in AREAS if any(n in label for n in needles))
        areas[area] += tottime
        rows.append((tottime, cumtime, calls, _short(label)))
    total = sum(areas.values()) or 1.0
    rows.sort(reverse=True)
    ours = [row for row in rows if row[3].startswith(("moqt/api", "kvsp/", "control/"))]
    return {"total_s": round(total, 3),
            "areas_pct": {a: round(100 * t / total, 1) for a, t in sorted(areas.items(), key=lambda x: -x[1]) if t},
            "top_self_time": [_row(row) for row in rows[:top]],
            "api_and_binding": [_row(row) for row in ours[:top // 2]]}


def _row(row: tuple[float, float, int, str]) -> dict[str, object]:
    tottime, cumtime, calls, function = row
    return {"function": function, "self_s": round(tottime, 4), "cum_s": round(cumtime, 4), "calls": calls}


# -- the client ------------------------------------------------------------------------------------
@dataclass
class Clients:
    setup: Setup
    session: KvspSession
    https: HolderClient
    moqt: MoqtBlockClient

    async def via_moqt(self, i: int) -> None:
        answer = await self.moqt.fetch_block(self.setup.record(i, moqt=True), token_count=DESCRIPTOR.block_tokens)
        if isinstance(answer, BlockMiss) or not answer.replica_verified:
            raise RuntimeError(f"MOQT fetch of block {i}: {answer}")

    async def via_https(self, i: int) -> None:
        record = self.setup.record(i, moqt=False)
        answer = await self.https.get_block(record.holder, DESCRIPTOR.compat_id, SCOPE, key(i), expect=record)
        if isinstance(answer, BlockMiss) or not answer.replica_verified:
            raise RuntimeError(f"HTTPS fetch of block {i}: {answer}")

    async def first_layer_moqt(self, i: int) -> tuple[float, float]:
        start = time.perf_counter()
        first = 0.0
        async with self.moqt.open_block(self.setup.record(i, moqt=True), token_count=DESCRIPTOR.block_tokens) as s:
            async for _ in s.layers():
                first = first or time.perf_counter() - start
        return first, time.perf_counter() - start

    async def first_layer_https(self, i: int) -> tuple[float, float]:
        start = time.perf_counter()
        first = 0.0
        record = self.setup.record(i, moqt=False)
        async with self.https.open_block(self.setup.uris["layered"], DESCRIPTOR.compat_id, SCOPE, key(i),
                                         expect=record) as stream:
            assert not isinstance(stream, BlockMiss)
            async for _ in stream.layers():
                first = first or time.perf_counter() - start
        return first, time.perf_counter() - start


async def _many(fetch: Callable[[int], Awaitable[None]], requests: int, concurrency: int) -> None:
    queue = iter(range(requests))

    async def worker() -> None:
        for n in queue:
            await fetch(n % BLOCKS)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def _run_many(runner: asyncio.Runner, fetch: Callable[[int], Awaitable[None]], requests: int,
              concurrency: int) -> None:
    runner.run(_many(fetch, requests, concurrency))


def _sample(values: list[float]) -> Sample:
    return Sample(statistics.median(values), min(values), max(values), len(values))


def _paired(first: Callable[[], object], second: Callable[[], object], reps: int) -> tuple[Sample, Sample]:
    """Both measured in alternation, one repetition each in turn, so that load from elsewhere on the
    machine (other processes on the same cores) hits both alike."""
    times: tuple[list[float], list[float]] = ([], [])
    for rep in range(reps + 1):
        for index, fn in enumerate((first, second)):
            start = time.perf_counter()
            fn()
            if rep:  # the first round warms both paths up
                times[index].append(time.perf_counter() - start)
    return _sample(times[0]), _sample(times[1])


def _throughput_rows(runner: asyncio.Runner, clients: Clients, quick: bool) -> list[dict[str, object]]:
    requests, reps = (16, 3) if quick else (64, 9)
    rows = []
    for concurrency in (1, 4):
        moqt, https = _paired(functools.partial(_run_many, runner, clients.via_moqt, requests, concurrency),
                              functools.partial(_run_many, runner, clients.via_https, requests, concurrency), reps)
        row = case(f"fetch-2MiB-c{concurrency}", moqt, https, "MOQT throughput >= 1.0x HTTPS GET (ratio >= 1.0)",
                   unit="s per batch", higher_is_better=True)
        size = len(block(0))
        row["mib_per_s"] = {"moqt": round(requests * size / MiB / moqt.median_s, 1),
                            "https": round(requests * size / MiB / https.median_s, 1)}
        rows.append(row)
    return rows


def _first_layer_row(runner: asyncio.Runner, clients: Clients, quick: bool) -> dict[str, object]:
    reps = 9 if quick else 31
    for i in range(2):  # warm both paths
        runner.run(clients.first_layer_moqt(i))
        runner.run(clients.first_layer_https(i))
    moqt, https = [], []
    for n in range(reps):  # alternated, as in _paired
        moqt.append(runner.run(clients.first_layer_moqt(n % BLOCKS)))
        https.append(runner.run(clients.first_layer_https(n % BLOCKS)))
    first_moqt, whole_moqt = _sample([f for f, _ in moqt]), _sample([w for _, w in moqt])
    first_https, whole_https = _sample([f for f, _ in https]), _sample([w for _, w in https])
    row = case("first-layer-2MiB", first_moqt, first_https,
               "MOQT first layer no later than HTTPS with per-layer writes (ratio >= 1.0) and "
               "<= 1/8 of the MOQT whole-block time (first_over_whole <= 0.125)", higher_is_better=True)
    row["first_over_whole"] = round(first_moqt.median_s / whole_moqt.median_s, 3)
    row["ms"] = {"moqt_first": round(first_moqt.median_s * 1e3, 2), "moqt_whole": round(whole_moqt.median_s * 1e3, 2),
                 "https_first": round(first_https.median_s * 1e3, 2),
                 "https_whole": round(whole_https.median_s * 1e3, 2)}
    return row


def _profile(runner: asyncio.Runner, clients: Clients, pipe: Any, fetches: int) -> dict[str, object]:
    pipe.send("profile-on")
    pipe.recv()
    profiler = cProfile.Profile()
    profiler.enable()
    runner.run(_many(clients.via_moqt, fetches, 1))
    profiler.disable()
    pipe.send("profile-off")
    return {"fetches": fetches, "client": summarize(profiler), "server": pipe.recv()}


def _measure(setup: Setup, pipe: Any, quick: bool) -> tuple[list[dict[str, object]], dict[str, object]]:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        clients = runner.run(_clients(setup))
        try:
            for i in range(BLOCKS):
                runner.run(clients.https.put_block(setup.uris["holder"], DESCRIPTOR.compat_id, SCOPE, key(i), block(i)))
            rows = _throughput_rows(runner, clients, quick)
            rows.append(_first_layer_row(runner, clients, quick))
            profile = _profile(runner, clients, pipe, 16 if quick else 64)
        finally:
            runner.run(clients.moqt.close())
            runner.run(clients.session.close())
    return rows, profile


async def _clients(setup: Setup) -> Clients:
    session = KvspSession(client_context(setup.files("client")))
    d = setup.dir
    moqt = MoqtBlockClient.from_files(d / "client.pem", d / "client.key", d / "ca.pem")
    return Clients(setup, session, HolderClient(session), moqt)


def run(quick: bool = False) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="kvsp-bench-moqt-") as tmp:
        directory = Path(tmp)
        uris = {name: f"https://127.0.0.1:{_free_port()}/{name}/" for name in ROLES}
        make_dev_pki(directory, [RoleSpec(n, u) for n, u in uris.items()])
        (directory / "descriptor.json").write_text(json.dumps(DESCRIPTOR.to_json()))
        setup = Setup(directory, uris, _free_port(socket.SOCK_DGRAM))
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        server = ctx.Process(target=_serve_main, args=(tmp, uris, setup.moqt_port, child), daemon=True)
        server.start()
        try:
            if not parent.poll(60) or parent.recv() != "ready":
                raise RuntimeError("the benchmark server did not start")
            cases, profile = _measure(setup, parent, quick)
        finally:
            parent.send("stop")
            server.join(10)
            if server.is_alive():
                server.kill()
    return {"name": "moqt", "params": {"block_octets": len(block(0)), "layers": DESCRIPTOR.layers,
                                       "server": "child process (holder role: HTTPS + MOQT), uvloop both ends",
                                       "tls": "1.3 with client certificates (TCP and QUIC)"},
            "cases": cases, "profile": profile}


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
