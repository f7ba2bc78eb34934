"""PC over HTTP (spec section 6.9, extension POST maps/{map}): reshard plans committed or aborted, who may post maps."""

from __future__ import annotations

import asyncio

from kvsp.problems import ProblemType
from tests.test_pc_http import INSTANCES, Env, env, eventually, metrics_text, problem_type

__all__ = ["env"]  # the fixture of tests/test_pc_http.py, used here too


# -- resharding (section 6.9, extension POST maps/{map}) ----------------------------------------------------
def shard_map(version: int, *owners: str) -> dict[str, object]:
    step = 96 // len(owners)
    return {"map": "m1", "version": version,
            "shards": [{"tokens": [i * step, (i + 1) * step], "instance": o} for i, o in enumerate(owners)]}


async def test_reshard_commits_when_every_member_acknowledges(env: Env) -> None:
    u = env.uri
    for name in INSTANCES:
        await env.report(name)
    assert (await env.call("ops", "POST", "maps/m1", shard_map(4, u("ii1"), u("ii2"), u("ii3"))))[0] == 201
    status, state = await env.call("ops", "POST", "maps/m1", shard_map(5, u("ii1"), u("ii2")))
    assert status == 202 and isinstance(state, dict) and state["in_progress"] == 5
    commit = {"map": "m1", "commit": 5}
    await eventually(lambda: all(commit in d.bodies("reshard") for d in env.doubles.values()))
    for double in env.doubles.values():
        plan, done = double.bodies("reshard")
        assert (plan["from"], plan["to"]) == (4, 5) and done == commit
    assert await env.call("pc", "GET", "maps/m1") == (200, {
        "map": shard_map(5, u("ii1"), u("ii2")), "in_progress": None, "last": {"version": 5, "outcome": "committed"}})
    assert 'kvsp_pc_reshards_total{outcome="committed"} 1.0' in (await metrics_text(env))[1]


async def test_reshard_aborts_when_a_member_never_answers(env: Env) -> None:
    u = env.uri
    env.doubles["ii3"].hang_plans = True
    await env.call("pc", "POST", "maps/m1", shard_map(4, u("ii1"), u("ii2"), u("ii3")))
    status, _ = await env.call("pc", "POST", "maps/m1?deadline_ms=200", shard_map(5, u("ii1"), u("ii2")))
    assert status == 202
    await eventually(lambda: all(d.bodies("reshard") for d in env.doubles.values()))
    await asyncio.sleep(0.05)  # acknowledgements of ii1 and ii2 in; ii3 hangs
    assert env.pc.reshards.in_progress("m1") == 5
    env.clock.advance(0.2)
    abort = {"map": "m1", "abort": 5}
    await eventually(lambda: all(abort in d.bodies("reshard") for d in env.doubles.values()))
    assert all({"map": "m1", "commit": 5} not in d.bodies("reshard") for d in env.doubles.values())
    status, state = await env.call("ops", "GET", "maps/m1")
    assert state == {"map": shard_map(4, u("ii1"), u("ii2"), u("ii3")), "in_progress": None,
                     "last": {"version": 5, "outcome": "aborted"}}
    assert 'kvsp_pc_reshards_total{outcome="aborted"} 1.0' in (await metrics_text(env))[1]


async def test_maps_are_for_the_pc_and_operators_only(env: Env) -> None:
    u = env.uri
    status, body = await env.call("fe", "POST", "maps/m1", shard_map(1, u("ii1")))
    assert status == 403
    status, body = await env.call("ii1", "GET", "maps/m1")
    assert status == 403
    status, body = await env.call("ops", "GET", "maps/m1")
    assert status == 404
    await env.call("ops", "POST", "maps/m1", shard_map(1, u("ii1")))
    status, body = await env.call("ops", "POST", "maps/m1", shard_map(3, u("ii2")))
    assert status == 409 and problem_type(body) == ProblemType.PLAN_CONFLICT.uri
    status, body = await env.call("ops", "POST", "maps/m2", shard_map(1, u("ii1")))
    assert status == 400  # the body names another map
