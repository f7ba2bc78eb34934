"""Output rules of section 6.8: labels, checkpoints, release after acknowledgement, front-end reassembly."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control.instance.core import OutputGate, OutputToken
from control.pc.core import ResumeSession, SessionTable
from kvsp.engine import DeterministicTestEngine, EngineGeometry, greedy_sampler, top_p_sampler
from kvsp.output import OutputAssembler, OutputOverflow
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import Sampler, SessionCheckpoint

SID = "6f1d0a9e-2c55-4d7e-9a0e-5b7f2f9f6a11"
II1, II2 = "https://ii1.example/kvsp/", "https://ii2.example/kvsp/"
GEOMETRY = EngineGeometry(layers=2, kv_heads=2, head_dim=4, block_tokens=4, vocab_size=97)
PROMPT = (11, 12, 13, 14, 15, 16)  # one complete block and a tail of two


def base(sampler: Sampler, *, epoch: int = 1) -> SessionCheckpoint:
    """Offset-0 checkpoint of PROMPT (prompt_blocks stand in for the first block's key)."""
    return SessionCheckpoint(SID, epoch, bytes(32), bytes(16), (bytes([9]) * 32,), PROMPT[4:], (), 0, sampler)


def tok(index: int, epoch: int, token: int = 0) -> OutputToken:
    return OutputToken(index, epoch, token)


# -- the gate ---------------------------------------------------------------------------------------
def test_deterministic_sampler_releases_each_token_at_once_with_index_and_epoch() -> None:
    gate = OutputGate(base(greedy_sampler()), block_tokens=4)
    assert gate.push(50) == [OutputToken(0, 1, 50)]
    assert gate.push(51) == [OutputToken(1, 1, 51)]
    assert gate.released == 2 and gate.acked == 0


def test_non_deterministic_sampler_releases_nothing_before_the_ack() -> None:
    gate = OutputGate(base(top_p_sampler(0.9, 7)), block_tokens=4, release_batch=3)
    for t in (50, 51, 52):
        assert gate.push(t) == []
    assert gate.checkpoint_due()
    checkpoint = gate.checkpoint(dataclasses.replace(top_p_sampler(0.9, 7), step=3))
    assert gate.push(53) == []
    assert gate.released == 0
    assert gate.ack(3, epoch=2) == []  # an acknowledgement of another epoch releases nothing
    assert gate.ack(checkpoint.output_offset, epoch=1) == [OutputToken(i, 1, 50 + i) for i in range(3)]
    assert gate.ack(3, epoch=1) == []
    assert gate.released == 3  # token 3 waits for a checkpoint that covers it
    with pytest.raises(ValueError):
        gate.ack(4, epoch=1)  # never checkpointed


def test_checkpoint_due_when_a_block_completes() -> None:
    gate = OutputGate(base(greedy_sampler()), block_tokens=4)  # 6 prompt tokens: block 1 ends at 8
    gate.push(1)
    assert not gate.checkpoint_due()
    gate.push(2)
    assert gate.checkpoint_due()
    gate.checkpoint(greedy_sampler())
    assert not gate.checkpoint_due()
    for t in range(4):
        gate.push(t)
    assert gate.checkpoint_due()


def test_checkpoint_due_at_least_every_64_tokens() -> None:
    gate = OutputGate(base(greedy_sampler()), block_tokens=1024)
    for t in range(63):
        gate.push(t)
        assert not gate.checkpoint_due()
    gate.push(63)
    assert gate.checkpoint_due()
    assert gate.checkpoint_due(final=True)


def test_final_checkpoint_flushes_the_rest() -> None:
    gate = OutputGate(base(top_p_sampler(0.9, 1)), block_tokens=1024, release_batch=10)
    gate.push(5)
    assert not gate.checkpoint_due() and gate.checkpoint_due(final=True)


def test_checkpoint_is_a_valid_record_of_everything_generated() -> None:
    gate = OutputGate(base(greedy_sampler()), block_tokens=4)
    for t in (7, 8, 9):
        gate.push(t)
    checkpoint = gate.checkpoint(dataclasses.replace(greedy_sampler(), step=3))
    assert (checkpoint.generated, checkpoint.output_offset, checkpoint.sampler.step) == ((7, 8, 9), 3, 3)
    assert SessionCheckpoint.from_json(checkpoint.to_json()) == checkpoint


def test_resumed_gate_labels_from_the_output_offset_at_the_new_epoch() -> None:
    resume = dataclasses.replace(base(greedy_sampler(), epoch=2), generated=(7, 8, 9), output_offset=3)
    gate = OutputGate(resume, block_tokens=4)
    assert gate.released == gate.acked == 3
    assert gate.push(10) == [OutputToken(3, 2, 10)]


# -- the assembler ----------------------------------------------------------------------------------
def test_assembler_delivers_in_order_and_drops_duplicates() -> None:
    asm = OutputAssembler()
    assert asm.receive(tok(1, 1, 21)) == []
    assert asm.receive(tok(1, 1, 21)) == []
    assert asm.receive(tok(0, 1, 20)) == [tok(0, 1, 20), tok(1, 1, 21)]
    assert asm.receive(tok(0, 1, 20)) == []
    assert asm.next_index == 2


def test_assembler_drops_lower_epochs_where_the_newer_one_speaks() -> None:
    asm = OutputAssembler()
    asm.receive(tok(0, 1, 20))
    asm.receive(tok(2, 1, 99))  # buffered, then superseded: epoch 2 resumes at index 1
    assert asm.receive(tok(1, 2, 21)) == [tok(1, 2, 21)]
    assert asm.receive(tok(2, 1, 99)) == []
    assert asm.receive(tok(2, 2, 22)) == [tok(2, 2, 22)]
    assert asm.epoch == 2


def test_assembler_keeps_a_lower_epoch_token_below_the_resume_point() -> None:
    # Epoch 2 resumed at index 3 (its checkpoint covers 0..2); index 2 of epoch 1 was still in flight.
    asm = OutputAssembler()
    asm.receive(tok(0, 1, 20))
    asm.receive(tok(1, 1, 21))
    assert asm.receive(tok(3, 2, 23)) == []
    assert asm.receive(tok(2, 1, 22)) == [tok(2, 1, 22), tok(3, 2, 23)]


def test_assembler_bounds_what_it_buffers() -> None:
    asm = OutputAssembler(max_buffered=2)
    asm.receive(tok(5, 1))
    asm.receive(tok(6, 1))
    with pytest.raises(OutputOverflow):
        asm.receive(tok(7, 1))
    assert asm.receive(tok(0, 1)) == [tok(0, 1)]  # the next index is always taken


# -- against the deterministic test engine ----------------------------------------------------------
def run(sampler: Sampler, n: int) -> list[int]:
    """n output tokens of an uninterrupted session."""
    engine = DeterministicTestEngine(GEOMETRY, sampler)
    out = [engine.prefill(PROMPT).token]
    out.extend(engine.decode_step().token for _ in range(n - 1))
    return out


def resumed(sampler: Sampler, generated: Sequence[int], n: int) -> list[int]:
    """Tokens from index len(generated) to n-1 by a fresh engine resumed from a checkpoint."""
    engine = DeterministicTestEngine(GEOMETRY)
    engine.restore_sampler(dataclasses.replace(sampler, step=len(generated)))
    out = [engine.prefill([*PROMPT, *generated]).token]
    out.extend(engine.decode_step().token for _ in range(n - len(generated) - 1))
    return out


@st.composite
def failovers(draw: st.DrawFn) -> tuple[Sampler, int, list[list[OutputToken]]]:
    """Token streams of 1-3 epochs: epoch e runs from its resume point c_e past the next one's c_{e+1}."""
    sampler = draw(st.sampled_from([greedy_sampler(), top_p_sampler(0.9, 7), top_p_sampler(0.5, 123)]))
    n = draw(st.integers(2, 24))
    epochs = draw(st.integers(1, 3))
    starts = sorted(draw(st.lists(st.integers(0, n - 1), min_size=epochs - 1, max_size=epochs - 1)))
    starts = [0, *starts]
    truth = run(sampler, n)
    streams: list[list[OutputToken]] = []
    for e, start in enumerate(starts):
        stop = n if e == len(starts) - 1 else draw(st.integers(starts[e + 1], n))  # released before failing
        tokens = truth[start:stop] if e == 0 else resumed(sampler, truth[:start], n)[: stop - start]
        streams.append([OutputToken(start + i, e + 1, t) for i, t in enumerate(tokens)])
    return sampler, n, streams


@given(failovers(), st.data())
def test_any_interleaving_delivers_each_index_once_as_an_uninterrupted_run(
        case: tuple[Sampler, int, list[list[OutputToken]]], data: st.DataObject) -> None:
    sampler, n, streams = case
    labels = data.draw(st.permutations([e for e, s in enumerate(streams) for _ in s]))
    queues = [list(s) for s in streams]
    arrivals = [queues[e].pop(0) for e in labels]  # each stream stays in order, streams interleave
    repeats = data.draw(st.lists(st.sampled_from(arrivals), max_size=5)) if arrivals else []
    asm = OutputAssembler()
    delivered: list[OutputToken] = []
    for token in arrivals + repeats:
        delivered.extend(asm.receive(token))
    assert [t.index for t in delivered] == list(range(n))
    assert [t.token for t in delivered] == run(sampler, n)
    newest = max(t.epoch for t in arrivals)
    first_newest = next(i for i, t in enumerate(arrivals) if t.epoch == newest)
    seen_before = {t.index for t in arrivals[:first_newest]}
    for t in delivered:  # an index the newest epoch produces comes from it unless delivered earlier
        if t.index >= streams[newest - 1][0].index and t.epoch != newest:
            assert t.index in seen_before


def test_non_deterministic_session_with_the_pc_and_a_failover() -> None:
    """Tokens reach the front end only after the PC acknowledged them; after a failover the new
    instance continues from the checkpoint and the front end sees one consistent output."""
    sampler = top_p_sampler(0.9, 42)
    truth = run(sampler, 12)
    pc = SessionTable()
    start = base(sampler)
    pc.open(SID, II1, 0.0, checkpoint=start)
    engine = DeterministicTestEngine(GEOMETRY, sampler)
    gate = OutputGate(start, block_tokens=4, release_batch=4)
    front = OutputAssembler()
    shown: list[int] = []
    token = engine.prefill(PROMPT).token
    for i in range(7):  # ii1 generates 7 tokens; the 8th would come after it fails
        assert gate.push(token) == []  # nothing is released by the push itself
        if gate.checkpoint_due():
            ack = pc.checkpoint(II1, gate.checkpoint(engine.sampler_state()), float(i))
            shown += [t.token for r in gate.ack(ack.output_offset, epoch=ack.epoch) for t in front.receive(r)]
        token = engine.decode_step().token
    # Checkpoints were due where blocks of the sequence completed (6 prompt tokens, 4 per block): at 2 and 6.
    assert gate.output_offset == 7 and gate.released == 6 and shown == truth[:6]
    late = gate.checkpoint(engine.sampler_state())  # ii1 is partitioned: its checkpoint arrives late
    [resume] = pc.fail_instance(II1, 10.0, lambda c, avoid: II2)
    assert isinstance(resume, ResumeSession) and resume.checkpoint.epoch == 2
    with pytest.raises(ProblemError) as info:
        pc.checkpoint(II1, late, 10.5)
    assert info.value.problem.kind is ProblemType.STALE_EPOCH
    # ii2 resumes: sampler restored, KV recomputed from the checkpoint's tokens, labels from offset 6.
    cp = resume.checkpoint
    assert cp.output_offset == 6
    engine2 = DeterministicTestEngine(GEOMETRY)
    engine2.restore_sampler(cp.sampler)
    gate2 = OutputGate(cp, block_tokens=4, release_batch=4)
    token = engine2.prefill([*PROMPT, *cp.generated]).token
    for i in range(12 - cp.output_offset):
        gate2.push(token)
        if gate2.checkpoint_due(final=i == 12 - cp.output_offset - 1):
            ack = pc.checkpoint(II2, gate2.checkpoint(engine2.sampler_state()), 11.0 + i)
            shown += [t.token for r in gate2.ack(ack.output_offset, epoch=ack.epoch) for t in front.receive(r)]
        token = engine2.decode_step().token
    assert shown == truth and front.next_index == 12
