"""The Placement Controller over real mutual TLS on loopback, with instance doubles (spec 6.3-6.9).

The PC runs combined with the IS (``roles = ["pc", "is"]``), so the PC owns the status route and
feeds the IS's board, and looks prompts up at itself.  Each inference instance is a double: a small
aiohttp app with its own certificate that records every directive the PC sends it and refuses (and
remembers) any request that does not come from the PC's identity.  The clock is a FakeClock; the only
waiting is bounded polling for the PC's asynchronous actions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from control.deploy.pki import DevPki
from control.http import identity, json_response, make_app
from control.pc.app import PC
from control.pc.service import PlacementController
from control.serve import serving
from kvsp.client.http import KvspSession
from kvsp.client.index import IndexClient
from kvsp.encoding import canonical_json
from kvsp.identifiers import role_id
from kvsp.keys import block_keys
from kvsp.problems import PROBLEM_MEDIA_TYPE, ProblemType
from kvsp.records import (
    InstanceStatus,
    Link,
    LookupRequest,
    PrefetchDirective,
    ReplicaRecord,
    Residency,
    Sampler,
    SessionCheckpoint,
)
from kvsp.registry import InstanceState, Tier
from kvsp.service.policy import Policy, ScopeGrant
from tests.support.servers import FakeClock, role_config, running
from tests.support.vectors import APPENDIX_A_COMPAT_ID, APPENDIX_A_SCOPE_ID, APPENDIX_A_SCOPE_KEY, VECTORS

SCOPE = bytes.fromhex(APPENDIX_A_SCOPE_ID)
COMPAT = bytes.fromhex(APPENDIX_A_COMPAT_ID)
B = 4  # block_tokens of the Appendix A descriptor
PROMPT = list(range(100, 118))  # 18 tokens: 4 blocks and a tail of 2
KEYS = block_keys(APPENDIX_A_SCOPE_KEY, COMPAT, B, PROMPT)
TTL_MS = 3000
JSON_TYPE = "application/kvsp+json"
INSTANCES = ["ii1", "ii2", "ii3"]
ROLES = ["pc", "fe", "h1", "ops", "other", *INSTANCES]


def problem_type(body: object) -> str | None:
    return body.get("type") if isinstance(body, dict) else None


# -- instance doubles -----------------------------------------------------------------------------------
@dataclass
class Received:
    method: str
    path: str  # relative to the instance's base URI
    body: dict[str, object]


@dataclass
class InstanceDouble:
    """An inference instance that records what the PC sends and accepts it from the PC only."""

    name: str
    uri: str
    pc: str
    received: list[Received] = field(default_factory=list)
    strangers: list[str] = field(default_factory=list)  # identities other than the PC that tried
    start_status: int = 202
    resume_status: int = 202
    hang_plans: bool = False
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = make_app(json_limit=1 << 20)
        base = "/" + self.uri.split("/", 3)[3]
        app.router.add_post(base + "prefetch", self._prefetch)
        app.router.add_post(base + "sessions/{session}/start", self._start)
        app.router.add_post(base + "sessions/{session}/resume", self._resume)
        app.router.add_post(base + "reshard", self._reshard)
        app.router.add_put(base + "state", self._state)
        return app

    async def _record(self, request: web.Request) -> dict[str, object]:
        who = identity(request)
        if who != self.pc:  # section 9: directives only from the PC
            self.strangers.append(who)
            raise web.HTTPForbidden()
        body = json.loads(await request.read())
        self.received.append(Received(request.method, request.path.split("/", 2)[2], body))
        return body  # type: ignore[no-any-return]

    async def _prefetch(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        return web.Response(status=202, headers={"Location": f"prefetch/{body['directive']}"})

    async def _start(self, request: web.Request) -> web.Response:
        await self._record(request)
        if self.start_status != 202:
            return web.Response(status=self.start_status)
        return web.Response(status=202)

    async def _resume(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.Response(status=self.resume_status)

    async def _reshard(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if "from" in body and self.hang_plans:
            await self.released.wait()  # never acknowledges: released by the abort
            return web.Response(status=409)
        if "abort" in body:
            self.released.set()
        return json_response({})

    async def _state(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        return json_response(body)

    def paths(self) -> list[str]:
        return [f"{r.method} {r.path}" for r in self.received]

    def bodies(self, suffix: str) -> list[dict[str, object]]:
        return [r.body for r in self.received if r.path.endswith(suffix)]


# -- environment ------------------------------------------------------------------------------------------
@dataclass
class Env:
    pki: DevPki
    clock: FakeClock
    app: web.Application
    doubles: dict[str, InstanceDouble]
    sessions: dict[str, KvspSession] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=dict)

    @property
    def pc(self) -> PlacementController:
        return self.app[PC]

    @property
    def base(self) -> str:
        return self.pki.uri("pc")

    def uri(self, name: str) -> str:
        return self.pki.uri(name)

    def session(self, name: str) -> KvspSession:
        if name not in self.sessions:
            self.sessions[name] = self.pki.session(name)
        return self.sessions[name]

    async def call(self, name: str, method: str, path: str, body: object | None = None
                   ) -> tuple[int, object | None]:
        """A request whose answer the test checks (every error must be Problem Details)."""
        data = canonical_json(body) if isinstance(body, dict) else (body.to_bytes() if body is not None else None)  # type: ignore[attr-defined]
        headers = {"Content-Type": JSON_TYPE} if data is not None else {}
        async with self.session(name).http.request(method, self.base + path, data=data, headers=headers) as resp:
            raw = await resp.read()
            assert resp.headers.get("Cache-Control") == "no-store"
            if resp.status >= 400:
                assert resp.content_type == PROBLEM_MEDIA_TYPE, (resp.status, raw)
            return resp.status, (json.loads(raw) if raw else None)

    def status(self, name: str, *, epoch: int | None = None, prefill: float = 10_000.0, queued: int = 0,
               state: InstanceState = InstanceState.ACTIVE, requested: InstanceState | None = None,
               ttl_ms: int = TTL_MS) -> InstanceStatus:
        links = (Link(self.uri("h1"), 100_000.0, 10),)
        return InstanceStatus(self.uri(name), epoch if epoch is not None else self.epochs.get(name, 1), state, 0,
                              queued, 8, 0.5, prefill, 1000.0, links, ttl_ms, requested)

    async def report(self, name: str, sender: str | None = None, **kw: object) -> tuple[int, object | None]:
        status = self.status(name, **kw)  # type: ignore[arg-type]
        self.epochs[name] = status.epoch
        return await self.call(sender or name, "PUT", f"instances/{role_id(status.instance)}/status", status)

    async def generate(self, name: str = "fe", **changes: object) -> tuple[int, object | None]:
        body: dict[str, object] = {"scope_id": SCOPE.hex(), "compat_id": COMPAT.hex(), "prompt": PROMPT,
                                   "max_tokens": 8, "sampler": {"method": "greedy", "params": {}, "seed": 7}}
        body.update(changes)
        return await self.call(name, "POST", "requests", body)

    async def publish_prompt_blocks(self, count: int = len(KEYS)) -> None:
        client = IndexClient(self.session("h1"), self.base)
        for key in KEYS[:count]:
            await client.publish(ReplicaRecord(key, COMPAT, SCOPE, self.uri("h1"), 1, 1 << 20, bytes(32),
                                               (Residency(Tier.HOST, (0, 31)),), 600_000))


def checkpoint(session: str, generated: tuple[int, ...], *, epoch: int = 1) -> SessionCheckpoint:
    """What an instance reports: the prompt's blocks and tail as the PC computed them, greedy sampler."""
    return SessionCheckpoint(session, epoch, COMPAT, SCOPE, tuple(KEYS), tuple(PROMPT[len(KEYS) * B:]), generated,
                             len(generated), Sampler("greedy", (), 7, len(generated), True))


