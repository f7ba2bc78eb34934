"""Failover between real processes (spec sections 6.3 and 6.8): ``kvsp serve pc,is``, two
``kvsp serve instance,holder`` and a cache holder, with a front end that follows the session across
instances (control/deploy/system.py).

1. An instance is killed with SIGKILL in the middle of a greedy generation: the PC sees its status
   expire, raises the session's epoch and resumes it on the other instance; the front end receives,
   index by index, exactly the output of an uninterrupted run of the engine.
2. With a top-p sampler (not deterministic) no token reaches the front end before the PC has recorded
   a checkpoint covering it: every answer of ``GET sessions/{s}`` asked after a token arrived covers
   it, and while the PC is frozen (SIGSTOP) the instance keeps generating but releases nothing; a
   greedy session under the same freeze keeps streaming.
3. An instance frozen with SIGSTOP past its status ttl is failed over; when it runs again (SIGCONT),
   its next checkpoint is refused with kvsp-stale-epoch and its run stops, a reader of its old stream
   gets nothing the PC had not acknowledged before the failover, the front end never gets an old-epoch
   token after a new-epoch one, and the instance rejoins as a new incarnation.

The engine is slowed to 20 ms per decoded token (``[instance] test_decode_us_per_token``), so that a
signal lands mid-generation.  Each test runs in well under a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path

import aiohttp

from control.deploy.system import FrontEnd, Output, Settings, System, reference_tokens, running_system
from kvsp.engine import greedy_sampler, top_p_sampler
from kvsp.records.generation import SessionState, StreamEnd, TokenEvent, parse_stream_line

PROMPT = (128000, 791, 6460, 374, 264, 1296, 315, 279, 11, 12)  # two blocks of 4 and a tail of two
MAX_TOKENS = 80
SLOW_DECODE = {"test_decode_us_per_token": 20_000}


def other(name: str | None) -> str:
    return "ii1" if name == "ii2" else "ii2"


async def test_sigkill_mid_generation_resumes_on_the_other_instance_with_identical_output(tmp_path: Path) -> None:
    sampler = greedy_sampler()
    async with running_system(tmp_path, Settings(instance=dict(SLOW_DECODE))) as system:
        fe = FrontEnd(system)
        info = await fe.generate(PROMPT, MAX_TOKENS, sampler)
        owner = system.name_of(info.instance)
        assert info.epoch == 1 and owner in ("ii1", "ii2")
        killed: list[float] = []

        async def kill_at_20(out: Output) -> None:
            if len(out.delivered) == 20 and not killed:
                killed.append(system.signal(owner, signal.SIGKILL))

        out = await fe.receive(info, timeout_s=40, on_token=kill_at_20)
        assert killed, "the instance finished before it could be killed"
        assert [t.index for t in out.delivered] == list(range(MAX_TOKENS))
        assert out.tokens == reference_tokens(PROMPT, MAX_TOKENS, sampler)
        assert out.end == StreamEnd("max_tokens", 2)
        last = out.reconnects[-1][1]
        assert (system.name_of(last.instance), last.epoch) == (other(owner), 2)
        final = await fe.info(info.session)
        assert (final.epoch, final.state, system.name_of(final.instance)) == (2, SessionState.FINISHED, other(owner))
        pc = await system.metrics("pc")
        assert pc['kvsp_pc_instance_failures_total{reason="expired"}'] == 1
        assert pc["kvsp_pc_migrations_total"] == 1
        resumed = await system.metrics(other(owner))
        assert resumed["kvsp_instance_resumes_total"] == 1
        assert resumed['kvsp_instance_tokens_fetched_total{source="remote"}'] >= 8  # the prompt blocks, from h1
        delay = out.first_delivery_after(killed[0])
        assert delay is not None
        print(f"failover: first resumed token {delay - killed[0]:.3f} s after SIGKILL (status ttl 1.5 s)")


async def test_non_deterministic_tokens_are_released_only_after_the_pc_acknowledged_them(tmp_path: Path) -> None:
    settings = Settings(instance={"test_decode_us_per_token": 10_000, "status_ttl_ms": 3000})
    async with running_system(tmp_path, settings) as system:
        fe = FrontEnd(system, stall_s=5.0)  # keep reading while the PC is frozen
        sampler = top_p_sampler(0.9, 11)
        info = await fe.generate(PROMPT, 60, sampler)
        owner = system.name_of(info.instance)
        assert owner is not None
        covered: list[tuple[int, int]] = []  # (tokens received before asking, output_offset the PC recorded)
        checks: set[asyncio.Task[None]] = set()
        frozen: dict[str, float] = {}
        freezes: list[asyncio.Task[None]] = []

        async def ask(received: int) -> None:
            covered.append((received, (await fe.info(info.session)).output_offset))

        async def watch(out: Output) -> None:
            task = asyncio.ensure_future(ask(len(out.delivered)))  # asked strictly after the token arrived
            checks.add(task)
            task.add_done_callback(checks.discard)
            if len(out.delivered) == 20 and not freezes:
                freezes.append(asyncio.ensure_future(freeze_pc(system, owner, frozen)))

        out = await fe.receive(info, timeout_s=40, on_token=watch)
        await asyncio.gather(*checks, *freezes)
        assert out.tokens == reference_tokens(PROMPT, 60, sampler)
        # Causality: PC records the checkpoint -> acks -> instance releases -> front end receives -> asks.
        assert covered and all(offset >= received for received, offset in covered), covered
        # While the PC was frozen (after a grace for acks already on the wire) nothing was released,
        # although the instance went on generating.
        during = [at for at in out.delivered_at if frozen["stop"] + 0.15 <= at <= frozen["cont"]]
        assert during == [], f"{len(during)} tokens released while the PC could not acknowledge"
        assert frozen["generated_after"] > frozen["generated_before"]
        assert await system.metric(owner, 'kvsp_instance_checkpoints_total{result="acked"}') >= 10

        # Control: a greedy (deterministic) session streams on while the PC is frozen.
        greedy = await fe.generate(PROMPT, 60, greedy_sampler())
        control: dict[str, float] = {}
        control_freezes: list[asyncio.Task[None]] = []

        async def freeze_early(out: Output) -> None:
            if len(out.delivered) == 5 and not control_freezes:
                freeze = freeze_pc(system, system.name_of(greedy.instance) or "", control)
                control_freezes.append(asyncio.ensure_future(freeze))

        out2 = await fe.receive(greedy, timeout_s=40, on_token=freeze_early)
        await asyncio.gather(*control_freezes)
        assert out2.tokens == reference_tokens(PROMPT, 60, greedy_sampler())
        assert [at for at in out2.delivered_at if control["stop"] + 0.15 <= at <= control["cont"]]


async def freeze_pc(system: System, instance: str, into: dict[str, float]) -> None:
    """SIGSTOP the PC for 0.6 s (well under the status ttl); note what the instance generated meanwhile."""
    into["stop"] = system.signal("pc", signal.SIGSTOP)
    try:
        await asyncio.sleep(0.15)
        into["generated_before"] = await system.metric(instance, "kvsp_instance_tokens_generated_total")
        await asyncio.sleep(0.4)
        into["generated_after"] = await system.metric(instance, "kvsp_instance_tokens_generated_total")
    finally:
        into["cont"] = system.signal("pc", signal.SIGCONT)


async def read_stream(http: aiohttp.ClientSession, url: str, into: list[tuple[float, TokenEvent | StreamEnd]]) -> None:
    """An independent reader of one instance's stream, to its end or break."""
    with contextlib.suppress(aiohttp.ClientError, ConnectionError):
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=None)) as resp:
            assert resp.status == 200
            while raw := await resp.content.readline():
                into.append((time.monotonic(), parse_stream_line(raw)))


