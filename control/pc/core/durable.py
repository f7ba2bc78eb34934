"""The PC's durable state as records, and the write rules every store applies (sans-I/O, decision D7).

What a Placement Controller must not lose when its process dies is written through a `PcStore`
(``control.pc.store``) before the PC acts on it: sessions (epoch, owner, latest checkpoint and what
the PC needs to start one again), the instance registry (the highest epoch seen and the PC's view of
each instance's state), Shard Maps (the authoritative version and a move in progress) and the prefetch
directives sent.  The in-memory store applies the rules below in Python; the Redis store applies the
same rules in Lua scripts, atomically where the state lives (``control/pc/store/scripts.py``), and one
table-driven suite (tests/test_pc_backend_rules.py) runs against both.

Rules, checked in this order after the caller's fencing token (`Refusal.FENCED` first, always):

- **checkpoint** (spec section 6.8): the session must exist (NOT_FOUND) and not be closed (CLOSED); an
  epoch lower than the session's is STALE, a higher one was never issued (UNISSUED); only the owner
  may checkpoint (FORBIDDEN); the recorded checkpoint is the one with the highest output_offset
  (a late, lower one changes nothing and is acknowledged with the recorded offset);
- **open**: a session is created once (EXISTS);
- **session** (a move, a close, stranding): a lower epoch than the recorded one is STALE; at the same
  or a higher epoch the recorded checkpoint is kept when its output_offset is higher than the one
  written (relabelled with the new epoch), so acknowledged output can never be taken back;
- **instance** (section 6.3): a record with an epoch lower than the highest seen is STALE;
- **map** (section 6.9): a version lower than the authoritative one is STALE.

Times are not stored: expiry is local to the leader's clock, so a new leader gives every instance a
fresh status ttl and every session a fresh idle timeout from its takeover (``restore`` in the cores).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.records import InstanceStatus, PrefetchDirective, SessionCheckpoint, ShardMap
from kvsp.registry import InstanceState


class Refusal(enum.StrEnum):
    """Why a store refused a write; the Lua scripts return these strings."""

    FENCED = "fenced"  # the caller's fencing token is not the current lease: it does not lead
    STALE = "stale"  # a lower epoch (or map version) than the recorded one
    UNISSUED = "unissued"  # a checkpoint epoch the PC never issued
    NOT_FOUND = "not-found"
    CLOSED = "closed"
    FORBIDDEN = "forbidden"  # a checkpoint from an instance that does not own the session
    EXISTS = "exists"


@dataclass(frozen=True, slots=True)
class Refused:
    """A rule's verdict against a write; ``current`` is the recorded epoch or version where it matters."""

    reason: Refusal
    current: int | None = None


class WriteRefused(Exception):
    """A store refused a write (`Refused` raised); `problem` is what a peer is answered, except for
    FENCED, which says that this PC no longer leads (the adapter steps down instead)."""

    def __init__(self, refused: Refused, what: str) -> None:
        super().__init__(f"{what}: {refused.reason.value}" + ("" if refused.current is None
                                                             else f" (recorded {refused.current})"))
        self.refused = refused
        self.what = what

    @property
    def reason(self) -> Refusal:
        return self.refused.reason

    def problem(self) -> ProblemError:
        reason, detail = self.refused.reason, str(self)
        if reason is Refusal.STALE:
            return ProblemError.of(ProblemType.STALE_EPOCH, detail)
        if reason in (Refusal.NOT_FOUND, Refusal.CLOSED):
            return ProblemError.of(ProblemType.NOT_FOUND, detail)
        if reason is Refusal.FORBIDDEN:
            return ProblemError(Problem.generic(403, "Forbidden", detail))
        if reason is Refusal.FENCED:
            return ProblemError(Problem.generic(503, "Service Unavailable", detail))
        return ProblemError(Problem.generic(409, "Conflict", detail))


# -- records --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SessionRecord:
    """One session as a store keeps it.

    ``checkpoint`` is at ``epoch`` (the PC relabels it when it raises the epoch); ``prompt`` is kept
    until the first checkpoint with output (a move before it re-sends the start); ``max_tokens`` and
    ``last_owner`` are what `SessionInfo` reports; ``moving`` says that the session was moved to
    ``owner`` and the owner has not accepted its resume yet (a new leader sends it again: the same
    resume at the same epoch is idempotent at the instance).
    """

    session: str
    epoch: int
    owner: str | None
    checkpoint: SessionCheckpoint | None = None
    scope_id: bytes | None = None
    compat_id: bytes | None = None
    stranded: str | None = None
    closed: bool = False
    max_tokens: int | None = None
    prompt: tuple[int, ...] | None = None
    last_owner: str | None = None
    moving: bool = False

    @property
    def output_offset(self) -> int:
        return 0 if self.checkpoint is None else self.checkpoint.output_offset


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """The last accepted status of an instance and the PC's view of its state (section 6.3)."""

    status: InstanceStatus
    state: InstanceState

    @property
    def instance(self) -> str:
        return self.status.instance

    @property
    def epoch(self) -> int:
        return self.status.epoch

    def to_json(self) -> dict[str, object]:
        return {"status": self.status.to_json(), "state": self.state.value}

    @classmethod
    def from_json(cls, value: dict[str, object]) -> InstanceRecord:
        return cls(InstanceStatus.from_json(value["status"]), InstanceState(str(value["state"])))