async def eventually(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Bounded polling for an asynchronous action of the PC."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def make_policy(pki: DevPki) -> Policy:
    u = pki.uri
    instances = frozenset(u(n) for n in INSTANCES)
    return Policy(pc=u("pc"), scopes={SCOPE: ScopeGrant(
        lookup=frozenset({u("pc"), u("fe")}), read=instances | {u("h1")}, store=instances | {u("h1")})},
        instances=instances)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    pki = DevPki.make(tmp_path / "pki", ROLES)
    (tmp_path / "scope.key").write_text(APPENDIX_A_SCOPE_KEY.hex())
    descriptor = str(VECTORS / "appendix_a_descriptor.json")
    policy = make_policy(pki)
    sections: dict[str, dict[str, object]] = {
        "pc": {"scope_keys": {SCOPE.hex(): str(tmp_path / "scope.key")}, "descriptors": [descriptor],
               "min_active": 1, "status_check_interval_ms": 5, "call_timeout_ms": 3000,
               "operators": [pki.uri("ops")]},
        "is": {"descriptors": [descriptor], "sweep_interval_s": 0.05},
    }
    clock = FakeClock()
    doubles = {n: InstanceDouble(n, pki.uri(n), pki.uri("pc")) for n in INSTANCES}
    async with AsyncExitStack() as stack:
        for name, double in doubles.items():
            await stack.enter_async_context(serving(role_config(pki, name, ("instance",), policy), app=double.app()))
        app = await stack.enter_async_context(
            running(role_config(pki, "pc", ("pc", "is"), policy, sections), clock=clock))
        e = Env(pki, clock, app, doubles)
        try:
            yield e
        finally:
            for double in doubles.values():
                double.released.set()
            for s in e.sessions.values():
                await s.close()
    # Section 9: every directive any double received came from the PC's own identity.
    assert all(not d.strangers for d in doubles.values()), {n: d.strangers for n, d in doubles.items()}


# -- status (section 6.3) ---------------------------------------------------------------------------------
async def test_status_is_accepted_only_from_that_instance(env: Env) -> None:
    assert await env.report("ii1") == (200, {"state": "active"})
    for stranger in ("ii2", "fe"):  # another instance, or any other identity
        status, body = await env.report("ii1", sender=stranger)
        assert status == 403 and isinstance(body, dict) and body["status"] == 403
    wrong_path = env.status("ii1")
    status, _ = await env.call("ii1", "PUT", f"instances/{role_id(env.uri('ii2'))}/status", wrong_path)
    assert status == 400
    assert env.pc.registry.epoch_of(env.uri("ii1")) == 1 and len(env.pc.registry) == 1


async def test_lower_epoch_is_discarded(env: Env) -> None:
    assert (await env.report("ii1", epoch=5))[0] == 200
    status, body = await env.report("ii1", epoch=4)
    assert status == 409 and problem_type(body) == ProblemType.STALE_EPOCH.uri
    assert env.pc.registry.epoch_of(env.uri("ii1")) == 5


async def test_expired_instance_is_failed_and_never_placed(env: Env) -> None:
    await env.report("ii1", prefill=50_000.0)  # the cheaper one
    await env.report("ii2")
    env.clock.advance(2.0)
    await env.report("ii2")
    env.clock.advance(1.5)  # ii1's record (3 s) ran out; ii2's has 1.5 s left
    await eventually(lambda: env.pc.registry.state_of(env.uri("ii1")) is InstanceState.FAILED)
    status, info = await env.generate()
    assert status == 200 and isinstance(info, dict) and info["instance"] == env.uri("ii2")
    assert env.doubles["ii1"].received == []
    # The failed incarnation stays fenced; a restart (higher epoch) makes it active again.
    status, body = await env.report("ii1", epoch=1)
    assert status == 409 and problem_type(body) == ProblemType.INVALID_STATE.uri
    assert await env.report("ii1", epoch=2) == (200, {"state": "active"})


async def test_sleep_request_is_answered_by_policy(env: Env) -> None:
    await env.report("ii1", prefill=50_000.0)
    await env.report("ii2")
    assert await env.report("ii1", requested=InstanceState.SLEEPING) == (200, {"state": "draining"})
    # min_active = 1: ii2 is the last active instance, so its request is refused.
    assert await env.report("ii2", requested=InstanceState.SLEEPING) == (200, {"state": "active"})
    status, info = await env.generate()
    assert status == 200 and isinstance(info, dict) and info["instance"] == env.uri("ii2")  # not the draining one


async def test_sleeping_instance_is_woken_before_it_gets_a_session(env: Env) -> None:
    await env.report("ii1")
    await env.report("ii2")
    await env.report("ii1", requested=InstanceState.SLEEPING)
    assert await env.report("ii1", state=InstanceState.SLEEPING) == (200, {"state": "sleeping"})
    env.clock.advance(2.0)
    await env.report("ii1", state=InstanceState.SLEEPING)
    env.clock.advance(1.5)  # ii2 expired: only the sleeping ii1 is left
    status, info = await env.generate()
    assert status == 200 and isinstance(info, dict) and info["instance"] == env.uri("ii1")
    assert env.doubles["ii1"].paths()[0] == "PUT state"
    assert env.doubles["ii1"].bodies("state") == [{"state": "active"}]
    assert env.doubles["ii1"].paths()[-1].endswith("/start")


# -- placement (sections 6.2, 6.4, 6.5; extension POST requests) ---------------------------------------------
async def test_request_goes_to_the_cheapest_instance_and_starts_at_epoch_1(env: Env) -> None:
    await env.report("ii1", prefill=10_000.0)
    await env.report("ii2", prefill=40_000.0)
    await env.report("ii3", prefill=20_000.0, queued=0)
    status, info = await env.generate(session="6f1d0a9e-2c55-4d7e-9a0e-5b7f2f9f6a11")
    assert status == 200
    assert info == {"session": "6f1d0a9e-2c55-4d7e-9a0e-5b7f2f9f6a11", "instance": env.uri("ii2"), "epoch": 1,
                    "output_offset": 0, "state": "running"}
    ii2 = env.doubles["ii2"]
    assert ii2.paths() == ["POST sessions/6f1d0a9e-2c55-4d7e-9a0e-5b7f2f9f6a11/start"]  # nothing cached: no prefetch
    assert ii2.received[0].body == {
        "session": "6f1d0a9e-2c55-4d7e-9a0e-5b7f2f9f6a11", "epoch": 1, "scope_id": SCOPE.hex(),
        "compat_id": COMPAT.hex(), "prompt": PROMPT, "max_tokens": 8,
        "sampler": {"method": "greedy", "params": {}, "seed": 7, "step": 0, "deterministic": True}}
    assert env.doubles["ii1"].received == [] and env.doubles["ii3"].received == []
    status, _ = await env.generate(session="6f1d0a9e-2c55-4d7e-9a0e-5b7f2f9f6a11")
    assert status == 409  # the session exists


async def test_prefetch_is_sent_when_the_index_has_the_blocks(env: Env) -> None:
    await env.publish_prompt_blocks()
    await env.report("ii1")
    status, info = await env.generate()
    assert status == 200 and isinstance(info, dict)
    ii1 = env.doubles["ii1"]
    assert [p.split("/")[0] for p in ii1.paths()] == ["POST prefetch", "POST sessions"]  # prefetch, then start
    directive = PrefetchDirective.from_json(ii1.received[0].body)
    assert directive.block_keys == tuple(KEYS)
    assert all(b.sources == (env.uri("h1"),) for b in directive.blocks)
    assert directive.request_ref == info["session"] and directive.scope_id == SCOPE
    assert ii1.received[1].body["epoch"] == 1


async def test_statuses_reach_the_is_board_for_lookup_estimates(env: Env) -> None:
    await env.publish_prompt_blocks()
    await env.report("ii1")
    response = await IndexClient(env.session("pc"), env.base).lookup(
        LookupRequest(SCOPE, COMPAT, tuple(KEYS), (env.uri("ii1"), env.uri("ii2"))))
    assert response.matched == len(KEYS)
    [target] = response.targets  # ii2 never reported: no estimate for it
    assert target.instance == env.uri("ii1") and target.fetch_us is not None and target.recompute_us is not None


async def test_no_prefetch_when_nothing_is_cached(env: Env) -> None:
    await env.report("ii1")
    await env.generate()
    assert [p.split("/")[0] for p in env.doubles["ii1"].paths()] == ["POST sessions"]


async def test_request_refusals_are_problem_details(env: Env) -> None:
    status, body = await env.generate()
    assert status == 503  # no instance at all
    await env.report("ii1")
    status, body = await env.generate("other")
    assert status == 403 and problem_type(body) == ProblemType.SCOPE_DENIED.uri
    status, body = await env.generate(compat_id="00" * 32)
    assert status == 409 and problem_type(body) == ProblemType.INCOMPATIBLE.uri
    status, body = await env.generate(max_tokens=0)
    assert status == 400
    status, body = await env.generate(sampler={"method": "beam"})
    assert status == 400
    assert env.doubles["ii1"].received == []


async def test_refused_start_moves_the_session_on(env: Env) -> None:
    await env.report("ii1", prefill=40_000.0)
    await env.report("ii2")
    env.doubles["ii1"].start_status = 409
    status, info = await env.generate()
    assert status == 200 and isinstance(info, dict)
    assert (info["instance"], info["epoch"], info["state"]) == (env.uri("ii2"), 2, "running")
    # Nothing was computed yet, so the next instance gets the start again (with the prompt), at epoch 2:
    # a resume would name prompt blocks that no instance has.
    [start] = env.doubles["ii2"].bodies("/start")
    assert start["epoch"] == 2 and start["prompt"] == PROMPT and start["max_tokens"] == 8
    assert env.doubles["ii2"].bodies("/resume") == []


# -- checkpoints and failover (section 6.8) -----------------------------------------------------------------
async def placed_session(env: Env) -> str:
    await env.report("ii1", prefill=40_000.0)
    await env.report("ii2")
    status, info = await env.generate()
    assert status == 200 and isinstance(info, dict) and info["instance"] == env.uri("ii1")
    return str(info["session"])


async def test_checkpoints_are_acknowledged_for_the_owner_only(env: Env) -> None:
    session = await placed_session(env)
    cp = checkpoint(session, (1, 2, 3))
    status, body = await env.call("ii2", "PUT", f"sessions/{session}/checkpoint", cp)
    assert status == 403
    assert await env.call("ii1", "PUT", f"sessions/{session}/checkpoint", cp) == (
        200, {"session": session, "epoch": 1, "output_offset": 3})
    unissued = checkpoint(session, (1, 2, 3), epoch=2)
    assert (await env.call("ii1", "PUT", f"sessions/{session}/checkpoint", unissued))[0] == 409
    rewrite = checkpoint(session, (9, 9, 9, 9))  # alters output already checkpointed
    assert (await env.call("ii1", "PUT", f"sessions/{session}/checkpoint", rewrite))[0] == 409
    assert await env.call("fe", "GET", f"sessions/{session}") == (200, {
        "session": session, "instance": env.uri("ii1"), "epoch": 1, "output_offset": 3, "state": "running"})
    status, body = await env.call("other", "GET", f"sessions/{session}")
    assert status == 403
    status, body = await env.call("fe", "GET", "sessions/0b7e4c1a-9d3f-4e2a-8c6b-1f5a7d9e3c20")
    assert status == 404 and problem_type(body) == ProblemType.NOT_FOUND.uri


async def test_unknown_session_is_never_registered_by_a_checkpoint(env: Env) -> None:
    session = "0b7e4c1a-9d3f-4e2a-8c6b-1f5a7d9e3c20"
    status, _ = await env.call("fe", "PUT", f"sessions/{session}/checkpoint", checkpoint(session, (1,)))
    assert status == 403
    await env.report("ii3")  # even a live instance: only the PC opens sessions (section 9)
    status, _ = await env.call("ii3", "PUT", f"sessions/{session}/checkpoint", checkpoint(session, (1,)))
    assert status == 403 and env.pc.sessions.epoch_of(session) is None


async def test_failed_instance_sessions_resume_elsewhere_at_a_higher_epoch(env: Env) -> None:
    session = await placed_session(env)
    cp = checkpoint(session, (1, 2, 3))
    assert (await env.call("ii1", "PUT", f"sessions/{session}/checkpoint", cp))[0] == 200
    env.clock.advance(2.0)
    await env.report("ii2")
    env.clock.advance(1.5)  # ii1 expires
    ii2 = env.doubles["ii2"]
    await eventually(lambda: bool(ii2.bodies("/resume")))
    [resume] = ii2.bodies("/resume")
    assert ii2.received[-1].path == f"sessions/{session}/resume"
    assert {k: v for k, v in resume.items() if k != "max_tokens"} == checkpoint(session, (1, 2, 3), epoch=2).to_json()
    assert resume["max_tokens"] == 8
    status, body = await env.call("ii1", "PUT", f"sessions/{session}/checkpoint", checkpoint(session, (1, 2, 3, 4)))
    assert status == 409 and problem_type(body) == ProblemType.STALE_EPOCH.uri
    assert await env.call("ii2", "PUT", f"sessions/{session}/checkpoint", checkpoint(session, (1, 2, 3, 4), epoch=2)) \
        == (200, {"session": session, "epoch": 2, "output_offset": 4})
    status, info = await env.call("fe", "GET", f"sessions/{session}")
    assert info == {"session": session, "instance": env.uri("ii2"), "epoch": 2, "output_offset": 4, "state": "running"}
    status, metrics = await metrics_text(env)
    assert "kvsp_pc_migrations_total 1.0" in metrics
    assert 'kvsp_pc_stale_epoch_rejections_total{message="checkpoint"} 1.0' in metrics


async def test_finished_session_is_not_resumed(env: Env) -> None:
    session = await placed_session(env)
    done = checkpoint(session, tuple(range(8)))  # max_tokens = 8
    assert (await env.call("ii1", "PUT", f"sessions/{session}/checkpoint", done))[0] == 200
    assert (await env.call("fe", "GET", f"sessions/{session}"))[1]["state"] == "finished"  # type: ignore[index]
    env.clock.advance(2.0)
    await env.report("ii2")
    env.clock.advance(1.5)
    await eventually(lambda: env.pc.registry.state_of(env.uri("ii1")) is InstanceState.FAILED)
    await asyncio.sleep(0.05)
    assert env.doubles["ii2"].bodies("/resume") == []


async def test_session_without_instance_waits_and_is_resumed_later(env: Env) -> None:
    await env.report("ii1")
    _, info = await env.generate()
    assert isinstance(info, dict)
    session = str(info["session"])
    env.clock.advance(3.5)  # the only instance expires: nowhere to resume
    await eventually(lambda: env.pc.sessions.stranded() == [session])
    assert (await env.call("fe", "GET", f"sessions/{session}"))[1]["state"] == "stranded"  # type: ignore[index]
    await env.report("ii3")
    env.clock.advance(1.0)
    await eventually(lambda: bool(env.doubles["ii3"].bodies("/start")))
    assert env.doubles["ii3"].bodies("/start")[0]["epoch"] == 2  # no output yet: started again


async def test_moves_without_progress_are_bounded(env: Env) -> None:
    session = await placed_session(env)
    assert (await env.call("ii1", "PUT", f"sessions/{session}/checkpoint", checkpoint(session, (1, 2))))[0] == 200
    await env.report("ii3")
    for name in ("ii2", "ii3"):
        env.doubles[name].resume_status = 409  # neither can load the session's blocks
    env.clock.advance(2.0)
    await env.report("ii2")
    await env.report("ii3")
    env.clock.advance(1.5)  # ii1 expires

    def attempts() -> int:
        return sum(len(env.doubles[n].bodies("/resume")) for n in ("ii2", "ii3"))
    await eventually(lambda: env.pc.sessions.stranded() == [session])

    async def a_second_passes() -> None:  # stranded sessions are retried once a (fake) second
        env.clock.advance(1.0)
        await env.report("ii2")
        await env.report("ii3")
        await asyncio.sleep(0.03)
    for _ in range(8):
        await a_second_passes()
    await eventually(lambda: attempts() == 6)
    await a_second_passes()
    assert attempts() == 6  # the move budget is spent: no more attempts, no more epochs
    epochs = [int(str(b["epoch"])) for n in ("ii2", "ii3") for b in env.doubles[n].bodies("/resume")]
    assert sorted(epochs) == list(range(2, 8))  # every attempt fenced the one before
    _, info = await env.call("fe", "GET", f"sessions/{session}")
    assert isinstance(info, dict) and info["state"] == "stranded" and info["output_offset"] == 2


# -- identities, metrics -------------------------------------------------------------------------------------
async def test_doubles_refuse_directives_from_anyone_but_the_pc(env: Env) -> None:
    double = env.doubles["ii1"]
    async with env.session("fe").http.put(double.uri + "state", json={"state": "active"}) as resp:
        assert resp.status == 403
    assert double.strangers == [env.uri("fe")] and double.received == []
    double.strangers.clear()


async def metrics_text(env: Env) -> tuple[int, str]:
    async with env.session("ops").http.get(env.base + "metrics") as resp:
        return resp.status, await resp.text()


async def test_metrics_count_placements_and_prefetches(env: Env) -> None:
    await env.publish_prompt_blocks()
    await env.report("ii1")
    await env.generate()
    status, text = await metrics_text(env)
    assert status == 200
    assert 'kvsp_pc_placements_total{result="assigned"} 1.0' in text
    assert "kvsp_pc_cache_placements_total 1.0" in text
    assert 'kvsp_pc_prefetches_sent_total{result="accepted"} 1.0' in text
    assert 'kvsp_pc_instances{state="active"} 1.0' in text


async def test_problem_details_on_malformed_bodies(env: Env) -> None:
    async with env.session("ii1").http.put(env.base + f"instances/{role_id(env.uri('ii1'))}/status",
                                           data=b"{", headers={"Content-Type": JSON_TYPE}) as resp:
        assert resp.status == 400 and resp.content_type == PROBLEM_MEDIA_TYPE
    async with env.session("fe").http.post(env.base + "requests", data=b"{}", headers={"Content-Type": "text/plain"}
                                           ) as resp:
        assert resp.status == 415 and resp.content_type == PROBLEM_MEDIA_TYPE
    status, _ = await env.call("ii1", "PUT", "instances/short/status", env.status("ii1"))
    assert status == 400


@pytest.mark.parametrize("sender", ["fe", "pc"])
async def test_session_lookup_by_admin_and_front_end(env: Env, sender: str) -> None:
    session = await placed_session(env)
    status, info = await env.call(sender, "GET", f"sessions/{session}")
    assert status == 200 and isinstance(info, dict) and info["epoch"] == 1



async def test_instance_allow_list_limits_who_may_report(env: Env) -> None:
    env.pc.settings = dataclasses.replace(env.pc.settings, instances=frozenset({env.uri("ii1")}))
    assert (await env.report("ii1"))[0] == 200
    status, body = await env.report("ii2")
    assert status == 403 and isinstance(body, dict) and body["type"] == "about:blank"
    assert env.pc.registry.state_of(env.uri("ii2")) is None
