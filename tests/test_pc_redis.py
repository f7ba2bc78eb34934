"""Following the leader, and the PC's state across a Redis restart (decision D7).

1. `PcEndpoints` (what instances and front ends use) against PC doubles over mutual TLS: a standby's
   421 is followed to the leader it names (only if that is a configured PC), a 503 carrying
   ``"leader"`` and an unreachable PC move on, the leader's own 503 is its answer, and a pass without a
   leader ends in `LeaderUnavailable` (some PC answered) or a plain `TransportError` (none did).
2. Real processes (control/deploy/system.py with two PCs on Redis): Redis killed and restarted **with
   AOF** mid-session: the leader stops granting while Redis is down, loads its state again when the
   lease proves still its own, and the top-p session completes with exactly the undisturbed tokens.
   **Without AOF** Redis restarts empty, which is the documented degradation (docs/scale.md): the PCs
   elect a leader again within about a lease ttl, that leader knows no session (GET sessions/{s} is
   404), the instances register again with their next status report, and new requests run normally.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from control.deploy.pki import DevPki
from control.deploy.redis import RedisServer, RedisUnavailable, start_redis
from control.deploy.system import FrontEnd, Output, Settings, reference_tokens, running_system
from control.http import json_response, make_app
from control.pc.endpoints import LeaderUnavailable, PcEndpoints
from control.serve import serving
from kvsp.client.http import TransportError
from kvsp.engine import greedy_sampler, top_p_sampler
from kvsp.problems import ProblemError
from kvsp.records.generation import SessionState, StreamEnd
from kvsp.service.policy import Policy
from tests.support.servers import role_config

PROMPT = (128000, 791, 6460, 374, 264, 1296, 315, 279, 11, 12)
INSTANCE = {"test_decode_us_per_token": 20_000, "pc_timeout_ms": 1000}


# -- 1. following the leader ------------------------------------------------------------------------------
@dataclass
class PcDouble:
    """Answers ``GET sessions/x`` as told: 200, a standby's 421 naming ``leader``, or a 503."""

    answer: int = 200
    leader: str | None = None
    own_503: bool = False  # a 503 of the leader itself (no "leader" member)
    hits: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.hits.append(request.path)
        if self.answer == 200:
            return json_response({"ok": True})
        body: dict[str, object] = {"type": "about:blank", "status": self.answer, "title": "x"}
        if not self.own_503:
            body["leader"] = self.leader
        return web.json_response(body, status=self.answer, content_type="application/problem+json")


@pytest.fixture
async def doubles(tmp_path: Path) -> AsyncIterator[tuple[DevPki, dict[str, PcDouble]]]:
    pki = DevPki.make(tmp_path, ["a", "b", "c", "fe"])
    out = {name: PcDouble() for name in ("a", "b", "c")}
    async with contextlib.AsyncExitStack() as stack:
        for name, double in out.items():
            app = make_app(json_limit=1 << 16)
            app.router.add_get(f"/{name}/sessions/x", double.handle)
            await stack.enter_async_context(serving(role_config(pki, name, ("pc",), Policy()), app=app))
        yield pki, out


async def get(pki: DevPki, endpoints: PcEndpoints) -> object:
    async with pki.session("fe") as session:
        _, body = await endpoints.request_json(session, "GET", "sessions/x", timeout_s=2.0)
    return body


@pytest.mark.loopback
async def test_a_standby_s_421_is_followed_to_the_leader_it_names(doubles: tuple[DevPki, dict[str, PcDouble]]) -> None:
    pki, d = doubles
    d["a"].answer, d["a"].leader = 421, pki.uri("c")
    d["b"].answer = 200
    endpoints = PcEndpoints([pki.uri(n) for n in ("a", "b", "c")])
    assert await get(pki, endpoints) == {"ok": True}
    assert (len(d["a"].hits), len(d["b"].hits), len(d["c"].hits)) == (1, 0, 1)  # a named c: c, not b
    assert endpoints.leader == pki.uri("c")
    await get(pki, endpoints)
    assert len(d["a"].hits) == 1 and len(d["c"].hits) == 2  # it remembers the leader


@pytest.mark.loopback
async def test_503s_and_dead_pcs_are_passed_a_leader_outside_the_list_is_not(
        doubles: tuple[DevPki, dict[str, PcDouble]]) -> None:
    pki, d = doubles
    d["a"].answer = 503  # no leader known there
    d["b"].answer, d["b"].leader = 421, "https://elsewhere.example/pc/"
    endpoints = PcEndpoints([pki.uri("a"), pki.uri("b"), "https://127.0.0.1:1/dead/", pki.uri("c")])
    assert await get(pki, endpoints) == {"ok": True}
    assert endpoints.leader == pki.uri("c")
    d["c"].answer, d["c"].own_503 = 503, True  # the leader's own 503 is an answer, not "not here"
    with pytest.raises(ProblemError) as refused:
        await get(pki, endpoints)
    assert refused.value.problem.status == 503
    d["c"].own_503 = False
    with pytest.raises(LeaderUnavailable):  # every PC answered, none leads
        await get(pki, endpoints)
    with pytest.raises(TransportError) as none:
        await get(pki, PcEndpoints(["https://127.0.0.1:1/dead/"]))
    assert not isinstance(none.value, LeaderUnavailable)  # nobody answered: not an election


