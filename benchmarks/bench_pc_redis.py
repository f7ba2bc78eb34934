"""The Placement Controller on Redis (decision D7): what a checkpoint costs, and how long a takeover takes.

Real processes on loopback with mutual TLS, and a real redis-server started here (AOF off: the figures
are the protocol's, not the disk's; ``appendfsync always`` adds an fsync per write).

Cases:

- ``checkpoint_put_{memory,redis}``: one ``PUT sessions/{s}/checkpoint`` (section 6.8) at a ``kvsp serve
  pc`` process, from sending it to the acknowledgement, as an instance sees it (a top-p session releases
  its tokens only after this).  The PC with ``backend = "redis"`` acknowledges only once the fenced
  checkpoint script ran in Redis.  Baseline: the embedded PC.  Goal: Redis adds at most a millisecond
  to the acknowledgement (``added_ms`` <= 1.0; the ratio to the embedded PC is informative: it is
  the HTTPS exchange that sets the baseline).
- ``takeover_ttl_{N}ms``: two PCs on one Redis, lease ttl N; SIGKILL of the leader while a top-p
  session streams (each of its tokens waits for an acknowledged checkpoint) to the first token the front
  end receives after it, i.e. the first checkpoint the standby acknowledged, released and delivered.
  The killed PC is started again (it becomes the standby) before the next repetition.
  Baseline: the goal, lease ttl + one status interval (the instances report every 500 ms).  Goal:
  ratio <= 1.  ``to_leader_s`` in the row is SIGKILL to the standby leading (its health says so).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from aiohttp import web

from benchmarks.timing import Sample, add_check, case
from control.deploy import configs
from control.deploy.fixtures import DESCRIPTOR, SCOPE
from control.deploy.pki import DevPki
from control.deploy.processes import kill, serve, wait_listening
from control.deploy.redis import RedisServer, start_redis
from control.deploy.system import FrontEnd, Output, Settings, System, running_system
from control.http import json_response, make_app
from control.serve import serving
from kvsp.engine import top_p_sampler
from kvsp.identifiers import role_id
from kvsp.records import InstanceStatus, SessionCheckpoint
from kvsp.records.generation import SessionInfo
from kvsp.registry import InstanceState
from kvsp.service.config import RoleConfig, ServerConfig
from kvsp.service.policy import Policy

JSON = "application/kvsp+json"
STATUS_INTERVAL_S = 0.5  # control/deploy/system.py: status ttl 1.5 s, a report every third
PROMPT = (128000, 791, 6460, 374, 264, 1296, 315, 279, 11, 12)
DECODE_US = 20_000
KILL_AT = 15
TOKENS = 60


# -- checkpoint PUT latency -------------------------------------------------------------------------------
@asynccontextmanager
async def _instance_double(pki: DevPki) -> AsyncIterator[None]:
    """"ii1": accepts the PC's start (202) and nothing else is needed of an instance here."""
    async def start(request: web.Request) -> web.Response:
        return json_response({}, status=202)

    async def state(request: web.Request) -> web.Response:
        return web.Response(status=200, body=await request.read(), content_type=JSON)

    app = make_app(json_limit=1 << 20)
    app.router.add_post("/ii1/sessions/{s}/start", start)
    app.router.add_put("/ii1/state", state)
    config = RoleConfig(("instance",), ServerConfig(pki.uri("ii1"), "127.0.0.1", pki.port("ii1")), pki.files("ii1"),
                        Policy(), pki.dir)
    async with serving(config, app=app):
        yield


def _write_pc(tmp: Path, pki: DevPki, redis_url: str | None) -> Path:
    (tmp / "model.json").write_text(json.dumps(DESCRIPTOR.to_json()))
    members = [pki.uri(n) for n in ("pc", "ii1", "fe")]
    configs.PolicyFile(pki.uri("pc"), [pki.uri("ii1")], [configs.ScopeEntry.open_to(SCOPE, members)]).write(
        tmp / "policy.toml")
    pc = configs.PcSection(descriptors=["model.json"], status_check_interval_ms=100)
    if redis_url is not None:
        pc = dataclasses.replace(pc, backend="redis", redis=configs.RedisTable(redis_url, timeout_ms=1000),
                                 lease_ttl_ms=3000)
    return configs.RoleFile(["pc"], pki.uri("pc"), configs.Tls.of("pc"), "policy.toml", sections=[pc]).write(
        tmp / "pc.toml")


