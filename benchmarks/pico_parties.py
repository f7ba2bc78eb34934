"""The parties of benchmarks/bench_picoquic.py, one per process, each run by the picoquic venv's Python.

    python -m benchmarks.pico_parties ROLE DIR [--quic aioquic|picoquic] [--sizes 2,16] [...]

Roles: ``publisher`` (a ``moqt.api.Publisher`` of stored blocks), ``https`` (aiohttp over mutual TLS serving
the same blocks whole and layer by layer), ``relay`` (``relay.server.Relay`` whose upstream is a publisher),
``moqt-sub`` (Subscribers, direct and through the relay) and ``https-sub`` (an aiohttp client). ``DIR`` holds
the development PKI, the token issuer's public key and the tokens (bench_picoquic writes them).

Each party waits for ``start`` (its peers' URIs: ``upstream`` for a relay, ``direct`` and ``relay`` for
subscribers), then answers commands, one JSON object a line on stdin, with one JSON line on stdout prefixed by
`PREFIX` (so stray output of a C library cannot pass for an answer); logs go to stderr. Every party
answers ``cpu`` (its user+sys seconds, all threads, and those of its event-loop thread; the rest is
picoquic's network thread where there is one), ``profile_on``/``profile_off`` (a cProfile of the
event loop's thread, summarised by `benchmarks.profiling.summarize`) and ``stop``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import aiohttp
import uvloop
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from benchmarks.profiling import summarize
from kvsp.client.moqt import BLOCK_CLIENT_QUIC
from kvsp.service.tls import TlsFiles, client_context, server_context
from moqt.api import MemoryTrackSource, MoqtObject, Publisher, Subscriber, UpstreamLink, allow_authenticated
from moqt.quic import EndpointConfig, QuicSettings
from moqt.wire import Location, Namespace
from relay.server import Relay
from relay.settings import RELAY_QUIC, RelaySettings

PREFIX: Final = "@@bench "
MiB: Final = 1 << 20
LAYERS: Final = 32  # one MOQT object per layer, as bench_moqt and bench_relay lay blocks out
BLOCKS: Final = 4  # distinct stored blocks per size, fetched in turn
TRACK: Final = b"kv"
POOLS: Final = ("b", "r")  # "b": blocks fetched directly (and over HTTPS); "r": fetched once each through a relay
Reply = dict[str, Any]
Handler = Callable[[dict[str, Any]], Awaitable[Reply]]


def block_ns(pool: str, mib: int, index: int) -> Namespace:
    return (b"bench", pool.encode(), str(mib).encode(), str(index).encode())


def layer_octets(mib: int) -> int:
    return mib * MiB // LAYERS


def block_data(mib: int, index: int) -> bytes:
    """Random octets: block ``index`` of ``mib`` MiB (nothing checks their values, only their count)."""
    return os.urandom(mib * MiB)


def say(reply: Reply) -> None:
    sys.stdout.write(PREFIX + json.dumps(reply) + "\n")
    sys.stdout.flush()


# -- CPU and profiles, every party -------------------------------------------------------------------
def cpu_now() -> Reply:
    """CPU seconds (user+sys) of the whole process, every thread (ended ones included), and of the event
    loop's thread (this one: commands are answered on the loop), at nanosecond resolution (os.times and
    /proc count 10 ms ticks, too coarse for one block)."""
    return {"cpu": time.process_time(), "loop": time.thread_time()}


async def _command_lines() -> asyncio.StreamReader:
    """stdin read on the event loop, not by a thread: then the loop's thread is the only Python thread, so a
    thread-CPU cProfile of it sees all the Python work (picoquic's network thread runs no Python)."""
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def serve_commands(lines: asyncio.StreamReader, handle: Handler | None = None) -> None:
    """Answer the parent's commands until ``stop`` (or until stdin closes: the parent is gone)."""
    profiler: cProfile.Profile | None = None
    while line := await lines.readline():
        command: dict[str, Any] = json.loads(line)
        op = command["op"]
        if op == "stop":
            return
        if op == "cpu":
            say(cpu_now())
        elif op == "profile_on":
            profiler = cProfile.Profile(time.thread_time)  # this thread's CPU: not waits, nor picoquic's thread
            profiler.enable()
            say({})
        elif op == "profile_off" and profiler is not None:
            profiler.disable()
            say({"profile": summarize(profiler)})
            profiler = None
        elif handle is not None:
            say(await handle(command))
        else:
            say({"error": f"unknown command {op!r}"})


# -- configuration -------------------------------------------------------------------------------------
def issuer_keys(directory: Path) -> tuple[ec.EllipticCurvePublicKey, ...]:
    key = serialization.load_pem_public_key((directory / "issuer.pub.pem").read_bytes())
    assert isinstance(key, ec.EllipticCurvePublicKey)
    return (key,)


def token(directory: Path, name: str) -> bytes:
    return (directory / f"{name}.token").read_bytes()


ETHERNET: Final = "aioquic-ethernet"
"""aioquic with the datagram size it uses to any peer off loopback (``max_datagram_size``, 1452: Ethernet's
MTU), also on loopback: how it moves blocks between racks, where no 64 KiB datagram fits the path."""


def endpoint(directory: Path, role: str, settings: QuicSettings, quic: str) -> EndpointConfig:
    """A role's certificate and the deployment CA; token keys for servers (a picoquic server authenticates
    clients by token only, an aioquic one by certificate here)."""
    if quic == ETHERNET:
        settings, quic = replace(settings, loopback_datagram_size=settings.max_datagram_size), "aioquic"
    return EndpointConfig.from_files(directory / f"{role}.pem", directory / f"{role}.key", directory / "ca.pem",
                                     replace(settings, quic=quic), token_keys=issuer_keys(directory))


def client_token(directory: Path, name: str, quic: str) -> bytes | None:
    """picoquic clients present no certificate, so they authenticate by token; aioquic ones by certificate."""
    return token(directory, name) if quic == "picoquic" else None


def stored_blocks(sizes: Iterable[int], relay_blocks: int) -> dict[Namespace, bytes]:
    blocks = {block_ns("b", mib, i): block_data(mib, i) for mib in sizes for i in range(BLOCKS)}
    shared = blocks[block_ns("b", 2, 0)] if relay_blocks else b""
    blocks.update({block_ns("r", 2, j): shared for j in range(relay_blocks)})  # one buffer, many tracks
    return blocks


# -- publisher ----------------------------------------------------------------------------------------
async def publisher_role(args: argparse.Namespace, start: dict[str, Any], lines: asyncio.StreamReader) -> None:
    source = MemoryTrackSource()
    for namespace, data in stored_blocks(args.sizes, args.relay_blocks).items():
        size, view = len(data) // LAYERS, memoryview(data)
        source.put(namespace, TRACK, [MoqtObject(0, n, view[n * size : (n + 1) * size]) for n in range(LAYERS)])
    publisher = Publisher(source, authorize=allow_authenticated)
    port = await publisher.listen("127.0.0.1", 0, endpoint(args.dir, "publisher", QuicSettings(), args.quic))
    say({"port": port})
    try:
        await serve_commands(lines)
    finally:
        await asyncio.wait_for(publisher.close(), 10.0)


# -- HTTPS server -------------------------------------------------------------------------------------
def https_app(blocks: dict[Namespace, bytes]) -> web.Application:
    """``/blocks/POOL/MIB/I``: the block in one write (the throughput baseline); ``/layered/...``: one write
    and drain per layer (the first-layer baseline, as bench_moqt's layered handler)."""
    def lookup(request: web.Request) -> bytes:
        m = request.match_info
        return blocks[block_ns(m["pool"], int(m["mib"]), int(m["i"]))]

    async def whole(request: web.Request) -> web.Response:
        return web.Response(body=lookup(request), content_type="application/octet-stream")

    async def layered(request: web.Request) -> web.StreamResponse:
        data = lookup(request)
        response = web.StreamResponse()
        response.content_type = "application/octet-stream"
        response.content_length = len(data)
        await response.prepare(request)
        size = len(data) // LAYERS
        for n in range(LAYERS):
            await response.write(data[n * size : (n + 1) * size])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/blocks/{pool}/{mib}/{i}", whole)
    app.router.add_get("/layered/{pool}/{mib}/{i}", layered)
    return app


async def https_role(args: argparse.Namespace, start: dict[str, Any], lines: asyncio.StreamReader) -> None:
    runner = web.AppRunner(https_app(stored_blocks(args.sizes, 0)), access_log=None)
    await runner.setup()
    files = TlsFiles(args.dir / "https.pem", args.dir / "https.key", args.dir / "ca.pem")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))  # bound here so that its port is known (aiohttp's site does not say)
    await web.SockSite(runner, sock, ssl_context=server_context(files)).start()
    say({"port": sock.getsockname()[1]})
    try:
        await serve_commands(lines)
    finally:
        await runner.cleanup()


