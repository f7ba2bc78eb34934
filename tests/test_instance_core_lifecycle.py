"""The instance's side of the lifecycle (spec section 6.3), alone and talking to the PC's registry."""

from __future__ import annotations

import pytest

from control.instance.core import InstanceLifecycle, ReportStatus
from control.pc.core import InstanceRegistry, InvalidTransition, StatusAccepted
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import InstanceStatus, StateChange
from kvsp.registry import InstanceState

A, D, S, F = InstanceState.ACTIVE, InstanceState.DRAINING, InstanceState.SLEEPING, InstanceState.FAILED
II1, II2 = "https://ii1.example/kvsp/", "https://ii2.example/kvsp/"
SID = "6f1d0a9e-2c55-4d7e-9a0e-5b7f2f9f6a11"


def record(life: InstanceLifecycle, now: float, *, load: int = 0) -> InstanceStatus:
    return life.make_status(running=load, queued=0, batch_size=8, kv_utilization=0.1, prefill_tokens_per_s=1e4,
                            decode_tokens_per_s=1e3, links=(), ttl_ms=3000, now=now)


def test_new_sessions_only_while_active() -> None:
    life = InstanceLifecycle(II1, 1)
    life.admit(SID)
    life.on_state_change(StateChange(D), 0.0)
    with pytest.raises(ProblemError) as info:
        life.admit("0b7e4c1a-9d3f-4e2a-8c6b-1f5a7d9e3c20")
    assert info.value.problem.kind is ProblemType.INVALID_STATE
    with pytest.raises(ProblemError):
        life.require_active("prefetch directive")


def test_draining_finishes_sessions_then_sleeps_and_reports() -> None:
    life = InstanceLifecycle(II1, 1)
    life.admit(SID)
    assert life.on_state_change(StateChange(S), 0.0) == [ReportStatus("state change to sleeping")]
    assert life.state is D  # in-flight sessions first
    assert life.finish(SID, 1.0) == [ReportStatus("sleeping")]
    assert life.state is S


def test_sleep_command_without_sessions_sleeps_at_once() -> None:
    life = InstanceLifecycle(II1, 1)
    actions = life.on_state_change(StateChange(S), 0.0)
    assert life.state is S and ReportStatus("sleeping") in actions


def test_only_the_pc_wakes_a_sleeping_instance() -> None:
    life = InstanceLifecycle(II1, 1)
    life.on_state_change(StateChange(S), 0.0)
    assert life.requested_state(1e9) is None  # it never asks for anything while asleep
    with pytest.raises(InvalidTransition):
        life.on_state_change(StateChange(D), 1.0)
    life.on_state_change(StateChange(A), 2.0)
    assert life.state is A


def test_failed_is_not_a_state_the_pc_can_set() -> None:
    with pytest.raises(ProblemError):
        InstanceLifecycle(II1, 1).on_state_change(StateChange(F), 0.0)


def test_asks_to_sleep_only_after_staying_idle() -> None:
    life = InstanceLifecycle(II1, 7, idle_load=0, idle_for_s=60.0)
    assert record(life, 0.0).requested_state is None
    assert record(life, 59.0).requested_state is None
    assert record(life, 30.0 + 60.0, load=1).requested_state is None  # busy again: the wait restarts
    assert record(life, 100.0).requested_state is None
    status = record(life, 160.0)
    assert status.requested_state is S and status.epoch == 7 and status.state is A


def test_refused_request_waits_a_full_period_again() -> None:
    life = InstanceLifecycle(II1, 1, idle_for_s=60.0)
    record(life, 0.0)
    assert record(life, 60.0).requested_state is S
    assert life.on_status_answer(StateChange(A), 60.1) == []
    assert record(life, 100.0).requested_state is None
    assert record(life, 121.0).requested_state is S


def test_conversation_with_the_pc_registry() -> None:
    """Sleep request accepted, sessions finish, sleeping reported; the PC wakes it for work."""
    reg = InstanceRegistry()
    reg.report(InstanceStatus(II2, 1, A, 0, 0, 8, 0.1, 1e4, 1e3, (), 3000), 0.0)
    life = InstanceLifecycle(II1, 1, idle_for_s=10.0)
    life.admit(SID)
    reg.report(record(life, 0.0, load=1), 0.0)
    life.finish(SID, 1.0)
    record(life, 1.0)  # idle from now
    reg.report(InstanceStatus(II2, 1, A, 0, 0, 8, 0.1, 1e4, 1e3, (), 3000), 10.0)  # ii2 stays active
    out = reg.report(record(life, 11.0), 11.0)
    assert isinstance(out, StatusAccepted) and out.answer == StateChange(D)
    actions = life.on_status_answer(out.answer, 11.0)
    assert life.state is S and ReportStatus("sleeping") in actions
    out = reg.report(record(life, 11.1), 11.1)
    assert isinstance(out, StatusAccepted) and out.state is S and out.actions == ()
    wake = reg.wake(II1, 12.0)
    life.on_state_change(wake.body, 12.0)
    out = reg.report(record(life, 12.1), 12.1)
    assert isinstance(out, StatusAccepted) and out.state is A and life.state is A
