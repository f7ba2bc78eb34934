"""Sequence shards at the instance (spec section 6.9), sans-I/O.

`ShardStore` keeps this instance's KV of one context by token range, as views of the buffers the
engine or the network filled, so that resharding can keep what stays:

- a retained range is never transferred or copied: after the commit it is a view of the very buffer
  it was in before (``bytes_moved`` counts only fetched octets; retained ones add 0);
- a plan's fetch ranges are pending until loaded; the plan is acknowledged (`AckPlan`) only once all
  of them are, and what was fetched is staged apart from the authoritative version;
- version v stays in force (and is what `read` serves to peers fetching from us) until the commit;
  the commit keeps retained plus fetched ranges and releases the rest (the plan's "release");
- an abort discards everything fetched for v+1, and so does passing the deadline without having
  acknowledged (the PC cannot commit without our acknowledgement), so a lost abort leaks nothing;
- plans, commits and aborts that do not match the current version are kvsp-plan-conflict; a repeated
  plan, commit or abort is answered as the first one was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from control.instance.core.events import (
    Aborted,
    AckPlan,
    CancelFetches,
    Committed,
    FetchRange,
    PlanFailed,
    ShardAction,
)
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import ReshardAbort, ReshardCommit, ReshardMessage, ReshardPlan, TokenRange
from kvsp.records.base import merge_ranges, subtract_ranges


def _conflict(detail: str) -> ProblemError:
    return ProblemError.of(ProblemType.PLAN_CONFLICT, detail)


@dataclass(frozen=True, slots=True, eq=False)
class Segment:
    """KV of ``tokens`` as one view; equality is identity, because views are not values."""

    tokens: TokenRange
    data: memoryview

    def slice(self, start: int, end: int, bytes_per_token: int) -> Segment:
        """A view of tokens [start, end) of this segment: no copy."""
        lo, hi = (start - self.tokens[0]) * bytes_per_token, (end - self.tokens[0]) * bytes_per_token
        return Segment((start, end), self.data[lo:hi])


@dataclass(slots=True)
class _Pending:
    """The plan being carried out; never leaves this module."""

    plan: ReshardPlan
    deadline: float
    waiting: set[TokenRange]
    staged: list[Segment] = field(default_factory=list)
    acked: bool = False

    @property
    def staged_bytes(self) -> int:
        return sum(s.data.nbytes for s in self.staged)


class ShardStore:
    """This instance's shards of one context (map), and the reshard in progress."""

    __slots__ = ("_bpt", "_pending", "_segments", "bytes_moved", "bytes_retained", "instance", "map_id", "version")

    def __init__(self, instance: str, map_id: str, version: int, *, bytes_per_token: int) -> None:
        """``bytes_per_token``: KV octets of one token (all layers, K and V), to check and slice buffers."""
        if bytes_per_token < 1:
            raise ValueError("bytes_per_token must be positive")
        self.instance, self.map_id, self.version = instance, map_id, version
        self._bpt = bytes_per_token
        self._segments: list[Segment] = []
        self._pending: _Pending | None = None
        self.bytes_moved = 0  # octets fetched from peers for plans (retained ranges never add to it)
        self.bytes_retained = 0  # octets kept in place across commits

    # -- the authoritative version -------------------------------------------------------------
    def held(self) -> tuple[TokenRange, ...]:
        return merge_ranges(s.tokens for s in self._segments)

    @property
    def held_bytes(self) -> int:
        """Octets of the authoritative version held here."""
        return sum(s.data.nbytes for s in self._segments)

    @property
    def staged_bytes(self) -> int:
        """Octets fetched for a version not yet committed (0 when no plan is in progress)."""
        return 0 if self._pending is None else self._pending.staged_bytes

    def put(self, tokens: TokenRange, data: memoryview | bytes | bytearray) -> None:
        """Store the KV of tokens this instance holds in the current version (prefill, decode growth)."""
        segment = self._segment(tokens, data)
        if any(s.tokens[0] < tokens[1] and tokens[0] < s.tokens[1] for s in self._segments):
            raise ValueError(f"tokens {tokens} overlap a held range")
        self._segments = sorted([*self._segments, segment], key=lambda s: s.tokens)

    def read(self, tokens: TokenRange) -> list[memoryview]:
        """Views of ``tokens`` in the authoritative version (a peer fetching from us); no copy."""
        return [s.data for s in self._views(tokens)]

    def _segment(self, tokens: TokenRange, data: memoryview | bytes | bytearray) -> Segment:
        view = memoryview(data).cast("B")
        if tokens[0] >= tokens[1] or view.nbytes != (tokens[1] - tokens[0]) * self._bpt:
            raise ValueError(f"{view.nbytes} octets do not hold tokens {tokens} at {self._bpt} octets per token")
        return Segment(tokens, view)

    def _views(self, tokens: TokenRange) -> list[Segment]:
        if subtract_ranges([tokens], self.held()):
            raise _conflict(f"tokens {tokens} are not held by {self.instance} in version {self.version}")
        return [s.slice(max(tokens[0], s.tokens[0]), min(tokens[1], s.tokens[1]), self._bpt)
                for s in self._segments if s.tokens[0] < tokens[1] and tokens[0] < s.tokens[1]]

    # -- POST reshard --------------------------------------------------------------------------
    def handle(self, message: ReshardMessage, now: float) -> list[ShardAction]:
        """Dispatch a POST reshard body (the adapter has checked that the client is the PC)."""
        if isinstance(message, ReshardPlan):
            return self.apply_plan(message, now)
        if isinstance(message, ReshardCommit):
            return self.commit(message, now)
        return self.abort(message, now)

    def apply_plan(self, plan: ReshardPlan, now: float) -> list[ShardAction]:
        """Start fetching; `AckPlan` at once when there is nothing to fetch."""
        self._check_map(plan.map)
        if self._pending is not None:
            if self._pending.plan != plan:
                raise _conflict(f"map {plan.map}: a plan to version {self._pending.plan.to_version} is in progress")
            return [AckPlan(plan.map, plan.to_version)] if self._pending.acked else []
        if plan.from_version != self.version:
            raise _conflict(f"map {plan.map}: plan from version {plan.from_version}, this instance has {self.version}")
        held = self.held()
        if subtract_ranges(plan.retain, held) or subtract_ranges(plan.release, held):
            raise _conflict(f"map {plan.map}: the plan retains or releases tokens {self.instance} does not hold")
        pending = _Pending(plan, now + plan.deadline_ms / 1000, {f.tokens for f in plan.fetch})
        self._pending = pending
        actions: list[ShardAction] = [FetchRange(plan.map, plan.to_version, f.tokens, f.source) for f in plan.fetch]
        if not pending.waiting:
            pending.acked = True
            actions.append(AckPlan(plan.map, plan.to_version))
        return actions

    def fetched(self, tokens: TokenRange, data: memoryview | bytes | bytearray, now: float) -> list[ShardAction]:
        """A fetch range arrived; data nobody waits for any more (aborted, expired) is dropped."""
        pending = self._pending
        if pending is None or tokens not in pending.waiting:
            return []
        segment = self._segment(tokens, data)
        pending.waiting.discard(tokens)
        pending.staged.append(segment)
        self.bytes_moved += segment.data.nbytes
        if pending.waiting:
            return []
        pending.acked = True
        return [AckPlan(pending.plan.map, pending.plan.to_version)]

    def fetch_failed(self, tokens: TokenRange, reason: str, now: float) -> list[ShardAction]:
        """A fetch range could not be loaded: the plan cannot be acknowledged (the PC will abort)."""
        pending = self._pending
        if pending is None or tokens not in pending.waiting:
            return []
        return [PlanFailed(pending.plan.map, pending.plan.to_version, tokens, reason)]

    def commit(self, message: ReshardCommit, now: float) -> list[ShardAction]:
        """Version v+1 is in force: keep retained (in place) and fetched ranges, release the rest."""
        self._check_map(message.map)
        pending = self._pending
        if pending is None and message.commit == self.version:
            return []  # repeated commit
        if pending is None or message.commit != pending.plan.to_version:
            raise _conflict(f"map {message.map}: no plan to version {message.commit} in progress")
        if not pending.acked:
            raise _conflict(f"map {message.map}: commit of version {message.commit} before it was acknowledged")
        retained = [piece for r in pending.plan.retain for piece in self._views(r)]
        released = subtract_ranges(self.held(), pending.plan.retain)
        released_bytes = sum(s.data.nbytes for r in released for s in self._views(r))
        self.bytes_retained += sum(s.data.nbytes for s in retained)
        self._segments = sorted([*retained, *pending.staged], key=lambda s: s.tokens)
        self.version, self._pending = message.commit, None
        return [Committed(message.map, message.commit, released, released_bytes)]

    def abort(self, message: ReshardAbort, now: float) -> list[ShardAction]:
        """Discard what was fetched for v+1; version v stays."""
        self._check_map(message.map)
        pending = self._pending
        if pending is None or message.abort != pending.plan.to_version:
            if message.abort == self.version + 1 and pending is None:
                return []  # repeated abort, or one after our own expiry
            raise _conflict(f"map {message.map}: no plan to version {message.abort} in progress")
        return self._discard(pending)

    def tick(self, now: float) -> list[ShardAction]:
        """Past the deadline without acknowledgement, the PC cannot commit: discard now."""
        pending = self._pending
        if pending is None or pending.acked or now < pending.deadline:
            return []
        return self._discard(pending)

    def next_deadline(self) -> float | None:
        pending = self._pending
        return None if pending is None or pending.acked else pending.deadline

    def _discard(self, pending: _Pending) -> list[ShardAction]:
        self._pending = None
        plan = pending.plan
        actions: list[ShardAction] = []
        if pending.waiting:
            actions.append(CancelFetches(plan.map, plan.to_version, tuple(sorted(pending.waiting))))
        actions.append(Aborted(plan.map, plan.to_version, pending.staged_bytes))
        return actions

    def _check_map(self, map_id: str) -> None:
        if map_id != self.map_id:
            raise _conflict(f"map {map_id} is not {self.map_id}")
