"""Session migration (spec section 6.8): POST sessions/{session}/resume on a second instance continues from
the checkpoint's output_offset at the new epoch with exactly the tokens an uninterrupted run produces.
Real instances, the real IS and holder on loopback with mutual TLS, and a PC double."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest

from control.deploy.pki import DevPki
from control.instance.core import OutputToken
from control.instance.records import EndLine
from kvsp.engine import greedy_sampler, top_p_sampler
from kvsp.output import OutputAssembler
from kvsp.records import Sampler, SessionCheckpoint
from tests.support.instance import (
    COMPAT,
    NAMES,
    PROMPT,
    SCOPE,
    B,
    World,
    keys_of,
    reference_tokens,
    start_body,
    tokens_of,
    world,
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return DevPki.make(tmp_path_factory.mktemp("pki"), NAMES)


def sid() -> str:
    return str(uuid.uuid4())


def resume_body(checkpoint: SessionCheckpoint, epoch: int, max_tokens: int | None) -> dict[str, object]:
    body = dataclasses.replace(checkpoint, epoch=epoch).to_json()
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


async def resume(w: World, instance: str, checkpoint: SessionCheckpoint, epoch: int,
                 max_tokens: int | None = 12) -> tuple[int, object]:
    w.pc.epochs[checkpoint.session] = epoch  # the PC raised the epoch before resuming (failover)
    return await w.call("pc", "POST", w.url(instance, f"sessions/{checkpoint.session}/resume"),
                        resume_body(checkpoint, epoch, max_tokens))


@pytest.mark.parametrize("sampler", [greedy_sampler(), top_p_sampler(0.9, 11)], ids=["greedy", "top-p"])
async def test_resume_on_a_second_instance_continues_the_uninterrupted_output(
        pki: DevPki, tmp_path: Path, sampler: Sampler) -> None:
    async with world(pki, tmp_path) as w:
        s = sid()
        assert (await w.call("pc", "POST", w.url("ii1", f"sessions/{s}/start"), start_body(s, sampler)))[0] == 202
        first = await w.stream("ii1", s)
        full = [t for _, _, t in tokens_of(first)]
        assert full == reference_tokens(PROMPT, 12, sampler)
        [checkpoint] = [c for c in w.pc.checkpoints if c.session == s and c.output_offset == 6]
        # the blocks ii1 published (prompt and generated) are what ii2 loads
        await w.wait_published(keys_of([*PROMPT, *full[:6]]), pki.uri("ii1"))
        before = len(w.pc.checkpoints)
        status, body = await resume(w, "ii2", checkpoint, 2)
        assert status == 202 and isinstance(body, dict) and body["output_offset"] == 6 and body["epoch"] == 2
        rest = await w.stream("ii2", s, start=6)
        assert tokens_of(rest) == [(i, 2, full[i]) for i in range(6, 12)]
        assert rest[-1] == EndLine("max_tokens", 2)
        # what the checkpoint covers is served at the new epoch too (final tokens)
        assert tokens_of(await w.stream("ii2", s)) == [(i, 2, t) for i, t in enumerate(full)]
        # all 16 context tokens (4 blocks) came from ii1's replicas: nothing recomputed
        assert await w.metric("ii2", 'kvsp_instance_tokens_fetched_total{source="remote"}') == 16
        assert await w.metric("ii2", "kvsp_instance_tokens_recomputed_total") == 0
        assert await w.metric("ii2", "kvsp_instance_resumes_total") == 1
        ii2_checkpoints = w.pc.checkpoints[before:]
        assert ii2_checkpoints and all(c.epoch == 2 and c.output_offset > 6 for c in ii2_checkpoints)
        assert ii2_checkpoints[-1].output_offset == 12 and ii2_checkpoints[-1].generated == tuple(full)
        # the front end: ii1's stream cut after index 7, then ii2's: every index once, newest epoch
        assembler = OutputAssembler()
        delivered: list[OutputToken] = []
        for line in [*first[:8], *rest]:
            if isinstance(line, OutputToken):
                delivered += assembler.receive(line)
        assert [t.token for t in delivered] == full
        # a repeated resume is idempotent; an older epoch is refused
        assert (await resume(w, "ii2", checkpoint, 2))[0] == 202
        status, problem = await w.call("pc", "POST", w.url("ii2", f"sessions/{s}/resume"),
                                       resume_body(checkpoint, 1, 12))
        assert status == 409 and isinstance(problem, dict) and problem["type"].endswith("kvsp-stale-epoch")


async def test_resume_loads_prompt_blocks_and_recomputes_the_uncovered_tokens(pki: DevPki, tmp_path: Path) -> None:
    """No instance ran the session here: the prompt blocks are at h1, the tail and generated tokens are
    recomputed from the checkpoint, and the sampler is restored at its step."""
    sampler = top_p_sampler(0.7, 5)
    full = reference_tokens(PROMPT, 10, sampler)
    async with world(pki, tmp_path) as w:
        keys = await w.put_blocks(PROMPT, [0, 1])
        s = sid()
        checkpoint = SessionCheckpoint(s, 3, COMPAT, SCOPE, tuple(keys[:2]), PROMPT[8:], tuple(full[:5]), 5,
                                       dataclasses.replace(sampler, step=5))
        status, _ = await resume(w, "ii2", checkpoint, 3, max_tokens=10)
        assert status == 202
        lines = await w.stream("ii2", s, start=5)
        assert tokens_of(lines) == [(i, 3, full[i]) for i in range(5, 10)]
        assert await w.metric("ii2", 'kvsp_instance_tokens_fetched_total{source="remote"}') == 2 * B
        assert await w.metric("ii2", "kvsp_instance_tokens_recomputed_total") == 2 + 5  # tail + generated


async def test_resume_without_loadable_prompt_blocks_is_refused(pki: DevPki, tmp_path: Path) -> None:
    async with world(pki, tmp_path, instance={"load_timeout_ms": 500}) as w:
        s = sid()
        prompt = [1, 2, 3, 4, 5]
        checkpoint = SessionCheckpoint(s, 2, COMPAT, SCOPE, tuple(keys_of(prompt)), (5,), (), 0, greedy_sampler())
        status, problem = await resume(w, "ii2", checkpoint, 2)
        assert status == 503, problem  # the PC moves on to another instance
        status, _ = await w.call("fe", "GET", w.url("ii2", f"sessions/{s}/tokens"))
        assert status == 404
        assert w.role("ii2").instance.lifecycle.sessions == frozenset()


async def test_the_failed_instance_is_fenced_once_the_session_moved(pki: DevPki, tmp_path: Path) -> None:
    """ii1 still runs (partitioned) while the PC resumed the session on ii2: ii1's next checkpoint is
    stale, it stops, and only ii2 extends the session."""
    sampler = top_p_sampler(0.9, 2)
    async with world(pki, tmp_path) as w:
        w.pc.release.clear()  # ii1's first checkpoint waits at the PC
        s = sid()
        assert (await w.call("pc", "POST", w.url("ii1", f"sessions/{s}/start"),
                             start_body(s, sampler, max_tokens=10)))[0] == 202
        await w.wait_for(lambda: w.pc.checkpoints, "ii1's first checkpoint")
        first = w.pc.checkpoints[0]
        w.pc.epochs[s] = 2
        w.pc.release.set()  # the first ack still goes out (it was recorded); the next checkpoints are stale
        await w.wait_for(lambda: not w.role("ii1").instance.run_of(s).live, "ii1 stopped", timeout=5)
        ii1_lines = await w.stream("ii1", s)
        assert all(isinstance(t, OutputToken) and t.epoch == 1 for t in ii1_lines)  # no end line
        assert (await resume(w, "ii2", first, 2, max_tokens=10))[0] == 202
        rest = await w.stream("ii2", s, start=first.output_offset)
        full = reference_tokens(PROMPT, 10, sampler)
        assert tokens_of(rest) == [(i, 2, full[i]) for i in range(first.output_offset, 10)]
        assert await w.metric("ii1", 'kvsp_instance_sessions_ended_total{reason="fenced"}') == 1
