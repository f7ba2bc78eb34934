"""The Placement Controller on Redis, active/standby, between real processes (decision D7).

Every test runs a real redis-server and two ``kvsp serve pc`` processes on it (``pc`` and ``pc2``, lease
ttl 1 s), a ``kvsp serve is``, a cache holder and two ``kvsp serve instance,holder`` configured with
both PCs, and a front end that follows the leader (control/deploy/system.py).  The engine is slowed to
20 ms per decoded token so that signals land mid-generation.

1. SIGKILL of the leader with a greedy and a top-p session streaming: the standby takes over within
   about one lease ttl and carries both on (no instance moves: the sessions stay at epoch 1); both
   streams complete with no index repeated and exactly the tokens of an undisturbed run.
2. A leader paused with SIGSTOP past its lease: the standby takes over and carries the session on;
   resumed (SIGCONT), the old leader's renewal is refused by the store's script, it steps down and
   answers 421 naming the new leader; no instance was fenced by it.
3. Redis paused (SIGSTOP): the leader stops acknowledging checkpoints (a top-p stream releases nothing)
   and lets its lease lapse; once Redis runs again a PC leads and the session completes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from control.deploy.redis import RedisServer, RedisUnavailable, start_redis
from control.deploy.system import FrontEnd, Output, Settings, reference_tokens, running_system
from kvsp.engine import greedy_sampler, top_p_sampler
from kvsp.records.generation import SessionState, StreamEnd

PROMPT = (128000, 791, 6460, 374, 264, 1296, 315, 279, 11, 12)
MAX_TOKENS = 80
LEASE_TTL_MS = 1000
STATUS_INTERVAL_S = 0.5  # the instances' status ttl 1.5 s, a report every third of it
INSTANCE = {"test_decode_us_per_token": 20_000, "pc_timeout_ms": 1000}
PCS = ("pc", "pc2")


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    try:
        server = start_redis(tmp_path / "redis")
    except RedisUnavailable as exc:
        if os.environ.get("KVSP_REQUIRE_REDIS") == "1":
            pytest.fail(f"KVSP_REQUIRE_REDIS=1 and {exc}")
        pytest.skip(str(exc))
    yield server
    server.stop(kill=True)


def pair(redis: RedisServer, **instance: object) -> Settings:
    return Settings(redis_url=redis.url, lease_ttl_ms=LEASE_TTL_MS, instance={**INSTANCE, **instance})


def other_pc(name: str) -> str:
    return "pc2" if name == "pc" else "pc"


async def test_sigkill_of_the_leader_mid_generation_loses_no_session(tmp_path: Path, redis: RedisServer) -> None:
    async with running_system(tmp_path / "run", pair(redis)) as system:
        leader = await system.wait_leader()
        fe = FrontEnd(system)
        greedy, sampled = greedy_sampler(), top_p_sampler(0.9, 11)
        g_info = await fe.generate(PROMPT, MAX_TOKENS, greedy)
        s_info = await fe.generate(PROMPT, MAX_TOKENS, sampled)
        killed: list[float] = []

        async def kill_at_20(out: Output) -> None:
            if len(out.delivered) == 20 and not killed:
                killed.append(system.signal(leader, signal.SIGKILL))

        g_out, s_out = await asyncio.gather(fe.receive(g_info, timeout_s=60, on_token=kill_at_20),
                                            fe.receive(s_info, timeout_s=60))
        assert killed, "the greedy session finished before the leader could be killed"
        for out, sampler in ((g_out, greedy), (s_out, sampled)):
            assert [t.index for t in out.delivered] == list(range(MAX_TOKENS))  # none repeated, none missing
            assert out.tokens == reference_tokens(PROMPT, MAX_TOKENS, sampler)  # none altered
            assert out.end == StreamEnd("max_tokens", 1)
        new = await system.wait_leader(other_than=leader)
        assert new == other_pc(leader)
        for info in (g_info, s_info):
            final = await fe.info(info.session)
            assert (final.epoch, final.state, final.instance) == (1, SessionState.FINISHED, info.instance)
        pc = await system.metrics(new)
        assert pc["kvsp_pc_takeovers_total"] == 1 and pc["kvsp_pc_leader"] == 1
        assert pc["kvsp_pc_migrations_total"] == 0  # no instance failed: the sessions never moved
        after = s_out.first_delivery_after(killed[0] + 0.05)  # the sampled stream waits for an ack
        assert after is not None
        gap = after - killed[0]
        print(f"takeover: first top-p token {gap:.3f} s after SIGKILL of the leader "
              f"(lease ttl {LEASE_TTL_MS / 1000:g} s, status interval {STATUS_INTERVAL_S} s)")
        assert gap < 4 * LEASE_TTL_MS / 1000  # the benchmark holds it to ttl + one status interval
        for name in ("ii1", "ii2"):
            assert await system.metric(name, 'kvsp_instance_checkpoints_total{result="stale"}') == 0


async def test_a_paused_old_leader_is_refused_by_the_store_and_steps_down(tmp_path: Path, redis: RedisServer) -> None:
    async with running_system(tmp_path / "run", pair(redis)) as system:
        old = await system.wait_leader()
        fe = FrontEnd(system)
        sampler = top_p_sampler(0.9, 5)
        info = await fe.generate(PROMPT, MAX_TOKENS, sampler)
        times: dict[str, float] = {}
        successor: list[str] = []
        watcher: list[asyncio.Task[None]] = []

        async def pause_then_resume() -> None:
            successor.append(await system.wait_leader(other_than=old, timeout=20))
            times["took_over"] = time.monotonic()
            await asyncio.sleep(0.5)  # the new leader acknowledges checkpoints meanwhile
            times["cont"] = system.signal(old, signal.SIGCONT)

        async def stop_at_10(out: Output) -> None:
            if len(out.delivered) == 10 and not watcher:
                times["stop"] = system.signal(old, signal.SIGSTOP)
                watcher.append(asyncio.ensure_future(pause_then_resume()))

        out = await fe.receive(info, timeout_s=60, on_token=stop_at_10)
        await watcher[0]
        new = successor[0]
        assert out.tokens == reference_tokens(PROMPT, MAX_TOKENS, sampler)
        assert [t.index for t in out.delivered] == list(range(MAX_TOKENS)) and out.end == StreamEnd("max_tokens", 1)

        async def stepped_down() -> bool:
            doc = await system.health(old)
            return doc is not None and doc["pc"] == {"role": "standby", "leader": system.uri(new)}
        await system.wait_for(stepped_down, "the old leader to step down", timeout=10)
        stale = await system.metrics(old)
        assert stale["kvsp_pc_leader"] == 0 and stale["kvsp_pc_step_downs_total"] == 1
        # Its first lease call after the pause was refused by the script (the lease holds the new
        # leader's fence), and any write it tried was refused the same way: nothing it wrote went through.
        # (Only if a renewal was in flight at the very moment of the SIGSTOP does its timeout fire first,
        # on resuming: then it steps down on its own deadline, before any write.)
        refused = stale.get('kvsp_pc_fenced_writes_total{op="renew"}', 0.0)
        lapsed = system.log(old).count("could not be renewed before its deadline")
        assert (refused, lapsed) in ((1.0, 0), (0.0, 1)), (refused, lapsed)
        async with system.http["fe"].get(system.uri(old) + f"sessions/{info.session}") as resp:
            body = await resp.json()
            assert resp.status == 421 and body["leader"] == system.uri(new), body
        final = await fe.info(info.session)
        assert (final.epoch, final.state) == (1, SessionState.FINISHED)
        for name in ("ii1", "ii2"):  # no instance was fenced by the old leader
            assert await system.metric(name, 'kvsp_instance_checkpoints_total{result="stale"}') == 0
        assert times["took_over"] - times["stop"] < 3 * LEASE_TTL_MS / 1000



async def test_redis_paused_stops_acknowledgements_and_the_lease_lapses(tmp_path: Path, redis: RedisServer) -> None:
    async with running_system(tmp_path / "run", pair(redis)) as system:
        await system.wait_leader()
        fe = FrontEnd(system, stall_s=5.0)
        sampler = top_p_sampler(0.9, 3)
        info = await fe.generate(PROMPT, MAX_TOKENS, sampler)
        owner = system.name_of(info.instance)
        assert owner is not None
        window: dict[str, float] = {}
        pausing: list[asyncio.Task[None]] = []

        async def pause_redis() -> None:
            window["stop"] = time.monotonic()
            redis.signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(0.4)
                window["acked_before"] = await system.metric(owner, 'kvsp_instance_checkpoints_total{result="acked"}')
                await asyncio.sleep(3.0)  # well past the lease ttl: the leader has stepped down
                window["leader_during"] = 1.0 if await system.leader() is not None else 0.0
                window["acked_after"] = await system.metric(owner, 'kvsp_instance_checkpoints_total{result="acked"}')
            finally:
                window["cont"] = time.monotonic()
                redis.signal(signal.SIGCONT)

        async def at_10(out: Output) -> None:
            if len(out.delivered) == 10 and not pausing:
                pausing.append(asyncio.ensure_future(pause_redis()))

        out = await fe.receive(info, timeout_s=60, on_token=at_10)
        await pausing[0]
        assert out.tokens == reference_tokens(PROMPT, MAX_TOKENS, sampler)
        assert [t.index for t in out.delivered] == list(range(MAX_TOKENS))
        # No acknowledgement while Redis could not record it, so no token was released meanwhile.
        assert window["acked_after"] == window["acked_before"]
        released = [at for at in out.delivered_at if window["stop"] + 0.4 <= at <= window["cont"]]
        assert released == [], f"{len(released)} tokens released while no checkpoint could be recorded"
        assert window["leader_during"] == 0.0  # nobody led on state it could not write
        steps = sum([(await system.metrics(n)).get("kvsp_pc_step_downs_total", 0.0) for n in PCS])
        assert steps >= 1
        assert (await fe.info(info.session)).state is SessionState.FINISHED