# -- 2. Redis restarts ------------------------------------------------------------------------------------
@dataclass
class Redis:
    server: RedisServer

    def kill(self) -> None:
        self.server.stop(kill=True)

    async def restart(self) -> None:
        self.server = await asyncio.to_thread(self.server.restart)


def redis_fixture(appendonly: bool) -> object:
    @pytest.fixture
    def fixture(tmp_path: Path) -> Iterator[Redis]:
        try:
            redis = Redis(start_redis(tmp_path / "redis", appendonly=appendonly))
        except RedisUnavailable as exc:
            if os.environ.get("KVSP_REQUIRE_REDIS") == "1":
                pytest.fail(f"KVSP_REQUIRE_REDIS=1 and {exc}")
            pytest.skip(str(exc))
        yield redis
        redis.server.stop(kill=True)
    return fixture


durable = redis_fixture(appendonly=True)
volatile = redis_fixture(appendonly=False)


async def test_with_aof_a_redis_restart_keeps_every_session(tmp_path: Path, durable: Redis) -> None:
    settings = Settings(redis_url=durable.server.url, lease_ttl_ms=2000, instance=dict(INSTANCE))
    async with running_system(tmp_path / "run", settings) as system:
        leader = await system.wait_leader()
        fe = FrontEnd(system, stall_s=5.0)
        sampler = top_p_sampler(0.9, 21)
        info = await fe.generate(PROMPT, 80, sampler)
        restarts: list[asyncio.Task[None]] = []

        async def restart() -> None:
            durable.kill()  # a crash: appendfsync always has every acknowledged write on disk
            await asyncio.sleep(0.3)
            await durable.restart()

        async def at_15(out: Output) -> None:
            if len(out.delivered) == 15 and not restarts:
                restarts.append(asyncio.ensure_future(restart()))

        out = await fe.receive(info, timeout_s=60, on_token=at_15)
        await restarts[0]
        assert out.tokens == reference_tokens(PROMPT, 80, sampler)
        assert [t.index for t in out.delivered] == list(range(80)) and out.end == StreamEnd("max_tokens", 1)
        final = await fe.info(info.session)
        assert (final.epoch, final.state, final.output_offset) == (1, SessionState.FINISHED, 80)
        now = await system.wait_leader()
        pc = await system.metrics(now)
        # The same leader, which loaded its state again once Redis was back (the lease survived in the AOF).
        assert now == leader and pc["kvsp_pc_takeovers_total"] >= 2


async def test_without_aof_a_redis_restart_forgets_sessions_and_the_pcs_start_over(tmp_path: Path,
                                                                                 volatile: Redis) -> None:
    settings = Settings(redis_url=volatile.server.url, lease_ttl_ms=1000, instance=dict(INSTANCE))
    async with running_system(tmp_path / "run", settings) as system:
        await system.wait_leader()
        fe = FrontEnd(system)
        before = await fe.generate(PROMPT, 8, greedy_sampler())
        assert (await fe.receive(before, timeout_s=30)).tokens == reference_tokens(PROMPT, 8, greedy_sampler())
        async def takeovers() -> float:
            return sum([(await system.metrics(n)).get("kvsp_pc_takeovers_total", 0.0) for n in system.pcs])
        elected = await takeovers()
        volatile.kill()
        await volatile.restart()  # empty: no AOF, no RDB

        async def elected_again() -> bool:  # the leader notices at its next renewal, a third of a ttl later
            return await takeovers() > elected
        await system.wait_for(elected_again, "a PC to lead again after the empty restart", timeout=20)

        async def forgotten() -> bool:  # the degradation: the session is forgotten.  Polled: until its next
            leader = await system.wait_leader(timeout=20)  # renewal fails, the old leader still answers
            async with system.http["fe"].get(system.uri(leader) + f"sessions/{before.session}") as resp:
                return resp.status == 404  # from memory (its writes are fenced already)
        await system.wait_for(forgotten, "the leader to have forgotten the session", timeout=20)
        await system.wait_active()  # the instances registered again with their next status report
        after = await fe.generate(PROMPT, 8, greedy_sampler())
        out = await fe.receive(after, timeout_s=30)
        assert out.tokens == reference_tokens(PROMPT, 8, greedy_sampler())
        assert await takeovers() == elected + 1  # one election after the empty restart
