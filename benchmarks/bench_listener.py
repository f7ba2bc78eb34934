"""Slow, greedy and refused clients against real ``kvsp serve`` listeners (issue 17 items 1, 2 and 6).

For each source tree measured (``--tree``, and ``--compare`` for a baseline such as the tree before the
change, in the same run), this starts ``kvsp serve is`` and ``kvsp serve frontend`` from that tree, with
the same role files (a tree that predates the ``[server]`` limits ignores those keys), and probes them:

* ``*_open_s``: seconds until the server closes a connection that misbehaves, or the window (still
  open): partial headers, headers trickled one octet every 0.5 s, a body trickled the same way, a body
  that stops, a connection silent after its TLS handshake, a kept-alive connection without a next
  request, a TCP connection that never finishes its TLS handshake.  The role files set short limits
  (`LIMITS`) so that a run takes seconds; the goal is each limit plus a margin;
* ``connections_from_one_address``: of 80 connections from one address, each with a request answered
  and kept alive, how many the server took (goal: the cap, 64), and whether another address still gets in;
* ``health_requests_per_s``, ``health_server_cpu_us_per_request``: GET health over 8 kept-alive
  connections, 1 s rounds with each tree first in turn: the guard's cost in throughput (informative)
  and in server CPU per request (goal: the median of the rounds' ratios <= 1.15);
* ``tls_alert_*``: whether a client refused for TLS 1.2, no certificate or a foreign CA reads the TLS
  alert (1) or only an EOF or a reset (0);
* ``frontend_*``: one anonymous client opens 64 streaming completions that stay in flight (the PC and
  instance are `HeldStreams`, a double in this process); then another tenant's client, and another
  anonymous address, ask for one each.  Goals: both are admitted (1), the greedy address holds at most
  its derived cap (16).

Run: ``python -m benchmarks.bench_listener [--quick] [--tree DIR] [--compare DIR]``; prints JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from benchmarks.bench_index import _cpu_s
from benchmarks.timing import Op, add_check, case
from benchmarks.trees import ROOT, print_run, tree_parser
from control.deploy import configs
from control.deploy.frontend_double import held_streams
from control.deploy.pki import DevPki
from control.deploy.ports import free_port
from control.deploy.processes import stop_all, wait_listening
from control.up.layout import bytes_model_descriptor

LIMITS = configs.ServerLimits(handshake_timeout_ms=2000, header_timeout_ms=2000, body_timeout_ms=2000,
                              body_min_octets_per_s=1024, idle_timeout_ms=5000, send_timeout_ms=5000,
                              max_connections_per_client=64)
MARGIN_S = 2.0
BOUNDS_S = {"partial_headers": 2.0, "trickled_headers": 2.0, "trickled_body": 2.0, "stalled_body": 2.0,
            "silent_after_handshake": 2.0, "idle_after_request": 5.0, "half_open_handshake": 2.0}
API_KEY = "sk-bench-0123456789abcdef"
FRONTEND_CAP = 64  # max_concurrent: per tenant 32, per address 16 where the caps exist
CAP_PROBE = 80


def _serve(tree: Path, roles: str, config: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "control.cli", "serve", roles, "--config", str(config)],
                                cwd=config.parent, env=env, stdout=out, stderr=out)


class Probe:
    """One tree's ``kvsp serve is`` and the raw clients that misbehave at it."""

    def __init__(self, tree: Path, folder: Path) -> None:
        self.tree, self.folder = tree, folder
        folder.mkdir(parents=True, exist_ok=True)
        self.pki = DevPki.make(folder / "pki", ["is", "cli"])
        self.other = DevPki.make(folder / "other", ["cli"])
        self.port = self.pki.port("is")
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        config = configs.RoleFile(["is"], self.pki.uri("is"), configs.Tls.of("is", "pki"), limits=LIMITS)
        path = config.write(self.folder / "is.toml")
        self.proc = _serve(self.tree, "is", path, self.folder / "is.log")
        await wait_listening("is", self.port, self.proc, log=self.folder / "is.log")

    def stop(self) -> None:
        if self.proc is not None:
            stop_all([self.proc])

    async def open(self, ctx: ssl.SSLContext | bool = True, local: str = "127.0.0.1",
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection from ``local``: TLS with the client certificate, ``ctx``'s TLS, or plain (False)."""
        context = self.pki.client_ssl("cli") if ctx is True else ctx or None
        return await asyncio.wait_for(asyncio.open_connection(
            "127.0.0.1", self.port, ssl=context, server_hostname="127.0.0.1" if context else None,
            local_addr=(local, 0)), 10)


# -- slow clients -------------------------------------------------------------------------------------
HEALTH = b"GET /is/health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
LOOKUP = (b"POST /is/lookup HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/kvsp+json\r\n"
          b"Content-Length: 100000\r\n\r\n")


async def _trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, window_s: float) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError, ssl.SSLError):
        for _ in range(int(window_s / 0.5) + 1):
            await asyncio.sleep(0.5)
            if reader.at_eof():  # the server closed: writing on would only log asyncio's complaints
                return
            writer.write(b"x")
            await writer.drain()


