"""The PC adapter's runtime: it feeds the sans-I/O cores and carries out the actions they return.

Every decision is made in `control.pc.core` (`InstanceRegistry`, `SessionTable`, `ReshardCoordinator`,
`Placer`, `Leadership`); this module reads the clock, authorizes nothing (the HTTP handlers do), and
moves values between the cores, the store and the network:

- a status record goes to the registry (and to the IS's `StatusBoard` when the IS runs here); the
  incarnations it ends fail over, the state changes it asks for are sent;
- a request gets its Block Keys computed with the scope's key, a lookup at the IS with the eligible
  instances as targets, a `Placer` decision, a prefetch directive when there is one, and a start;
- an instance failure fences and moves its sessions (`SessionTable.fail_instance`), aborts its
  reshards, and each resume is delivered, moving on (`fail_session`) when the instance refuses it;
- the maintenance loop (`run`) expires statuses, reshard deadlines and idle sessions by the clock.

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

Every outbound call is bounded by ``[pc] call_timeout_ms``; retries are bounded in number.
"""

from __future__ import annotations

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
    Assign,
    Chooser,
    FailoverAction,
    InstanceFailed,
    InstanceRegistry,
    MinActivePolicy,
    NoPlacement,
    PlacementRequest,
    Placer,
    PlacerConfig,
    ReshardAction,
    ReshardCoordinator,
    ResumeSession,
    SendAbort,
    SendCommit,
    SendPlan,
    SendStateChange,
    SessionStranded,
    SessionTable,
    StatusDiscarded,
    Wake,
)
from control.pc.core.durable import DirectiveRecord, MapRecord, Refusal, SessionRecord, Snapshot, WriteRefused
from control.pc.core.leadership import Leadership, LeaseTiming, Role
from control.pc.metrics import PcMetrics
from control.pc.settings import PcSettings
from control.pc.store import Fence, MemoryStore, PcStore, StoreUnavailable, make_holder
from control.pc.tasks import Background, KeyedOrder, backoff_s
from kvsp.client.index import IndexClient
from kvsp.descriptor import CompatDescriptor
from kvsp.errors import KvspError
from kvsp.keys import block_keys
from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.records import (
    InstanceStatus,
    LookupRequest,
    LookupResponse,
    PrefetchDirective,
    ReshardMessage,
    SessionCheckpoint,
    ShardMap,
    StateChange,
)
from kvsp.records.base import MAX_URIS
from kvsp.records.generation import GenerateRequest, ResumeRequest, SessionInfo, SessionState, StartSession
from kvsp.registry import InstanceState
from kvsp.service.policy import Policy

log = logging.getLogger("kvsp.pc")

T = TypeVar("T")
FIRST_EPOCH: Final = 1
RESUME_ATTEMPTS: Final = 3  # instances tried for one failover before the session waits (stranded)
MAX_MOVES: Final = 6  # moves without progress (no checkpoint at the new epoch) before the PC gives up
DELIVERY_ATTEMPTS: Final = 6  # PUT state, reshard commit/abort: retries before giving up
STRANDED_RETRY_S: Final = 1.0
MIN_LOOP_DELAY_S: Final = 0.005
NO_LOOKUP: Final = LookupResponse(())
EMBEDDED_LEASE_MS: Final = 10 * 365 * 86_400_000  # the embedded PC leads for the life of its process
DROP_KEY: Final = "drop"


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


def _nowhere(checkpoint: SessionCheckpoint, avoid: frozenset[str]) -> str | None:
    return None


def _forbidden(detail: str) -> ProblemError:
    return ProblemError(Problem.generic(403, "Forbidden", detail))


def _service_unavailable(detail: str) -> ProblemError:
    return ProblemError(Problem.generic(503, "Service Unavailable", detail))


