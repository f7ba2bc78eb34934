"""Instance lifecycle (spec section 6.3): the state-change record, and the lifecycle as ONE table shared by
the PC and the instance (it lives with the records so that neither role imports the other).

`StateChange` is the body of PUT state and of the PC's answer to a status PUT. The PC accepts a request
to sleep with ``{"state": "draining"}`` and refuses it with
``{"state": "active"}``; PUT state on an instance carries the same object.

Both sides must agree on which moves exist, so the moves are data, not code spread over handlers
(h11 keeps its state table in one file for the same reason).  `TRANSITIONS` maps
``(state, event) -> next state``; a pair that is absent is not a move the protocol allows, and
`next_state` raises `InvalidTransition` (problem type kvsp-invalid-state, 409) for it.

Why the table looks like this (the spec's rules, then what we chose where it is silent):

- Sleeping is reached only through draining, because "a draining instance MUST complete its
  in-flight sessions" and enters sleeping "when it has none left".  So an accepted sleep request,
  a PC drain and a PC sleep all lead from active to draining; ``sessions_done`` then leads to sleeping.
- "A sleeping instance becomes active only on a state change from the PC": ``pc_wake`` is the only
  way out of sleeping other than failure.  ``pc_wake`` also cancels a drain in progress.
- PUT is idempotent, so a PC command whose target is the current state is a self-loop
  (active + pc_wake, draining + pc_drain/pc_sleep, sleeping + pc_sleep).  ``pc_drain`` of a sleeping
  instance is refused: there is nothing to drain, and "draining" is not reachable from sleeping.
- ``status_expired`` (the record's ttl_ms passed) and ``fault`` (the instance reported itself
  failed, or a new epoch showed that the old incarnation died without its record expiring) lead
  every live state to failed.  ``fault`` is our addition: the spec names only expiry as a cause, but a
  restart before expiry ends the old incarnation just as surely, and its sessions must be resumed.
- failed is left only by ``restart`` (a record with a higher epoch), into active.  A failed instance
  takes no commands: it must restart first.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Self

from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.reader import ObjectReader
from kvsp.records.base import JsonRecord
from kvsp.registry import INSTANCE_STATES, InstanceState


@dataclass(frozen=True, slots=True)
class StateChange(JsonRecord):
    """``{"state": <instance state>}``."""

    state: InstanceState

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        return cls(InstanceState(r.choice("state", INSTANCE_STATES)))

    def to_json(self) -> dict[str, object]:
        return {"state": self.state.value}



class LifecycleEvent(enum.StrEnum):
    """Inputs of the lifecycle table."""

    PC_DRAIN = "pc_drain"  # PUT state {"state": "draining"}
    PC_SLEEP = "pc_sleep"  # PUT state {"state": "sleeping"}
    PC_WAKE = "pc_wake"  # PUT state {"state": "active"}
    SLEEP_REQUEST_ACCEPTED = "sleep_request_accepted"  # status answer {"state": "draining"}
    SESSIONS_DONE = "sessions_done"  # a draining instance finished its last in-flight session
    STATUS_EXPIRED = "status_expired"  # the PC saw no record within ttl_ms
    FAULT = "fault"  # reported failed, or superseded by a new epoch before expiry
    RESTART = "restart"  # a record with a higher epoch after failure


_A, _D, _S, _F = InstanceState.ACTIVE, InstanceState.DRAINING, InstanceState.SLEEPING, InstanceState.FAILED
_E = LifecycleEvent

TRANSITIONS: Final[Mapping[tuple[InstanceState, LifecycleEvent], InstanceState]] = MappingProxyType({
    (_A, _E.PC_DRAIN): _D,
    (_A, _E.PC_SLEEP): _D,
    (_A, _E.PC_WAKE): _A,
    (_A, _E.SLEEP_REQUEST_ACCEPTED): _D,
    (_A, _E.STATUS_EXPIRED): _F,
    (_A, _E.FAULT): _F,
    (_D, _E.PC_DRAIN): _D,
    (_D, _E.PC_SLEEP): _D,
    (_D, _E.PC_WAKE): _A,
    (_D, _E.SESSIONS_DONE): _S,
    (_D, _E.STATUS_EXPIRED): _F,
    (_D, _E.FAULT): _F,
    (_S, _E.PC_SLEEP): _S,
    (_S, _E.PC_WAKE): _A,
    (_S, _E.STATUS_EXPIRED): _F,
    (_S, _E.FAULT): _F,
    (_F, _E.RESTART): _A,
})

# The PC command that a PUT state body (or a status answer outside a sleep request) stands for.
COMMAND_FOR_TARGET: Final[Mapping[InstanceState, LifecycleEvent]] = MappingProxyType({
    InstanceState.ACTIVE: LifecycleEvent.PC_WAKE,
    InstanceState.DRAINING: LifecycleEvent.PC_DRAIN,
    InstanceState.SLEEPING: LifecycleEvent.PC_SLEEP,
})


class InvalidTransition(ProblemError):
    """``event`` is not allowed in ``state``: kvsp-invalid-state (409), raised by the table alone."""

    def __init__(self, state: InstanceState, event: LifecycleEvent, subject: str | None = None) -> None:
        who = f"{subject}: " if subject else ""
        detail = f"{who}{event.value} is not allowed in state {state.value}"
        super().__init__(Problem.of(ProblemType.INVALID_STATE, detail))
        self.state = state
        self.event = event


def next_state(state: InstanceState, event: LifecycleEvent, subject: str | None = None) -> InstanceState:
    """The state after ``event``; `InvalidTransition` when the table has no such move."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidTransition(state, event, subject) from None


def allowed(state: InstanceState, event: LifecycleEvent) -> bool:
    return (state, event) in TRANSITIONS


def command_for(target: InstanceState, subject: str | None = None) -> LifecycleEvent:
    """The PC command that asks for ``target``; "failed" cannot be commanded (kvsp-invalid-state)."""
    event = COMMAND_FOR_TARGET.get(target)
    if event is None:
        raise ProblemError.of(ProblemType.INVALID_STATE,
                              f"{subject + ': ' if subject else ''}the PC cannot set state {target.value}")
    return event