async def _answer(reader: asyncio.StreamReader) -> None:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:] if line)
    await asyncio.wait_for(reader.readexactly(int(fields[b"content-length"])), 10)


async def _open_for(reader: asyncio.StreamReader, start: float, window_s: float) -> float:
    """Seconds from ``start`` until the server closed the connection, or the window."""
    with contextlib.suppress(ConnectionError, ssl.SSLError, TimeoutError):
        while await asyncio.wait_for(reader.read(65536), max(0.01, start + window_s - time.monotonic())):
            pass
    return round(min(time.monotonic() - start, window_s), 2)


async def attack(p: Probe, name: str, window_s: float) -> float:
    start = time.monotonic()
    reader, writer = await p.open(ctx=name != "half_open_handshake", local="127.0.0.3")
    trickling = None
    match name:
        case "partial_headers":
            writer.write(HEALTH)
        case "trickled_headers":
            writer.write(HEALTH + b"X-Slow: ")
            trickling = asyncio.create_task(_trickle(reader, writer, window_s))
        case "trickled_body":
            writer.write(LOOKUP)
            trickling = asyncio.create_task(_trickle(reader, writer, window_s))
        case "stalled_body":
            writer.write(LOOKUP + b"{" * 100)
        case "idle_after_request":
            writer.write(HEALTH + b"\r\n")
            await _answer(reader)
            start = time.monotonic()
        case "half_open_handshake":
            writer.write(b"\x16\x03\x01\x02\x00\x01")  # the start of a ClientHello
    try:
        return await _open_for(reader, start, window_s)
    finally:
        if trickling is not None:
            trickling.cancel()
        writer.close()


async def cap_probe(p: Probe) -> dict[str, float]:
    """Connections from one address, each with a request answered and then kept alive."""
    held: list[asyncio.StreamWriter] = []
    admitted = 0
    for _ in range(CAP_PROBE):
        try:
            reader, writer = await p.open()
            held.append(writer)
            writer.write(HEALTH + b"\r\n")
            await _answer(reader)
            admitted += 1
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError, TimeoutError):
            pass
    reader, writer = await p.open(local="127.0.0.2")  # while the first address holds its connections
    writer.write(HEALTH + b"Connection: close\r\n\r\n")
    other = float((await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.1 200"))
    for w in (*held, writer):
        w.close()
    return {"admitted": float(admitted), "other_address": other}


async def health_rate(p: Probe, seconds: float) -> tuple[float, float]:
    """GET health over 8 kept-alive connections for ``seconds``: requests per second, and the server's CPU
    microseconds per request (steadier than the rate on a machine shared with other work)."""
    assert p.proc is not None
    cpu_before = _cpu_s(p.proc.pid) or 0.0
    connector = aiohttp.TCPConnector(ssl=p.pki.client_ssl("cli"), limit=8, local_addr=("127.0.0.4", 0))
    count = 0
    async with aiohttp.ClientSession(connector=connector) as http:
        deadline = time.monotonic() + seconds

        async def worker() -> None:
            nonlocal count
            while time.monotonic() < deadline:
                async with http.get(p.pki.uri("is") + "health") as resp:
                    await resp.read()
                count += 1
        start = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(8)))
        elapsed = time.monotonic() - start
    return count / elapsed, ((_cpu_s(p.proc.pid) or 0.0) - cpu_before) / max(count, 1) * 1e6


def _tls_clients(p: Probe) -> dict[str, ssl.SSLContext]:
    tls12 = p.pki.client_ssl("cli")
    tls12.minimum_version = tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    anonymous = ssl.create_default_context(cafile=str(p.pki.dir / "ca.pem"))
    foreign = ssl.create_default_context(cafile=str(p.pki.dir / "ca.pem"))
    files = p.other.files("cli")
    foreign.load_cert_chain(files.cert, files.key)
    return {"tls12": tls12, "no_certificate": anonymous, "foreign_ca": foreign}


