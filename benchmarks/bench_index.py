"""Index Service benchmarks: lookup throughput over mutual TLS, and memory per replica record.

* lookup: POST lookup of a 64-key prompt (all hits, one replica each) against the IS started with
  ``kvsp serve is --config FILE`` in its own process, versus a bare aiohttp HTTPS handler that parses
  the JSON request and answers with the same response document (``json.loads``/``json.dumps``), also
  in its own process, with the same TLS 1.3 mutual-authentication context and uvloop.  The client is
  this process: one session with keep-alive, 1, 8 and 32 requests in flight (quick: 1 and 8), a fixed
  number of requests per repetition; it reads each body but does not parse it, so the servers are what
  is compared.  Both servers run at once and their bursts alternate, so load from elsewhere hits both.
  Each row gives both servers' and the client's CPU microseconds per request.
  Goal: the IS serves >= 0.5x the requests/s of the bare handler (ratio >= 0.5).
* memory: tracemalloc over parsing and inserting N records into a `ReplicaIndex` (the IS's path),
  versus keeping the same parsed records in a list (what any server that keeps them must hold).
  Records without layer_digests, and with 32.  Goal: <= 1.25x the list.

Run: ``python -m benchmarks.bench_index [--quick]``; prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import uvloop
from aiohttp import web

from benchmarks.timing import case, paired
from control.deploy.configs import IndexSection, PolicyFile, RoleFile, ScopeEntry, Tls
from control.deploy.pki import loopback_uri
from control.index.store import ReplicaIndex
from kvsp.identifiers import role_id
from kvsp.pki import RoleSpec, make_dev_pki
from kvsp.records import LookupRequest, ReplicaRecord, Residency, digest_of_layers
from kvsp.registry import Tier
from kvsp.service.tls import TlsFiles, client_context, server_context

SCOPE = bytes.fromhex("6d1c6481cd428737da312c089db3832a")
COMPAT = bytes.fromhex("5ed5c2f238839655d7c4029e12b7f31caf9e7421f4edb4057feee6dab760ee0f")
KEYS = 64
CONCURRENCIES = (1, 8, 32)
JSON_TYPE = "application/kvsp+json"


def _record(i: int, holder: str, layers: int = 0) -> ReplicaRecord:
    key = hashlib.sha256(i.to_bytes(8, "big")).digest()
    digests = tuple(hashlib.sha256(key + bytes([n])).digest() for n in range(layers))
    return ReplicaRecord(block_key=key, compat_id=COMPAT, scope_id=SCOPE, holder=holder, codec=1, size=2 << 20,
                         digest=digest_of_layers(digests) if layers else hashlib.sha256(key).digest(),
                         residency=(Residency(Tier.DEVICE, (0, 15)), Residency(Tier.HOST, (16, 31))),
                         ttl_ms=600_000, layer_digests=digests)


# -- servers (each in its own process) ------------------------------------------------------------
def _write_deployment(d: Path) -> dict[str, str]:
    uris = {name: loopback_uri(name) for name in ("is", "bare", "client")}
    make_dev_pki(d, [RoleSpec(n, u) for n, u in uris.items()])
    client = uris["client"]
    PolicyFile(scopes=[ScopeEntry(SCOPE.hex(), lookup=[client], store=[client])]).write(d / "policy.toml")
    RoleFile(["is"], uris["is"], Tls.of("is"), "policy.toml", sections=[IndexSection(sweep_interval_s=60)]).write(
        d / "is.toml")
    return uris


def _bare_main(d: Path, port: int) -> None:
    """The floor: parse the JSON request, answer with a JSON document of the same size as the IS's."""
    template = json.loads((d / "response.json").read_bytes())

    async def lookup(request: web.Request) -> web.Response:
        json.loads(await request.read())
        body = json.dumps(template, separators=(",", ":"), ensure_ascii=False).encode()
        return web.Response(body=body, content_type=JSON_TYPE, headers={"Cache-Control": "no-store"})

    app = web.Application()
    app.router.add_post("/bare/lookup", lookup)
    ctx = server_context(TlsFiles(d / "bare.pem", d / "bare.key", d / "ca.pem"))
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=ctx, print=None, access_log=None,
                loop=uvloop.new_event_loop())


