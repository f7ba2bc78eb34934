"""Session checkpoints and failover at the PC (spec section 6.8)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from control.pc.core import Ack, Chooser, ResumeSession, SessionLimitError, SessionStranded, SessionTable
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import Sampler, SessionCheckpoint

SID = "6f1d0a9e-2c55-4d7e-9a0e-5b7f2f9f6a11"
SID2 = "0b7e4c1a-9d3f-4e2a-8c6b-1f5a7d9e3c20"
II1, II2, II3 = "https://ii1.example/kvsp/", "https://ii2.example/kvsp/", "https://ii3.example/kvsp/"
SAMPLER = Sampler("top-p", (("p", 0.9),), 7, 3, False)


def cp(generated: tuple[int, ...] = (1296, 315, 279), *, epoch: int = 1, session: str = SID) -> SessionCheckpoint:
    return SessionCheckpoint(session, epoch, bytes(32), bytes(16), (bytes([1]) * 32,), (374, 264), generated,
                             len(generated), dataclasses.replace(SAMPLER, step=len(generated)))


def pick(target: str | None) -> tuple[list[tuple[SessionCheckpoint, frozenset[str]]], Chooser]:
    calls: list[tuple[SessionCheckpoint, frozenset[str]]] = []

    def choose(checkpoint: SessionCheckpoint, avoid: frozenset[str]) -> str | None:
        calls.append((checkpoint, avoid))
        return target

    return calls, choose


def problem_of(exc: pytest.ExceptionInfo[ProblemError]) -> tuple[ProblemType | None, int]:
    return exc.value.problem.kind, exc.value.problem.status


def table_with_session(owner: str = II1) -> SessionTable:
    table = SessionTable()
    table.open(SID, owner, 0.0)
    return table


# -- checkpoints ------------------------------------------------------------------------------------
def test_checkpoint_is_acknowledged_with_its_offset() -> None:
    table = table_with_session()
    assert table.checkpoint(II1, cp(), 1.0) == Ack(SID, 1, 3)
    assert Ack(SID, 1, 3).to_json() == {"session": SID, "epoch": 1, "output_offset": 3}


def test_highest_output_offset_of_the_epoch_is_kept() -> None:
    table = table_with_session()
    table.checkpoint(II1, cp((1, 2, 3, 4)), 1.0)
    ack = table.checkpoint(II1, cp((1, 2)), 2.0)  # a late, lower checkpoint
    assert ack == Ack(SID, 1, 4)  # acknowledged with what the PC holds, which covers it
    latest = table.latest(SID)
    assert latest is not None and latest.output_offset == 4


def test_lower_epoch_is_stale() -> None:
    table = table_with_session()
    table.checkpoint(II1, cp(), 1.0)
    table.fail_session(SID, 2.0, lambda c, a: II2)
    with pytest.raises(ProblemError) as info:
        table.checkpoint(II1, cp((1296, 315, 279, 9)), 3.0)
    assert problem_of(info) == (ProblemType.STALE_EPOCH, 409)


def test_unissued_epoch_is_refused() -> None:
    table = table_with_session()
    with pytest.raises(ProblemError) as info:
        table.checkpoint(II1, cp(epoch=2), 1.0)
    assert problem_of(info) == (None, 409)


def test_checkpoint_from_non_owner_is_forbidden() -> None:
    table = table_with_session(II1)
    with pytest.raises(ProblemError) as info:
        table.checkpoint(II2, cp(), 1.0)
    assert problem_of(info) == (None, 403)


def test_unknown_session_is_adopted_by_its_sender() -> None:
    table = SessionTable()
    assert table.checkpoint(II2, cp(), 0.0) == Ack(SID, 1, 3)
    assert table.owner_of(SID) == II2


def test_unknown_session_is_not_found_without_adoption() -> None:
    with pytest.raises(ProblemError) as info:
        SessionTable(adopt_unknown=False).checkpoint(II1, cp(), 0.0)
    assert problem_of(info) == (ProblemType.NOT_FOUND, 404)


@pytest.mark.parametrize(("change", "kind", "status"), [
    (lambda c: dataclasses.replace(c, compat_id=b"\x01" * 32), ProblemType.INCOMPATIBLE, 409),
    (lambda c: dataclasses.replace(c, scope_id=b"\x01" * 16), ProblemType.INCOMPATIBLE, 409),
    (lambda c: dataclasses.replace(c, prompt_tail=(1,)), None, 409),
    (lambda c: dataclasses.replace(c, sampler=dataclasses.replace(c.sampler, seed=8)), None, 409),
    (lambda c: dataclasses.replace(c, generated=(1296, 999, 279, 5), output_offset=4), None, 409),
], ids=["compat", "scope", "prompt", "sampler", "rewrites-output"])
def test_checkpoint_contradicting_the_recorded_one_is_refused(
        change: Callable[[SessionCheckpoint], SessionCheckpoint], kind: ProblemType | None, status: int) -> None:
    table = table_with_session()
    table.checkpoint(II1, cp(), 1.0)
    with pytest.raises(ProblemError) as info:
        table.checkpoint(II1, change(cp()), 2.0)
    assert problem_of(info) == (kind, status)


# -- failover ---------------------------------------------------------------------------------------
def test_failover_resumes_at_epoch_plus_one_and_fences_the_old_owner() -> None:
    table = table_with_session(II1)
    table.checkpoint(II1, cp(), 1.0)
    calls, choose = pick(II2)
    actions = table.fail_instance(II1, 2.0, choose)
    assert len(actions) == 1 and isinstance(actions[0], ResumeSession)
    resume = actions[0]
    assert (resume.session, resume.instance) == (SID, II2)
    assert resume.checkpoint == dataclasses.replace(cp(), epoch=2)
    assert calls == [(resume.checkpoint, frozenset({II1}))]
    assert (table.epoch_of(SID), table.owner_of(SID)) == (2, II2)
    # Any later message of the old epoch is rejected, even a higher offset.
    with pytest.raises(ProblemError) as info:
        table.checkpoint(II1, cp((1296, 315, 279, 5, 6)), 3.0)
    assert problem_of(info) == (ProblemType.STALE_EPOCH, 409)
    # The new owner extends the session at the new epoch.
    assert table.checkpoint(II2, cp((1296, 315, 279, 8), epoch=2), 3.0) == Ack(SID, 2, 4)
    with pytest.raises(ProblemError):
        table.close(SID, II1, 1, 4.0)  # the old owner cannot close it either


def test_only_sessions_of_the_failed_instance_move() -> None:
    table = SessionTable()
    table.open(SID, II1, 0.0, checkpoint=cp((), epoch=1))
    table.open(SID2, II3, 0.0, checkpoint=cp((), session=SID2))
    actions = table.fail_instance(II1, 1.0, lambda c, a: II2)
    assert [a.session for a in actions] == [SID]
    assert table.owner_of(SID2) == II3 and table.epoch_of(SID2) == 1


def test_initial_checkpoint_lets_a_session_resume_before_its_first_checkpoint() -> None:
    table = SessionTable()
    table.open(SID, II1, 0.0, checkpoint=cp(()))
    [action] = table.fail_instance(II1, 1.0, lambda c, a: II2)
    assert isinstance(action, ResumeSession) and action.checkpoint.output_offset == 0


def test_session_without_checkpoint_is_stranded_but_fenced() -> None:
    table = table_with_session()
    [action] = table.fail_instance(II1, 1.0, lambda c, a: II2)
    assert action == SessionStranded(SID, 2, "no-checkpoint")
    with pytest.raises(ProblemError) as info:
        table.checkpoint(II1, cp(), 2.0)
    assert problem_of(info) == (ProblemType.STALE_EPOCH, 409)


def test_no_instance_strands_then_retry_places() -> None:
    table = table_with_session()
    table.checkpoint(II1, cp(), 1.0)
    [action] = table.fail_instance(II1, 2.0, lambda c, a: None)
    assert action == SessionStranded(SID, 2, "no-instance")
    assert table.stranded() == [SID] and table.owner_of(SID) is None
    assert table.retry_stranded(3.0, lambda c, a: None) == []
    [resume] = table.retry_stranded(4.0, lambda c, a: II3)
    assert resume.instance == II3 and resume.checkpoint.epoch == 2  # no owner in between: nobody to fence
    assert table.stranded() == []


def test_refused_resume_moves_on_at_a_higher_epoch() -> None:
    table = table_with_session()
    table.checkpoint(II1, cp(), 1.0)
    table.fail_instance(II1, 2.0, lambda c, a: II2)
    calls, choose = pick(II3)
    action = table.fail_session(SID, 3.0, choose)
    assert isinstance(action, ResumeSession) and action.checkpoint.epoch == 3 and action.instance == II3
    assert calls[0][1] == frozenset({II2})


# -- lifetime and bounds ----------------------------------------------------------------------------
def test_closed_session_stays_fenced_until_it_expires() -> None:
    table = table_with_session()
    table.checkpoint(II1, cp(), 1.0)
    table.close(SID, II1, 1, 2.0)
    with pytest.raises(ProblemError) as info:
        table.checkpoint(II1, cp(), 3.0)
    assert problem_of(info) == (ProblemType.NOT_FOUND, 404)
    assert table.sessions_of(II1) == []
    assert table.expire(2.0 + 3600.0) == [SID] and len(table) == 0


def test_idle_sessions_expire_by_injected_clock() -> None:
    table = SessionTable(idle_timeout_s=10.0)
    table.open(SID, II1, 0.0)
    table.checkpoint(II1, cp(), 5.0)
    assert table.expire(14.9) == []
    assert table.expire(15.0) == [SID]


def test_session_count_is_bounded() -> None:
    table = SessionTable(max_sessions=1)
    table.open(SID, II1, 0.0)
    with pytest.raises(SessionLimitError) as info:
        table.checkpoint(II2, cp(session=SID2), 0.0)
    assert info.value.problem.status == 503


def test_open_twice_is_a_conflict() -> None:
    table = table_with_session()
    with pytest.raises(ProblemError) as info:
        table.open(SID, II2, 0.0)
    assert info.value.problem.status == 409
