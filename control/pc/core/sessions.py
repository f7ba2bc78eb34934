"""Session checkpoints and migration at the PC (spec section 6.8), sans-I/O.

`SessionTable` records, per session, its owner instance, its epoch and the checkpoint with the
highest output_offset of that epoch.  Rules enforced, in the order they are checked:

- a checkpoint with a lower epoch than the session's is rejected with kvsp-stale-epoch (409).  After a
  failover the epoch is raised at once, so every later message of the failed instance is rejected,
  whether it was delayed in the network or comes from a partitioned instance that is still running;
- an epoch higher than the PC issued is rejected (409): only the PC raises epochs;
- a checkpoint from an instance that is not the session's current owner is rejected (403); one for a
  session the table does not know is kvsp-not-found unless ``adopt_unknown`` (the PC adopts none, and
  answers 403 before it asks, like for a session owned by another);
- a checkpoint must name the scope_id and compat_id the session was opened with, and agree with the
  recorded checkpoint on everything they share: compat_id and scope_id (kvsp-incompatible otherwise),
  prompt, sampler method, parameters and seed, and the generated tokens both cover.  Output already
  delivered is never altered, so a checkpoint that rewrites it is refused;
- the recorded checkpoint is the one with the highest output_offset; a late, lower one is kept out
  but still acknowledged with the recorded offset (which covers it).

On instance failure, `fail_instance` raises each of its sessions' epoch, picks a new instance through
a callback and returns `ResumeSession` with the latest checkpoint at the new epoch.  The table is
bounded (``max_sessions``); idle sessions are dropped by `expire`.  Closed and stranded sessions stay
as tombstones until they expire, so that a stale message cannot re-create them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from control.pc.core.durable import SessionRecord
from control.pc.core.events import Ack, FailoverAction, ResumeSession, SessionStranded
from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.records import SessionCheckpoint

DEFAULT_MAX_SESSIONS: Final = 65536
DEFAULT_IDLE_TIMEOUT_S: Final = 3600.0
FIRST_EPOCH: Final = 1

# Picks the instance to resume a session on: (checkpoint at the new epoch, instances to avoid) -> URI.
Chooser = Callable[[SessionCheckpoint, frozenset[str]], str | None]

NO_INSTANCE: Final = "no-instance"
NO_CHECKPOINT: Final = "no-checkpoint"


class SessionLimitError(ProblemError):
    """The PC tracks ``max_sessions`` already (503): a bound on state that peers can create."""

    def __init__(self, limit: int) -> None:
        super().__init__(Problem.generic(503, "Service Unavailable", f"the PC tracks at most {limit} sessions"))


def _conflict(detail: str) -> ProblemError:
    return ProblemError(Problem.generic(409, "Conflict", detail))


def _forbidden(detail: str) -> ProblemError:
    return ProblemError(Problem.generic(403, "Forbidden", detail))


@dataclass(slots=True)
class _Session:
    """Mutable bookkeeping of one session; never leaves this module."""

    session: str
    owner: str | None
    epoch: int
    checkpoint: SessionCheckpoint | None
    touched: float
    stranded: str | None = None  # NO_INSTANCE or NO_CHECKPOINT while the session has no owner
    closed: bool = False
    scope_id: bytes | None = None  # what the session was opened with; None for an adopted one
    compat_id: bytes | None = None


class SessionTable:
    """Owner, epoch and latest checkpoint of each session."""

    __slots__ = ("_adopt", "_idle", "_max", "_sessions")

    def __init__(self, *, max_sessions: int = DEFAULT_MAX_SESSIONS, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 adopt_unknown: bool = True) -> None:
        """``adopt_unknown``: a checkpoint for a session the PC never placed registers it, owned by
        its sender, so sessions started without the PC are still protected by checkpoints."""
        self._max = max_sessions
        self._idle = idle_timeout_s
        self._adopt = adopt_unknown
        self._sessions: dict[str, _Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._sessions))

    # -- queries -------------------------------------------------------------------------------
    def owner_of(self, session: str) -> str | None:
        entry = self._sessions.get(session)
        return None if entry is None else entry.owner

    def epoch_of(self, session: str) -> int | None:
        entry = self._sessions.get(session)
        return None if entry is None else entry.epoch

    def latest(self, session: str) -> SessionCheckpoint | None:
        """The checkpoint a resume would use (at the session's current epoch), or None."""
        entry = self._sessions.get(session)
        return None if entry is None else entry.checkpoint

    def sessions_of(self, instance: str) -> list[str]:
        return sorted(s.session for s in self._sessions.values() if s.owner == instance and not s.closed)

    def stranded(self) -> list[str]:
        return sorted(s.session for s in self._sessions.values() if s.stranded == NO_INSTANCE)

    # -- durable state (control.pc.core.durable) ------------------------------------------------
    def record(self, session: str) -> SessionRecord | None:
        """What a store keeps of ``session`` (the PC adds what it knows beyond the table), or None."""
        e = self._sessions.get(session)
        if e is None:
            return None
        return SessionRecord(e.session, e.epoch, e.owner, e.checkpoint, e.scope_id, e.compat_id, e.stranded, e.closed)

    def restore(self, record: SessionRecord, now: float) -> None:
        """Take a session over from the store (a new leader): its idle timeout starts again at ``now``."""
        self._insert(_Session(record.session, record.owner, record.epoch, record.checkpoint, now, record.stranded,
                              record.closed, record.scope_id, record.compat_id))

    # -- placement and checkpoints -------------------------------------------------------------
    def open(self, session: str, owner: str, now: float, *, checkpoint: SessionCheckpoint | None = None,
             epoch: int = FIRST_EPOCH, scope_id: bytes | None = None, compat_id: bytes | None = None) -> None:
        """Register a session the PC placed on ``owner``.  An initial checkpoint (output_offset 0, built
        from the prompt the PC has anyway) lets the session resume even if it fails before its first one.
        ``scope_id`` and ``compat_id`` (the request's; by default the initial checkpoint's) bind every
        later checkpoint: without them the first one could move the session into another scope."""
        if session in self._sessions:
            raise _conflict(f"session {session} already exists")
        if checkpoint is not None:
            if checkpoint.session != session or checkpoint.epoch != epoch:
                raise ValueError("the initial checkpoint must name the session and its epoch")
            if scope_id not in (None, checkpoint.scope_id) or compat_id not in (None, checkpoint.compat_id):
                raise ValueError("the initial checkpoint must name the session's scope_id and compat_id")
            scope_id, compat_id = checkpoint.scope_id, checkpoint.compat_id
        self._insert(_Session(session, owner, epoch, checkpoint, now, scope_id=scope_id, compat_id=compat_id))

    def _insert(self, entry: _Session) -> _Session:
        if len(self._sessions) >= self._max:
            raise SessionLimitError(self._max)
        self._sessions[entry.session] = entry
        return entry

    def checkpoint(self, sender: str, checkpoint: SessionCheckpoint, now: float) -> Ack:
        """PUT sessions/{session}/checkpoint from ``sender`` (the authenticated instance)."""
        entry = self._sessions.get(checkpoint.session)
        if entry is None:
            if not self._adopt:
                raise ProblemError.of(ProblemType.NOT_FOUND, f"no session {checkpoint.session}")
            entry = self._insert(_Session(checkpoint.session, sender, checkpoint.epoch, None, now))
        self._check_fence(entry, sender, checkpoint.epoch)
        _check_bound(entry, checkpoint)
        _check_consistent(entry.checkpoint, checkpoint)
        if entry.checkpoint is None or checkpoint.output_offset > entry.checkpoint.output_offset:
            entry.checkpoint = checkpoint
        entry.touched = now
        return Ack(entry.session, entry.epoch, entry.checkpoint.output_offset)

    def _check_fence(self, entry: _Session, sender: str, epoch: int) -> None:
        if epoch < entry.epoch:
            raise ProblemError.of(ProblemType.STALE_EPOCH,
                                  f"session {entry.session}: epoch {epoch} is older than {entry.epoch}")
        if epoch > entry.epoch:
            raise _conflict(f"session {entry.session}: epoch {epoch} was never issued (current {entry.epoch})")
        if entry.closed:
            raise ProblemError.of(ProblemType.NOT_FOUND, f"session {entry.session} is closed")
        if entry.owner != sender:
            raise _forbidden(f"session {entry.session} at epoch {epoch} is not owned by {sender}")

    def close(self, session: str, sender: str, epoch: int, now: float) -> None:
        """The owner finished the session; it stays as a tombstone until it expires."""
        entry = self._sessions.get(session)
        if entry is None:
            raise ProblemError.of(ProblemType.NOT_FOUND, f"no session {session}")
        self._check_fence(entry, sender, epoch)
        entry.closed, entry.owner, entry.touched = True, None, now

    # -- failover ------------------------------------------------------------------------------
    def fail_instance(self, instance: str, now: float, choose: Chooser) -> list[FailoverAction]:
        """Move every session owned by the failed ``instance`` to a new instance at epoch + 1."""
        owned = [s for s in self._sessions.values() if s.owner == instance and not s.closed]
        return [self._failover(entry, now, choose, frozenset({instance}))
                for entry in sorted(owned, key=lambda s: s.session)]

    def fail_session(self, session: str, now: float, choose: Chooser) -> FailoverAction:
        """Move one session on (its resume was refused or undeliverable); its owner is avoided."""
        entry = self._sessions.get(session)
        if entry is None or entry.closed:
            raise ProblemError.of(ProblemType.NOT_FOUND, f"no open session {session}")
        avoid = frozenset() if entry.owner is None else frozenset({entry.owner})
        return self._failover(entry, now, choose, avoid)

    def retry_stranded(self, now: float, choose: Chooser) -> list[ResumeSession]:
        """Try again to place sessions stranded for lack of an instance."""
        out: list[ResumeSession] = []
        for entry in sorted(self._sessions.values(), key=lambda s: s.session):
            if entry.stranded == NO_INSTANCE:
                action = self._failover(entry, now, choose, frozenset())
                if isinstance(action, ResumeSession):
                    out.append(action)
        return out

    def _failover(self, entry: _Session, now: float, choose: Chooser, avoid: frozenset[str]) -> FailoverAction:
        # Raise the epoch before anything else: from here on the old owner is fenced.  A stranded
        # session has no owner to fence, so a retry keeps the epoch its resume has not used yet.
        # A retry that finds no instance does not count as activity: a session stranded for good
        # still ages out through `expire` instead of being kept alive by its own retries.
        if entry.owner is not None or entry.stranded is None:
            entry.epoch += 1
            entry.touched = now
        entry.owner = None
        if entry.checkpoint is None:
            entry.stranded = NO_CHECKPOINT
            return SessionStranded(entry.session, entry.epoch, NO_CHECKPOINT)
        checkpoint = dataclasses.replace(entry.checkpoint, epoch=entry.epoch)
        entry.checkpoint = checkpoint
        target = choose(checkpoint, avoid)
        if target is None:
            entry.stranded = NO_INSTANCE
            return SessionStranded(entry.session, entry.epoch, NO_INSTANCE)
        entry.owner, entry.stranded, entry.touched = target, None, now
        return ResumeSession(entry.session, target, checkpoint)

    def expire(self, now: float) -> list[str]:
        """Drop sessions untouched for ``idle_timeout_s`` (finished, abandoned, or tombstones)."""
        gone = [s.session for s in self._sessions.values() if now - s.touched >= self._idle]
        for session in gone:
            del self._sessions[session]
        return gone


def _check_bound(entry: _Session, new: SessionCheckpoint) -> None:
    if (entry.scope_id is not None and new.scope_id != entry.scope_id) or \
            (entry.compat_id is not None and new.compat_id != entry.compat_id):
        raise ProblemError.of(ProblemType.INCOMPATIBLE,
                              f"session {new.session}: compat_id or scope_id differs from the session's")


def _check_consistent(recorded: SessionCheckpoint | None, new: SessionCheckpoint) -> None:
    """A checkpoint may extend the recorded one but not contradict it (section 6.8: delivered output
    is never repeated or altered)."""
    if recorded is None:
        return
    if new.compat_id != recorded.compat_id or new.scope_id != recorded.scope_id:
        raise ProblemError.of(ProblemType.INCOMPATIBLE,
                              f"session {new.session}: compat_id or scope_id differs from its checkpoints")
    if new.prompt_blocks != recorded.prompt_blocks or new.prompt_tail != recorded.prompt_tail:
        raise _conflict(f"session {new.session}: the prompt differs from the recorded checkpoint")
    a, b = new.sampler, recorded.sampler
    if (a.method, a.params, a.seed, a.deterministic) != (b.method, b.params, b.seed, b.deterministic):
        raise _conflict(f"session {new.session}: the sampler differs from the recorded checkpoint")
    shared = min(new.output_offset, recorded.output_offset)
    if new.generated[:shared] != recorded.generated[:shared]:
        raise _conflict(f"session {new.session}: generated tokens differ from those already checkpointed")
