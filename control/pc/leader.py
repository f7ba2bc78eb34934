"""The PC leader's working copy, its lease, and its writes through the store (decision D7).

**Durable state** (decision D7).  The cores are the leader's working copy; what must survive the
process is written through the `PcStore` (``[pc] backend``) *before* the PC acts on it: a checkpoint
is acknowledged, a start or resume sent, a plan or directive sent, only after the store took the write.
Each write carries the leader's fence and is checked by the store with the epoch rules of
`control.pc.core.durable`.  Writes of one key are ordered (`KeyedOrder`) and each writes the key's
latest in-memory state.  When a write's outcome is unknown (`StoreUnavailable`) the PC stops granting
(``syncing``) until a renewal shows the lease is still its own and the state is loaded again; when a
write is fenced, or the lease cannot be renewed before its deadline, the PC steps down to standby and
forgets its working copy.  A new leader loads everything from the store (`take_over`).

With the embedded memory store the PC is its own only leader from start-up (no lease loop); with Redis
``run_lease`` acquires, renews and syncs (`Leadership` says when).
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from control.index.status import StatusBoard
from control.pc.client import InstanceClient
from control.pc.core import (
    FailoverAction,
    InstanceRegistry,
    MinActivePolicy,
    Placer,
    PlacerConfig,
    ReshardAction,
    ReshardCoordinator,
    ResumeSession,
    SessionTable,
)
from control.pc.core.durable import MapRecord, Refusal, SessionRecord, Snapshot, WriteRefused
from control.pc.core.leadership import Leadership, LeaseTiming, Role
from control.pc.metrics import PcMetrics
from control.pc.settings import PcSettings
from control.pc.store import Fence, MemoryStore, PcStore, StoreUnavailable, make_holder
from control.pc.tasks import Background, KeyedOrder
from kvsp.client.index import IndexClient
from kvsp.problems import Problem, ProblemError
from kvsp.registry import InstanceState
from kvsp.service.logs import FailureStreak
from kvsp.service.policy import Policy

log = logging.getLogger("kvsp.pc")

T = TypeVar("T")
EMBEDDED_LEASE_MS: Final = 10 * 365 * 86_400_000  # the embedded PC leads for the life of its process


@dataclass(slots=True)
class SessionMeta:
    """What the PC knows of a session it placed beyond the core's table.

    ``prompt`` is kept until the first checkpoint with output: until then a move re-sends the start
    (at the new epoch) instead of a resume, because a Session Checkpoint names prompt blocks by key
    only, and blocks that no instance has computed yet cannot be loaded anywhere.
    """

    scope_id: bytes
    max_tokens: int
    last_owner: str | None
    prompt: tuple[int, ...] | None = None
    moves: int = 0  # moves since the last checkpoint at the current epoch (not stored: a new leader starts at 0)
    moving: bool = False  # moved, and the new owner has not accepted the resume yet (stored)


@dataclass(frozen=True, slots=True)
class ReshardOutcome:
    version: int
    outcome: str  # "committed" or "aborted"


class NotLeader(Exception):
    """This PC does not lead now.  The HTTP adapter answers 421 naming ``leader`` (a standby that knows
    the leader) or 503 (no leader known, or this PC is loading its state or cannot reach its store)."""

    def __init__(self, leader: str | None, detail: str) -> None:
        super().__init__(detail)
        self.leader = leader
        self.detail = detail


def _service_unavailable(detail: str) -> ProblemError:
    return ProblemError(Problem.generic(503, "Service Unavailable", detail))



class LeadingController(abc.ABC):
    """The PC's cores (its working copy), its store and lease, its outbound clients and background
    work, bound to one clock.  `PlacementController` adds what the PC does with them."""

    def __init__(self, settings: PcSettings, policy: Policy, *, base_uri: str, clock: Callable[[], float],
                 metrics: PcMetrics, board: StatusBoard | None = None, store: PcStore | None = None,
                 lease_clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.policy = policy
        self.base_uri = base_uri
        self.clock = clock
        self.lease_clock = lease_clock  # real time: the lease expires in the store by real time
        self.metrics = metrics
        self.board = board
        self.store: PcStore = store if store is not None else MemoryStore()
        self.embedded = store is None or settings.backend.kind == "memory"
        self.holder = make_holder(uuid.uuid4().hex, base_uri)
        self.leadership = Leadership(LeaseTiming(settings.lease_ttl_ms / 1000))
        self._fence: Fence | None = None
        self._order = KeyedOrder()
        mean_us = settings.mean_service_ms * 1000
        self.placers = {compat: Placer(PlacerConfig(block_tokens=d.block_tokens, layers=d.layers,
                                                    mean_service_us=mean_us))
                        for compat, d in settings.descriptors.items()}
        self.client: InstanceClient | None = None  # set when the app starts (needs a running loop)
        self.index: IndexClient | None = None
        self.tasks = Background()
        self._forget()

    def _forget(self) -> None:
        """Empty working copy: at start-up, and when this PC steps down (it must not act on it again)."""
        self.tasks.cancel_all()
        self.registry = InstanceRegistry(MinActivePolicy(self.settings.min_active))
        # Every session is one the PC placed: a checkpoint never creates one (section 9: only the PC
        # decides who serves a session, and a session's instance receives its prompt).
        self.sessions = SessionTable(adopt_unknown=False)
        self.reshards = ReshardCoordinator()
        self.meta: dict[str, SessionMeta] = {}
        self.map_outcomes: dict[str, ReshardOutcome] = {}
        self._desired: dict[str, InstanceState] = {}
        self._state_senders: set[str] = set()
        self._last_stranded_retry = -math.inf

    @property
    def instances(self) -> InstanceClient:
        if self.client is None:
            raise _service_unavailable("the PC is not started")
        return self.client

    # -- leadership (decision D7) -----------------------------------------------------------------
    @property
    def role(self) -> Role:
        return self.leadership.role

    @property
    def leader(self) -> str | None:
        """The leader's base URI as this PC knows it (its own while it leads)."""
        return self.base_uri if self.role is not Role.STANDBY else self.leadership.leader

    def require_leader(self) -> None:
        """Raise `NotLeader` unless this PC may grant now: the role handlers call it first."""
        if self.leadership.may_grant(self.lease_clock()):
            return
        leader = self.leadership.leader if self.role is Role.STANDBY else None
        if leader == self.base_uri:
            leader = None  # our own lapsed lease: nobody leads until it expires
        self.metrics.not_leader.labels("421" if leader else "503").inc()
        raise NotLeader(leader, self._not_leader_detail(leader))

    def _not_leader_detail(self, leader: str | None) -> str:
        if self.role is Role.SYNCING:
            return "this PC holds the lease and is loading its state from the store"
        if leader is not None:
            return f"this PC is a standby; the leader is {leader}"
        return "no PC leads at the moment (an election is under way, or the store is unreachable)"

    async def start(self) -> None:
        """The embedded store: lead at once.  Redis: `run_lease` elects (called by the app)."""
        if self.embedded:
            await self._try_acquire(EMBEDDED_LEASE_MS)

    async def run_lease(self) -> None:
        """Acquire, renew and sync for the life of the process; cancelled at shutdown."""
        streak = FailureStreak(log, "PC lease round")
        while True:
            try:
                await self._lease_round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one bad round must not end the election for the process lifetime
                streak.failed(exc, self.lease_clock())
            else:
                streak.succeeded(self.lease_clock())
            await asyncio.sleep(self.leadership.next_wait(self.lease_clock()))

    async def _lease_round(self) -> None:
        """Standby: try to acquire.  Leading or syncing: renew; a refusal (the lease is another's) steps
        down at once; a renew that cannot get through steps down once the local deadline has passed."""
        if self.role is Role.STANDBY:
            await self._try_acquire(self.leadership.timing.ttl_ms)
            return
        fence = self._fence
        assert fence is not None
        sent = self.lease_clock()
        try:
            still_ours = await self.store.renew(fence, self.leadership.timing.ttl_ms)
        except StoreUnavailable as exc:
            if self.leadership.lapsed(self.lease_clock()):
                self.step_down(f"the lease could not be renewed before its deadline ({exc})")
            else:
                self._store_failed(exc)
            return
        if not still_ours:
            self.metrics.fenced_writes.labels("renew").inc()
            self.step_down("the store refused the renewal: the lease expired and may have been taken over")
            return
        self.leadership.renewed(sent)
        if self.role is Role.SYNCING:
            await self._sync()

    async def _try_acquire(self, ttl_ms: int) -> None:
        sent = self.lease_clock()
        try:
            view = await self.store.acquire(self.holder, ttl_ms)
        except StoreUnavailable as exc:
            log.info("lease acquire failed: %s", exc)
            self.leadership.saw_leader(None)
            return
        if view.fence is None:
            self.leadership.saw_leader(view.leader)
            return
        self._fence = view.fence
        self.leadership.granted(view.fence.token, self.base_uri, sent, ttl_ms / 1000)
        log.warning("PC %s acquired the leader lease (fencing token %d)", self.base_uri, view.fence.token)
        await self._sync()

    async def _sync(self) -> None:
        """Load the whole state from the store and lead with it (a takeover, or after a store error)."""
        try:
            snapshot = await self.store.load()
        except StoreUnavailable as exc:
            log.warning("loading the PC state failed, still syncing: %s", exc)
            self.metrics.store_errors.labels("load").inc()
            return
        if self.role is not Role.SYNCING:
            return  # stepped down while loading
        self.take_over(snapshot)
        self.leadership.synced()
        self.metrics.leader.set(1)
        self.metrics.takeovers.inc()
        log.warning("PC %s leads with %d sessions, %d instances, %d maps", self.base_uri, len(snapshot.sessions),
                    len(snapshot.instances), len(snapshot.maps))

    def take_over(self, snapshot: Snapshot) -> None:
        """Replace the working copy with ``snapshot``; moves that were in progress are aborted."""
        self._forget()
        now = self.clock()
        for record in snapshot.instances:
            self.registry.restore(record, now, grace_s=self.leadership.timing.ttl_s)
        for s in snapshot.sessions:
            self.sessions.restore(s, now)
            if s.scope_id is not None and s.max_tokens is not None:
                self.meta[s.session] = SessionMeta(s.scope_id, s.max_tokens, s.last_owner, s.prompt, moving=s.moving)
        aborts: list[ReshardAction] = []
        for m in snapshot.maps:
            if m.last is not None:
                self.map_outcomes[m.map] = ReshardOutcome(*m.last)
            aborts.extend(self.reshards.restore(m.current, m.moving_to))
        if aborts:
            self.tasks.spawn(self.carry_out_reshard(aborts), "kvsp-pc-restore-aborts")
        for s in snapshot.sessions:  # the old leader may have died before a move's resume went out
            if s.moving and s.owner is not None and s.checkpoint is not None and not s.closed:
                self._follow_later(ResumeSession(s.session, s.owner, s.checkpoint))

    def step_down(self, reason: str) -> None:
        """Stop leading: standby, the working copy forgotten, every delivery in flight cancelled."""
        if self.role is Role.STANDBY:
            return
        log.warning("PC %s steps down: %s", self.base_uri, reason)
        self.leadership.lost()
        self._fence = None
        self.metrics.leader.set(0)
        self.metrics.step_downs.inc()
        self._forget()

    def _store_failed(self, exc: StoreUnavailable) -> None:
        if self.role is Role.LEADER:
            log.warning("PC %s stops granting until its state is loaded again: %s", self.base_uri, exc)
            self.leadership.store_failed()
            self.metrics.leader.set(0)
            self.tasks.cancel_all()

    async def release(self) -> None:
        """At shutdown: give the lease up, so a standby takes over at its next attempt, not after a ttl."""
        fence, self._fence = self._fence, None
        if fence is not None and not self.embedded:
            try:
                await self.store.release(fence)
            except StoreUnavailable as exc:
                log.info("lease release failed (it expires by itself): %s", exc)

    # -- writes through the store -----------------------------------------------------------------
    async def _write(self, key: str, op: Callable[[Fence], Awaitable[T]], what: str) -> T:
        """Run ``op`` with this leader's fence once ``key``'s earlier writes are done.

        A refusal that is the peer's (a checkpoint's epoch) propagates as `WriteRefused`; an unknown
        outcome stops granting; a fenced write steps down; the caller gets `NotLeader` for both."""
        async with self._order.hold(key):
            fence = self._fence
            if fence is None or self.role is not Role.LEADER:
                raise NotLeader(None, f"{what}: this PC stopped leading")
            try:
                return await op(fence)
            except StoreUnavailable as exc:
                self.metrics.store_errors.labels(what.split(" ", 1)[0]).inc()
                self._store_failed(exc)
                raise NotLeader(None, f"{what}: the store did not answer") from exc
            except WriteRefused as exc:
                if exc.reason is Refusal.FENCED:
                    self.metrics.fenced_writes.labels(what.split(" ", 1)[0]).inc()
                    self.step_down(f"a write was fenced ({exc})")
                    raise NotLeader(None, f"{what}: this PC no longer holds the lease") from exc
                raise

    async def _own_write(self, key: str, op: Callable[[Fence], Awaitable[None]], what: str) -> None:
        """A write of the PC's own decision: a refusal means the store and the working copy disagree,
        so the PC stops granting and loads the store's state again."""
        try:
            await self._write(key, op, what)
        except WriteRefused as exc:
            log.error("the store refused %s: %s; reloading", what, exc)
            self._store_failed(StoreUnavailable(str(exc)))
            raise NotLeader(None, f"{what}: the store's state differs; reloading") from exc

    def session_record(self, session: str) -> SessionRecord | None:
        record = self.sessions.record(session)
        meta = self.meta.get(session)
        if record is None or meta is None:
            return record
        return dataclasses.replace(record, max_tokens=meta.max_tokens, prompt=meta.prompt, last_owner=meta.last_owner,
                                   moving=meta.moving)

    async def save_session(self, session: str) -> None:
        async def op(fence: Fence) -> None:
            record = self.session_record(session)
            if record is not None:
                await self.store.save_session(fence, record)
        await self._own_write(f"s:{session}", op, f"session {session}")

    async def save_sessions(self, sessions: Sequence[str]) -> None:
        await asyncio.gather(*(self.save_session(s) for s in dict.fromkeys(sessions)))

    async def save_instance(self, instance: str) -> None:
        async def op(fence: Fence) -> None:
            record = self.registry.record(instance)
            if record is not None:
                await self.store.save_instance(fence, record)
        await self._own_write(f"i:{instance}", op, f"instance {instance}")

    async def save_map(self, map_id: str) -> None:
        async def op(fence: Fence) -> None:
            current = self.reshards.authoritative(map_id)
            if current is not None:
                last = self.map_outcomes.get(map_id)
                record = MapRecord(current, self.reshards.moving_to(map_id),
                                   None if last is None else (last.version, last.outcome))
                await self.store.save_map(fence, record)
        await self._own_write(f"m:{map_id}", op, f"map {map_id}")


    # -- what the runtime does with a snapshot's moves in progress --------------------------------
    @abc.abstractmethod
    def _follow_later(self, action: FailoverAction) -> None:
        """Deliver a resume (or record a stranded session) in the background."""

    @abc.abstractmethod
    async def carry_out_reshard(self, actions: Sequence[ReshardAction]) -> None:
        """Store each finished move, then send its commits and aborts."""