@dataclass(frozen=True, slots=True)
class MapRecord:
    """A Shard Map: the authoritative version, the one a move goes to, and the last move's outcome."""

    current: ShardMap
    moving_to: ShardMap | None = None
    last: tuple[int, str] | None = None  # (version, "committed" | "aborted")

    @property
    def map(self) -> str:
        return self.current.map

    @property
    def version(self) -> int:
        return self.current.version

    def to_json(self) -> dict[str, object]:
        return {"current": self.current.to_json(),
                "moving_to": None if self.moving_to is None else self.moving_to.to_json(),
                "last": None if self.last is None else list(self.last)}

    @classmethod
    def from_json(cls, value: dict[str, object]) -> MapRecord:
        moving, last = value.get("moving_to"), value.get("last")
        return cls(ShardMap.from_json(value["current"]), None if moving is None else ShardMap.from_json(moving),
                   None if not isinstance(last, list) else (int(last[0]), str(last[1])))


@dataclass(frozen=True, slots=True)
class DirectiveRecord:
    """A prefetch directive the PC sent (section 6.5), kept until its deadline and lease have passed."""

    instance: str
    directive: PrefetchDirective

    @property
    def id(self) -> str:
        return self.directive.directive

    @property
    def lifetime_ms(self) -> int:
        return self.directive.deadline_ms + self.directive.lease_ms

    def to_json(self) -> dict[str, object]:
        return {"instance": self.instance, "directive": self.directive.to_json()}

    @classmethod
    def from_json(cls, value: dict[str, object]) -> DirectiveRecord:
        return cls(str(value["instance"]), PrefetchDirective.from_json(value["directive"]))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a new leader loads before it grants anything."""

    sessions: tuple[SessionRecord, ...] = ()
    instances: tuple[InstanceRecord, ...] = ()
    maps: tuple[MapRecord, ...] = ()
    directives: tuple[DirectiveRecord, ...] = ()


# -- the rules ------------------------------------------------------------------------------------
def checkpoint_rule(stored: SessionRecord | None, sender: str,
                    checkpoint: SessionCheckpoint) -> SessionRecord | Refused:
    """The session after recording ``checkpoint`` from ``sender``, or why not."""
    if stored is None:
        return Refused(Refusal.NOT_FOUND)
    if checkpoint.epoch < stored.epoch:
        return Refused(Refusal.STALE, stored.epoch)
    if checkpoint.epoch > stored.epoch:
        return Refused(Refusal.UNISSUED, stored.epoch)
    if stored.closed:
        return Refused(Refusal.CLOSED)
    if stored.owner != sender:
        return Refused(Refusal.FORBIDDEN)
    if stored.checkpoint is not None and checkpoint.output_offset <= stored.output_offset:
        return stored  # the recorded one covers it
    prompt = None if checkpoint.output_offset > 0 else stored.prompt
    return dataclasses.replace(stored, checkpoint=checkpoint, prompt=prompt)


def open_rule(stored: SessionRecord | None, new: SessionRecord) -> SessionRecord | Refused:
    return new if stored is None else Refused(Refusal.EXISTS, stored.epoch)


def session_rule(stored: SessionRecord | None, new: SessionRecord) -> SessionRecord | Refused:
    """A whole session written (moved, closed, stranded): never to a lower epoch, never losing output."""
    if stored is None:
        return new
    if new.epoch < stored.epoch:
        return Refused(Refusal.STALE, stored.epoch)
    if stored.checkpoint is not None and stored.output_offset > new.output_offset:
        kept = dataclasses.replace(stored.checkpoint, epoch=new.epoch)
        return dataclasses.replace(new, checkpoint=kept, prompt=None)
    return new


def instance_rule(stored: InstanceRecord | None, new: InstanceRecord) -> InstanceRecord | Refused:
    if stored is not None and new.epoch < stored.epoch:
        return Refused(Refusal.STALE, stored.epoch)
    return new


def map_rule(stored: MapRecord | None, new: MapRecord) -> MapRecord | Refused:
    if stored is not None and new.version < stored.version:
        return Refused(Refusal.STALE, stored.version)
    return new
