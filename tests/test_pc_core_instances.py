"""The PC's instance registry (spec section 6.3): epochs, expiry, restart, sleep requests, state changes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control.pc.core import (
    InstanceRegistry,
    InvalidTransition,
    MinActivePolicy,
    SendStateChange,
    StatusAccepted,
    StatusDiscarded,
)
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import InstanceStatus, StateChange
from kvsp.registry import InstanceState

A, D, S, F = InstanceState.ACTIVE, InstanceState.DRAINING, InstanceState.SLEEPING, InstanceState.FAILED
II1, II2, II3 = "https://ii1.example/kvsp/", "https://ii2.example/kvsp/", "https://ii3.example/kvsp/"
TTL_MS = 3000


def status(instance: str = II1, epoch: int = 1, state: InstanceState = A, *, requested: InstanceState | None = None,
           ttl_ms: int = TTL_MS, queued: int = 0) -> InstanceStatus:
    return InstanceStatus(instance, epoch, state, 0, queued, 8, 0.1, 40000.0, 3000.0, (), ttl_ms, requested)


def accepted(outcome: StatusAccepted | StatusDiscarded) -> StatusAccepted:
    assert isinstance(outcome, StatusAccepted), outcome
    return outcome


def test_first_record_registers_an_active_instance() -> None:
    reg = InstanceRegistry()
    out = accepted(reg.report(status(), 0.0))
    assert (out.state, out.answer, out.failed, out.actions) == (A, None, (), ())
    assert reg.state_of(II1) is A and reg.epoch_of(II1) == 1
    assert [s.instance for s in reg.eligible(0.0)] == [II1]


# -- epochs -----------------------------------------------------------------------------------------
def test_lower_epoch_is_discarded_with_stale_epoch() -> None:
    reg = InstanceRegistry()
    reg.report(status(epoch=5), 0.0)
    out = reg.report(status(epoch=4, queued=99), 1.0)
    assert isinstance(out, StatusDiscarded)
    assert (out.epoch, out.current_epoch) == (4, 5)
    assert out.problem.kind is ProblemType.STALE_EPOCH and out.problem.status == 409
    status_now = reg.status_of(II1)
    assert status_now is not None and status_now.queued == 0  # the stale record changed nothing


def test_same_epoch_refreshes_the_record() -> None:
    reg = InstanceRegistry()
    reg.report(status(), 0.0)
    accepted(reg.report(status(queued=7), 2.0))
    status_now = reg.status_of(II1)
    assert status_now is not None and status_now.queued == 7
    assert reg.expire(2.0 + TTL_MS / 1000 - 0.001) == []  # the refresh moved the expiry


# -- expiry and restart -----------------------------------------------------------------------------
def test_expiry_by_injected_clock_fails_the_instance() -> None:
    reg = InstanceRegistry()
    reg.report(status(), 10.0)
    assert reg.next_expiry() == pytest.approx(13.0)
    assert reg.expire(12.999) == []
    failed = reg.expire(13.0)
    assert [(f.instance, f.epoch, f.previous, f.reason) for f in failed] == [(II1, 1, A, "expired")]
    assert reg.state_of(II1) is F
    assert reg.eligible(13.0) == []
    assert reg.expire(100.0) == []  # failed once
    assert reg.next_expiry() is None


def test_eligible_skips_an_expired_record_before_expire_runs() -> None:
    reg = InstanceRegistry()
    reg.report(status(), 0.0)
    assert reg.eligible(TTL_MS / 1000) == []


def test_same_epoch_after_failure_is_discarded_as_invalid_state() -> None:
    reg = InstanceRegistry()
    reg.report(status(), 0.0)
    reg.expire(5.0)
    out = reg.report(status(), 5.1)  # a partitioned instance comes back with the old incarnation
    assert isinstance(out, StatusDiscarded) and out.problem.kind is ProblemType.INVALID_STATE
    assert reg.state_of(II1) is F


def test_new_epoch_after_failure_is_a_restart() -> None:
    reg = InstanceRegistry()
    reg.report(status(), 0.0)
    reg.expire(5.0)
    out = accepted(reg.report(status(epoch=2), 6.0))
    assert (out.state, out.failed) == (A, ())
    assert reg.epoch_of(II1) == 2 and [s.instance for s in reg.eligible(6.0)] == [II1]


def test_new_epoch_before_expiry_fails_the_old_incarnation() -> None:
    reg = InstanceRegistry()
    reg.report(status(), 0.0)
    reg.drain(II1, 0.5)
    out = accepted(reg.report(status(epoch=2), 1.0))
    assert [(f.epoch, f.previous, f.reason) for f in out.failed] == [(1, D, "restarted")]
    assert out.state is A


def test_record_saying_failed_fails_the_instance() -> None:
    reg = InstanceRegistry()
    reg.report(status(), 0.0)
    out = accepted(reg.report(status(state=F), 1.0))
    assert [(f.reason, f.previous) for f in out.failed] == [("fault", A)] and out.state is F


def test_pc_declared_fault() -> None:
    reg = InstanceRegistry()
    reg.report(status(), 0.0)
    assert reg.fault(II1, 1.0).reason == "fault"
    with pytest.raises(InvalidTransition):
        reg.fault(II1, 1.0)  # already failed: not a move of the table


# -- sleep requests ---------------------------------------------------------------------------------
def test_sleep_request_accepted_when_enough_others_stay_active() -> None:
    reg = InstanceRegistry(MinActivePolicy(min_active=1))
    reg.report(status(II2), 0.0)
    out = accepted(reg.report(status(requested=S), 0.0))
    assert out.answer == StateChange(D) and out.state is D and out.actions == ()
    assert [s.instance for s in reg.eligible(0.0)] == [II2]  # draining gets no new work


def test_sleep_request_refused_when_it_would_leave_too_few() -> None:
    reg = InstanceRegistry(MinActivePolicy(min_active=2))
    reg.report(status(II2), 0.0)
    out = accepted(reg.report(status(requested=S), 0.0))
    assert out.answer == StateChange(A) and out.state is A


def test_sleep_request_of_the_last_instance_is_refused_by_default() -> None:
    reg = InstanceRegistry()
    assert accepted(reg.report(status(requested=S), 0.0)).answer == StateChange(A)


def test_repeated_sleep_request_while_draining_is_answered_draining() -> None:
    reg = InstanceRegistry()
    reg.report(status(II2), 0.0)
    reg.report(status(requested=S), 0.0)
    out = accepted(reg.report(status(state=D, requested=S), 1.0))
    assert out.answer == StateChange(D) and out.state is D


def test_custom_policy_sees_the_request_and_the_count() -> None:
    seen: list[tuple[str, int]] = []

    class Policy:
        def allow_sleep(self, request: InstanceStatus, others_active: int) -> bool:
            seen.append((request.instance, others_active))
            return False

    reg = InstanceRegistry(Policy())
    reg.report(status(II2), 0.0)
    reg.report(status(II3), 0.0)
    reg.report(status(requested=S), 0.0)
    assert seen == [(II1, 2)]


def test_draining_instance_reporting_sleeping_is_sleeping() -> None:
    reg = InstanceRegistry()
    reg.report(status(II2), 0.0)
    reg.report(status(requested=S), 0.0)
    out = accepted(reg.report(status(state=S), 1.0))
    assert out.state is S and out.actions == ()
    assert [s.instance for s in reg.sleeping(1.0)] == [II1]
    assert reg.eligible(1.0)[0].instance == II2


# -- PC-initiated changes ---------------------------------------------------------------------------
def test_drain_sleep_wake_produce_state_change_actions() -> None:
    reg = InstanceRegistry()
    reg.report(status(), 0.0)
    assert reg.drain(II1, 0.0) == SendStateChange(II1, D)
    assert reg.state_of(II1) is D
    assert reg.sleep(II1, 0.0) == SendStateChange(II1, S)
    assert reg.state_of(II1) is D  # sleeping is reached once the instance reports its sessions done
    reg.report(status(state=S), 0.5)
    assert reg.wake(II1, 1.0) == SendStateChange(II1, A)
    assert reg.state_of(II1) is A
    assert SendStateChange(II1, A).body.to_json() == {"state": "active"}


def test_command_not_in_the_table_raises() -> None:
    reg = InstanceRegistry()
    reg.report(status(), 0.0)
    reg.sleep(II1, 0.0)
    reg.report(status(state=S), 0.0)
    with pytest.raises(InvalidTransition):
        reg.drain(II1, 0.0)  # nothing to drain in a sleeping instance
    reg.expire(10.0)
    with pytest.raises(InvalidTransition):
        reg.wake(II1, 10.0)  # a failed instance must restart, not be woken


def test_command_to_unknown_instance_is_not_found() -> None:
    with pytest.raises(ProblemError) as info:
        InstanceRegistry().wake(II1, 0.0)
    assert info.value.problem.kind is ProblemType.NOT_FOUND


def test_lagging_report_is_answered_with_the_pcs_view() -> None:
    reg = InstanceRegistry()
    reg.report(status(), 0.0)
    reg.drain(II1, 0.0)
    out = accepted(reg.report(status(state=A), 0.1))  # sent before the PUT state arrived
    assert out.actions == (SendStateChange(II1, D),) and out.state is D


def test_woken_instance_that_still_reports_sleeping_is_told_again() -> None:
    reg = InstanceRegistry()
    reg.report(status(), 0.0)
    reg.sleep(II1, 0.0)
    reg.report(status(state=S), 0.1)
    reg.wake(II1, 0.2)
    out = accepted(reg.report(status(state=S), 0.3))
    assert out.actions == (SendStateChange(II1, A),)


def test_eligible_carries_the_pcs_view_of_the_state() -> None:
    reg = InstanceRegistry()
    reg.report(status(), 0.0)
    reg.sleep(II1, 0.0)
    reg.report(status(state=S), 0.1)
    reg.wake(II1, 0.2)
    views = reg.eligible(0.2)
    assert [s.state for s in views] == [A]
    raw = reg.status_of(II1)
    assert raw is not None and raw.state is A  # the record said sleeping; the PC's view is what counts


def test_never_eligible_unless_active() -> None:
    reg = InstanceRegistry()
    for inst in (II1, II2, II3):
        reg.report(status(inst), 0.0)
    reg.drain(II2, 0.0)
    reg.fault(II3, 0.0)
    assert [s.instance for s in reg.eligible(0.0)] == [II1]


# -- bounds -----------------------------------------------------------------------------------------
def test_instance_count_is_bounded() -> None:
    reg = InstanceRegistry(max_instances=1)
    reg.report(status(), 0.0)
    with pytest.raises(ProblemError) as info:
        reg.report(status(II2), 0.0)
    assert info.value.problem.status == 503


def test_forget_only_failed_instances() -> None:
    reg = InstanceRegistry()
    reg.report(status(), 0.0)
    with pytest.raises(ProblemError):
        reg.forget(II1)
    reg.fault(II1, 0.0)
    reg.forget(II1)
    assert len(reg) == 0 and reg.state_of(II1) is None


# -- any sequence of inputs ---------------------------------------------------------------------------
Op = tuple[str, str, int, InstanceState, InstanceState | None, str, float]
OPS = st.tuples(st.sampled_from(["report", "command", "expire", "tick"]), st.sampled_from([II1, II2]),
                st.integers(1, 4), st.sampled_from(list(InstanceState)), st.sampled_from([None, S]),
                st.sampled_from(["drain", "sleep", "wake", "fault"]), st.floats(0.0, 2.0))


@given(st.lists(OPS, max_size=40))
def test_any_input_sequence_keeps_the_invariants(ops: list[Op]) -> None:
    """Every input is either applied or refused with a ProblemError; epochs never go back; only
    active, unexpired instances are eligible; a refusal changes nothing."""
    reg = InstanceRegistry()
    now = 0.0
    highest: dict[str, int] = {}
    for kind, inst, epoch, state, requested, command, dt in ops:
        before = {i: reg.state_of(i) for i in (II1, II2)}
        try:
            if kind == "report":
                reg.report(status(inst, epoch, state, requested=requested), now)
            elif kind == "command":
                getattr(reg, command)(inst, now)
            elif kind == "expire":
                reg.expire(now)
            else:
                now += dt
        except ProblemError:
            assert {i: reg.state_of(i) for i in (II1, II2)} == before
        for name in (II1, II2):
            epoch_now = reg.epoch_of(name)
            if epoch_now is not None:
                assert epoch_now >= highest.get(name, 0)
                highest[name] = epoch_now
        for s in reg.eligible(now):
            assert reg.state_of(s.instance) is A and s.state is A
