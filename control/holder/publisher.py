"""Publishing the holder's replicas to the Index Service (spec section 6.1).

Two parts, as elsewhere in kvsp: `RefreshSchedule` decides *when* each record is due again (sans-I/O,
``now`` passed in), and `Publisher` does the HTTP requests.  The publisher keeps the requests for one
block in order (a withdrawal never overtakes an earlier publication of the same block, which would
leave a stale record at the IS) while different blocks proceed concurrently, up to a bound.

Records are built when the request is sent, not when it is queued, so a record never carries a
residency or read rate that has since changed, and a block evicted in the meantime is not published.
When the IS caps the TTL, the next refresh comes at a third of the capped TTL.
A failed publication is retried soon (``RETRY_S``) rather than at the next refresh; a failed
withdrawal is logged and counted: the record expires at the IS after its ``ttl_ms`` in any case.

A withdrawal goes where the records went: the publisher remembers the holder URI of every record it
sent for a block (a relay's, for MOQT records published through one) and DELETEs at each, naming
this holder as the producer, since at a relay's URI the IS keeps one record per producer.  Blocks it
never published in this process (found stale in local storage after a restart) are withdrawn at the
URIs it would publish at.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from control.holder.metrics import HolderMetrics
from control.holder.store import BlockId
from kvsp.client.index import IndexClient
from kvsp.errors import KvspError
from kvsp.identifiers import role_id
from kvsp.records import ReplicaRecord

log = logging.getLogger("kvsp.holder.publisher")

RETRY_S: Final = 1.0
DEFAULT_CONCURRENCY: Final = 16

RecordOf = Callable[[BlockId], ReplicaRecord | None]


class RefreshSchedule:
    """Due times of published records: each is refreshed every ``interval_s`` (ttl/3, spec section 8).

    A heap with lazy deletion: `remove` and rescheduling only update ``_due``; stale heap items are
    skipped when they surface.
    """

    __slots__ = ("_due", "_heap", "_seq", "interval_s")

    def __init__(self, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError("the refresh interval must be positive")
        self.interval_s = interval_s
        self._due: dict[BlockId, float] = {}
        self._heap: list[tuple[float, int, BlockId]] = []
        self._seq = itertools.count()

    def __contains__(self, block: object) -> bool:
        return block in self._due

    def __len__(self) -> int:
        return len(self._due)

    def blocks(self) -> list[BlockId]:
        return list(self._due)

    def schedule(self, block: BlockId, at: float) -> None:
        self._due[block] = at
        heapq.heappush(self._heap, (at, next(self._seq), block))

    def published(self, block: BlockId, now: float) -> None:
        """The record was (or is being) sent now: next due one interval later."""
        self.schedule(block, now + self.interval_s)

    def remove(self, block: BlockId) -> None:
        self._due.pop(block, None)

    def due(self, now: float) -> list[BlockId]:
        """Blocks whose refresh is due at ``now``, each rescheduled one interval later."""
        out: list[BlockId] = []
        while self._heap and self._heap[0][0] <= now:
            at, _, block = heapq.heappop(self._heap)
            if self._due.get(block) != at:
                continue  # removed or rescheduled since
            out.append(block)
            self.published(block, now)
        return out

    def delay(self, now: float) -> float | None:
        """Seconds until the next refresh is due (0 if overdue), None when nothing is published."""
        while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return max(0.0, self._heap[0][0] - now) if self._heap else None


class Publisher:
    """Ordered, bounded, failure-tolerant publish/withdraw of this holder's replica records.

    ``index`` may be None (no IS configured, or not yet connected): operations then succeed locally
    and only the schedule is kept.
    """

    def __init__(self, holder: str, record_of: RecordOf, clock: Callable[[], float], interval_s: float,
                 metrics: HolderMetrics, *, concurrency: int = DEFAULT_CONCURRENCY) -> None:
        self.index: IndexClient | None = None
        self.holder = holder
        self.producer_id = role_id(holder)  # every record this holder publishes names it as the producer
        self.schedule = RefreshSchedule(interval_s)
        self._record_of = record_of
        self._clock = clock
        self._metrics = metrics
        self._limit = asyncio.Semaphore(concurrency)
        self._tails: dict[BlockId, asyncio.Task[bool]] = {}
        self._variants: list[tuple[str, Callable[[ReplicaRecord], ReplicaRecord]]] = []
        # Holder URIs of the records sent per block, as one shared tuple per distinct set.
        self._sent: dict[BlockId, tuple[str, ...]] = {}
        self._sent_sets: dict[tuple[str, ...], tuple[str, ...]] = {}

    def add_variant(self, holder: str, derive: Callable[[ReplicaRecord], ReplicaRecord]) -> None:
        """Publish ``derive(record)`` beside every record, refreshed and withdrawn with it.

        For the same replica served another way: the MOQT record whose holder is ``holder`` (a
        ``moqt://`` URI: the holder's endpoint, or its relay's) and whose namespace names this
        holder as the producer (decision D3).  ``holder`` is where the records of blocks not
        published in this process are withdrawn; the others are withdrawn where they were sent.
        """
        self._variants.append((holder, derive))

    # -- operations ------------------------------------------------------------------------------
    def publish(self, block: BlockId) -> asyncio.Task[bool]:
        """Publish (or refresh) the block's record; returns the task, which never raises."""
        self.schedule.published(block, self._clock())
        return self._chain(block, lambda: self._publish(block))

    def withdraw(self, block: BlockId) -> asyncio.Task[bool]:
        """Withdraw the block's record and stop refreshing it; the task never raises."""
        self.schedule.remove(block)
        return self._chain(block, lambda: self._withdraw(block))

    def refresh_due(self, now: float) -> int:
        """Send the refreshes that are due; returns how many."""
        due = self.schedule.due(now)
        for block in due:
            self._chain(block, functools.partial(self._publish, block))
        return len(due)

    async def drain(self) -> None:
        """Wait until every request queued so far has finished."""
        while self._tails:
            await asyncio.wait(list(self._tails.values()))

    async def withdraw_all(self, timeout_s: float) -> None:
        """Clean shutdown: withdraw every published record, waiting at most ``timeout_s``."""
        tasks = [self.withdraw(block) for block in self.schedule.blocks()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            if pending:
                log.warning("%d withdrawals did not finish within %.1f s", len(pending), timeout_s)
                for task in pending:
                    task.cancel()

    def targets(self, block: BlockId) -> tuple[str, ...]:
        """Holder URIs a withdrawal of the block DELETEs at: where its records were sent, else where
        they would be sent."""
        sent = self._sent.get(block)
        return sent if sent is not None else (self.holder, *(holder for holder, _ in self._variants))

    # -- machinery -------------------------------------------------------------------------------
    def _chain(self, block: BlockId, op: Callable[[], Awaitable[bool]]) -> asyncio.Task[bool]:
        previous = self._tails.get(block)

        async def run() -> bool:
            if previous is not None:
                await asyncio.wait([previous])
            async with self._limit:
                return await op()

        task = asyncio.get_running_loop().create_task(run())
        self._tails[block] = task
        task.add_done_callback(lambda t: self._forget(block, t))
        return task

    def _forget(self, block: BlockId, task: asyncio.Task[bool]) -> None:
        if self._tails.get(block) is task:
            del self._tails[block]

    async def _publish(self, block: BlockId) -> bool:
        record = self._record_of(block)
        if record is None:  # evicted or expired since it was queued
            self.schedule.remove(block)
            return False
        if self.index is None:
            return True
        sent = self._clock()
        records = [record, *(derive(record) for _, derive in self._variants)]
        self._remember(block, records)  # before the PUTs: one that fails may still have been stored
        try:
            stored = await self.index.publish(record)
            for variant in records[1:]:
                await self.index.publish(variant)
        except (KvspError, OSError) as exc:
            self._metrics.index_failures.labels("publish").inc()
            log.warning("publishing %s failed: %s", block, exc)
            if block in self.schedule:
                self.schedule.schedule(block, self._clock() + min(RETRY_S, self.schedule.interval_s))
            return False
        # The IS caps ttl_ms (section 6.1) and answers with the record as stored: refresh by that TTL.
        effective = stored.ttl_ms if isinstance(stored, ReplicaRecord) else record.ttl_ms
        if effective < record.ttl_ms and block in self.schedule:
            self.schedule.schedule(block, sent + effective / 3000)
        return True

    def _remember(self, block: BlockId, records: list[ReplicaRecord]) -> None:
        holders = tuple(dict.fromkeys((*self._sent.get(block, ()), *(r.holder for r in records))))
        self._sent[block] = self._sent_sets.setdefault(holders, holders)

    async def _withdraw(self, block: BlockId) -> bool:
        targets = self.targets(block)
        self._sent.pop(block, None)
        if self.index is None:
            return True
        try:
            for holder in targets:
                await self.index.withdraw(holder, block.block_key, producer=self.producer_id)
        except (KvspError, OSError) as exc:
            self._metrics.index_failures.labels("withdraw").inc()
            log.warning("withdrawing %s failed: %s", block, exc)
            return False
        return True
