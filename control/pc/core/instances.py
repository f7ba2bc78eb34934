"""The PC's view of the inference instances (spec section 6.3), sans-I/O.

`InstanceRegistry` keeps the latest status record of each instance and the PC's own view of its
lifecycle state, moved only through the table in `kvsp.records.lifecycle`.  Rules enforced:

- records with an epoch lower than the highest seen are discarded (`StatusDiscarded`, kvsp-stale-epoch);
  a record of an incarnation the PC declared failed is discarded too (kvsp-invalid-state): a fenced
  instance must restart with a higher epoch, or it could extend sessions that were moved elsewhere;
- a record whose ttl_ms passed makes the instance failed (`expire(now)` -> `InstanceFailed`);
- a higher epoch is a restart: the old incarnation is failed first (so its sessions fail over even
  when its record had not expired yet), then the new one starts active;
- a sleep request (``requested_state == "sleeping"``) is answered by a `SleepPolicy`:
  ``{"state": "draining"}`` to accept, ``{"state": "active"}`` to refuse;
- the PC's view wins over a lagging report: when a record's state differs from the view (a PUT state
  not yet applied, or lost), a `SendStateChange` re-asserts the view.  The one move the instance makes
  on its own, draining -> sleeping when its sessions are done, is taken from the report;
- `eligible(now)` returns only active, unexpired instances: nothing else may get new requests or
  prefetch directives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Protocol

from control.pc.core.durable import InstanceRecord
from control.pc.core.events import (
    InstanceFailed,
    SendStateChange,
    StatusAccepted,
    StatusDiscarded,
    StatusOutcome,
)
from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.records import InstanceStatus, StateChange
from kvsp.records.lifecycle import LifecycleEvent, command_for, next_state
from kvsp.registry import InstanceState

DEFAULT_MAX_INSTANCES: Final = 4096

_ACTIVE, _DRAINING, _SLEEPING, _FAILED = (InstanceState.ACTIVE, InstanceState.DRAINING,
                                          InstanceState.SLEEPING, InstanceState.FAILED)


class SleepPolicy(Protocol):
    """Decides a sleep request; ``others_active`` counts the other active, unexpired instances."""

    def allow_sleep(self, request: InstanceStatus, others_active: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class MinActivePolicy:
    """Allow sleep while at least ``min_active`` other instances stay active, so capacity never hits 0."""

    min_active: int = 1

    def allow_sleep(self, request: InstanceStatus, others_active: int) -> bool:
        return others_active >= self.min_active


@dataclass(slots=True)
class _Entry:
    """Mutable bookkeeping of one instance; never leaves this module."""

    status: InstanceStatus
    state: InstanceState  # the PC's view
    expires_at: float

    @property
    def epoch(self) -> int:
        return self.status.epoch

    def view(self) -> InstanceStatus:
        """The last record with the PC's view of the state, which is what placement must go by."""
        if self.status.state is self.state:
            return self.status
        return dataclasses.replace(self.status, state=self.state)


