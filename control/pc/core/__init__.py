"""Sans-I/O cores of the Placement Controller: every method takes ``now`` and returns typed values.

- `InstanceRegistry` (section 6.3): status records, epochs, expiry, sleep requests, state changes;
- `lifecycle` (section 6.3): the one (state, event) -> next state table, shared with the instance;
- `SessionTable` (section 6.8): checkpoints, epochs, ownership, failover;
- `ReshardCoordinator` (section 6.9): plan, acknowledge, commit or abort;
- `Placer` (section 6.4): cost-based choice of an instance and the prefetch directive to send it.

What each returned action asks the HTTP adapter to do is said in `control.pc.core.events`.
"""

from control.pc.core.events import (
    Ack,
    Assign,
    FailoverAction,
    InstanceFailed,
    NoPlacement,
    Placement,
    ReshardAction,
    ResumeSession,
    SendAbort,
    SendCommit,
    SendPlan,
    SendStateChange,
    SessionStranded,
    StatusAccepted,
    StatusDiscarded,
    StatusOutcome,
    Wake,
)
from control.pc.core.instances import InstanceRegistry, MinActivePolicy, SleepPolicy
from control.pc.core.placement import PlacementRequest, Placer, PlacerConfig
from control.pc.core.reshard import ReshardCoordinator
from control.pc.core.sessions import Chooser, SessionLimitError, SessionTable
from kvsp.records.lifecycle import TRANSITIONS, InvalidTransition, LifecycleEvent, next_state

__all__ = [
    "TRANSITIONS",
    "Ack",
    "Assign",
    "Chooser",
    "FailoverAction",
    "InstanceFailed",
    "InstanceRegistry",
    "InvalidTransition",
    "LifecycleEvent",
    "MinActivePolicy",
    "NoPlacement",
    "Placement",
    "PlacementRequest",
    "Placer",
    "PlacerConfig",
    "ReshardAction",
    "ReshardCoordinator",
    "ResumeSession",
    "SendAbort",
    "SendCommit",
    "SendPlan",
    "SendStateChange",
    "SessionLimitError",
    "SessionStranded",
    "SessionTable",
    "SleepPolicy",
    "StatusAccepted",
    "StatusDiscarded",
    "StatusOutcome",
    "Wake",
    "next_state",
]