@contextmanager
def _process(args: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (Linux /proc), or None where that is not available."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- client -----------------------------------------------------------------------------------------
async def _wait_ready(http: aiohttp.ClientSession, url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            async with http.post(url, data=b"{}", headers={"Content-Type": JSON_TYPE}) as resp:
                await resp.read()
                return
        except aiohttp.ClientError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _burst(http: aiohttp.ClientSession, url: str, body: bytes, count: int, concurrency: int) -> None:
    """``count`` POSTs with ``concurrency`` in flight, over the session's keep-alive connections."""
    headers = {"Content-Type": JSON_TYPE}

    async def worker(n: int) -> None:
        for _ in range(n):
            async with http.post(url, data=body, headers=headers) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{url}: HTTP {resp.status}")

    await asyncio.gather(*(worker(count // concurrency) for _ in range(concurrency)))


def _lookup_cases(quick: bool) -> list[dict[str, object]]:
    count, reps = (240, 3) if quick else (1152, 5)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        uris = _write_deployment(d)
        records = [_record(i, uris["client"]) for i in range(KEYS)]
        body = LookupRequest(SCOPE, COMPAT, tuple(r.block_key for r in records)).to_bytes()
        port = int(uris["bare"].split(":")[2].split("/")[0])
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            http = runner.run(_session(client_context(TlsFiles(d / "client.pem", d / "client.key", d / "ca.pem"))))
            try:
                with _process(["-m", "control.cli", "serve", "is", "--config", str(d / "is.toml")]) as ours:
                    runner.run(_wait_ready(http, uris["is"] + "lookup"))
                    response = runner.run(_publish(http, uris["is"], records, body))
                    (d / "response.json").write_bytes(response)
                    with _process(["-m", "benchmarks.bench_index", "--bare-server", str(d), str(port)]) as bare:
                        runner.run(_wait_ready(http, uris["bare"] + "lookup"))
                        servers = ((ours, uris["is"] + "lookup"), (bare, uris["bare"] + "lookup"))
                        rows = [_lookup_row(runner, http, servers, body, c, count, reps)
                                for c in ((1, 8) if quick else CONCURRENCIES)]
            finally:
                runner.run(http.close())
    for row in rows:
        row["response_octets"] = len(response)
    return rows


Server = tuple[subprocess.Popen[bytes], str]


def _lookup_row(runner: asyncio.Runner, http: aiohttp.ClientSession, servers: tuple[Server, Server], body: bytes,
                concurrency: int, count: int, reps: int) -> dict[str, object]:
    """The IS and the bare handler at one concurrency, bursts in alternation (see `paired`), and each
    server's CPU microseconds per request over its bursts."""
    count -= count % concurrency
    (ours_proc, ours_url), (bare_proc, bare_url) = servers
    client_cpu = [0.0, 0.0]  # this process's CPU seconds in each side's bursts

    def burst(side: int, url: str) -> None:
        start = time.process_time()
        runner.run(_burst(http, url, body, count, concurrency))
        client_cpu[side] += time.process_time() - start

    before = _cpu_s(ours_proc.pid), _cpu_s(bare_proc.pid)
    ours, base = paired(lambda: burst(0, ours_url), lambda: burst(1, bare_url), reps=reps, warmup=1)
    after = _cpu_s(ours_proc.pid), _cpu_s(bare_proc.pid)
    cpu = [None if b is None or a is None else round(1e6 * (a - b) / (count * (reps + 1)))
           for b, a in zip(before, after, strict=True)]
    row = case(f"lookup-{KEYS}keys-https-c{concurrency}", ours, base,
               "IS requests/s >= 0.5x a bare aiohttp HTTPS JSON handler (ratio >= 0.5)",
               unit=f"s per {count} requests", higher_is_better=True, goal_min_ratio=0.5)
    row.update(requests_per_s=round(count / ours.median_s), baseline_requests_per_s=round(count / base.median_s),
               server_cpu_us_per_request=cpu[0], baseline_server_cpu_us_per_request=cpu[1],
               client_cpu_us_per_request=round(1e6 * client_cpu[0] / (count * (reps + 1))),
               baseline_client_cpu_us_per_request=round(1e6 * client_cpu[1] / (count * (reps + 1))))
    return row


async def _session(ctx: object) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(ssl=ctx, limit=max(CONCURRENCIES))  # type: ignore[arg-type]
    return aiohttp.ClientSession(connector=connector)


async def _publish(http: aiohttp.ClientSession, base: str, records: list[ReplicaRecord], lookup: bytes) -> bytes:
    """Publish the prompt's records, then return the IS's answer to the benchmark's lookup."""
    headers = {"Content-Type": JSON_TYPE}
    for record in records:
        url = f"{base}replicas/{role_id(record.holder)}/{record.block_key.hex()}"
        async with http.put(url, data=record.to_bytes(), headers=headers) as resp:
            if resp.status not in (200, 201):
                raise RuntimeError(f"publish: HTTP {resp.status}: {await resp.text()}")
    async with http.post(base + "lookup", data=lookup, headers=headers) as resp:
        data = await resp.read()
    if json.loads(data)["matched"] != len(records):
        raise RuntimeError("the benchmark prompt does not hit every key")
    return data


# -- memory -------------------------------------------------------------------------------------------
def _traced_bytes(build: Callable[[], object]) -> int:
    """Octets still allocated after ``build`` returns (its result kept alive), garbage collected."""
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        kept = build()
        gc.collect()
        end = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del kept
    return end - start


def _memory_cases(quick: bool) -> list[dict[str, object]]:
    n = 5_000 if quick else 50_000
    holders = [f"https://h{i}.example:8443/kvsp/" for i in range(4)]
    rows = []
    for layers in (0, 32):
        blobs = [json.dumps(_record(i, holders[i % 4], layers).to_json()).encode() for i in range(n)]

        def into_index(blobs: list[bytes] = blobs) -> object:
            index = ReplicaIndex(ttl_ms_max=600_000)
            for blob in blobs:
                record = ReplicaRecord.from_bytes(blob)
                index.put(record, role_id(record.holder), 0.0)
            return index

        def into_list(blobs: list[bytes] = blobs) -> object:
            return [ReplicaRecord.from_bytes(blob) for blob in blobs]

        ours, base = _traced_bytes(into_index) / n, _traced_bytes(into_list) / n
        row = case(f"memory-per-record-{layers}layer-digests", round(ours), round(base),
                   "<= 1.25x the parsed records kept in a list (ratio <= 1.25)", unit="octets/record",
                   goal_max_ratio=1.25)
        row["records"] = n
        rows.append(row)
    return rows


def run(quick: bool = False) -> dict[str, object]:
    return {"name": "index", "params": {"keys": KEYS, "concurrency": list(CONCURRENCIES)},
            "cases": [*_lookup_cases(quick), *_memory_cases(quick)]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_index")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--bare-server", nargs=2, metavar=("DIR", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_server:
        _bare_main(Path(args.bare_server[0]), int(args.bare_server[1]))
    else:
        print(json.dumps(run(args.quick), indent=2))
