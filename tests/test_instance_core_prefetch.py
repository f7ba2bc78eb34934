"""Prefetch directives at the instance (spec sections 6.5 and 9, decision D2)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control.instance.core import (
    CancelLoads,
    DirectiveForbidden,
    DirectiveQuotaExceeded,
    LoadBlock,
    PrefetchTracker,
)
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import PrefetchBlock, PrefetchDirective, PrefetchState, PrefetchStatus

PC = "https://pc.example/kvsp/"
OTHER = "https://ii9.example/kvsp/"
H1, H2 = "https://h1.example/kvsp/", "https://h2.example/kvsp/"
KEYS = [bytes([i + 1]) * 32 for i in range(4)]
IDS = [f"a2b7c9e0-1f3d-4c1a-8f5b-6d2e9a7c3b1{i}" for i in range(10)]


def directive(n: int = 0, keys: list[bytes] = KEYS, deadline_ms: int = 50) -> PrefetchDirective:
    return PrefetchDirective(IDS[n], bytes(16), bytes(32), tuple(PrefetchBlock(k, (H1, H2)) for k in keys),
                             deadline_ms, 2000, "ref")


def state(tracker: PrefetchTracker, n: int = 0) -> tuple[PrefetchState, tuple[bytes, ...]]:
    status = tracker.status(IDS[n])
    status.check_directive(directive(n))  # whatever we report is a valid status of the directive
    return status.state, status.loaded


def test_accept_returns_loads_in_prefix_order() -> None:
    tracker = PrefetchTracker(PC)
    actions = tracker.accept(PC, directive(), 0.0)
    assert actions == [LoadBlock(IDS[0], i, k, (H1, H2), 2000) for i, k in enumerate(KEYS)]
    assert state(tracker) == (PrefetchState.PENDING, ())


def test_directive_from_anyone_but_the_pc_is_forbidden() -> None:
    tracker = PrefetchTracker(PC)
    with pytest.raises(DirectiveForbidden) as info:
        tracker.accept(OTHER, directive(), 0.0)
    assert info.value.problem.status == 403
    assert tracker.pending == 0
    with pytest.raises(ProblemError):
        tracker.status(IDS[0])  # nothing was recorded


def test_pending_directive_quota() -> None:
    tracker = PrefetchTracker(PC, max_pending=2)
    tracker.accept(PC, directive(0), 0.0)
    tracker.accept(PC, directive(1), 0.0)
    with pytest.raises(DirectiveQuotaExceeded) as info:
        tracker.accept(PC, directive(2), 0.0)
    assert info.value.problem.status == 429
    for key in KEYS:
        tracker.loaded(IDS[0], key, 0.01)  # one completes: room for another
    assert tracker.pending == 1
    assert tracker.accept(PC, directive(2), 0.02) != []


def test_all_loaded_is_complete() -> None:
    tracker = PrefetchTracker(PC)
    tracker.accept(PC, directive(), 0.0)
    for key in reversed(KEYS):
        assert state(tracker)[0] is PrefetchState.PENDING
        tracker.loaded(IDS[0], key, 0.01)
    assert state(tracker) == (PrefetchState.COMPLETE, tuple(KEYS))
    assert tracker.next_deadline() is None


def test_only_the_leading_loaded_blocks_count() -> None:
    tracker = PrefetchTracker(PC)
    tracker.accept(PC, directive(), 0.0)
    tracker.loaded(IDS[0], KEYS[0], 0.01)
    tracker.loaded(IDS[0], KEYS[2], 0.01)
    assert state(tracker) == (PrefetchState.PENDING, (KEYS[0],))  # block 2 cannot be used without block 1


def test_deadline_stops_loading_and_reports_partial() -> None:
    tracker = PrefetchTracker(PC)
    tracker.accept(PC, directive(deadline_ms=50), 10.0)
    tracker.loaded(IDS[0], KEYS[0], 10.01)
    tracker.loaded(IDS[0], KEYS[1], 10.02)
    assert tracker.next_deadline() == pytest.approx(10.05)
    assert tracker.tick(10.049) == []
    assert tracker.tick(10.05) == [CancelLoads(IDS[0], (KEYS[2], KEYS[3]))]
    assert state(tracker) == (PrefetchState.PARTIAL, (KEYS[0], KEYS[1]))
    tracker.loaded(IDS[0], KEYS[2], 10.06)  # arrived too late: does not count any more
    assert state(tracker) == (PrefetchState.PARTIAL, (KEYS[0], KEYS[1]))
    assert tracker.tick(11.0) == []


def test_deadline_with_nothing_loaded_is_still_partial() -> None:
    # Section 6.5: "If the deadline expires, the instance stops loading and reports 'partial'".
    tracker = PrefetchTracker(PC)
    tracker.accept(PC, directive(), 0.0)
    tracker.tick(1.0)
    assert state(tracker) == (PrefetchState.PARTIAL, ())


def test_failed_block_cancels_the_blocks_after_it() -> None:
    tracker = PrefetchTracker(PC)
    tracker.accept(PC, directive(), 0.0)
    tracker.loaded(IDS[0], KEYS[0], 0.01)
    tracker.loaded(IDS[0], KEYS[3], 0.01)
    assert tracker.load_failed(IDS[0], KEYS[1], 0.02) == [CancelLoads(IDS[0], (KEYS[2],))]
    assert state(tracker) == (PrefetchState.PARTIAL, (KEYS[0],))


def test_first_block_failing_is_failed() -> None:
    tracker = PrefetchTracker(PC)
    tracker.accept(PC, directive(), 0.0)
    tracker.load_failed(IDS[0], KEYS[0], 0.01)
    assert state(tracker) == (PrefetchState.FAILED, ())


def test_blocks_already_held_count_as_loaded() -> None:
    tracker = PrefetchTracker(PC)
    actions = tracker.accept(PC, directive(), 0.0, held={KEYS[0], KEYS[1]})
    assert [a.block_key for a in actions if isinstance(a, LoadBlock)] == KEYS[2:]
    assert state(tracker) == (PrefetchState.PENDING, (KEYS[0], KEYS[1]))
    tracker2 = PrefetchTracker(PC)
    assert tracker2.accept(PC, directive(), 0.0, held=set(KEYS)) == []
    assert state(tracker2)[0] is PrefetchState.COMPLETE


def test_repeated_directive_is_idempotent_and_a_different_one_conflicts() -> None:
    tracker = PrefetchTracker(PC)
    tracker.accept(PC, directive(), 0.0)
    assert tracker.accept(PC, directive(), 0.1) == []
    assert tracker.pending == 1
    with pytest.raises(ProblemError) as info:
        tracker.accept(PC, directive(deadline_ms=99), 0.1)
    assert info.value.problem.status == 409


def test_other_compat_id_is_incompatible() -> None:
    tracker = PrefetchTracker(PC, compat_id=b"\x07" * 32)
    with pytest.raises(ProblemError) as info:
        tracker.accept(PC, directive(), 0.0)
    assert info.value.problem.kind is ProblemType.INCOMPATIBLE


def test_unknown_directive_or_block_is_not_found() -> None:
    tracker = PrefetchTracker(PC)
    with pytest.raises(ProblemError) as info:
        tracker.status(IDS[5])
    assert info.value.problem.kind is ProblemType.NOT_FOUND
    tracker.accept(PC, directive(keys=KEYS[:1]), 0.0)
    with pytest.raises(ProblemError):
        tracker.loaded(IDS[0], KEYS[3], 0.0)


def test_finished_directives_are_forgotten_beyond_the_bound() -> None:
    tracker = PrefetchTracker(PC, max_finished=2)
    for n in range(3):
        tracker.accept(PC, directive(n), 0.0, held=set(KEYS))
    with pytest.raises(ProblemError):
        tracker.status(IDS[0])
    assert tracker.status(IDS[2]) == PrefetchStatus(IDS[2], PrefetchState.COMPLETE, tuple(KEYS))


def test_status_round_trips_as_the_wire_record() -> None:
    tracker = PrefetchTracker(PC)
    tracker.accept(PC, directive(), 0.0)
    tracker.loaded(IDS[0], KEYS[0], 0.0)
    status = tracker.status(IDS[0])
    assert PrefetchStatus.from_json(status.to_json()) == status


EVENTS = st.lists(st.tuples(st.sampled_from(["loaded", "failed", "tick"]), st.integers(0, 3), st.floats(0.0, 0.03)),
                  max_size=20)


@given(EVENTS)
def test_any_progress_reports_a_valid_prefix_status(events: list[tuple[str, int, float]]) -> None:
    tracker = PrefetchTracker(PC)
    tracker.accept(PC, directive(deadline_ms=50), 0.0)
    now = 0.0
    settled_state: PrefetchState | None = None
    for kind, index, dt in events:
        now += dt
        if kind == "loaded":
            tracker.loaded(IDS[0], KEYS[index], now)
        elif kind == "failed":
            tracker.load_failed(IDS[0], KEYS[index], now)
        else:
            tracker.tick(now)
        status, loaded = state(tracker)
        assert loaded == tuple(KEYS[: len(loaded)])  # always a prefix of the directive
        if settled_state is not None:
            assert status is settled_state  # a settled directive never changes again
        elif status is not PrefetchState.PENDING:
            settled_state = status
