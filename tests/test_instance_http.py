"""The inference instance over HTTPS: real instances (each also a holder), the real IS and a real holder on
loopback with mutual TLS, and a PC double.  Directives, prefetch, generation with checkpoints, the
token stream, and the lifecycle."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from pathlib import Path

import pytest

from control.deploy.pki import DevPki
from control.holder.store import BlockId
from control.instance.records import EndLine
from kvsp.client.index import IndexClient
from kvsp.engine import greedy_sampler, top_p_sampler
from kvsp.registry import InstanceState
from kvsp.service.policy import Quotas
from tests.support.instance import (
    COMPAT,
    NAMES,
    PROMPT,
    SCOPE,
    B,
    World,
    keys_of,
    reference_block,
    reference_tokens,
    replica_record,
    stalled_holder,
    start_body,
    tokens_of,
    world,
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return DevPki.make(tmp_path_factory.mktemp("pki"), NAMES)


def sid() -> str:
    return str(uuid.uuid4())


def directive(w: World, keys: list[bytes], sources: list[str], *, deadline_ms: int = 5000) -> dict[str, object]:
    return {"directive": sid(), "scope_id": SCOPE.hex(), "compat_id": COMPAT.hex(), "deadline_ms": deadline_ms,
            "lease_ms": 2000, "blocks": [{"block_key": k.hex(), "sources": sources} for k in keys]}


async def prefetch_state(w: World, location: str, *, until: tuple[str, ...] = ("complete", "partial", "failed"),
                         timeout: float = 10.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        status, body = await w.call("pc", "GET", location)
        assert status == 200 and isinstance(body, dict)
        if not until or body["state"] in until or time.monotonic() > deadline:
            return body
        await asyncio.sleep(0.02)


# -- authorization ---------------------------------------------------------------------------------
async def test_directives_from_anyone_but_the_pc_are_forbidden(pki: DevPki, tmp_path: Path) -> None:
    async with world(pki, tmp_path) as w:
        s = sid()
        keys = keys_of(PROMPT)
        calls = [
            ("PUT", "state", {"state": "draining"}),
            ("POST", "prefetch", directive(w, keys, [pki.uri("h1")])),
            ("POST", f"sessions/{s}/start", start_body(s, greedy_sampler())),
            ("POST", "reshard", {"map": "m", "from": 1, "to": 2, "deadline_ms": 100, "retain": [], "fetch": [],
                                 "release": []}),
            ("GET", f"prefetch/{sid()}", None),
        ]
        for method, path, body in calls:
            status, problem = await w.call("other", method, w.url("ii1", path), body)
            assert status == 403, (path, problem)
            assert isinstance(problem, dict) and problem["status"] == 403
        status, _ = await w.call("other", "GET", w.url("ii1", "shards/m?tokens=0-4"))
        assert status == 403  # not a peer
        assert w.role("ii1").instance.lifecycle.state is InstanceState.ACTIVE
        # a reader without the scope cannot follow a session's tokens
        assert (await w.call("pc", "POST", w.url("ii1", f"sessions/{s}/start"), start_body(s, greedy_sampler())))[0] \
            == 202
        status, problem = await w.call("other", "GET", w.url("ii1", f"sessions/{s}/tokens"))
        assert status == 403 and isinstance(problem, dict) and problem["type"].endswith("kvsp-scope-denied")


# -- prefetch (section 6.5) ------------------------------------------------------------------------
async def test_prefetch_loads_blocks_from_another_holder_and_publishes_them(pki: DevPki, tmp_path: Path) -> None:
    async with world(pki, tmp_path) as w:
        keys = await w.put_blocks(PROMPT, [0, 1])
        status, body = await w.call("pc", "POST", w.url("ii1", "prefetch"), directive(w, keys, [pki.uri("h1")]))
        assert status == 202 and isinstance(body, dict)
        location = w.url("ii1", f"prefetch/{body['directive']}")
        state = await prefetch_state(w, location)
        assert state["state"] == "complete" and state["loaded"] == [k.hex() for k in keys]
        holder = w.holder("ii1")
        for i, key in enumerate(keys):
            entry = holder.store.get(BlockId(COMPAT, SCOPE, key), holder.clock())
            assert entry is not None and entry.meta.repr_digest is not None
            served = await holder.representation(entry, entry.meta.layers)
            assert b"".join(bytes(p) for p in served.parts) == reference_block(PROMPT, i)
        await w.wait_published(keys, pki.uri("ii1"))  # a new replica, at the instance's holder
        groups = await w.lookup(keys)
        assert {r.holder for r in groups[0]} == {pki.uri("h1"), pki.uri("ii1")}
        # the prefetched prefix serves the next session: nothing fetched remotely, only the tail computed
        s = sid()
        assert (await w.call("pc", "POST", w.url("ii1", f"sessions/{s}/start"),
                             start_body(s, greedy_sampler(), max_tokens=3)))[0] == 202
        lines = await w.stream("ii1", s)
        assert [t for _, _, t in tokens_of(lines)] == reference_tokens(PROMPT, 3, greedy_sampler())
        assert await w.metric("ii1", 'kvsp_instance_tokens_fetched_total{source="local"}') == 2 * B
        assert await w.metric("ii1", "kvsp_instance_tokens_recomputed_total") == len(PROMPT) - 2 * B
        assert await w.metric("ii1", 'kvsp_instance_prefetches_total{state="complete"}') == 1


async def test_prefetch_deadline_reports_partial_and_the_pending_quota(pki: DevPki, tmp_path: Path) -> None:
    """Block 0 comes from h1, block 1 only from a holder that never answers: partial at the deadline."""
    quotas = Quotas(pending_directives_per_instance=1)
    async with world(pki, tmp_path, quotas=quotas) as w, stalled_holder(pki) as slow:
        keys = await w.put_blocks(PROMPT, [0])
        async with pki.session("slow") as session:  # the stalled holder's replica of block 1, at the IS
            await IndexClient(session, pki.uri("is")).publish(replica_record(keys[1], slow, reference_block(PROMPT, 1)))
        body = directive(w, keys, [pki.uri("h1"), slow], deadline_ms=1500)
        started = time.monotonic()
        status, answer = await w.call("pc", "POST", w.url("ii1", "prefetch"), body)
        assert status == 202 and isinstance(answer, dict)
        location = w.url("ii1", f"prefetch/{answer['directive']}")
        status, problem = await w.call("pc", "POST", w.url("ii1", "prefetch"), directive(w, keys[:1], [slow]))
        assert status == 429, problem  # one pending directive at most (policy quota)
        # admitted work is not blocked by the pending directive: a session runs to its end meanwhile
        s = sid()
        assert (await w.call("pc", "POST", w.url("ii1", f"sessions/{s}/start"),
                             start_body(s, greedy_sampler(), prompt=[5, 6, 7, 8, 9], max_tokens=2)))[0] == 202
        assert len(tokens_of(await w.stream("ii1", s))) == 2
        assert (await prefetch_state(w, location, until=()))["state"] == "pending"
        state = await prefetch_state(w, location)
        assert state["state"] == "partial" and state["loaded"] == [keys[0].hex()]
        assert 1.4 < time.monotonic() - started < 4.0  # the deadline, not the stalled holder, ended it


# -- generation (section 6.8, extension resources) ---------------------------------------------------
async def test_start_streams_labelled_tokens_checkpoints_every_block_and_publishes_generated_blocks(
        pki: DevPki, tmp_path: Path) -> None:
    async with world(pki, tmp_path) as w:
        s = sid()
        status, body = await w.call("pc", "POST", w.url("ii1", f"sessions/{s}/start"), start_body(s, greedy_sampler()))
        assert status == 202 and isinstance(body, dict) and body["epoch"] == 1
        lines = await w.stream("ii1", s)
        expected = reference_tokens(PROMPT, 12, greedy_sampler())
        assert tokens_of(lines) == [(i, 1, t) for i, t in enumerate(expected)]
        assert lines[-1] == EndLine("max_tokens", 1)
        # a block of the sequence completes at 12, 16 and 20 tokens (10 prompt + 2, 6, 10); then the last
        assert w.pc.offsets(s) == [2, 6, 10, 12]
        last = w.pc.checkpoints[-1]
        assert last.generated == tuple(expected) and last.prompt_blocks == tuple(keys_of(PROMPT))
        assert last.prompt_tail == PROMPT[8:] and last.sampler.step == 12
        # every complete block in the cache (prompt + 11 generated = 21 tokens: 5 blocks) is published
        sequence = [*PROMPT, *expected[:11]]
        keys = keys_of(sequence)
        assert len(keys) == 5
        await w.wait_published(keys, pki.uri("ii1"))
        holder = w.holder("ii1")
        entry = holder.store.get(BlockId(COMPAT, SCOPE, keys[4]), holder.clock())
        assert entry is not None
        served = await holder.representation(entry, entry.meta.layers)
        assert b"".join(bytes(p) for p in served.parts) == reference_block(sequence, 4)
        # a late reader starting in the middle gets the rest and the end line
        late = await w.stream("ii1", s, start=9)
        assert [t.index for t in late if not isinstance(t, EndLine)] == [9, 10, 11]
        assert await w.metric("ii1", "kvsp_instance_tokens_generated_total") == 12
        assert await w.metric("ii1", 'kvsp_instance_checkpoints_total{result="acked"}') == 4


async def test_non_deterministic_sampler_releases_nothing_before_the_ack(pki: DevPki, tmp_path: Path) -> None:
    async with world(pki, tmp_path) as w:
        w.pc.release.clear()  # the PC double holds its acknowledgements
        s = sid()
        sampler = top_p_sampler(0.9, 7)
        assert (await w.call("pc", "POST", w.url("ii1", f"sessions/{s}/start"),
                             start_body(s, sampler, max_tokens=8)))[0] == 202
        reader = asyncio.ensure_future(w.stream("ii1", s))
        await w.wait_for(lambda: w.pc.checkpoints, "a checkpoint")
        await asyncio.sleep(0.3)
        assert not reader.done()
        run = w.role("ii1").instance.run_of(s)
        assert run.log.tokens == [] and run.gate.output_offset >= 1  # sampled, not released
        released_at = time.monotonic()
        w.pc.release.set()
        lines = await reader
        assert tokens_of(lines) == [(i, 1, t) for i, t in enumerate(reference_tokens(PROMPT, 8, sampler))]
        assert lines[-1] == EndLine("max_tokens", 1)
        assert all(at >= released_at for at, _ in w.pc.acks)
        assert w.pc.offsets(s)[-1] == 8


async def test_a_stale_epoch_answer_fences_the_session(pki: DevPki, tmp_path: Path) -> None:
    async with world(pki, tmp_path) as w:
        s = sid()
        w.pc.epochs[s] = 2  # the PC has already moved the session on
        assert (await w.call("pc", "POST", w.url("ii1", f"sessions/{s}/start"),
                             start_body(s, top_p_sampler(0.9, 3), max_tokens=40)))[0] == 202
        lines = await w.stream("ii1", s)
        assert lines == []  # nothing released, no end line: the stream just ends
        assert await w.metric("ii1", 'kvsp_instance_sessions_ended_total{reason="fenced"}') == 1
        # a start with an older epoch than the one running is refused
        s2 = sid()
        assert (await w.call("pc", "POST", w.url("ii1", f"sessions/{s2}/start"),
                             start_body(s2, greedy_sampler(), epoch=3, max_tokens=1000)))[0] == 202
        status, problem = await w.call("pc", "POST", w.url("ii1", f"sessions/{s2}/start"),
                                       start_body(s2, greedy_sampler(), epoch=2))
        assert status == 409 and isinstance(problem, dict) and problem["type"].endswith("kvsp-stale-epoch")


async def test_without_a_holder_role_blocks_are_cached_here_but_not_published(pki: DevPki, tmp_path: Path) -> None:
    async with world(pki, tmp_path, roles=("instance",), instance={"replicate_to": [pki.uri("h1")]}) as w:
        for _ in range(2):
            s = sid()
            assert (await w.call("pc", "POST", w.url("ii1", f"sessions/{s}/start"),
                                 start_body(s, greedy_sampler(), max_tokens=3)))[0] == 202
            assert len(tokens_of(await w.stream("ii1", s))) == 3
        assert await w.metric("ii1", 'kvsp_instance_tokens_fetched_total{source="local"}') == 2 * B  # 2nd session
        # computed blocks were copied to replicate_to, and it is that holder which published them
        await w.role("ii1").replicator.drain()
        keys = keys_of(PROMPT)
        await w.wait_published(keys, pki.uri("h1"))
        assert all(r.holder == pki.uri("h1") for group in await w.lookup(keys) for r in group)
        # two prompt blocks and the first generated one (10 + 2 tokens in the cache); once, not per session
        assert await w.metric("ii1", 'kvsp_instance_blocks_replicated_total{result="stored"}') == 3


# -- lifecycle (section 6.3) ---------------------------------------------------------------------------
async def test_status_every_third_of_the_ttl_and_a_granted_sleep_request(pki: DevPki, tmp_path: Path) -> None:
    async with world(pki, tmp_path, instance={"status_ttl_ms": 300, "idle_for_s": 0.5}) as w:
        await asyncio.sleep(1.2)
        mine = [(at, st) for at, st in w.pc.statuses if st.instance == pki.uri("ii1")]
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(mine)]
        assert len(mine) >= 8 and max(gaps) <= 0.1 + 0.06, gaps
        assert {st.epoch for _, st in mine} == {w.role("ii1").instance.lifecycle.epoch}
        assert all(st.ttl_ms == 300 and st.batch_size == 8 for _, st in mine)
        assert any(st.requested_state is InstanceState.SLEEPING for _, st in mine)  # idle for 0.5 s: asks
        w.pc.grant_sleep = True
        lifecycle = w.role("ii1").instance.lifecycle
        await w.wait_for(lambda: lifecycle.state is InstanceState.SLEEPING, "sleeping", timeout=3)
        await w.wait_for(lambda: w.pc.statuses[-1][1].state is InstanceState.SLEEPING, "sleep reported", timeout=3)
        s = sid()
        status, problem = await w.call("pc", "POST", w.url("ii1", f"sessions/{s}/start"),
                                       start_body(s, greedy_sampler()))
        assert status == 409 and isinstance(problem, dict) and problem["type"].endswith("kvsp-invalid-state")


async def test_draining_finishes_in_flight_sessions_then_sleeps(pki: DevPki, tmp_path: Path) -> None:
    async with world(pki, tmp_path) as w:
        w.pc.release.clear()
        s = sid()
        assert (await w.call("pc", "POST", w.url("ii1", f"sessions/{s}/start"),
                             start_body(s, top_p_sampler(0.8, 1), max_tokens=6)))[0] == 202
        await w.wait_for(lambda: w.pc.checkpoints, "a checkpoint")
        status, body = await w.call("pc", "PUT", w.url("ii1", "state"), {"state": "draining"})
        assert status == 200 and body == {"state": "draining"}
        s2 = sid()
        status, _ = await w.call("pc", "POST", w.url("ii1", f"sessions/{s2}/start"), start_body(s2, greedy_sampler()))
        assert status == 409  # no new sessions while draining
        status, _ = await w.call("pc", "POST", w.url("ii1", "prefetch"), directive(w, keys_of(PROMPT), [pki.uri("h1")]))
        assert status == 409
        w.pc.release.set()
        lines = await w.stream("ii1", s)
        assert lines[-1] == EndLine("max_tokens", 1)
        lifecycle = w.role("ii1").instance.lifecycle
        await w.wait_for(lambda: lifecycle.state is InstanceState.SLEEPING, "sleeping")
        await w.wait_for(lambda: any(st.state is InstanceState.SLEEPING for _, st in w.pc.statuses), "reported")
        status, body = await w.call("pc", "PUT", w.url("ii1", "state"), {"state": "active"})
        assert status == 200 and body == {"state": "active"}


async def test_a_context_longer_than_the_lookup_quota_loads_the_prefix_the_quota_allows(
        pki: DevPki, tmp_path: Path) -> None:
    """keys_per_lookup = 1 and a prompt of two cached blocks: the IS refuses a lookup of two keys, so the
    instance asks for the first only, loads it and computes the rest (it used to load nothing)."""
    async with world(pki, tmp_path, quotas=Quotas(keys_per_lookup=1)) as w:
        for block in (0, 1):  # each published (the test's own lookups are bounded by the quota too)
            await w.put_blocks(PROMPT, [block])
        s = sid()
        assert (await w.call("pc", "POST", w.url("ii1", f"sessions/{s}/start"),
                             start_body(s, greedy_sampler(), max_tokens=3)))[0] == 202
        lines = await w.stream("ii1", s)
        assert [t for _, _, t in tokens_of(lines)] == reference_tokens(PROMPT, 3, greedy_sampler())
        assert await w.metric("ii1", 'kvsp_instance_tokens_fetched_total{source="remote"}') == B
        assert await w.metric("ii1", "kvsp_instance_tokens_recomputed_total") == len(PROMPT) - B