async def _checkpoint_latency(tmp: Path, redis_url: str | None, puts: int) -> Sample:
    pki = DevPki.make(tmp, ["pc", "ii1", "fe"])
    config = _write_pc(tmp, pki, redis_url)
    with (tmp / "pc.log").open("ab") as log:
        proc = serve("pc", config, cwd=tmp, stderr=log)
    try:
        await wait_listening("pc", pki.port("pc"), proc, timeout=30, log=tmp / "pc.log")
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(_instance_double(pki))
            ii1 = await stack.enter_async_context(pki.session("ii1"))
            fe = await stack.enter_async_context(pki.session("fe"))
            pc = pki.uri("pc")
            status = InstanceStatus(pki.uri("ii1"), int(time.time() * 1000), InstanceState.ACTIVE, 0, 0, 8, 0.0,
                                    1e5, 1e3, (), 60_000)
            deadline = time.monotonic() + 20
            while True:  # until the PC leads (the Redis one acquires its lease first)
                try:
                    await ii1.request_json("PUT", pc + f"instances/{role_id(status.instance)}/status", status,
                                           ok=(200,))
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
            sampler = top_p_sampler(0.9, 1)
            request = {"scope_id": SCOPE.hex(), "compat_id": DESCRIPTOR.compat_id.hex(), "prompt": list(PROMPT),
                       "max_tokens": puts + 10, "sampler": {"method": sampler.method, "params": dict(sampler.params),
                                                            "seed": sampler.seed}}
            _, body = await fe.request_json("POST", pc + "requests", request, ok=(200,))
            info = SessionInfo.from_json(body)
            times = []
            for k in range(1, puts + 1):
                checkpoint = SessionCheckpoint(info.session, info.epoch, DESCRIPTOR.compat_id, SCOPE, (), PROMPT,
                                               tuple(range(k)), k, dataclasses.replace(sampler, step=k))
                started = time.perf_counter()
                await ii1.request_json("PUT", pc + f"sessions/{info.session}/checkpoint", checkpoint, ok=(200,))
                times.append(time.perf_counter() - started)
        return Sample.of(times[min(10, len(times) // 4):])  # the first PUTs open connections
    finally:
        kill(proc)


async def _checkpoint_cases(redis: RedisServer, puts: int) -> list[dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="kvsp-bench-pc-redis-") as tmp:
        memory = await _checkpoint_latency(Path(tmp) / "memory", None, puts)
        on_redis = await _checkpoint_latency(Path(tmp) / "redis", redis.url, puts)
    rows = [case("checkpoint_put_memory", memory, None, "the embedded PC: the baseline of the Redis one"),
            case("checkpoint_put_redis", on_redis, memory,
                 "checkpoint PUT acknowledged after the fenced script in Redis: Redis adds <= 1 ms (added_ms)")]
    rows[1]["added_ms"] = round((on_redis.median_s - memory.median_s) * 1000, 3)
    add_check(rows[1], "added_ms", "<=", 1.0)
    return rows


# -- takeover ---------------------------------------------------------------------------------------------
async def _leads(system: System, name: str) -> bool:
    doc = await system.health(name)
    return doc is not None and doc.get("pc", {}).get("role") == "leader"


async def _one_takeover(system: System, rep: int) -> tuple[float, float]:
    """(SIGKILL to the standby leading, SIGKILL to the first top-p token after it)."""
    leader = await system.wait_leader(30)
    standby = "pc2" if leader == "pc" else "pc"
    await system.wait_for(lambda: _standby_ready(system, standby), f"{standby} up as the standby", 30)
    fe = FrontEnd(system, stall_s=5.0, poll_s=0.02)
    info = await fe.generate(tuple(p + rep for p in PROMPT), TOKENS, top_p_sampler(0.9, 100 + rep))
    killed: list[float] = []
    led: list[float] = []

    async def watch_standby() -> None:
        while not await _leads(system, standby):
            await asyncio.sleep(0.02)
        led.append(time.monotonic())

    watcher: list[asyncio.Task[None]] = []

    async def kill_leader(out: Output) -> None:
        if len(out.delivered) == KILL_AT and not killed:
            killed.append(system.signal(leader, signal.SIGKILL))
            watcher.append(asyncio.ensure_future(watch_standby()))

    out = await fe.receive(info, timeout_s=60, on_token=kill_leader)
    assert killed and out.end is not None and len(out.tokens) == TOKENS
    await asyncio.wait_for(watcher[0], 30)
    first = out.first_delivery_after(killed[0])
    assert first is not None
    kill(system.procs[leader])
    system.spawn(leader)  # it comes back as the standby
    await wait_listening(leader, system.pki.port(leader), system.procs[leader], timeout=30,
                         log=system.tmp / f"{leader}.log")
    return led[0] - killed[0], first - killed[0]


async def _standby_ready(system: System, name: str) -> bool:
    doc = await system.health(name)
    return doc is not None and doc.get("pc", {}).get("role") == "standby"


async def _takeover_cases(redis: RedisServer, ttls: Sequence[int], reps: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for ttl in ttls:
        settings = Settings(redis_url=redis.url, lease_ttl_ms=ttl,
                            instance={"test_decode_us_per_token": DECODE_US, "pc_timeout_ms": 1000})
        with tempfile.TemporaryDirectory(prefix="kvsp-bench-takeover-") as tmp:
            async with running_system(Path(tmp), settings) as system:
                results = [await _one_takeover(system, r) for r in range(reps)]
        goal = ttl / 1000 + STATUS_INTERVAL_S
        row = case(f"takeover_ttl_{ttl}ms", Sample.of([r[1] for r in results]), Sample(goal, goal, goal, 1),
                   "SIGKILL of the leader to the first top-p token after it <= lease ttl + one status interval "
                   "(ratio <= 1.0)", goal_max_ratio=1.0)
        row["to_leader_s"] = round(Sample.of([r[0] for r in results]).median_s, 3)
        row["lease_ttl_s"] = ttl / 1000
        add_check(row, "to_leader_s", "<=", goal)
        rows.append(row)
        await _flush(redis)
    return rows


async def _flush(redis: RedisServer) -> None:
    """Forget the previous system's PC state (each system has its own PCs and sessions)."""
    from redis.asyncio import Redis  # noqa: PLC0415 - only this suite talks to Redis directly

    client = Redis.from_url(redis.url)
    try:
        await client.flushall()
    finally:
        await client.aclose()


def run(quick: bool = False) -> dict[str, object]:
    ttls = (1000,) if quick else (1000, 2000, 4000)
    reps = 2 if quick else 5
    puts = 100 if quick else 500

    async def main(redis: RedisServer) -> list[dict[str, object]]:
        checkpoint = await _checkpoint_cases(redis, puts)
        await _flush(redis)
        return checkpoint + await _takeover_cases(redis, ttls, reps)

    with tempfile.TemporaryDirectory(prefix="kvsp-bench-redis-") as tmp:
        redis = start_redis(Path(tmp) / f"redis-{uuid.uuid4().hex[:6]}")
        try:
            rows = asyncio.run(main(redis))
        finally:
            redis.stop(kill=True)
    params: dict[str, object] = {"lease_ttls_ms": list(ttls), "reps": reps, "checkpoint_puts": puts,
                                 "status_interval_s": STATUS_INTERVAL_S, "decode_us_per_token": DECODE_US,
                                 "kill_at_token": KILL_AT, "redis_appendonly": False}
    return {"name": "pc_redis", "params": params, "cases": rows}


if __name__ == "__main__":
    print(json.dumps(run(quick=True), indent=2))