# -- relay --------------------------------------------------------------------------------------------
async def relay_role(args: argparse.Namespace, start: dict[str, Any], lines: asyncio.StreamReader) -> None:
    """A relay whose upstream is the publisher (the relay dials it, as a rack relay dials its spine): both
    legs on ``--quic``, from one EndpointConfig."""
    upstream = start["upstream"]
    settings = RelaySettings("127.0.0.1", 0, "moqt://127.0.0.1:1/relay", upstream=(upstream,),
                             cache_octets=1 << 30, subscriber_buffer_octets=512 * MiB)
    relay = Relay(settings, authorize=allow_authenticated)
    config = endpoint(args.dir, "relay", RELAY_QUIC, args.quic)
    port = await relay.listen("127.0.0.1", 0, config)
    link = UpstreamLink(relay, upstream, config, token=client_token(args.dir, "relay", args.quic))
    link.start()
    await link.wait_connected(30.0)
    say({"port": port})

    async def handle(command: dict[str, Any]) -> Reply:
        return {"stats": relay.stats.to_json()} if command["op"] == "stats" else {"error": "unknown command"}

    try:
        await serve_commands(lines, handle)
    finally:
        await link.close()
        await asyncio.wait_for(relay.close(), 10.0)


# -- subscribers ----------------------------------------------------------------------------------------
async def fetch_moqt(sub: Subscriber, namespace: Namespace, octets: int) -> tuple[float, float]:
    """(first object, last object) seconds after the FETCH was sent; every object counted."""
    start = time.perf_counter()
    first, count, got = 0.0, 0, 0
    async with sub.fetch(namespace, TRACK, Location(0, 0), Location(0, LAYERS), stall_timeout_s=30.0) as objects:
        async for obj in objects:
            count, got = count + 1, got + obj.payload.nbytes
            first = first or time.perf_counter() - start
    if count != LAYERS or got != octets:
        raise RuntimeError(f"FETCH of {namespace}: {count} objects, {got} octets")
    return first, time.perf_counter() - start


