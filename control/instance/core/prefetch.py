"""Prefetch directives at the instance (spec section 6.5), sans-I/O.

`PrefetchTracker` decides which directives to accept and tracks each one's state; the adapter does
the leasing, loading and publishing that the returned `LoadBlock` actions ask for.  Rules enforced:

- directives are accepted only from the PC's identity (section 9: "instances MUST accept them only
  from the PC"); any other client gets `DirectiveForbidden` (403);
- at most ``max_pending`` directives are pending at once (section 9 REQUIRES a quota on pending
  directives; decision D2 sets the default): one more is `DirectiveQuotaExceeded` (429);
- a directive for another Compatibility ID is kvsp-incompatible (409); a repeated directive identifier
  is idempotent when the body is the same and a conflict (409) when it is not;
- states are pending, partial, complete and failed.  Only the leading loaded blocks count, because an
  engine extends a cache at its end and cannot use block i+1 without block i: the reported ``loaded``
  list is that prefix, and once a block fails the later ones are cancelled (they could not count);
- when the deadline passes the instance stops loading (`CancelLoads`) and reports "partial"; the
  request is then served with the loaded prefix and the rest is recomputed;
- a directive whose blocks all settle is "complete" when all loaded, "partial" when a prefix loaded,
  and "failed" when not even the first block did.
- finished directives stay readable (GET prefetch/{id}) until ``max_finished`` newer ones push them out;
- a directive whose ``request_ref`` names a session (the PC sets it to the session ID) is found by
  `for_request`: that session's start waits for it and is then served with the prefix it loaded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Final

from control.instance.core.events import CancelLoads, LoadBlock, PrefetchAction
from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.records import PrefetchDirective, PrefetchState, PrefetchStatus

DEFAULT_MAX_PENDING: Final = 64  # kvsp.service.policy.Quotas.pending_directives_per_instance
DEFAULT_MAX_FINISHED: Final = 1024


class DirectiveForbidden(ProblemError):
    """A directive from a client that is not the PC (403)."""

    def __init__(self, sender: str) -> None:
        super().__init__(Problem.generic(403, "Forbidden", f"{sender} is not the placement controller"))


class DirectiveQuotaExceeded(ProblemError):
    """Too many pending directives (429): the quota section 9 requires."""

    def __init__(self, limit: int) -> None:
        super().__init__(Problem.generic(429, "Too Many Requests", f"at most {limit} pending prefetch directives"))


@dataclass(slots=True)
class _Directive:
    """Mutable progress of one directive; never leaves this module."""

    directive: PrefetchDirective
    deadline: float
    state: PrefetchState = PrefetchState.PENDING
    loaded: set[int] = field(default_factory=set)  # indices into directive.blocks
    failed: set[int] = field(default_factory=set)
    prefix: int = 0  # number of leading blocks loaded
    index: dict[bytes, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.index = {block.block_key: i for i, block in enumerate(self.directive.blocks)}

    def add_loaded(self, index: int) -> None:
        self.loaded.add(index)
        while self.prefix in self.loaded:
            self.prefix += 1

    @property
    def settled(self) -> bool:
        return len(self.loaded) + len(self.failed) == len(self.directive.blocks)

    def unsettled(self) -> list[int]:
        return [i for i in range(len(self.directive.blocks)) if i not in self.loaded and i not in self.failed]


class PrefetchTracker:
    """Directives received by one instance, by identifier."""

    __slots__ = ("_compat_id", "_directives", "_max_finished", "_max_pending", "_pc")

    def __init__(self, pc_identity: str, *, max_pending: int = DEFAULT_MAX_PENDING,
                 max_finished: int = DEFAULT_MAX_FINISHED, compat_id: bytes | None = None) -> None:
        self._pc = pc_identity
        self._max_pending = max_pending
        self._max_finished = max_finished
        self._compat_id = compat_id
        self._directives: OrderedDict[str, _Directive] = OrderedDict()

    @property
    def pending(self) -> int:
        return sum(1 for d in self._directives.values() if d.state is PrefetchState.PENDING)

    def next_deadline(self) -> float | None:
        """When `tick` next has work to do (the adapter arms one timer for it), or None."""
        return min((d.deadline for d in self._directives.values() if d.state is PrefetchState.PENDING), default=None)

    # -- POST prefetch -------------------------------------------------------------------------
    def accept(self, sender: str, directive: PrefetchDirective, now: float,
               held: Collection[bytes] = ()) -> list[PrefetchAction]:
        """Take a directive from ``sender`` (the authenticated client); ``held`` are the keys the instance
        already has, which count as loaded at once.  The adapter answers 202 with Location
        ``prefetch/{directive}`` and carries out the returned loads."""
        if sender != self._pc:
            raise DirectiveForbidden(sender)
        if self._compat_id is not None and directive.compat_id != self._compat_id:
            raise ProblemError.of(ProblemType.INCOMPATIBLE, "the directive's compat_id is not this instance's")
        known = self._directives.get(directive.directive)
        if known is not None:
            if known.directive != directive:
                raise ProblemError(Problem.generic(409, "Conflict", f"directive {directive.directive} differs"))
            return []
        if self.pending >= self._max_pending:
            raise DirectiveQuotaExceeded(self._max_pending)
        entry = _Directive(directive, now + directive.deadline_ms / 1000)
        for i, block in enumerate(directive.blocks):
            if block.block_key in held:
                entry.add_loaded(i)
        self._directives[directive.directive] = entry
        self._settle_if_done(entry)
        self._trim()
        if entry.state is not PrefetchState.PENDING:
            return []
        return [LoadBlock(directive.directive, i, directive.blocks[i].block_key, directive.blocks[i].sources,
                          directive.lease_ms) for i in entry.unsettled()]

    # -- progress from the adapter -------------------------------------------------------------
    def loaded(self, directive_id: str, block_key: bytes, now: float) -> list[PrefetchAction]:
        """A block is verified and placed.  After the deadline it no longer counts for the directive."""
        entry, index = self._block(directive_id, block_key)
        if entry.state is not PrefetchState.PENDING or index in entry.failed:
            return []
        entry.add_loaded(index)
        self._settle_if_done(entry)
        return []

    def load_failed(self, directive_id: str, block_key: bytes, now: float) -> list[PrefetchAction]:
        """No source could supply a block: the later blocks can no longer extend the prefix."""
        entry, index = self._block(directive_id, block_key)
        if entry.state is not PrefetchState.PENDING or index in entry.loaded:
            return []
        later = [i for i in entry.unsettled() if i > index]
        entry.failed.update([index, *later])
        self._settle_if_done(entry)
        keys = tuple(entry.directive.blocks[i].block_key for i in later)
        return [CancelLoads(directive_id, keys)] if keys else []

    def tick(self, now: float) -> list[PrefetchAction]:
        """Past its deadline a pending directive stops loading and becomes "partial" (section 6.5)."""
        out: list[PrefetchAction] = []
        for entry in self._directives.values():
            if entry.state is PrefetchState.PENDING and now >= entry.deadline:
                entry.state = PrefetchState.PARTIAL
                rest = tuple(entry.directive.blocks[i].block_key for i in entry.unsettled())
                if rest:
                    out.append(CancelLoads(entry.directive.directive, rest))
        self._trim()
        return out

    def for_request(self, request_ref: str) -> PrefetchStatus | None:
        """The newest directive sent for ``request_ref`` (the PC's session ID), or None."""
        for entry in reversed(self._directives.values()):
            if entry.directive.request_ref == request_ref:
                return self.status(entry.directive.directive)
        return None

    # -- GET prefetch/{id} ---------------------------------------------------------------------
    def status(self, directive_id: str) -> PrefetchStatus:
        """State and the loaded prefix (only the leading loaded blocks count)."""
        entry = self._entry(directive_id)
        keys = tuple(b.block_key for b in entry.directive.blocks[: entry.prefix])
        return PrefetchStatus(directive_id, entry.state, keys)

    def _entry(self, directive_id: str) -> _Directive:
        entry = self._directives.get(directive_id)
        if entry is None:
            raise ProblemError.of(ProblemType.NOT_FOUND, f"no directive {directive_id}")
        return entry

    def _block(self, directive_id: str, block_key: bytes) -> tuple[_Directive, int]:
        entry = self._entry(directive_id)
        index = entry.index.get(block_key)
        if index is not None:
            return entry, index
        raise ProblemError.of(ProblemType.NOT_FOUND, f"directive {directive_id} has no block {block_key.hex()}")

    def _settle_if_done(self, entry: _Directive) -> None:
        if not entry.settled:
            return
        if entry.prefix == len(entry.directive.blocks):
            entry.state = PrefetchState.COMPLETE
        elif entry.prefix > 0:
            entry.state = PrefetchState.PARTIAL
        else:
            entry.state = PrefetchState.FAILED

    def _trim(self) -> None:
        """Forget the oldest finished directives beyond ``max_finished``; pending ones are never dropped."""
        finished = [k for k, d in self._directives.items() if d.state is not PrefetchState.PENDING]
        for key in finished[: max(0, len(finished) - self._max_finished)]:
            del self._directives[key]
