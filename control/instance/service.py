"""The instance's asyncio adapter: admission, the session table, and the status loop (sections 6.3, 6.8).

Decisions stay in the cores (`InstanceLifecycle` admits and moves states, `OutputGate` labels and
releases); this module keeps the table of session runs, applies the epoch rules to start and resume
requests, and reports status to the PC at ``status_ttl_ms / 3``, sooner when the state changed.

Epoch rules for a session this instance already knows (section 6.8, section 9):
- a start or resume with a lower epoch is kvsp-stale-epoch (409);
- the same epoch again is idempotent when the request is the same (202 again), else a conflict (409);
- a higher epoch fences the run here (it stops at once, its stream ends) and the new one replaces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final

from control.instance.core import InstanceLifecycle, ReportStatus
from control.instance.engines import EngineFactory
from control.instance.metrics import InstanceMetrics
from control.instance.pc_client import PcClient
from control.instance.sessions import RESUME, SessionDeps, SessionFailed, SessionRun, SessionSpec
from control.instance.settings import InstanceSettings
from kvsp.client.http import TransportError
from kvsp.errors import ValidationError
from kvsp.keys import ScopeKey
from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.records import InstanceStatus
from kvsp.service.logs import FailureStreak

log = logging.getLogger("kvsp.instance")

RETAINED_FACTOR: Final = 4  # finished runs kept for late readers: up to this many times max_sessions


def _conflict(detail: str) -> ProblemError:
    return ProblemError(Problem.generic(409, "Conflict", detail))


class Instance:
    """Sessions and lifecycle of one inference instance."""

    def __init__(self, settings: InstanceSettings, base_uri: str, engines: EngineFactory, deps: SessionDeps,
                 clock: Callable[[], float]) -> None:
        self.settings = settings
        self.base_uri = base_uri
        self.engines = engines
        self.deps = deps
        self.clock = clock
        self.metrics: InstanceMetrics = deps.metrics
        # Restart-monotonic epoch without persistent state: the start time in ms (section 6.3).
        self.lifecycle = InstanceLifecycle(base_uri, int(time.time() * 1000), idle_for_s=settings.idle_for_s)
        self.runs: dict[str, SessionRun] = {}
        self._report = asyncio.Event()

    @property
    def pc(self) -> PcClient:
        return self.deps.pc

    # -- the session table -----------------------------------------------------------------------
    def run_of(self, session: str) -> SessionRun:
        run = self.runs.get(session)
        if run is None:
            raise ProblemError.of(ProblemType.NOT_FOUND, f"session {session} is not served here")
        return run

    def scope_key(self, scope_id: bytes) -> ScopeKey:
        key = self.settings.scope_keys.get(scope_id)
        if key is None:
            raise ProblemError.of(ProblemType.SCOPE_DENIED,
                                  f"this instance has no Scope Key for scope {scope_id.hex()}")
        return key

    def check_compat(self, compat_id: bytes) -> None:
        ours = self.settings.descriptor.compat_id
        if compat_id != ours:
            raise ProblemError.of(ProblemType.INCOMPATIBLE,
                                  f"this instance serves compat {ours.hex()}, not {compat_id.hex()}")

    def _supersede(self, spec: SessionSpec) -> bool:
        """Apply the epoch rules against a known run; True when the request repeats the current one."""
        known = self.runs.get(spec.session)
        if known is None:
            return False
        if spec.epoch < known.epoch:
            raise ProblemError.of(ProblemType.STALE_EPOCH, f"session {spec.session}: epoch {spec.epoch} is older "
                                                           f"than {known.epoch}")
        if spec.epoch == known.epoch:
            if known.spec == spec:
                return True
            raise _conflict(f"session {spec.session} epoch {spec.epoch} is already running with another request")
        known.fence()
        self._forget(known, "fenced")
        return False

    async def admit(self, spec: SessionSpec) -> bool:
        """Admit a session (only while active, within max_sessions); False when it repeats the current one.

        A resume loads its prompt blocks before this returns (it cannot start without them), so that the
        PC learns of a failure from the answer and moves on; a start loads in the background.
        """
        if self._supersede(spec):
            return False
        live = sum(1 for run in self.runs.values() if run.live)
        if live >= self.settings.limits.max_sessions:
            raise ProblemError(Problem.generic(503, "Service Unavailable",
                                               f"at most {self.settings.limits.max_sessions} sessions"))
        key = self.scope_key(spec.base.scope_id)
        try:
            engine = self.engines(spec.base.sampler)
        except ValueError as exc:
            raise ValidationError("sampler", str(exc)) from exc
        self.lifecycle.admit(spec.session)  # the last check: nothing below refuses
        run = SessionRun(spec, engine, key, self.deps, self._ended)
        self.runs[spec.session] = run
        self.metrics.sessions.labels(spec.kind).inc()
        if spec.kind == RESUME:
            await self._preload(run)
            self.metrics.resumes.inc()
        run.start()
        return True

    async def _preload(self, run: SessionRun) -> None:
        try:
            await run.load()
        except (SessionFailed, asyncio.CancelledError) as exc:
            if self.runs.get(run.session) is run:
                self._forget(run, "failed")
                del self.runs[run.session]  # never started: nothing to read
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise ProblemError(Problem.generic(503, "Service Unavailable", str(exc))) from exc

    def _ended(self, run: SessionRun, reason: str) -> None:
        if self.runs.get(run.session) is run:
            self._forget(run, reason)

    def _forget(self, run: SessionRun, reason: str) -> None:
        """A run ended (or was replaced): account for it and let a draining instance go to sleep."""
        if run.ended_at is None:
            run.ended_at = self.clock()
            self.metrics.sessions_ended.labels(reason).inc()
            if not run.log.closed:
                run.log.close(None)
        if not self._has_live(run.session, excluding=run):
            self._apply(self.lifecycle.finish(run.session, self.clock()))
        self._prune()

    def _has_live(self, session: str, *, excluding: SessionRun) -> bool:
        current = self.runs.get(session)
        return current is not None and current is not excluding and current.live

    def _prune(self) -> None:
        """Drop finished runs after their retention, and the oldest beyond the bound."""
        now = self.clock()
        keep_s = self.settings.limits.finished_retention_ms / 1000
        done = sorted((r for r in self.runs.values() if r.ended_at is not None), key=lambda r: r.ended_at or 0.0)
        excess = len(done) - RETAINED_FACTOR * self.settings.limits.max_sessions
        for i, run in enumerate(done):
            if (i < excess or now - (run.ended_at or now) >= keep_s) and self.runs.get(run.session) is run:
                del self.runs[run.session]

    # -- status (section 6.3) --------------------------------------------------------------------
    def _apply(self, actions: list[ReportStatus]) -> None:
        if actions:
            log.info("reporting status now: %s", ", ".join(a.reason for a in actions))
            self._report.set()

    def counts(self) -> tuple[int, int]:
        """(running, queued): generating now, and admitted but waiting for a batch slot or loading."""
        live = [r for r in self.runs.values() if r.live]
        running = sum(1 for r in live if r.running)
        return running, len(live) - running

    def make_status(self) -> InstanceStatus:
        running, queued = self.counts()
        self.metrics.sessions_running.set(running)
        self.metrics.sessions_queued.set(queued)
        limits = self.settings.limits
        cached = sum(r.engine.context_length for r in self.runs.values() if r.live)
        return self.lifecycle.make_status(
            running=running, queued=queued, batch_size=limits.batch_size,
            kv_utilization=min(1.0, cached / limits.kv_capacity_tokens),
            prefill_tokens_per_s=round(self.deps.prefill.rate, 3), decode_tokens_per_s=round(self.deps.decode.rate, 3),
            links=self.settings.links, ttl_ms=limits.status_ttl_ms, now=self.clock())

    async def report_once(self) -> None:
        """One status PUT; the answer goes through the lifecycle core (a sleep request answered)."""
        interval = self.settings.limits.status_ttl_ms / 3000
        try:
            answer = await self.pc.status(self.make_status(), timeout_s=max(interval, 0.05))
        except (ProblemError, TransportError, ValidationError) as exc:
            self.metrics.status_reports.labels("failed").inc()
            log.warning("status report to the PC failed: %s", exc)
            if isinstance(exc, ProblemError):
                self._apply(self.lifecycle.on_status_refused(exc.problem.kind, int(time.time() * 1000)))
            return
        self.metrics.status_reports.labels("ok").inc()
        try:
            self._apply(self.lifecycle.on_status_answer(answer, self.clock()))
        except ProblemError as exc:
            log.warning("the PC's answer %s was not applied: %s", answer.state.value, exc)

    async def status_loop(self) -> None:
        """Status at most every ttl/3 (section 6.3), at once after a state change; runs until cancelled."""
        interval = self.settings.limits.status_ttl_ms / 3000
        streak = FailureStreak(log, "status round")
        while True:
            self._report.clear()
            started = asyncio.get_running_loop().time()
            try:
                await self.report_once()
            except Exception as exc:  # the loop must outlive any one bad round
                streak.failed(exc, started)
            else:
                streak.succeeded(started)
            self._prune()
            left = interval - (asyncio.get_running_loop().time() - started)
            if left > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._report.wait(), left)

    def report_soon(self, actions: list[ReportStatus]) -> None:
        """Actions of the lifecycle core (a PUT state): send the status now."""
        self._apply(actions)

    async def close(self) -> None:
        tasks = [r.task for r in self.runs.values() if r.task is not None and not r.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