class PlacementController:
    """The PC's cores, its store, its outbound clients and its background work, bound to one clock."""

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
        while True:
            try:
                await self._lease_round()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad round must not end the election for the process lifetime
                log.exception("PC lease round failed")
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

    # -- authorization helpers (decisions of the policy, asked by the handlers) --------------------
    def is_admin(self, who: str) -> bool:
        return who == self.base_uri or self.policy.is_pc(who) or who in self.settings.operators

    def is_instance(self, who: str) -> bool:
        """An identity the policy lists as an instance (and ``[pc] instances`` too, when it is set).

        Authentication alone is not enough: every certificate of the deployment CA authenticates, and
        the PC sends an instance the prompts of the sessions it places there."""
        allowed = self.settings.instances
        return self.policy.is_instance(who) and (allowed is None or who in allowed)

    def _eligible(self, scope_id: bytes, now: float) -> list[InstanceStatus]:
        """Active instances that may read the scope: only they can serve its sessions."""
        return [s for s in self.registry.eligible(now) if self.policy.may_read(s.instance, scope_id)]

    def _sleeping(self, scope_id: bytes, now: float) -> list[InstanceStatus]:
        return [s for s in self.registry.sleeping(now) if self.policy.may_read(s.instance, scope_id)]

    # -- status (section 6.3) --------------------------------------------------------------------
    async def report_status(self, status: InstanceStatus, now: float) -> StateChange:
        """Record a status PUT (the handler checked the sender); the answer body's state.

        Only what a new leader needs is written: a new incarnation (the highest epoch seen) and a change
        of the PC's view of the state.  The load figures of a report are soft state: a new leader has
        the next report within a third of the ttl."""
        before = self.registry.record(status.instance)
        outcome = self.registry.report(status, now)
        if isinstance(outcome, StatusDiscarded):
            if outcome.kind is ProblemType.STALE_EPOCH:
                self.metrics.stale_epochs.labels("status").inc()
            raise ProblemError(outcome.problem)
        after = self.registry.record(status.instance)
        if before is None or after is None or (before.epoch, before.state) != (after.epoch, after.state):
            await self.save_instance(status.instance)
        if self.board is not None:
            self.board.put(status, now)
        self.metrics.statuses.inc()
        for failed in outcome.failed:
            await self.instance_failed(failed, now)
        for action in outcome.actions:
            self.send_state(action)
        return outcome.answer if outcome.answer is not None else StateChange(outcome.state)

    async def instance_failed(self, failed: InstanceFailed, now: float) -> None:
        """Fence and move the sessions of a failed incarnation; abort the reshards it belongs to.
        The moves are stored before any resume goes out."""
        log.warning("instance %s (epoch %d) failed: %s", failed.instance, failed.epoch, failed.reason)
        self.metrics.instance_failures.labels(failed.reason).inc()
        self._desired.pop(failed.instance, None)
        owned = self.sessions.sessions_of(failed.instance)
        await self.carry_out_reshard(self.reshards.member_failed(failed.instance, now))
        self._close_finished(failed.instance, now)
        actions = self.sessions.fail_instance(failed.instance, now, self.chooser(now))
        self._mark_moving(actions)
        await self.save_instance(failed.instance)
        await self.save_sessions(owned)
        for action in actions:
            self._follow_later(action)

    def _close_finished(self, instance: str, now: float) -> None:
        """Sessions whose checkpoint covers max_tokens are done: close them instead of resuming them."""
        for session in self.sessions.sessions_of(instance):
            meta, latest = self.meta.get(session), self.sessions.latest(session)
            epoch = self.sessions.epoch_of(session)
            if meta is not None and latest is not None and epoch is not None \
                    and latest.output_offset >= meta.max_tokens:
                self.sessions.close(session, instance, epoch, now)

    # -- instance state changes -----------------------------------------------------------------
    def send_state(self, action: SendStateChange) -> None:
        """PUT {instance}state in the background; the newest wanted state wins over older ones."""
        self._desired[action.instance] = action.state
        if action.instance not in self._state_senders:
            self._state_senders.add(action.instance)
            self.tasks.spawn(self._state_loop(action.instance), f"kvsp-pc-state {action.instance}")

    async def _state_loop(self, instance: str) -> None:
        try:
            for attempt in range(DELIVERY_ATTEMPTS):
                target = self._desired.get(instance)
                if target is None or self.registry.state_of(instance) in (None, InstanceState.FAILED):
                    return
                if await self._put_state(instance, target):
                    if self._desired.get(instance) is target:
                        del self._desired[instance]
                        return
                    continue
                await asyncio.sleep(backoff_s(attempt))
            log.warning("gave up PUT state on %s after %d attempts", instance, DELIVERY_ATTEMPTS)
        finally:
            self._state_senders.discard(instance)

    async def _put_state(self, instance: str, target: InstanceState) -> bool:
        try:
            await self.instances.put_state(instance, StateChange(target))
        except KvspError as exc:
            log.info("PUT state %s on %s failed: %s", target.value, instance, exc)
            self.metrics.state_changes.labels("failed").inc()
            return False
        self.metrics.state_changes.labels("accepted").inc()
        return True

    async def _wake(self, instance: str, now: float) -> None:
        """Wake a sleeping instance before routing to it; on failure keep trying in the background."""
        action = self.registry.wake(instance, now)
        await self.save_instance(instance)
        if not await self._put_state(instance, action.state):
            self.send_state(action)

    # -- placement (sections 6.2, 6.4, 6.5 and the extension POST requests) ------------------------
    async def place(self, request: GenerateRequest) -> SessionInfo:
        descriptor = self.settings.descriptors.get(request.compat_id)
        placer = self.placers.get(request.compat_id)
        if descriptor is None or placer is None:
            raise ProblemError.of(ProblemType.INCOMPATIBLE,
                                  f"the PC places no requests for compat_id {request.compat_id.hex()}")
        session = request.session or str(uuid.uuid4())
        if self.sessions.epoch_of(session) is not None:
            raise ProblemError(Problem.generic(409, "Conflict", f"session {session} already exists"))
        keys = self._block_keys(request, descriptor)
        lookup = await self._lookup(request, keys)
        self.require_leader()  # the lookup took time: still ours to grant?
        now = self.clock()
        decision = placer.place(
            PlacementRequest(request.scope_id, request.compat_id, len(request.prompt), request_ref=session),
            lookup, self._eligible(request.scope_id, now), self._sleeping(request.scope_id, now))
        if isinstance(decision, NoPlacement):
            self.metrics.placements.labels("none").inc()
            raise _service_unavailable(decision.reason)
        self.metrics.placements.labels("woken" if isinstance(decision, Wake) else "assigned").inc()
        if isinstance(decision, Wake):
            await self._wake(decision.instance, now)
        if decision.prefetch is not None:
            self.metrics.cache_placements.inc()
            await self._prefetch(decision.instance, decision.prefetch)
        return await self._open_and_start(request, session, decision, keys, descriptor)

    def _block_keys(self, request: GenerateRequest, descriptor: CompatDescriptor) -> list[bytes] | None:
        """The prompt's Block Keys, or None when the PC holds no key for the scope (recompute only)."""
        key = self.settings.scope_keys.get(request.scope_id)
        if key is None:
            return None
        return block_keys(key, request.compat_id, descriptor.block_tokens, request.prompt)

    async def _lookup(self, request: GenerateRequest, keys: list[bytes] | None) -> LookupResponse:
        """Longest-prefix lookup with the eligible instances as targets; no cache when it fails."""
        if not keys or self.index is None:
            return NO_LOOKUP
        targets = tuple(s.instance for s in self._eligible(request.scope_id, self.clock())[:MAX_URIS])
        quota = self.policy.quotas.keys_per_lookup
        query = LookupRequest(request.scope_id, request.compat_id, tuple(keys[:quota]), targets)
        try:
            return await self.index.lookup(query)
        except KvspError as exc:
            log.warning("lookup at %s failed, placing without the cache: %s", self.index.base_uri, exc)
            self.metrics.lookup_failures.inc()
            return NO_LOOKUP

    async def _prefetch(self, instance: str, directive: PrefetchDirective) -> None:
        async def op(fence: Fence) -> None:
            await self.store.save_directive(fence, DirectiveRecord(instance, directive))
        await self._own_write(f"d:{directive.directive}", op, f"directive {directive.directive}")
        try:
            await self.instances.prefetch(instance, directive)
        except KvspError as exc:
            # Not fatal: the instance fetches or recomputes what the directive would have loaded.
            log.info("prefetch directive to %s failed: %s", instance, exc)
            self.metrics.prefetches.labels("failed").inc()
            return
        self.metrics.prefetches.labels("accepted").inc()

    async def _open_and_start(self, request: GenerateRequest, session: str, decision: Assign | Wake,
                              keys: list[bytes] | None, descriptor: CompatDescriptor) -> SessionInfo:
        deterministic = request.sampler.method in self.settings.deterministic_methods
        sampler = dataclasses.replace(request.sampler, step=0, deterministic=deterministic)
        initial = None
        if keys is not None:  # lets the session resume even if it fails before its first checkpoint
            tail = request.prompt[len(keys) * descriptor.block_tokens:]
            initial = SessionCheckpoint(session, FIRST_EPOCH, request.compat_id, request.scope_id, tuple(keys),
                                        tail, (), 0, sampler)
        # Registered (and stored) before the start goes out, so that a fast first checkpoint finds its
        # session, here and at a leader that takes over before the first checkpoint.
        self.sessions.open(session, decision.instance, self.clock(), checkpoint=initial, epoch=FIRST_EPOCH,
                           scope_id=request.scope_id, compat_id=request.compat_id)
        self.meta[session] = SessionMeta(request.scope_id, request.max_tokens, decision.instance, request.prompt)

        async def op(fence: Fence) -> None:
            record = self.session_record(session)
            if record is not None:
                await self.store.open_session(fence, record)
        await self._own_write(f"s:{session}", op, f"session {session}")
        start = StartSession(session, FIRST_EPOCH, request.scope_id, request.compat_id, request.prompt,
                             request.max_tokens, sampler)
        try:
            await self.instances.start(decision.instance, start)
        except KvspError as exc:
            log.warning("start of session %s on %s failed: %s", session, decision.instance, exc)
            self.metrics.starts.labels("failed").inc()
            if self._owns(session, decision.instance, FIRST_EPOCH):
                now = self.clock()
                action = self.sessions.fail_session(session, now, self.chooser(now))
                self._mark_moving([action])
                await self.save_session(session)
                await self._follow(action)
        else:
            self.metrics.starts.labels("accepted").inc()
        return self.info(session)

    # -- sessions (section 6.8) -------------------------------------------------------------------
    async def checkpoint(self, sender: str, checkpoint: SessionCheckpoint, now: float) -> dict[str, object]:
        """Record a checkpoint PUT; the Ack body, sent only once the store recorded it.

        Authorized in this order, so that an identity that is not an instance learns nothing about any
        session: an instance (`is_instance`), a session the PC placed (an unknown one is refused like
        another's: a checkpoint never creates a session), ``read`` on the session's scope and on the one
        the checkpoint names (the grant that made the instance eligible for it).  The table then admits
        only the session's current instance at the current epoch, and only the session's own scope_id
        and compat_id; the store checks epoch and owner again, atomically, where the state lives."""
        scope = self.scope_of(checkpoint.session)
        refusal: ProblemError | None = None
        if not self.is_instance(sender):
            refusal = _forbidden(f"{sender} is not an instance of this deployment")
        elif scope is None:
            refusal = _forbidden(f"session {checkpoint.session} was not assigned to {sender}")
        elif not (self.policy.may_read(sender, scope) and self.policy.may_read(sender, checkpoint.scope_id)):
            refusal = ProblemError.of(ProblemType.SCOPE_DENIED,
                                      f"{sender} may not serve sessions of scope {checkpoint.scope_id.hex()}")
        if refusal is not None:
            self.metrics.denials.labels("checkpoint").inc()
            raise refusal
        try:
            ack = self.sessions.checkpoint(sender, checkpoint, now)
        except ProblemError as exc:
            self._count_refusal(exc)
            raise
        meta = self.meta.get(ack.session)
        if meta is not None:
            meta.moves = 0  # the current owner is making progress
            if ack.output_offset > 0:
                meta.prompt = None

        async def op(fence: Fence) -> int:
            return await self.store.record_checkpoint(fence, sender, checkpoint)
        try:
            offset = await self._write(f"s:{checkpoint.session}", op, f"checkpoint of {checkpoint.session}")
        except WriteRefused as exc:  # e.g. the session moved on while this one waited for its turn
            problem = exc.problem()
            self._count_refusal(problem)
            raise problem from exc
        return dataclasses.replace(ack, output_offset=offset).to_json()

    def _count_refusal(self, exc: ProblemError) -> None:
        if exc.problem.kind is ProblemType.STALE_EPOCH:
            self.metrics.stale_epochs.labels("checkpoint").inc()
        elif exc.problem.status == 403:
            self.metrics.denials.labels("checkpoint").inc()

    def scope_of(self, session: str) -> bytes | None:
        meta = self.meta.get(session)
        if meta is not None:
            return meta.scope_id
        latest = self.sessions.latest(session)
        return None if latest is None else latest.scope_id

    def info(self, session: str) -> SessionInfo:
        epoch = self.sessions.epoch_of(session)
        if epoch is None:
            raise ProblemError.of(ProblemType.NOT_FOUND, f"no session {session}")
        owner, latest, meta = self.sessions.owner_of(session), self.sessions.latest(session), self.meta.get(session)
        offset = 0 if latest is None else latest.output_offset
        if meta is not None and offset >= meta.max_tokens:
            state = SessionState.FINISHED
        elif owner is None:
            state = SessionState.STRANDED
        else:
            state = SessionState.RUNNING
        instance = owner if owner is not None else (meta.last_owner if meta is not None else None)
        return SessionInfo(session, instance, epoch, offset, state)

    # -- failover ---------------------------------------------------------------------------------
    def chooser(self, now: float) -> Chooser:
        """Where to resume a session: the `Placer`'s choice among eligible instances, without lookup."""
        def choose(checkpoint: SessionCheckpoint, avoid: frozenset[str]) -> str | None:
            placer = self.placers.get(checkpoint.compat_id)
            descriptor = self.settings.descriptors.get(checkpoint.compat_id)
            if placer is None or descriptor is None:
                return None
            tokens = (len(checkpoint.prompt_blocks) * descriptor.block_tokens + len(checkpoint.prompt_tail)
                      + len(checkpoint.generated))
            meta = self.meta.get(checkpoint.session)
            if meta is not None and meta.moves >= MAX_MOVES:
                return None  # it failed everywhere: let it wait, stranded, until it expires
            candidates = [s for s in self._eligible(checkpoint.scope_id, now) if s.instance not in avoid]
            decision = placer.place(PlacementRequest(checkpoint.scope_id, checkpoint.compat_id, tokens,
                                                     request_ref=checkpoint.session), NO_LOOKUP, candidates)
            if not isinstance(decision, Assign):
                return None
            if meta is not None:
                meta.moves += 1
            return decision.instance
        return choose

    def _mark_moving(self, actions: Sequence[FailoverAction]) -> None:
        for action in actions:
            meta = self.meta.get(action.session)
            if meta is not None:
                meta.moving = isinstance(action, ResumeSession)

    def _owns(self, session: str, instance: str, epoch: int) -> bool:
        return self.sessions.owner_of(session) == instance and self.sessions.epoch_of(session) == epoch

    def _follow_later(self, action: FailoverAction) -> None:
        if isinstance(action, ResumeSession):
            self.tasks.spawn(self._follow(action), f"kvsp-pc-resume {action.session}")
        else:
            self._stranded(action)

    def _stranded(self, action: SessionStranded) -> None:
        log.warning("session %s (epoch %d) stranded: %s", action.session, action.epoch, action.reason)
        self.metrics.stranded.labels(action.reason).inc()

    async def _follow(self, action: FailoverAction) -> None:
        """Deliver a resume; when it is refused or undeliverable, move on to another instance.

        After `RESUME_ATTEMPTS` instances the session is fenced once more and waits, stranded, for
        `SessionTable.retry_stranded` in the maintenance loop.  Every move is stored before its resume.
        """
        try:
            await self._follow_moves(action)
        except NotLeader as exc:
            log.info("resume of %s abandoned: %s", action.session, exc)

    async def _follow_moves(self, action: FailoverAction) -> None:
        for attempt in range(RESUME_ATTEMPTS):
            if isinstance(action, SessionStranded):
                break
            meta = self.meta.get(action.session)
            try:
                await self._resume(action, meta)
            except KvspError as exc:
                log.warning("resume of %s on %s failed: %s", action.session, action.instance, exc)
                self.metrics.resume_failures.inc()
                if not self._owns(action.session, action.instance, action.checkpoint.epoch):
                    return  # moved on meanwhile (another failure, or it finished)
                now = self.clock()
                choose = self.chooser(now) if attempt + 1 < RESUME_ATTEMPTS else _nowhere
                action = self.sessions.fail_session(action.session, now, choose)
                self._mark_moving([action])
                await self.save_session(action.session)
                continue
            self.metrics.migrations.inc()
            if meta is not None and self._owns(action.session, action.instance, action.checkpoint.epoch):
                meta.last_owner, meta.moving = action.instance, False
                await self.save_session(action.session)
            return
        if isinstance(action, SessionStranded):
            self._stranded(action)

    async def _resume(self, action: ResumeSession, meta: SessionMeta | None) -> None:
        """POST resume with the checkpoint at its new epoch; before any output, the start again."""
        checkpoint = action.checkpoint
        if meta is not None and meta.prompt is not None and checkpoint.output_offset == 0:
            start = StartSession(checkpoint.session, checkpoint.epoch, checkpoint.scope_id, checkpoint.compat_id,
                                 meta.prompt, meta.max_tokens, checkpoint.sampler)
            await self.instances.start(action.instance, start)
            return
        max_tokens = None if meta is None else max(meta.max_tokens, checkpoint.output_offset)
        await self.instances.resume(action.instance, ResumeRequest(checkpoint, max_tokens),
                                    timeout_s=self.settings.resume_timeout_s)

    # -- resharding (section 6.9) -----------------------------------------------------------------
    async def reshard(self, new: ShardMap, deadline_ms: int, now: float) -> str:
        """Move a map to ``new``: "started" when plans went out, "registered" for a new map (nothing
        to move), "unchanged" when ``new`` is already authoritative; kvsp-plan-conflict otherwise."""
        current = self.reshards.authoritative(new.map)
        if current is None:
            self.reshards.register(new)
            await self.save_map(new.map)
            return "registered"
        if current == new and self.reshards.in_progress(new.map) is None:
            return "unchanged"
        plans = self.reshards.start(current, new, deadline_ms, now)
        await self.save_map(new.map)
        for action in plans:
            self.tasks.spawn(self._send_plan(action), f"kvsp-pc-plan {action.instance}")
        return "started"

    async def _send_plan(self, action: SendPlan) -> None:
        try:
            await self.instances.reshard(action.instance, action.plan)
        except KvspError as exc:
            log.info("reshard plan for %s refused by %s: %s", action.plan.map, action.instance, exc)
            return  # no acknowledgement: the deadline aborts the move
        try:
            actions = self.reshards.ack(action.instance, action.plan.map, action.plan.to_version, self.clock())
        except ProblemError:
            return  # the move was already aborted (deadline, failed member)
        await self.carry_out_reshard(actions)

    async def carry_out_reshard(self, actions: Sequence[ReshardAction]) -> None:
        """Store each finished move, then send its commits and aborts (each retried).

        One call of the coordinator ends a move with one action per member, so each map named in
        ``actions`` is one finished move.
        """
        finished: dict[str, ReshardOutcome] = {}
        for action in actions:
            if isinstance(action, SendCommit):
                finished.setdefault(action.commit.map, ReshardOutcome(action.commit.commit, "committed"))
            elif isinstance(action, SendAbort):
                finished.setdefault(action.abort.map, ReshardOutcome(action.abort.abort, "aborted"))
        for map_id, outcome in finished.items():
            if self.map_outcomes.get(map_id) != outcome:
                self.metrics.reshards.labels(outcome.outcome).inc()
            self.map_outcomes[map_id] = outcome
        try:
            await asyncio.gather(*(self.save_map(m) for m in finished))
        except NotLeader as exc:
            log.info("reshard outcome not sent: %s", exc)
            return
        for action in actions:
            if isinstance(action, SendPlan):
                self.tasks.spawn(self._send_plan(action), f"kvsp-pc-plan {action.instance}")
            else:
                self.tasks.spawn(self._deliver_reshard(action), f"kvsp-pc-reshard {action.instance}")

    async def _deliver_reshard(self, action: SendCommit | SendAbort) -> None:
        message: ReshardMessage = action.commit if isinstance(action, SendCommit) else action.abort
        for attempt in range(DELIVERY_ATTEMPTS):
            if self.registry.state_of(action.instance) is InstanceState.FAILED:
                return
            try:
                await self.instances.reshard(action.instance, message)
                return
            except KvspError as exc:
                log.info("reshard %s to %s failed: %s", message.to_json(), action.instance, exc)
            await asyncio.sleep(backoff_s(attempt))

    # -- maintenance --------------------------------------------------------------------------------
    async def maintain(self, now: float) -> None:
        """One round of clock-driven work: expiry, reshard deadlines, idle sessions, stranded retries."""
        if not self.leadership.may_grant(self.lease_clock()):
            return
        for failed in self.registry.expire(now):
            await self.instance_failed(failed, now)
        await self.carry_out_reshard(self.reshards.tick(now))
        gone = self.sessions.expire(now)
        for session in gone:
            self.meta.pop(session, None)
        if gone:
            async def drop(fence: Fence) -> None:
                await self.store.drop_sessions(fence, gone)
            await self._own_write(DROP_KEY, drop, "drop sessions")
        if now - self._last_stranded_retry >= STRANDED_RETRY_S:
            self._last_stranded_retry = now
            actions = self.sessions.retry_stranded(now, self.chooser(now))
            self._mark_moving(actions)
            await self.save_sessions([a.session for a in actions])
            for action in actions:
                self._follow_later(action)

    def _delay(self, now: float) -> float:
        delay = self.settings.check_interval_s
        for due in (self.registry.next_expiry(), self.reshards.next_deadline()):
            if due is not None:
                delay = min(delay, due - now)
        return max(delay, MIN_LOOP_DELAY_S)

    async def run(self) -> None:
        """The maintenance loop; cancelled at shutdown."""
        while True:
            now = self.clock()
            try:
                await self.maintain(now)
            except NotLeader as exc:
                log.info("maintenance stopped: %s", exc)
            except Exception:  # one bad round must not end maintenance for the process lifetime
                log.exception("PC maintenance failed")
            await asyncio.sleep(self._delay(now))
