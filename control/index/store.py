"""The replica index of the Index Service (spec sections 6.1 and 6.2), sans-I/O.

`ReplicaIndex` never reads a clock and never touches asyncio: every method takes ``now`` (seconds on
any monotonic scale), so expiry is tested by passing numbers and the HTTP adapter stays thin.

Layout and costs:

- ``_by_key: dict[block_key, list[_Entry]]``, one entry per (holder-id, producer) of the key.  The
  producer is the record's `ReplicaRecord.producer_id`: the holder itself for an ``https`` record,
  the namespace's holder-id for a ``moqt`` one.  Records of blocks published through a relay all
  name the relay's URI, so they share one ``replicas/{holder-id}/{block_key}`` path; keying entries
  by the producer too keeps each producer's replica its own, so that no producer's PUT replaces, and
  no producer's DELETE removes, another's (sections 4.4, 6.1, 9).  The path has no scope, so a
  producer has at most one record per holder and Block Key; scope and compat_id are checked per
  entry at lookup, so a record of another scope or compat is never a match.  Block Keys are HMACs
  under the Scope Key, so keys of different scopes do not collide in practice and the per-key lists
  stay short (one entry per holder and producer).  A list costs 64 octets where a one-item dict
  costs 224.
- `lookup` probes ``_by_key`` once per requested key and stops at the first key without an
  unexpired replica, so it costs O(keys x holders per key) whatever the size of the index.
- Expiry: entries that a lookup meets expired are dropped on the spot; the rest are dropped by
  `sweep`, driven by a min-heap of ``(time, entry)`` items and bounded by ``limit`` items per call.
  A refresh that extends the expiry does not push a heap item: when the old item comes due, the
  entry is found alive and rescheduled at its real expiry.  So each live entry owns one heap item,
  and stale items (left by withdrawals, replacements and shortened TTLs) are compacted away once
  they outnumber the live ones, keeping memory proportional to the live records.
- Records are stored once, as parsed; identifiers that many records share (compat_id, scope_id,
  holder URI, holder-id, producer, residency) are interned so each distinct value is held once.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from kvsp.problems import Problem, ProblemError
from kvsp.records import ReplicaRecord

H = TypeVar("H", bound=Hashable)

DEFAULT_SWEEP_LIMIT: Final = 10_000
INTERN_LIMIT: Final = 65_536
_COMPACT_SLACK: Final = 1024
# A removed entry's ``scheduled`` is NaN, which equals no heap time, so its heap item reads as stale.
_REMOVED: Final = math.nan


class _Entry:
    """One replica of one producer at one holder: the record, its expiry and the time of its heap item.

    Invariant: while the entry is live, ``scheduled <= expires`` and the heap holds exactly one item
    ``(scheduled, entry)``.  No entry orders before another, so heap items with equal times are
    simply unordered among themselves (without ``__lt__`` the tuple comparison would raise).
    """

    __slots__ = ("expires", "holder_id", "producer", "record", "scheduled")

    def __init__(self, record: ReplicaRecord, holder_id: str, producer: str, expires: float) -> None:
        self.record = record
        self.holder_id = holder_id
        self.producer = producer
        self.expires = expires
        self.scheduled = expires

    def __lt__(self, other: _Entry) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class Stored:
    """The outcome of `ReplicaIndex.put`: the record as stored (TTL capped) and whether it is new."""

    record: ReplicaRecord
    created: bool

    @property
    def ttl_ms(self) -> int:
        """The effective TTL, which the holder should use to schedule its refresh."""
        return self.record.ttl_ms


@dataclass(slots=True)
class IndexStats:
    """Counters kept by the index for metrics (section 8); monotonic except ``replicas``."""

    replicas: int = 0
    expired: int = 0
    created: int = 0
    refreshed: int = 0
    withdrawn: int = 0


class _Interner:
    """Shares equal immutable values between records; bounded so that hostile input cannot grow it."""

    __slots__ = ("_limit", "_values")

    def __init__(self, limit: int) -> None:
        self._values: dict[object, object] = {}
        self._limit = limit

    def __call__(self, value: H) -> H:
        known = self._values.get(value)
        if known is not None:
            return known  # type: ignore[return-value]  # equal key, hence the same type
        if len(self._values) < self._limit:
            self._values[value] = value
        return value


class ReplicaIndex:
    """Replica records by Block Key, with TTL expiry and longest-prefix lookup (sans-I/O)."""

    def __init__(self, *, ttl_ms_max: int, capacity: int | None = None,
                 intern_limit: int = INTERN_LIMIT) -> None:
        if ttl_ms_max <= 0:
            raise ValueError("ttl_ms_max must be positive")
        self.ttl_ms_max = ttl_ms_max
        self.capacity = capacity
        self.stats = IndexStats()
        self._by_key: dict[bytes, list[_Entry]] = {}
        self._heap: list[tuple[float, _Entry]] = []
        self._intern = _Interner(intern_limit)

    def __len__(self) -> int:
        return self.stats.replicas

    # -- publish, refresh, withdraw ---------------------------------------------------------------
    def put(self, record: ReplicaRecord, holder_id: str, now: float) -> Stored:
        """Publish or refresh the producer's replica of ``record.block_key`` at ``holder_id`` (idempotent).

        The caller has checked that ``holder_id`` names the record's holder and that the client may
        publish for the record's producer.  Only that producer's entry is created or replaced; other
        producers' records at the same holder stay.  The TTL is capped at ``ttl_ms_max``; the stored
        record carries the capped TTL.  A refresh may change anything in the record, its scope
        included: the resource is (holder, block key, producer).
        """
        record = self._compact_record(record)
        producer = _producer(record, holder_id)
        expires = now + record.ttl_ms / 1000
        entries = self._by_key.get(record.block_key)
        entry = _find(entries, holder_id, producer) if entries is not None else None
        if entry is not None:
            revived = entry.expires <= now  # expired but not yet swept: this PUT creates it anew
            entry.record = record
            entry.expires = expires
            if expires < entry.scheduled:  # shortened: the existing heap item would come too late
                self._schedule(entry, expires)
            if revived:
                self.stats.expired += 1
                self.stats.created += 1
            else:
                self.stats.refreshed += 1
            return Stored(record, created=revived)
        if self.capacity is not None and self.stats.replicas >= self.capacity:
            raise ProblemError(Problem.generic(507, "Insufficient Storage",
                                               f"the index holds its maximum of {self.capacity} replicas"))
        holder_id = self._intern(holder_id)
        entry = _Entry(record, holder_id, holder_id if producer == holder_id else self._intern(producer), expires)
        if entries is None:
            self._by_key[record.block_key] = [entry]
        else:
            entries.append(entry)
        self._schedule(entry, expires)
        self.stats.replicas += 1
        self.stats.created += 1
        return Stored(record, created=True)

    def get(self, holder_id: str, block_key: bytes, now: float, producer: str | None = None) -> ReplicaRecord | None:
        """The unexpired record of ``producer`` (default: the holder itself) at ``holder_id``, or None."""
        entry = _find(self._by_key.get(block_key), holder_id, holder_id if producer is None else producer)
        return entry.record if entry is not None and entry.expires > now else None

    def records(self, holder_id: str, block_key: bytes, now: float) -> list[ReplicaRecord]:
        """Every producer's unexpired record of ``block_key`` at ``holder_id``."""
        return [e.record for e in self._by_key.get(block_key, ()) if e.holder_id == holder_id and e.expires > now]

    def delete(self, holder_id: str, block_key: bytes, now: float, producer: str | None = None) -> bool:
        """Withdraw one producer's replica (default: the holder's own); False when none was unexpired."""
        return self.withdraw(holder_id, block_key, now, (holder_id if producer is None else producer).__eq__) > 0

    def withdraw(self, holder_id: str, block_key: bytes, now: float, producers: Callable[[str], bool]) -> int:
        """Withdraw the replicas at ``holder_id`` of each producer for which ``producers`` is true.

        Returns how many of them were unexpired.  Entries of other producers are neither removed nor
        reported, so the answer tells a client nothing about replicas it may not withdraw.
        """
        entries = self._by_key.get(block_key)
        if entries is None:
            return 0
        live = 0
        for entry in [e for e in entries if e.holder_id == holder_id and producers(e.producer)]:
            if entry.expires > now:
                live += 1
                self.stats.withdrawn += 1
            else:
                self.stats.expired += 1
            self._remove(block_key, entries, entry)
        return live

    # -- lookup -----------------------------------------------------------------------------------
    def lookup(self, scope_id: bytes, compat_id: bytes, keys: Sequence[bytes],
               now: float) -> list[tuple[ReplicaRecord, ...]]:
        """Replicas of the longest prefix of ``keys`` that has an unexpired replica per key.

        Stops at the first key without one (Block Keys are chained, section 6.2).  Only records of
        ``scope_id`` and ``compat_id`` match.  Expired entries met on the way are removed.
        """
        groups: list[tuple[ReplicaRecord, ...]] = []
        by_key = self._by_key
        for key in keys:
            entries = by_key.get(key)
            if entries is None:
                break
            group = tuple(e.record for e in entries if e.expires > now
                          and e.record.scope_id == scope_id and e.record.compat_id == compat_id)
            if len(group) < len(entries):
                self._drop_expired(key, entries, now)
            if not group:
                break
            groups.append(group)
        return groups

    # -- expiry -----------------------------------------------------------------------------------
    def sweep(self, now: float, limit: int = DEFAULT_SWEEP_LIMIT) -> int:
        """Remove records expired at ``now``, examining at most ``limit`` heap items.

        Returns the number of records removed.  Call again while `due` is true to finish.
        """
        removed = 0
        heap = self._heap
        for _ in range(limit):
            if not heap or heap[0][0] > now:
                break
            scheduled, entry = heapq.heappop(heap)
            if entry.scheduled != scheduled:
                continue  # stale item: the entry was removed or rescheduled earlier
            if entry.expires > now:  # refreshed since the item was pushed: reschedule
                entry.scheduled = entry.expires
                heapq.heappush(heap, (entry.expires, entry))
                continue
            key = entry.record.block_key
            self._remove(key, self._by_key[key], entry)
            self.stats.expired += 1
            removed += 1
        return removed

    def due(self, now: float) -> bool:
        """Whether `sweep` has heap items to examine at ``now``."""
        return bool(self._heap) and self._heap[0][0] <= now

    @property
    def heap_size(self) -> int:
        """Heap items, live and stale; bounded by about twice the live records plus a constant."""
        return len(self._heap)

    # -- internals --------------------------------------------------------------------------------
    def _compact_record(self, record: ReplicaRecord) -> ReplicaRecord:
        """The record to store: TTL capped, shared identifiers interned (one copy per distinct value)."""
        intern = self._intern
        compat_id, scope_id = intern(record.compat_id), intern(record.scope_id)
        holder, residency = intern(record.holder), intern(record.residency)
        ttl_ms = min(record.ttl_ms, self.ttl_ms_max)
        if (ttl_ms == record.ttl_ms and compat_id is record.compat_id and scope_id is record.scope_id
                and holder is record.holder and residency is record.residency):
            return record
        return dataclasses.replace(record, compat_id=compat_id, scope_id=scope_id, holder=holder,
                                   residency=residency, ttl_ms=ttl_ms)

    def _schedule(self, entry: _Entry, when: float) -> None:
        entry.scheduled = when
        heapq.heappush(self._heap, (when, entry))
        if len(self._heap) > 2 * self.stats.replicas + _COMPACT_SLACK:
            self._heap = [item for item in self._heap if item[1].scheduled == item[0]]
            heapq.heapify(self._heap)

    def _remove(self, key: bytes, entries: list[_Entry], entry: _Entry) -> None:
        entries.remove(entry)  # identity first: list.remove tries `is` before `==`
        if not entries:
            del self._by_key[key]
        entry.scheduled = _REMOVED
        self.stats.replicas -= 1

    def _drop_expired(self, key: bytes, entries: list[_Entry], now: float) -> None:
        for entry in [e for e in entries if e.expires <= now]:
            self._remove(key, entries, entry)
            self.stats.expired += 1


def _producer(record: ReplicaRecord, holder_id: str) -> str:
    """`ReplicaRecord.producer_id`, given the holder-id the caller has already checked (no hashing)."""
    namespace = record.moqt_namespace
    return namespace.holder_id if namespace is not None else holder_id


def _find(entries: list[_Entry] | None, holder_id: str, producer: str) -> _Entry | None:
    if entries is None:
        return None
    for entry in entries:
        if entry.holder_id == holder_id and entry.producer == producer:
            return entry
    return None
