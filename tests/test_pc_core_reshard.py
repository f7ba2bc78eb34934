"""Reshard coordination at the PC (spec section 6.9): plans, acknowledgements, commit, abort, conflicts."""

from __future__ import annotations

import pytest

from control.pc.core import ReshardCoordinator, SendAbort, SendCommit, SendPlan
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import ReshardAbort, ReshardCommit, Shard, ShardFetch, ShardMap

II1, II2, II3 = "https://ii1.example/kvsp/", "https://ii2.example/kvsp/", "https://ii3.example/kvsp/"
MAP = "c3f8e1"
V4 = ShardMap(MAP, 4, (Shard((0, 8), II1), Shard((8, 16), II2), Shard((16, 24), II3)))
V5 = ShardMap(MAP, 5, (Shard((0, 12), II1), Shard((12, 24), II2)))
V6 = ShardMap(MAP, 6, (Shard((0, 24), II1),))


def plan_conflict(info: pytest.ExceptionInfo[ProblemError]) -> bool:
    return info.value.problem.kind is ProblemType.PLAN_CONFLICT and info.value.problem.status == 409


def started(now: float = 0.0) -> tuple[ReshardCoordinator, list[SendPlan]]:
    coord = ReshardCoordinator()
    coord.register(V4)
    return coord, coord.start(V4, V5, 200, now)


def test_start_sends_a_plan_to_every_member_of_either_version() -> None:
    _, plans = started()
    by_instance = {p.instance: p.plan for p in plans}
    assert set(by_instance) == {II1, II2, II3}
    assert by_instance[II1].retain == ((0, 8),) and by_instance[II1].fetch == (ShardFetch((8, 12), II2),)
    assert by_instance[II2].retain == ((12, 16),) and by_instance[II2].release == ((8, 12),)
    assert by_instance[II2].fetch == (ShardFetch((16, 24), II3),)
    assert by_instance[II3].retain == () and by_instance[II3].release == ((16, 24),)
    # Retained ranges are never transferred: no fetch of any instance covers what it retains.
    for plan in by_instance.values():
        for start, end in plan.retain:
            assert all(f.tokens[1] <= start or f.tokens[0] >= end for f in plan.fetch)
    assert all((p.from_version, p.to_version, p.deadline_ms) == (4, 5, 200) for p in by_instance.values())


def test_all_acknowledged_commits_to_all_members() -> None:
    coord, _ = started()
    assert coord.ack(II1, MAP, 5, 0.05) == []
    assert coord.ack(II3, MAP, 5, 0.06) == []
    assert coord.authoritative(MAP) == V4  # v stays authoritative until every member acknowledged
    actions = coord.ack(II2, MAP, 5, 0.07)
    assert actions == [SendCommit(i, ReshardCommit(MAP, 5)) for i in (II1, II2, II3)]
    assert coord.authoritative(MAP) == V5 and coord.in_progress(MAP) is None
    assert coord.ack(II2, MAP, 5, 0.08) == []  # a repeated acknowledgement after the commit


def test_repeated_acknowledgement_counts_once() -> None:
    coord, _ = started()
    coord.ack(II1, MAP, 5, 0.01)
    assert coord.ack(II1, MAP, 5, 0.02) == []
    assert coord.ack(II2, MAP, 5, 0.03) == []


def test_missing_acknowledgement_aborts_at_the_deadline() -> None:
    coord, _ = started(now=10.0)
    coord.ack(II1, MAP, 5, 10.05)
    coord.ack(II2, MAP, 5, 10.06)
    assert coord.next_deadline() == pytest.approx(10.2)
    assert coord.tick(10.199) == []
    actions = coord.tick(10.2)
    assert actions == [SendAbort(i, ReshardAbort(MAP, 5)) for i in (II1, II2, II3)]
    assert coord.authoritative(MAP) == V4 and coord.in_progress(MAP) is None
    assert coord.tick(11.0) == [] and coord.next_deadline() is None


def test_acknowledgement_after_the_deadline_aborts_instead_of_committing() -> None:
    coord, _ = started()
    coord.ack(II1, MAP, 5, 0.1)
    coord.ack(II2, MAP, 5, 0.1)
    actions = coord.ack(II3, MAP, 5, 0.2)
    assert all(isinstance(a, SendAbort) for a in actions) and len(actions) == 3
    assert coord.authoritative(MAP) == V4


def test_failed_member_aborts_at_once() -> None:
    coord, _ = started()
    assert len(coord.member_failed(II3, 0.01)) == 3
    assert coord.member_failed(II3, 0.02) == []
    assert coord.authoritative(MAP) == V4


def test_concurrent_reshard_is_a_plan_conflict() -> None:
    coord, _ = started()
    with pytest.raises(ProblemError) as info:
        coord.start(V4, V5, 200, 0.0)
    assert plan_conflict(info)
    with pytest.raises(ProblemError) as info:
        coord.register(V5)
    assert plan_conflict(info)


def test_plan_from_a_version_that_is_not_authoritative_is_a_plan_conflict() -> None:
    coord, _ = started()
    coord.tick(1.0)  # aborted: v4 still authoritative
    with pytest.raises(ProblemError) as info:
        coord.start(V5, V6, 200, 2.0)
    assert plan_conflict(info)


def test_next_reshard_after_commit() -> None:
    coord, _ = started()
    for inst in (II1, II2, II3):
        coord.ack(inst, MAP, 5, 0.01)
    plans = coord.start(V5, V6, 100, 1.0)
    assert {p.instance for p in plans} == {II1, II2}


@pytest.mark.parametrize(("instance", "version"), [(II1, 6), ("https://ii9.example/kvsp/", 5)])
def test_acknowledgement_that_does_not_match_is_a_plan_conflict(instance: str, version: int) -> None:
    coord, _ = started()
    with pytest.raises(ProblemError) as info:
        coord.ack(instance, MAP, version, 0.01)
    assert plan_conflict(info)


def test_non_consecutive_versions_are_a_plan_conflict() -> None:
    coord = ReshardCoordinator()
    with pytest.raises(ProblemError) as info:
        coord.start(V4, V6, 100, 0.0)
    assert plan_conflict(info)
    assert coord.authoritative(MAP) is None  # nothing registered by a refused start


def test_start_registers_an_unknown_map() -> None:
    coord = ReshardCoordinator()
    coord.start(V4, V5, 100, 0.0)
    assert coord.authoritative(MAP) == V4 and coord.in_progress(MAP) == 5
