"""Carrying out prefetch directives (spec section 6.5) in the background.

`PrefetchTracker` (sans-I/O) decides; `PrefetchRunner` does what its actions say: one IS lookup for
the directive's keys (the records carry the digests that loading verifies), then, for each
`LoadBlock`, a lease of ``lease_ms`` and a verified GET at the listed sources (through
`BlockFetcher.load`, restricted to those sources), placement in the own tiers (published as a new
replica), and `loaded` / `load_failed`.  A real-time timer calls `tick` at the deadline and the
`CancelLoads` it returns cancels the loads still running.  Directive work is I/O in tasks of its own,
with bounded concurrency, so it never blocks sessions already admitted (hashing runs in threads).

`settled` lets the start of the session a directive was sent for (``request_ref``) wait until the
directive has ended (complete, partial at its deadline, or failed) instead of fetching the same blocks
a second time alongside it; the session is then served with the prefix the directive placed in the
own tiers and recomputes the rest (section 6.5).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from control.holder.store import BlockId
from control.instance.blocks import Tiers
from control.instance.core import CancelLoads, LoadBlock, PrefetchAction, PrefetchTracker
from control.instance.loading import FetcherFactory, container_bytes, record_attempts
from control.instance.metrics import InstanceMetrics
from kvsp.client.http import TransportError
from kvsp.client.index import IndexClient
from kvsp.errors import ValidationError
from kvsp.problems import ProblemError
from kvsp.records import LookupRequest, PrefetchDirective, PrefetchStatus, ReplicaRecord

log = logging.getLogger("kvsp.instance.prefetch")

Replicas = Sequence[Sequence[ReplicaRecord]]


class _Directive:
    """The running loads of one directive, by block key."""

    def __init__(self, directive: PrefetchDirective, accepted_at: float) -> None:
        self.directive = directive
        self.accepted_at = accepted_at
        self.loads: dict[bytes, asyncio.Task[None]] = {}


class PrefetchRunner:
    """Accepts directives through the tracker and runs their loads."""

    def __init__(self, tracker: PrefetchTracker, tiers: Tiers, *, index: Callable[[], IndexClient],
                 fetchers: FetcherFactory, clock: Callable[[], float], metrics: InstanceMetrics,
                 concurrency: int, block_tokens: int) -> None:
        self.tracker = tracker
        self.tiers = tiers
        self.index = index
        self.fetchers = fetchers
        self.clock = clock
        self.metrics = metrics
        self.block_tokens = block_tokens
        self._gate = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._running: dict[str, asyncio.Task[None]] = {}  # by request_ref, while the directive runs

    def accept(self, sender: str, directive: PrefetchDirective) -> None:
        """POST prefetch: raises the tracker's problems (403, 409, 429); starts the loads."""
        now = self.clock()
        held = [b.block_key for b in directive.blocks
                if self.tiers.local.held(BlockId(directive.compat_id, directive.scope_id, b.block_key))]
        actions = self.tracker.accept(sender, directive, now, held)
        task = asyncio.get_running_loop().create_task(self._run(_Directive(directive, now), actions))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        ref = directive.request_ref
        if ref is not None:
            self._running[ref] = task
            task.add_done_callback(lambda t: self._running.pop(ref, None) if self._running.get(ref) is t else None)

    async def settled(self, request_ref: str) -> PrefetchStatus | None:
        """The directive sent for ``request_ref`` once it has ended (its deadline bounds the wait), or
        None when there was none."""
        task = self._running.get(request_ref)
        if task is not None:
            await asyncio.wait([task])  # never raises; the task ends by its deadline or at shutdown
        return self.tracker.for_request(request_ref)

    async def _run(self, run: _Directive, actions: list[PrefetchAction]) -> None:
        directive = run.directive
        loads = [a for a in actions if isinstance(a, LoadBlock)]
        deadline_s = directive.deadline_ms / 1000
        timer = asyncio.get_running_loop().create_task(self._deadline(run, deadline_s))
        try:
            if loads:
                replicas = await self._lookup(directive, deadline_s)
                for action in loads:
                    run.loads[action.block_key] = asyncio.get_running_loop().create_task(
                        self._load(run, action, replicas))
                await asyncio.gather(*run.loads.values(), return_exceptions=True)
        finally:
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer
            for task in run.loads.values():
                task.cancel()
        self.metrics.prefetches.labels(self.tracker.status(directive.directive).state.value).inc()

    async def _deadline(self, run: _Directive, deadline_s: float) -> None:
        await asyncio.sleep(deadline_s)
        self._apply(run, self.tracker.tick(max(self.clock(), run.accepted_at + deadline_s)))

    async def _lookup(self, directive: PrefetchDirective, deadline_s: float) -> Replicas:
        """The IS's records of the directive's keys (their digests verify the loads); none on failure."""
        request = LookupRequest(directive.scope_id, directive.compat_id, directive.block_keys)
        try:
            async with asyncio.timeout(deadline_s):
                return (await self.index().lookup(request)).replicas
        except (ProblemError, TransportError, ValidationError, TimeoutError) as exc:
            log.warning("prefetch %s: lookup failed: %s", directive.directive, exc)
            return ()

    async def _load(self, run: _Directive, action: LoadBlock, replicas: Replicas) -> None:
        directive = run.directive
        group = replicas[action.index] if action.index < len(replicas) else ()
        records = sorted((r for r in group if r.holder in action.sources), key=lambda r: action.sources.index(r.holder))
        loaded = False
        if records:
            async with self._gate:
                remaining = run.accepted_at + directive.deadline_ms / 1000 - self.clock()
                fetcher = self.fetchers(action.lease_ms, max(remaining, 0.001))
                result = await fetcher.load(directive.scope_id, directive.compat_id, [records],
                                            block_tokens=self.block_tokens)
                record_attempts(result, self.metrics)
                if result.blocks:
                    block = BlockId(directive.compat_id, directive.scope_id, action.block_key)
                    await self.tiers.place(block, container_bytes(result.blocks[0].container), computed=False)
                    self.metrics.prefetch_blocks.inc()
                    loaded = True
        now = self.clock()
        if loaded:
            self._apply(run, self.tracker.loaded(directive.directive, action.block_key, now))
        else:
            self._apply(run, self.tracker.load_failed(directive.directive, action.block_key, now))

    def _apply(self, run: _Directive, actions: list[PrefetchAction]) -> None:
        current = asyncio.current_task()
        for action in actions:
            if isinstance(action, CancelLoads):
                for key in action.block_keys:
                    task = run.loads.get(key)
                    if task is not None and task is not current:
                        task.cancel()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