async def test_partitioned_instance_is_fenced_by_epoch_and_rejoins(tmp_path: Path) -> None:
    sampler = top_p_sampler(0.9, 5)
    async with running_system(tmp_path, Settings(instance=dict(SLOW_DECODE))) as system:
        fe = FrontEnd(system)
        info = await fe.generate(PROMPT, MAX_TOKENS, sampler)
        owner = system.name_of(info.instance)
        assert owner is not None and info.instance is not None
        observed: list[tuple[float, TokenEvent | StreamEnd]] = []
        stream = info.instance + f"sessions/{info.session}/tokens"
        observer = asyncio.ensure_future(read_stream(system.http["fe"], stream, observed))
        times: dict[str, float] = {}
        resumed_at: list[int] = []

        async def partition() -> None:
            async def moved() -> bool:
                now = await fe.info(info.session)
                if now.epoch > 1:
                    resumed_at.append(now.output_offset)
                return now.epoch > 1
            await system.wait_for(moved, "the failover", timeout=20)
            times["failed_over"] = time.monotonic()
            await asyncio.sleep(0.3)  # the old instance sleeps through its failover, then runs again
            times["cont"] = system.signal(owner, signal.SIGCONT)

        task: list[asyncio.Task[None]] = []

        async def stop_at_20(out: Output) -> None:
            if len(out.delivered) == 20 and not task:
                times["stop"] = system.signal(owner, signal.SIGSTOP)
                task.append(asyncio.ensure_future(partition()))

        out = await fe.receive(info, timeout_s=45, on_token=stop_at_20)
        await task[0]
        await asyncio.wait_for(observer, 10)  # the old run stops: its stream ends
        assert out.tokens == reference_tokens(PROMPT, MAX_TOKENS, sampler)
        assert out.end == StreamEnd("max_tokens", 2)
        epochs = [seen.line.epoch for seen in out.lines]
        assert epochs == sorted(epochs), "a token of the old epoch reached the front end after the new epoch"
        # The old stream ends without an end line, and after the partition healed it carried only
        # tokens the PC had acknowledged before the failover (the resume point covers them).
        assert observed and not any(isinstance(line, StreamEnd) for _, line in observed)
        late = [line for at, line in observed if at >= times["cont"]]
        assert all(isinstance(t, TokenEvent) and t.epoch == 1 and t.index < resumed_at[0] for t in late), late
        old = await system.metrics(owner)
        pc = await system.metrics("pc")
        assert old['kvsp_instance_checkpoints_total{result="stale"}'] == 1
        assert pc['kvsp_pc_stale_epoch_rejections_total{message="checkpoint"}'] == 1
        assert old['kvsp_instance_sessions_ended_total{reason="fenced"}'] == 1
        assert pc['kvsp_pc_instance_failures_total{reason="expired"}'] == 1
        await system.wait_active()  # it reported again as a new incarnation and is active at the PC