async def tls_alerts(p: Probe) -> dict[str, float]:
    """1 where the refused client reads a TLS alert, 0 where it sees only an EOF or a reset."""
    out = {}
    for name, ctx in _tls_clients(p).items():
        seen = 0.0
        try:
            reader, writer = await p.open(ctx, local="127.0.0.5")
            writer.write(HEALTH + b"\r\n")
            await asyncio.wait_for(reader.read(1), 10)
            writer.close()
        except ssl.SSLError as exc:
            seen = float("ALERT" in str(exc).upper())
        except (ConnectionError, TimeoutError):
            pass
        out[name] = seen
    return out


# -- the front end ------------------------------------------------------------------------------------
async def frontend(tree: Path, folder: Path) -> dict[str, float]:
    pki = DevPki.make(folder / "pki", ["pc", "fe"])
    (folder / "model.json").write_text(json.dumps(bytes_model_descriptor().to_json()))
    (folder / "acme.key").write_text(API_KEY)
    port = free_port()
    section = configs.FrontendSection(pc=pki.uri("pc"), listen=f"127.0.0.1:{port}", descriptor="model.json",
                                      tenants={"public": "00" * 16, "acme": "5a" * 16}, api_keys={"acme": "acme.key"},
                                      anonymous_tenant="public", max_concurrent=FRONTEND_CAP)
    path = configs.RoleFile(["frontend"], pki.uri("fe"), configs.Tls.of("fe", "pki"), sections=[section]).write(
        folder / "fe.toml")
    url = f"http://127.0.0.1:{port}/v1/completions"
    body = {"model": "kvsp-test", "prompt": "hi", "max_tokens": 4, "stream": True}
    async with held_streams(pki), contextlib.AsyncExitStack() as stack:
        proc = _serve(tree, "frontend", path, folder / "fe.log")
        stack.callback(stop_all, [proc])
        await wait_listening("frontend", port, proc, log=folder / "fe.log")

        async def client(address: str) -> aiohttp.ClientSession:
            connector = aiohttp.TCPConnector(local_addr=(address, 0), limit=0)
            return await stack.enter_async_context(aiohttp.ClientSession(connector=connector))

        async def post(http: aiohttp.ClientSession, key: str | None = None) -> int:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            resp = await asyncio.wait_for(http.post(url, json=body, headers=headers), 30)
            stack.callback(resp.close)  # held open, unread, until the end
            return resp.status

        greedy = await client("127.0.0.2")
        statuses = [await post(greedy) for _ in range(FRONTEND_CAP)]
        acme = await post(await client("127.0.0.3"), API_KEY)
        anonymous = await post(await client("127.0.0.4"))
    return {"greedy_admitted": float(statuses.count(200)), "other_tenant_ok": float(acme == 200),
            "other_anonymous_address_ok": float(anonymous == 200)}


# -- a run ----------------------------------------------------------------------------------------------
async def measure_trees(trees: list[Path], quick: bool) -> list[dict[str, object]]:
    """Every probe against every tree; the slow clients of all trees at once (their windows overlap)."""
    window = 10.0 if quick else 14.0
    with tempfile.TemporaryDirectory(prefix="kvsp-bench-listener-") as tmp:
        probes = [Probe(tree, Path(tmp) / f"t{i}") for i, tree in enumerate(trees)]
        try:
            await asyncio.gather(*(p.start() for p in probes))
            results: list[dict[str, object]] = [{"tree": str(p.tree)} for p in probes]
            for p, r in zip(probes, results, strict=True):
                r["cap"] = await cap_probe(p)
                r["tls"] = await tls_alerts(p)
            names = list(BOUNDS_S)
            opened = await asyncio.gather(*(attack(p, n, window) for p in probes for n in names))
            for i, r in enumerate(results):
                r["open_s"] = dict(zip(names, opened[i * len(names):(i + 1) * len(names)], strict=True))
            rates: list[list[tuple[float, float]]] = [[] for _ in probes]
            for k in range(6 if quick else 16):  # in alternation, each tree first in turn: load from elsewhere
                for i in (range(len(probes)) if k % 2 == 0 else reversed(range(len(probes)))):  # hits both alike
                    rates[i].append(await health_rate(probes[i], 1.0))
            for r, pairs in zip(results, rates, strict=True):
                r["health_per_s"] = round(statistics.median(rate for rate, _ in pairs), 1)
                r["health_cpu_us"] = round(statistics.median(cpu for _, cpu in pairs), 1)
            if len(probes) > 1:  # the median of the rounds' own ratios: what drifts between rounds cancels
                ratio = statistics.median(a[1] / b[1] for a, b in zip(rates[0], rates[1], strict=True))
                results[0]["health_cpu_paired_ratio"] = round(ratio, 3)
        finally:
            for p in probes:
                p.stop()
        for i, (tree, r) in enumerate(zip(trees, results, strict=True)):
            (Path(tmp) / f"fe{i}").mkdir()
            r["frontend"] = await frontend(tree, Path(tmp) / f"fe{i}")
    return results


