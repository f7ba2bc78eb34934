"""Index Service on Redis: lookup rate of 64-key prompts, embedded vs Redis vs Redis Cluster, and CPU per lookup.

Three deployments, each of real ``kvsp serve is`` processes over mutual TLS, all running at once:

* embedded: one IS with the in-process index (``backend = "memory"``, the default) — the baseline;
* redis: one IS on one ``redis-server`` (one script call per lookup);
* cluster: two IS processes on a 3-master Redis Cluster (one script call per node and lookup);
  the client's requests alternate between the two IS processes.

The same 64 records are published to each (all hits, one replica per key).  The client is this
process (uvloop, one keep-alive session, 1, 8 and 32 requests in flight; quick: 8); it reads each
answer without parsing it.  Bursts of the three deployments alternate, so that load from elsewhere
hits all of them alike.  Each row gives CPU microseconds per lookup of every process involved, from
/proc/PID/stat utime+stime around the timed bursts: each IS per lookup it served, each redis-server
per lookup of its deployment, all server processes together (``server_cpu_us_per_lookup``), and the
client: on two shared cores CPU per lookup is the figure that predicts scaling, since the
rate is bounded by whichever process saturates a core first.
Goal: Redis (one IS) serves >= 0.5x the lookups/s of the embedded index (ratio >= 0.5).  The
cluster row is reported (no goal on two shared cores: five server processes share them).

Run: ``python -m benchmarks.bench_index_redis [--quick]``; prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import uvloop

from benchmarks.bench_index import KEYS, SCOPE, _cpu_s, _publish, _record, _session, _wait_ready
from benchmarks.timing import Sample, case
from control.deploy.configs import IndexSection, PolicyFile, RedisTable, RoleFile, ScopeEntry, Tls
from control.deploy.pki import loopback_uri
from control.deploy.processes import serve, stop_all
from control.deploy.redis import RedisCluster, RedisServer, start_cluster, start_redis
from kvsp.pki import RoleSpec, make_dev_pki
from kvsp.records import LookupRequest
from kvsp.service.tls import TlsFiles, client_context

COMPAT = bytes.fromhex("5ed5c2f238839655d7c4029e12b7f31caf9e7421f4edb4057feee6dab760ee0f")
CONCURRENCIES = (1, 8, 32)
JSON_TYPE = "application/kvsp+json"
NAMES = ("embedded", "redis", "c1", "c2")


@dataclass
class Deployment:
    """One configuration under test: its IS URLs (lookup) and the PIDs whose CPU it costs."""

    name: str
    urls: list[str]
    is_pids: list[int]
    redis_pids: list[int]
    times: list[float]
    cpu: dict[int, float]  # pid -> CPU seconds in the timed bursts
    client_cpu: float = 0.0


def _write(d: Path, server: RedisServer, cluster: RedisCluster) -> dict[str, str]:
    uris = {name: loopback_uri(name) for name in (*NAMES, "client")}
    make_dev_pki(d, [RoleSpec(n, u) for n, u in uris.items()])
    client = uris["client"]
    PolicyFile(scopes=[ScopeEntry(SCOPE.hex(), lookup=[client], store=[client])]).write(d / "policy.toml")
    sections = {
        "embedded": IndexSection(sweep_interval_s=60),
        # timeout_ms: generous, since a throughput run on shared cores is no outage test
        "redis": IndexSection(sweep_interval_s=60, backend="redis",
                              redis=RedisTable(url=server.url, timeout_ms=10_000)),
        "c1": IndexSection(sweep_interval_s=60, backend="redis",
                           redis=RedisTable(url=cluster.url, cluster=True, timeout_ms=10_000)),
    }
    sections["c2"] = sections["c1"]
    for name in NAMES:
        RoleFile(["is"], uris[name], Tls.of(name), "policy.toml", sections=[sections[name]]).write(d / f"{name}.toml")
    return uris


async def _burst(http: aiohttp.ClientSession, urls: Sequence[str], body: bytes, count: int, concurrency: int) -> None:
    """``count`` POSTs, ``concurrency`` in flight; worker w's j-th request goes to ``urls[(w + j) % n]``."""
    headers = {"Content-Type": JSON_TYPE}

    async def worker(w: int, n: int) -> None:
        for j in range(n):
            async with http.post(urls[(w + j) % len(urls)], data=body, headers=headers) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{resp.url}: HTTP {resp.status}")

    await asyncio.gather(*(worker(w, count // concurrency) for w in range(concurrency)))


def _timed_burst(runner: asyncio.Runner, http: aiohttp.ClientSession, dep: Deployment, body: bytes, count: int,
                 concurrency: int, timed: bool) -> None:
    pids = [*dep.is_pids, *dep.redis_pids]
    before = {pid: _cpu_s(pid) for pid in pids}
    cpu, start = time.process_time(), time.perf_counter()
    runner.run(_burst(http, dep.urls, body, count, concurrency))
    elapsed, client = time.perf_counter() - start, time.process_time() - cpu
    if not timed:
        return
    dep.times.append(elapsed)
    dep.client_cpu += client
    for pid in pids:
        b, a = before[pid], _cpu_s(pid)
        if a is not None and b is not None:
            dep.cpu[pid] = dep.cpu.get(pid, 0.0) + a - b


def _us(seconds: float, lookups: int) -> float:
    return round(1e6 * seconds / lookups, 1)


def _row(dep: Deployment, base: Deployment, concurrency: int, count: int, goal: str,
         goal_min_ratio: float | None) -> dict[str, object]:
    lookups = count * len(dep.times)
    ours, theirs = Sample.of(dep.times), Sample.of(base.times)
    row = case(f"lookup-{KEYS}keys-{dep.name}-c{concurrency}", ours, theirs, goal, unit=f"s per {count} lookups",
               higher_is_better=True, goal_min_ratio=goal_min_ratio)
    # Each IS serves an equal share of the lookups (requests alternate): its CPU per lookup it served.
    served = lookups / len(dep.is_pids)
    is_cpu = [_us(dep.cpu.get(p, 0.0), round(served)) for p in dep.is_pids]
    redis_cpu = [_us(dep.cpu.get(p, 0.0), lookups) for p in dep.redis_pids]  # per lookup of the deployment
    base_lookups = count * len(base.times)
    row.update(lookups_per_s=round(count / ours.median_s), baseline_lookups_per_s=round(count / theirs.median_s),
               is_cpu_us_per_lookup=is_cpu, redis_cpu_us_per_lookup=redis_cpu,
               server_cpu_us_per_lookup=_us(sum(dep.cpu.values()), lookups),
               baseline_server_cpu_us_per_lookup=_us(sum(base.cpu.values()), base_lookups),
               client_cpu_us_per_lookup=_us(dep.client_cpu, lookups),
               baseline_client_cpu_us_per_lookup=_us(base.client_cpu, base_lookups))
    return row


def _lookup_cases(quick: bool) -> list[dict[str, object]]:
    count, reps = (240, 3) if quick else (960, 5)
    concurrencies = (8,) if quick else CONCURRENCIES
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        server = start_redis(d / "redis")
        cluster = start_cluster(d / "cluster", 3)
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            uris = _write(d, server, cluster)
            procs = {name: serve("is", d / f"{name}.toml") for name in NAMES}
            records = [_record(i, uris["client"]) for i in range(KEYS)]
            body = LookupRequest(SCOPE, COMPAT, tuple(r.block_key for r in records)).to_bytes()
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                ctx = client_context(TlsFiles(d / "client.pem", d / "client.key", d / "ca.pem"))
                http = runner.run(_session(ctx))
                try:
                    for name in NAMES:
                        runner.run(_wait_ready(http, uris[name] + "lookup"))
                    for name in ("embedded", "redis", "c1"):  # c2 shares c1's cluster
                        runner.run(_publish(http, uris[name], records, body))
                    answers = {runner.run(_answer(http, uris[name], body)) for name in NAMES}
                    if len(answers) != 1:
                        raise RuntimeError("the deployments do not give the same answer")
                    for concurrency in concurrencies:
                        deps = [Deployment("embedded", [uris["embedded"] + "lookup"], [procs["embedded"].pid], [],
                                           [], {}),
                                Deployment("redis-1is", [uris["redis"] + "lookup"], [procs["redis"].pid],
                                           [server.proc.pid], [], {}),
                                Deployment("cluster-2is", [uris["c1"] + "lookup", uris["c2"] + "lookup"],
                                           [procs["c1"].pid, procs["c2"].pid], [n.proc.pid for n in cluster.nodes],
                                           [], {})]
                        n = count - count % concurrency
                        for rep in range(reps + 1):  # the first round warms up
                            for dep in deps:
                                _timed_burst(runner, http, dep, body, n, concurrency, timed=rep > 0)
                        embedded, redis, clustered = deps
                        rows.append(_row(redis, embedded, concurrency, n,
                                         "Redis (one IS) lookups/s >= 0.5x the embedded index (ratio >= 0.5)", 0.5))
                        rows.append(_row(clustered, embedded, concurrency, n,
                                         "reported: Redis Cluster (3 masters) behind two IS processes, vs embedded",
                                         None))
                finally:
                    runner.run(http.close())
        finally:
            stop_all(procs.values())
            cluster.stop(kill=True)
            server.stop(kill=True)
    for row in rows:
        row["answer_octets"] = len(next(iter(answers)))
    return rows


async def _answer(http: aiohttp.ClientSession, base: str, body: bytes) -> bytes:
    async with http.post(base + "lookup", data=body, headers={"Content-Type": JSON_TYPE}) as resp:
        data = await resp.read()
    if resp.status != 200 or json.loads(data)["matched"] != KEYS:
        raise RuntimeError(f"{base}: the benchmark prompt does not hit every key")
    return data


def run(quick: bool = False) -> dict[str, object]:
    return {"name": "index_redis", "params": {"keys": KEYS, "concurrency": [8] if quick else list(CONCURRENCIES),
                                              "cpus": os.cpu_count()},
            "cases": _lookup_cases(quick)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_index_redis")
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(run(parser.parse_args().quick), indent=2))
