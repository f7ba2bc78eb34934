"""What the PC cores return: outcomes, events and actions, as frozen slotted dataclasses.

The cores never send anything.  Each method returns values from this module and the HTTP adapter
carries them out (aioquic's ``events.py`` plays the same part), so every rule can be tested with an
injected clock and no sockets.  The docstring of each action says what the adapter does with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsp.problems import Problem, ProblemType
from kvsp.records import (
    PrefetchDirective,
    ReshardAbort,
    ReshardCommit,
    ReshardPlan,
    SessionCheckpoint,
    StateChange,
)
from kvsp.registry import InstanceState

# -- instances (section 6.3) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendStateChange:
    """Adapter: PUT {instance}state with body ``{"state": state}``; retry until 2xx or the instance fails."""

    instance: str
    state: InstanceState

    @property
    def body(self) -> StateChange:
        return StateChange(self.state)


@dataclass(frozen=True, slots=True)
class InstanceFailed:
    """The incarnation ``epoch`` of ``instance`` is gone (record expired, fault, or restart).

    Adapter: call `SessionTable.fail_instance` and `ReshardCoordinator.member_failed` with it, and
    carry out what they return.  ``previous`` is the state it was in, for logs and metrics.
    """

    instance: str
    epoch: int
    previous: InstanceState
    reason: str  # "expired", "fault" or "restarted"


@dataclass(frozen=True, slots=True)
class StatusAccepted:
    """A status record was recorded.  Adapter: answer the PUT with 200.

    ``answer`` is the body for a sleep request (``{"state": "draining"}`` accepts, ``{"state":
    "active"}`` refuses, section 6.3) and None otherwise (the adapter may then answer 204).
    ``failed`` lists the incarnations this record ended: the previous one when a higher epoch shows
    that it died before its record expired, and this one when the record itself says "failed".
    ``actions`` re-assert the PC's view when the instance's report lags behind it.
    """

    instance: str
    epoch: int
    state: InstanceState
    answer: StateChange | None = None
    failed: tuple[InstanceFailed, ...] = ()
    actions: tuple[SendStateChange, ...] = ()


@dataclass(frozen=True, slots=True)
class StatusDiscarded:
    """A status record was discarded (section 6.3).  Adapter: answer with `problem` (409).

    kvsp-stale-epoch when its epoch is lower than the highest seen; kvsp-invalid-state when it comes
    from an incarnation the PC has declared failed (it must restart with a higher epoch).
    """

    instance: str
    epoch: int
    current_epoch: int
    kind: ProblemType

    @property
    def problem(self) -> Problem:
        return Problem.of(self.kind, f"{self.instance}: epoch {self.epoch} discarded (current {self.current_epoch})")


StatusOutcome = StatusAccepted | StatusDiscarded

# -- sessions (section 6.8) -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ack:
    """The PC recorded a checkpoint covering ``output_offset`` tokens of ``epoch``.

    Adapter: answer the checkpoint PUT with 200 and `to_json` as the body.  An instance with a
    non-deterministic sampler releases tokens below ``output_offset`` only after it gets this.
    """

    session: str
    epoch: int
    output_offset: int

    def to_json(self) -> dict[str, object]:
        return {"session": self.session, "epoch": self.epoch, "output_offset": self.output_offset}


@dataclass(frozen=True, slots=True)
class ResumeSession:
    """Adapter: POST {instance}sessions/{session}/resume with ``checkpoint`` (already at the new epoch).

    On failure to deliver, call `SessionTable.fail_session` so the PC moves on to another instance.
    """

    session: str
    instance: str
    checkpoint: SessionCheckpoint


@dataclass(frozen=True, slots=True)
class SessionStranded:
    """A session of a failed instance could not be resumed now; its epoch was still raised (fenced).

    ``reason`` is "no-instance" (no eligible instance: retried by `SessionTable.retry_stranded`) or
    "no-checkpoint" (nothing to resume from: the session is dropped and the front end must retry
    the request).  Adapter: count it; tell the front end for "no-checkpoint".
    """

    session: str
    epoch: int
    reason: str


FailoverAction = ResumeSession | SessionStranded

# -- resharding (section 6.9) ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendPlan:
    """Adapter: POST {instance}reshard with ``plan``; a 200 answer means `ReshardCoordinator.ack`."""

    instance: str
    plan: ReshardPlan


@dataclass(frozen=True, slots=True)
class SendCommit:
    """Adapter: POST {instance}reshard with ``{"map": ..., "commit": v+1}``; retry until 2xx."""

    instance: str
    commit: ReshardCommit


@dataclass(frozen=True, slots=True)
class SendAbort:
    """Adapter: POST {instance}reshard with ``{"map": ..., "abort": v+1}``; retry until 2xx or failure."""

    instance: str
    abort: ReshardAbort


ReshardAction = SendPlan | SendCommit | SendAbort

# -- placement (section 6.4) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Assign:
    """Route the request to ``instance`` (active).  Adapter: POST ``prefetch`` to it first, when set."""

    instance: str
    cost_us: float
    prefetch: PrefetchDirective | None = None


@dataclass(frozen=True, slots=True)
class Wake:
    """No active instance is acceptable; wake the sleeping ``instance`` and route the request there.

    Adapter: `InstanceRegistry.wake` (which returns the PUT state action), carry that out, then POST
    ``prefetch`` at once so that loading overlaps the start (section 6.4), then route the request.
    """

    instance: str
    cost_us: float
    prefetch: PrefetchDirective | None = None


@dataclass(frozen=True, slots=True)
class NoPlacement:
    """No active or sleeping instance can take the request.  Adapter: answer the front end 503."""

    reason: str


Placement = Assign | Wake | NoPlacement