def _figure(doc: dict[str, object], group: str, key: str | None = None) -> float:
    value = doc[group]
    if key is not None:
        assert isinstance(value, dict)
        value = value[key]
    assert isinstance(value, int | float)
    return float(value)


def rows(result: dict[str, object], baseline: dict[str, object] | None) -> list[dict[str, object]]:
    """One row per figure; the baseline tree's figure beside it (no ratio: many figures are counts or 0/1)."""
    def row(name: str, group: str, key: str | None, goal: str, unit: str, op: Op, bound: float) -> dict[str, object]:
        out = case(name, _figure(result, group, key), None, goal, unit=unit)
        if baseline is not None:
            out["baseline"] = _figure(baseline, group, key)
        return add_check(out, "value", op, bound)

    out = [row(f"{name}_open_s", "open_s", name, f"closed within its limit ({bound} s) + {MARGIN_S} s", "s", "<=",
               bound + MARGIN_S) for name, bound in BOUNDS_S.items()]
    cap = float(LIMITS.max_connections_per_client or 0)
    out.append(row("connections_from_one_address", "cap", "admitted",
                   f"of {CAP_PROBE}, at most max_connections_per_client ({cap:.0f})", "connections", "<=", cap))
    out.append(row("other_address_while_one_is_capped", "cap", "other_address", "another address is still served (1)",
                   "bool", ">=", 1))
    out.append(case("health_requests_per_s", _figure(result, "health_per_s"),
                    _figure(baseline, "health_per_s") if baseline else None,
                    "informative: the guard's cost in throughput (shared cores: noisy)", unit="requests/s"))
    cpu = case("health_server_cpu_us_per_request", _figure(result, "health_cpu_us"),
               _figure(baseline, "health_cpu_us") if baseline else None,
               "the guard costs little: paired_ratio (the median of the rounds' ratios) <= 1.15", unit="us")
    if baseline is not None:
        cpu["paired_ratio"] = _figure(result, "health_cpu_paired_ratio")
        add_check(cpu, "paired_ratio", "<=", 1.15)
    out.append(cpu)
    out += [row(f"tls_alert_{name}", "tls", name, "the refused client reads the TLS alert (1), not an EOF or a "
                "reset (0)", "bool", ">=", 1) for name in ("tls12", "no_certificate", "foreign_ca")]
    out.append(row("frontend_greedy_address_admitted", "frontend", "greedy_admitted",
                   f"of {FRONTEND_CAP} streams from one address, at most its cap ({FRONTEND_CAP // 4})", "requests",
                   "<=", FRONTEND_CAP // 4))
    out.append(row("frontend_other_tenant_ok", "frontend", "other_tenant_ok",
                   "another tenant's request is admitted (1), not 429 (0)", "bool", ">=", 1))
    out.append(row("frontend_other_anonymous_address_ok", "frontend", "other_anonymous_address_ok",
                   "another anonymous address is admitted (1), not 429 (0)", "bool", ">=", 1))
    return out


def run(quick: bool = False, *, tree: Path = ROOT, compare: Path | None = None) -> dict[str, object]:
    trees = [tree, *([compare] if compare is not None else [])]
    results = asyncio.run(measure_trees(trees, quick))
    params: dict[str, object] = {"tree": str(tree), "limits": dataclasses.asdict(LIMITS), "results": results[0]}
    if compare is not None:
        params |= {"baseline_tree": str(compare), "baseline_results": results[1]}
    return {"name": "listener", "params": params, "cases": rows(results[0], results[1] if compare else None)}


def _main() -> None:
    print_run(run, tree_parser(__doc__).parse_args())


if __name__ == "__main__":
    _main()