async def test_session_survives_a_crash_before_its_prompt_blocks_reached_the_cache_holder(tmp_path: Path) -> None:
    """The cache holder is frozen, so the instance's copies of the prompt blocks cannot land; it is killed
    mid-generation.  Its checkpoints waited for those copies, so the PC never recorded one with output
    and still holds the prompt: it starts the session again at epoch 2 elsewhere (a resume would have
    named prompt blocks that exist nowhere any more, and the session would be stranded for good)."""
    sampler = greedy_sampler()
    settings = Settings(instance={**SLOW_DECODE, "load_timeout_ms": 3000})
    async with running_system(tmp_path, settings) as system:
        system.signal("h1", signal.SIGSTOP)
        fe = FrontEnd(system)
        info = await fe.generate(PROMPT, 40, sampler)
        owner = system.name_of(info.instance)
        killed: list[float] = []

        async def kill_at_10(out: Output) -> None:
            if len(out.delivered) == 10 and not killed:
                killed.append(system.signal(owner or "", signal.SIGKILL))

        out = await fe.receive(info, timeout_s=40, on_token=kill_at_10)
        assert killed
        assert out.tokens == reference_tokens(PROMPT, 40, sampler)
        moved = out.reconnects[-1][1]
        assert (system.name_of(moved.instance), moved.epoch, moved.output_offset) == (other(owner), 2, 0)
        assert (await system.metrics("pc"))["kvsp_pc_migrations_total"] == 1
        system.signal("h1", signal.SIGCONT)