class InstanceRegistry:
    """Status records and lifecycle state per instance, keyed by the instance base URI."""

    __slots__ = ("_entries", "_max_instances", "_policy")

    def __init__(self, sleep_policy: SleepPolicy | None = None, *,
                 max_instances: int = DEFAULT_MAX_INSTANCES) -> None:
        self._policy: SleepPolicy = sleep_policy if sleep_policy is not None else MinActivePolicy()
        self._max_instances = max_instances
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    # -- queries -------------------------------------------------------------------------------
    def state_of(self, instance: str) -> InstanceState | None:
        entry = self._entries.get(instance)
        return None if entry is None else entry.state

    def epoch_of(self, instance: str) -> int | None:
        entry = self._entries.get(instance)
        return None if entry is None else entry.epoch

    def status_of(self, instance: str) -> InstanceStatus | None:
        """The last accepted record, with the PC's view of the state."""
        entry = self._entries.get(instance)
        return None if entry is None else entry.view()

    def record(self, instance: str) -> InstanceRecord | None:
        """What a store keeps of ``instance``: its last record (the highest epoch seen) and the PC's view."""
        entry = self._entries.get(instance)
        return None if entry is None else InstanceRecord(entry.status, entry.state)

    def restore(self, record: InstanceRecord, now: float, grace_s: float = 0.0) -> None:
        """Take an instance over from the store (a new leader).  Its record expires one ttl plus
        ``grace_s`` from ``now``: expiry times are the old leader's clock, and a live instance reports
        again within a ttl once it has found the new leader (the grace: a few attempts at PCs that are
        gone or standing by)."""
        expires_at = now + record.status.ttl_ms / 1000 + grace_s
        self._entries[record.instance] = _Entry(record.status, record.state, expires_at)

    def eligible(self, now: float) -> list[InstanceStatus]:
        """Active, unexpired instances (sorted by URI): the only ones that may get work or prefetch."""
        return self._in_state(_ACTIVE, now)

    def sleeping(self, now: float) -> list[InstanceStatus]:
        """Sleeping, unexpired instances: candidates to wake when no active one will do (section 6.4)."""
        return self._in_state(_SLEEPING, now)

    def _in_state(self, state: InstanceState, now: float) -> list[InstanceStatus]:
        return [e.view() for _, e in sorted(self._entries.items())
                if e.state is state and now < e.expires_at]

    def next_expiry(self) -> float | None:
        """When `expire` next has work to do (the adapter arms one timer for it), or None."""
        return min((e.expires_at for e in self._entries.values() if e.state is not _FAILED), default=None)

    # -- status records ------------------------------------------------------------------------
    def report(self, status: InstanceStatus, now: float) -> StatusOutcome:
        """Record a status PUT (the adapter has checked that the client is ``status.instance``)."""
        entry = self._entries.get(status.instance)
        if entry is not None and status.epoch < entry.epoch:
            return StatusDiscarded(status.instance, status.epoch, entry.epoch, ProblemType.STALE_EPOCH)
        if entry is not None and status.epoch == entry.epoch and entry.state is _FAILED:
            return StatusDiscarded(status.instance, status.epoch, entry.epoch, ProblemType.INVALID_STATE)
        expires_at = now + status.ttl_ms / 1000
        failed: list[InstanceFailed] = []
        if entry is None or status.epoch > entry.epoch:
            if entry is None and len(self._entries) >= self._max_instances:
                raise ProblemError(Problem.generic(503, "Service Unavailable",
                                                   f"the PC tracks at most {self._max_instances} instances"))
            if entry is not None and entry.state is not _FAILED:
                failed.append(_fail(entry, LifecycleEvent.FAULT, "restarted"))
            entry = _Entry(status, next_state(_FAILED, LifecycleEvent.RESTART, status.instance), expires_at)
            self._entries[status.instance] = entry
        else:
            entry.status, entry.expires_at = status, expires_at
        if status.state is _FAILED:
            failed.append(_fail(entry, LifecycleEvent.FAULT, "fault"))
            return StatusAccepted(status.instance, status.epoch, entry.state, failed=tuple(failed))
        return self._reconcile(entry, status, now, tuple(failed))

    def _reconcile(self, entry: _Entry, status: InstanceStatus, now: float,
                   failed: tuple[InstanceFailed, ...]) -> StatusAccepted:
        if entry.state is _DRAINING and status.state is _SLEEPING:
            entry.state = next_state(_DRAINING, LifecycleEvent.SESSIONS_DONE, status.instance)
        answer: StateChange | None = None
        if status.requested_state is _SLEEPING:
            answer = self._decide_sleep(entry, status, now)
        actions: tuple[SendStateChange, ...] = ()
        if answer is None and status.state is not entry.state:
            actions = (SendStateChange(status.instance, entry.state),)
        return StatusAccepted(status.instance, status.epoch, entry.state, answer, failed, actions)

    def _decide_sleep(self, entry: _Entry, status: InstanceStatus, now: float) -> StateChange:
        """Answer a sleep request; only an instance active in both views can be put to sleep."""
        if entry.state is _ACTIVE and status.state is _ACTIVE:
            others = sum(1 for s in self.eligible(now) if s.instance != status.instance)
            if self._policy.allow_sleep(status, others):
                entry.state = next_state(_ACTIVE, LifecycleEvent.SLEEP_REQUEST_ACCEPTED, status.instance)
        return StateChange(entry.state)

    def expire(self, now: float) -> list[InstanceFailed]:
        """Fail every live instance whose record has expired (section 6.3: the PC considers it failed)."""
        return [_fail(entry, LifecycleEvent.STATUS_EXPIRED, "expired")
                for entry in self._entries.values() if entry.state is not _FAILED and now >= entry.expires_at]

    # -- PC-initiated changes ------------------------------------------------------------------
    def drain(self, instance: str, now: float) -> SendStateChange:
        return self._command(instance, _DRAINING)

    def sleep(self, instance: str, now: float) -> SendStateChange:
        """Ask for sleep: the view goes to draining until the instance reports sleeping."""
        return self._command(instance, _SLEEPING)

    def wake(self, instance: str, now: float) -> SendStateChange:
        return self._command(instance, _ACTIVE)

    def fault(self, instance: str, now: float) -> InstanceFailed:
        """Declare a live instance failed for a reason the PC saw itself (e.g. it refuses connections)."""
        entry = self._entry(instance)
        return _fail(entry, LifecycleEvent.FAULT, "fault")

    def _command(self, instance: str, target: InstanceState) -> SendStateChange:
        entry = self._entry(instance)
        entry.state = next_state(entry.state, command_for(target, instance), instance)
        return SendStateChange(instance, target)

    def _entry(self, instance: str) -> _Entry:
        entry = self._entries.get(instance)
        if entry is None:
            raise ProblemError.of(ProblemType.NOT_FOUND, f"no instance {instance}")
        return entry

    def forget(self, instance: str) -> None:
        """Drop a failed instance for good (decommissioned); a live one must be failed first."""
        entry = self._entries.get(instance)
        if entry is not None and entry.state is not _FAILED:
            raise ProblemError.of(ProblemType.INVALID_STATE, f"{instance} is {entry.state.value}, not failed")
        self._entries.pop(instance, None)


def _fail(entry: _Entry, event: LifecycleEvent, reason: str) -> InstanceFailed:
    previous = entry.state
    entry.state = next_state(previous, event, entry.status.instance)
    return InstanceFailed(entry.status.instance, entry.epoch, previous, reason)
