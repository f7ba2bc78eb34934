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

Leadership and durable state (decision D7) are the base class's, `control.pc.leader.LeadingController`.

Every outbound call is bounded by ``[pc] call_timeout_ms``; retries are bounded in number.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Sequence
from typing import Final

from control.pc.core import (
    Assign,
    Chooser,
    FailoverAction,
    InstanceFailed,
    NoPlacement,
    PlacementRequest,
    ReshardAction,
    ResumeSession,
    SendAbort,
    SendCommit,
    SendPlan,
    SendStateChange,
    SessionStranded,
    StatusDiscarded,
    Wake,
)
from control.pc.core.durable import DirectiveRecord, WriteRefused
from control.pc.leader import LeadingController, NotLeader, ReshardOutcome, SessionMeta, _service_unavailable
from control.pc.store import Fence
from control.pc.tasks import backoff_s
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
from kvsp.service.logs import FailureStreak

log = logging.getLogger("kvsp.pc")

FIRST_EPOCH: Final = 1
RESUME_ATTEMPTS: Final = 3  # instances tried for one failover before the session waits (stranded)
MAX_MOVES: Final = 6  # moves without progress (no checkpoint at the new epoch) before the PC gives up
DELIVERY_ATTEMPTS: Final = 6  # PUT state, reshard commit/abort: retries before giving up
STRANDED_RETRY_S: Final = 1.0
MIN_LOOP_DELAY_S: Final = 0.005
NO_LOOKUP: Final = LookupResponse(())
DROP_KEY: Final = "drop"


def _nowhere(checkpoint: SessionCheckpoint, avoid: frozenset[str]) -> str | None:
    return None


def _forbidden(detail: str) -> ProblemError:
    return ProblemError(Problem.generic(403, "Forbidden", detail))



class PlacementController(LeadingController):
    """The PC runtime: status, placement, checkpoints, failover, resharding and maintenance."""

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
        streak = FailureStreak(log, "PC maintenance")
        while True:
            now = self.clock()
            try:
                await self.maintain(now)
            except NotLeader as exc:
                log.info("maintenance stopped: %s", exc)
            except Exception as exc:  # one bad round must not end maintenance for the process lifetime
                streak.failed(exc, now)
            else:
                streak.succeeded(now)
            await asyncio.sleep(self._delay(now))

