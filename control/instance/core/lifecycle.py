"""The instance's own side of the lifecycle (spec section 6.3), driven by the PC's shared table.

`InstanceLifecycle` holds the state the instance reports and the sessions in flight, and moves only
through `kvsp.records.lifecycle.TRANSITIONS`, so the instance and the PC cannot disagree about
which moves exist.  Rules enforced:

- new sessions and prefetch directives are admitted only while active (`require_active`); a draining
  instance completes its in-flight sessions and accepts no new ones;
- when a draining instance has no session left it enters sleeping and reports it (`ReportStatus`);
- it asks to sleep (``requested_state = "sleeping"``) only after its load stayed at or below
  ``idle_load`` for ``idle_for_s`` seconds; a refusal restarts that wait, so it does not ask on
  every status;
- a sleeping instance becomes active only on a state change from the PC;
- when the PC refuses a status because it declared this incarnation failed (kvsp-invalid-state: the
  instance was partitioned or frozen past its ttl, and its sessions were moved at higher epochs), the
  instance starts a new incarnation: a higher epoch, active, no sessions of its own.  Runs of the old
  incarnation still going are left to the epoch fence: their next checkpoint is answered
  kvsp-stale-epoch and stops them, and a non-deterministic one releases nothing until then.  Without
  this the instance would stay refused, and idle, for the rest of its life.
"""

from __future__ import annotations

from collections.abc import Sequence

from control.instance.core.events import ReportStatus
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import InstanceStatus, Link, StateChange
from kvsp.records.lifecycle import LifecycleEvent, command_for, next_state
from kvsp.registry import InstanceState

_ACTIVE, _DRAINING, _SLEEPING = InstanceState.ACTIVE, InstanceState.DRAINING, InstanceState.SLEEPING


class InstanceLifecycle:
    """State, epoch and in-flight sessions of this instance."""

    __slots__ = ("_asked", "_idle_for", "_idle_load", "_idle_since", "_sessions", "epoch", "instance", "state")

    def __init__(self, instance: str, epoch: int, *, idle_load: int = 0, idle_for_s: float = 300.0) -> None:
        """``epoch`` must grow on every restart (the start time in milliseconds does, section 6.3)."""
        self.instance = instance
        self.epoch = epoch
        self.state = _ACTIVE
        self._idle_load = idle_load
        self._idle_for = idle_for_s
        self._idle_since: float | None = None
        self._asked = False
        self._sessions: set[str] = set()

    @property
    def sessions(self) -> frozenset[str]:
        return frozenset(self._sessions)

    # -- admission -----------------------------------------------------------------------------
    def require_active(self, what: str) -> None:
        """Refuse ``what`` (a new session, a prefetch directive) unless active: kvsp-invalid-state."""
        if self.state is not _ACTIVE:
            raise ProblemError.of(ProblemType.INVALID_STATE, f"{what} refused: instance is {self.state.value}")

    def admit(self, session: str) -> None:
        self.require_active(f"session {session}")
        self._sessions.add(session)

    def finish(self, session: str, now: float) -> list[ReportStatus]:
        """A session ended (completed, or moved away); a draining instance may now go to sleep."""
        self._sessions.discard(session)
        return self._maybe_sleep()

    def _maybe_sleep(self) -> list[ReportStatus]:
        if self.state is _DRAINING and not self._sessions:
            self.state = next_state(_DRAINING, LifecycleEvent.SESSIONS_DONE, self.instance)
            return [ReportStatus("sleeping")]
        return []

    # -- the PC's word -------------------------------------------------------------------------
    def on_state_change(self, change: StateChange, now: float) -> list[ReportStatus]:
        """PUT state from the PC (the adapter has checked that the client is the PC)."""
        self.state = next_state(self.state, command_for(change.state, self.instance), self.instance)
        self._idle_since, self._asked = None, False
        return [*self._maybe_sleep(), ReportStatus(f"state change to {change.state.value}")]

    def on_status_answer(self, answer: StateChange, now: float) -> list[ReportStatus]:
        """The body of the PC's 200 to a status PUT that asked to sleep."""
        if self._asked and self.state is _ACTIVE and answer.state is _DRAINING:
            self.state = next_state(_ACTIVE, LifecycleEvent.SLEEP_REQUEST_ACCEPTED, self.instance)
            self._asked = False
            return [*self._maybe_sleep(), ReportStatus("sleep request accepted")]
        if self._asked and answer.state is _ACTIVE:
            self._asked, self._idle_since = False, now  # refused: wait a full idle period again
            return []
        if answer.state is self.state:
            return []
        return self.on_state_change(answer, now)

    def on_status_refused(self, kind: ProblemType | None, epoch: int) -> list[ReportStatus]:
        """The PC refused a status PUT with problem type ``kind``.  kvsp-invalid-state means this
        incarnation was declared failed: restart as a new one at ``epoch`` (or one above the current
        epoch, whichever is higher; the adapter passes the time in ms, as at start-up)."""
        if kind is not ProblemType.INVALID_STATE:
            return []
        self.epoch = max(epoch, self.epoch + 1)
        self.state = _ACTIVE
        self._sessions.clear()
        self._idle_since, self._asked = None, False
        return [ReportStatus(f"restarted as incarnation {self.epoch}: the PC declared the previous one failed")]

    # -- status --------------------------------------------------------------------------------
    def observe_load(self, load: int, now: float) -> None:
        """Running plus queued requests now; feeds the decision to ask for sleep."""
        if load > self._idle_load:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = now

    def requested_state(self, now: float) -> InstanceState | None:
        """SLEEPING when the instance has been idle long enough and is active, else None."""
        if self.state is not _ACTIVE or self._idle_since is None or now - self._idle_since < self._idle_for:
            return None
        return _SLEEPING

    def make_status(self, *, running: int, queued: int, batch_size: int, kv_utilization: float,
                    prefill_tokens_per_s: float, decode_tokens_per_s: float, links: Sequence[Link],
                    ttl_ms: int, now: float) -> InstanceStatus:
        """The status record to PUT now: engine figures from the adapter, state and request from here."""
        self.observe_load(running + queued, now)
        requested = self.requested_state(now)
        self._asked = requested is _SLEEPING
        return InstanceStatus(self.instance, self.epoch, self.state, running, queued, batch_size, kv_utilization,
                              prefill_tokens_per_s, decode_tokens_per_s, tuple(links), ttl_ms, requested)
