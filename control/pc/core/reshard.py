"""Resharding of sequence-sharded caches, the PC side (spec section 6.9), sans-I/O.

`ReshardCoordinator` runs the two-phase move of a Shard Map from version v to v+1:

1. `start` computes every member's plan with `kvsp.records.plan_reshard` (ranges an instance holds in
   both versions are in its "retain" and are never transferred) and returns a `SendPlan` for each
   instance of either version;
2. each 200 answer is an `ack`; when every member has acknowledged, `SendCommit` goes to all of them
   and v+1 becomes authoritative;
3. when the deadline passes first (`tick`), or a member fails, `SendAbort` goes to all of them and
   v stays authoritative.

Version v remains authoritative (`authoritative`) until the commit.  Only one reshard per map runs at
a time; a second one, or a plan whose old map is not the authoritative version, is kvsp-plan-conflict.
An acknowledgement that arrives after the deadline aborts rather than commits: the members may
already have discarded what they fetched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from control.pc.core.events import ReshardAction, SendAbort, SendCommit, SendPlan
from kvsp.errors import ValidationError
from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.records import ReshardAbort, ReshardCommit, ReshardPlan, ShardMap, plan_reshard

DEFAULT_MAX_MAPS: Final = 4096


def _plan_conflict(detail: str) -> ProblemError:
    return ProblemError.of(ProblemType.PLAN_CONFLICT, detail)


@dataclass(slots=True)
class _Reshard:
    """One move in progress; never leaves this module."""

    old: ShardMap
    new: ShardMap
    plans: dict[str, ReshardPlan]
    deadline: float
    acked: set[str] = field(default_factory=set)

    @property
    def members(self) -> list[str]:
        return list(self.plans)


class ReshardCoordinator:
    """Authoritative Shard Map per map identifier, and the reshard in progress for each."""

    __slots__ = ("_maps", "_max_maps", "_pending")

    def __init__(self, *, max_maps: int = DEFAULT_MAX_MAPS) -> None:
        self._max_maps = max_maps
        self._maps: dict[str, ShardMap] = {}
        self._pending: dict[str, _Reshard] = {}

    # -- queries -------------------------------------------------------------------------------
    def authoritative(self, map_id: str) -> ShardMap | None:
        """The version every member must serve from: the old one until a commit."""
        return self._maps.get(map_id)

    def in_progress(self, map_id: str) -> int | None:
        """The version being moved to, or None."""
        pending = self._pending.get(map_id)
        return None if pending is None else pending.new.version

    def moving_to(self, map_id: str) -> ShardMap | None:
        """The map a move in progress goes to, or None."""
        pending = self._pending.get(map_id)
        return None if pending is None else pending.new

    def maps(self) -> list[str]:
        return sorted(self._maps)

    def restore(self, current: ShardMap, moving_to: ShardMap | None) -> list[SendAbort]:
        """Take a map over from the store (a new leader).  A move that was in progress is aborted: its
        acknowledgements went to the old leader, and version v stays authoritative until a commit."""
        self._maps[current.map] = current
        if moving_to is None:
            return []
        try:
            members = list(plan_reshard(current, moving_to, deadline_ms=1))
        except ValidationError:  # a pair the coordinator accepted plans; this only guards a bad record
            members = list(dict.fromkeys((*current.instances(), *moving_to.instances())))
        abort = ReshardAbort(current.map, moving_to.version)
        return [SendAbort(member, abort) for member in members]

    def next_deadline(self) -> float | None:
        """When `tick` next has work to do (the adapter arms one timer for it), or None."""
        return min((p.deadline for p in self._pending.values()), default=None)

    # -- operations ----------------------------------------------------------------------------
    def register(self, shard_map: ShardMap) -> None:
        """Declare the authoritative version of a map (a new parallel group, or PC recovery)."""
        if shard_map.map in self._pending:
            raise _plan_conflict(f"map {shard_map.map}: a reshard is in progress")
        if shard_map.map not in self._maps and len(self._maps) >= self._max_maps:
            raise ProblemError(Problem.generic(503, "Service Unavailable",
                                               f"the PC tracks at most {self._max_maps} shard maps"))
        self._maps[shard_map.map] = shard_map

    def start(self, old: ShardMap, new: ShardMap, deadline_ms: int, now: float) -> list[SendPlan]:
        """Begin moving ``old`` (version v) to ``new`` (v+1): one plan per member of either version."""
        if old.map in self._pending:
            raise _plan_conflict(f"map {old.map}: the move to version {self._pending[old.map].new.version} "
                                 "is still in progress")
        current = self._maps.get(old.map)
        if current is not None and current != old:
            raise _plan_conflict(f"map {old.map}: version {old.version} given, {current.version} is authoritative")
        try:
            plans = plan_reshard(old, new, deadline_ms=deadline_ms)
        except ValidationError as exc:
            raise _plan_conflict(f"map {old.map}: {exc}") from exc
        if current is None:
            self.register(old)
        self._pending[old.map] = _Reshard(old, new, plans, now + deadline_ms / 1000)
        return [SendPlan(instance, plan) for instance, plan in plans.items()]

    def ack(self, instance: str, map_id: str, version: int, now: float) -> list[ReshardAction]:
        """``instance`` answered its plan for ``version`` with 200 (it has loaded every fetch range)."""
        pending = self._pending.get(map_id)
        if pending is None or pending.new.version != version:
            current = self._maps.get(map_id)
            if current is not None and current.version == version and pending is None:
                return []  # a repeated acknowledgement of a move already committed
            raise _plan_conflict(f"map {map_id}: no move to version {version} in progress")
        if instance not in pending.plans:
            raise _plan_conflict(f"map {map_id}: {instance} is not a member of version {version - 1} or {version}")
        if now >= pending.deadline:
            return list(self._abort(map_id))
        pending.acked.add(instance)
        if len(pending.acked) < len(pending.plans):
            return []
        del self._pending[map_id]
        self._maps[map_id] = pending.new
        commit = ReshardCommit(map_id, pending.new.version)
        return [SendCommit(member, commit) for member in pending.members]

    def tick(self, now: float) -> list[SendAbort]:
        """Abort every move whose deadline passed before all members acknowledged."""
        out: list[SendAbort] = []
        for map_id in [m for m, p in self._pending.items() if now >= p.deadline]:
            out.extend(self._abort(map_id))
        return out

    def member_failed(self, instance: str, now: float) -> list[SendAbort]:
        """Abort at once the moves a failed instance belongs to: it can no longer acknowledge."""
        out: list[SendAbort] = []
        for map_id in [m for m, p in self._pending.items() if instance in p.plans]:
            out.extend(self._abort(map_id))
        return out

    def _abort(self, map_id: str) -> list[SendAbort]:
        pending = self._pending.pop(map_id)
        abort = ReshardAbort(map_id, pending.new.version)
        return [SendAbort(member, abort) for member in pending.members]
