"""The instance lifecycle table (spec section 6.3): every (state, event) pair, present or absent."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsp.problems import ProblemError, ProblemType
from kvsp.records.lifecycle import (
    TRANSITIONS,
    InvalidTransition,
    LifecycleEvent,
    allowed,
    command_for,
    next_state,
)
from kvsp.registry import InstanceState

A, D, S, F = InstanceState.ACTIVE, InstanceState.DRAINING, InstanceState.SLEEPING, InstanceState.FAILED
E = LifecycleEvent

# The whole table written out independently of the module: None = the move does not exist.
EXPECTED: dict[tuple[InstanceState, LifecycleEvent], InstanceState | None] = {
    (A, E.PC_DRAIN): D, (A, E.PC_SLEEP): D, (A, E.PC_WAKE): A, (A, E.SLEEP_REQUEST_ACCEPTED): D,
    (A, E.SESSIONS_DONE): None, (A, E.STATUS_EXPIRED): F, (A, E.FAULT): F, (A, E.RESTART): None,
    (D, E.PC_DRAIN): D, (D, E.PC_SLEEP): D, (D, E.PC_WAKE): A, (D, E.SLEEP_REQUEST_ACCEPTED): None,
    (D, E.SESSIONS_DONE): S, (D, E.STATUS_EXPIRED): F, (D, E.FAULT): F, (D, E.RESTART): None,
    (S, E.PC_DRAIN): None, (S, E.PC_SLEEP): S, (S, E.PC_WAKE): A, (S, E.SLEEP_REQUEST_ACCEPTED): None,
    (S, E.SESSIONS_DONE): None, (S, E.STATUS_EXPIRED): F, (S, E.FAULT): F, (S, E.RESTART): None,
    (F, E.PC_DRAIN): None, (F, E.PC_SLEEP): None, (F, E.PC_WAKE): None, (F, E.SLEEP_REQUEST_ACCEPTED): None,
    (F, E.SESSIONS_DONE): None, (F, E.STATUS_EXPIRED): None, (F, E.FAULT): None, (F, E.RESTART): A,
}


def test_expected_covers_every_pair() -> None:
    assert set(EXPECTED) == set(itertools.product(InstanceState, LifecycleEvent))


PAIRS = sorted(EXPECTED, key=lambda pair: (pair[0].value, pair[1].value))


@pytest.mark.parametrize(("state", "event"), PAIRS, ids=[f"{s.value}-{e.value}" for s, e in PAIRS])
def test_every_state_event_pair(state: InstanceState, event: LifecycleEvent) -> None:
    expected = EXPECTED[(state, event)]
    assert allowed(state, event) is (expected is not None)
    if expected is not None:
        assert next_state(state, event) is expected
        return
    with pytest.raises(InvalidTransition) as info:
        next_state(state, event, "https://ii1.example/kvsp/")
    problem = info.value.problem
    assert problem.kind is ProblemType.INVALID_STATE and problem.status == 409
    assert event.value in str(info.value) and state.value in str(info.value)
    assert info.value.state is state and info.value.event is event


def test_table_has_no_other_entries() -> None:
    assert {k: v for k, v in EXPECTED.items() if v is not None} == dict(TRANSITIONS)


def test_sleeping_is_left_only_by_pc_wake_or_failure() -> None:
    # Section 6.3: "A sleeping instance becomes active only on a state change from the PC."
    to_active = [e for (s, e), n in TRANSITIONS.items() if s is S and n is A]
    assert to_active == [E.PC_WAKE]


def test_sleeping_is_entered_only_from_draining_when_sessions_are_done() -> None:
    # Section 6.3: a draining instance completes its sessions, then enters sleeping.
    into_sleep = {(s, e) for (s, e), n in TRANSITIONS.items() if n is S and s is not S}
    assert into_sleep == {(D, E.SESSIONS_DONE)}


@pytest.mark.parametrize(("target", "event"), [(A, E.PC_WAKE), (D, E.PC_DRAIN), (S, E.PC_SLEEP)])
def test_command_for_each_target(target: InstanceState, event: LifecycleEvent) -> None:
    assert command_for(target) is event


def test_failed_cannot_be_commanded() -> None:
    with pytest.raises(ProblemError) as info:
        command_for(F, "https://ii1.example/kvsp/")
    assert info.value.problem.kind is ProblemType.INVALID_STATE


@given(st.sampled_from(list(InstanceState)), st.lists(st.sampled_from(list(LifecycleEvent)), max_size=30))
def test_any_event_sequence_moves_by_the_table_or_raises_invalid_transition(
        start: InstanceState, events: list[LifecycleEvent]) -> None:
    state = start
    for event in events:
        try:
            after = next_state(state, event)
        except InvalidTransition:
            assert (state, event) not in TRANSITIONS
        else:
            assert after is TRANSITIONS[(state, event)]
            state = after