async def fetch_https(session: aiohttp.ClientSession, url: str, octets: int, layered: bool) -> tuple[float, float]:
    """(first layer, whole body) seconds: the first layer is timed only from the layer-by-layer handler."""
    start = time.perf_counter()
    async with session.get(url) as response:
        response.raise_for_status()
        head = await response.content.readexactly(octets // LAYERS) if layered else b""
        first = time.perf_counter() - start
        got = len(head) + len(await response.read())
    if got != octets:
        raise RuntimeError(f"GET {url}: {got} octets")
    whole = time.perf_counter() - start
    return (first if layered else whole), whole


async def batch(fetch: Callable[[int], Awaitable[tuple[float, float]]], blocks: list[int],
                concurrency: int) -> Reply:
    """``blocks`` fetched with ``concurrency`` in flight; the wall time of all and each one's timings."""
    queue = iter(blocks)
    fetches: list[tuple[float, float]] = []

    async def worker() -> None:
        for index in queue:
            fetches.append(await fetch(index))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"elapsed": time.perf_counter() - start, "fetches": fetches}


async def moqt_sub_role(args: argparse.Namespace, start: dict[str, Any], lines: asyncio.StreamReader) -> None:
    config = endpoint(args.dir, "subscriber", BLOCK_CLIENT_QUIC, args.quic)  # as the block client reads blocks
    tok = client_token(args.dir, "subscriber", args.quic)
    subs = {target: await Subscriber.connect(start[target], config, token=tok, timeout_s=60.0)
            for target in ("direct", "relay") if start.get(target)}
    say({"draft": subs["direct"].endpoint.session.profile.draft})

    async def handle(command: dict[str, Any]) -> Reply:
        sub, pool, mib = subs[command["target"]], command["pool"], command["mib"]
        return await batch(lambda i: fetch_moqt(sub, block_ns(pool, mib, i), mib * MiB), command["blocks"],
                           command["concurrency"])

    try:
        await serve_commands(lines, handle)
    finally:
        for sub in subs.values():
            await sub.close()


async def https_sub_role(args: argparse.Namespace, start: dict[str, Any], lines: asyncio.StreamReader) -> None:
    files = TlsFiles(args.dir / "subscriber.pem", args.dir / "subscriber.key", args.dir / "ca.pem")
    connector = aiohttp.TCPConnector(ssl=client_context(files), limit=64)  # a keep-alive pool, as HolderClient
    timeout = aiohttp.ClientTimeout(total=120.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        say({})

        async def handle(command: dict[str, Any]) -> Reply:
            pool, mib, layered = command["pool"], command["mib"], command.get("layered", False)
            route = "layered" if layered else "blocks"
            return await batch(lambda i: fetch_https(session, f"{start['direct']}/{route}/{pool}/{mib}/{i}", mib * MiB,
                                                     layered), command["blocks"], command["concurrency"])

        await serve_commands(lines, handle)


Role = Callable[[argparse.Namespace, dict[str, Any], asyncio.StreamReader], Awaitable[None]]
ROLES: Final[dict[str, Role]] = {
    "publisher": publisher_role, "https": https_role, "relay": relay_role, "moqt-sub": moqt_sub_role,
    "https-sub": https_sub_role}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pico_parties")
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("dir", type=Path)
    parser.add_argument("--quic", default="aioquic", choices=("aioquic", "picoquic", ETHERNET))
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[2, 16])
    parser.add_argument("--relay-blocks", type=int, default=0)
    parser.add_argument("--loop", default="uvloop", choices=("uvloop", "asyncio"))
    return parser.parse_args(argv)


async def run_role(args: argparse.Namespace) -> None:
    """Wait for ``start`` (the peers' URIs: the parent starts every party at once, so that their imports
    overlap, and tells each one where its peers are once they listen), then play the role."""
    lines = await _command_lines()
    start: dict[str, Any] = json.loads(await lines.readline() or "{}")
    if start.get("op") == "start":
        await ROLES[args.role](args, start, lines)


def main(argv: list[str]) -> None:
    args = parse(argv)
    if args.loop == "uvloop":  # as kvsp serve runs its roles
        uvloop.run(run_role(args))
    else:
        asyncio.run(run_role(args))


if __name__ == "__main__":
    main(sys.argv[1:])
