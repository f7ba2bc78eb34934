"""Where the Index Service keeps its state (decision D7): the small async interface and its memory back-end.

`IndexBackend` is what the HTTP adapter (``control.index.app``) talks to: publish, read, withdraw and
look up replicas, count them, and keep Instance Status Records for lookup estimates.  Two back-ends
implement it:

- `MemoryBackend` (the default): the sans-I/O `ReplicaIndex` and `StatusBoard` of this process, read
  with the IS's injected clock, so tests drive expiry with a fake clock.  Behaviour is that of the
  stores themselves; nothing here adds rules.
- `control.index.redis_store.RedisIndex`: Redis or Redis Cluster, shared by any number of IS
  processes; expiry is decided by Redis's own clock (its TTLs), never by the IS's.

Authorization stays in the adapter.  What a back-end gets is already decided: the holder-id has
been checked against the record and the caller, and a withdrawal names the set of producers whose
records the caller may remove (so that a script in Redis can check and delete in one step).

A back-end that cannot reach its store raises `BackendUnavailable`; the adapter answers 503, which
clients treat as a miss (the index is advisory, section 6.1) or fail over on to another IS.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from control.index.encode import record_json
from control.index.status import StatusBoard
from control.index.store import ReplicaIndex, Stored
from kvsp.errors import KvspError
from kvsp.records import InstanceStatus, ReplicaRecord

Groups = Sequence[tuple[ReplicaRecord, ...]]
# How long the IS stops sending work to a back-end that failed before it tries again (seconds).
DEFAULT_COOLDOWN_S: Final = 0.5
# Records decoded from stored text that are kept (about 1.5 kB each with their text): a few prompts' worth.
DECODED_RECORDS: Final = 16_384


class BackendUnavailable(KvspError):
    """The store behind the IS did not answer (unreachable, timed out, refused); ``operation`` says what failed."""

    def __init__(self, operation: str, detail: str) -> None:
        super().__init__(f"index back-end unavailable during {operation}: {detail}")
        self.operation = operation
        self.detail = detail


class Matches:
    """A lookup's answer: ``matched`` leading keys and their replicas, as records or as stored text.

    The memory back-end holds parsed records.  Redis holds each record's canonical JSON and answers
    with their text: each key's records joined by TAB, the keys' groups by LF (canonical JSON never
    holds a raw control character, so the separators cannot occur inside a record).  The response
    needs the JSON text, which that text becomes with two replacements; records are needed only for
    ``targets`` estimates, and are then decoded through a cache keyed by their text (equal text,
    equal record), since the PC asks for estimates with every lookup and the same records recur.
    Each form is derived from the other once, on first use; that caching is why this is a small
    class and not a frozen dataclass.
    """

    __slots__ = ("_groups", "_text", "matched")

    def __init__(self, matched: int, groups: Groups | None = None, text: str | None = None) -> None:
        if groups is None and text is None:
            raise ValueError("Matches needs the groups or their text")
        self.matched = matched
        self._groups = groups
        self._text = text

    @classmethod
    def of_records(cls, groups: Groups) -> Matches:
        return cls(len(groups), groups=groups)

    @classmethod
    def of_text(cls, matched: int, text: str) -> Matches:
        """``text``: records' canonical JSON, TAB between the records of a key, LF between keys."""
        return cls(matched, text=text)

    def groups(self) -> Groups:
        """Replicas per matched key, as records (decoded from the stored text on first use)."""
        if self._groups is None:
            text = self._text or ""
            groups = text.split("\n") if text else []
            try:
                self._groups = [tuple(_decoded(r) for r in group.split("\t")) for group in groups]
            except (KvspError, ValueError) as exc:  # the store returned what no IS wrote
                raise BackendUnavailable("lookup", f"a stored record does not parse: {exc}") from exc
        return self._groups

    def replicas_text(self) -> str:
        """The members of the answer's ``replicas`` array as canonical JSON text: ``[r,r],[r]``."""
        if self._groups is not None:
            return ",".join(["[" + ",".join([record_json(r) for r in group]) + "]" for group in self._groups])
        text = self._text or ""
        return "[" + text.replace("\t", ",").replace("\n", "],[") + "]" if text else ""


@functools.lru_cache(maxsize=DECODED_RECORDS)
def _decoded(text: str) -> ReplicaRecord:
    return ReplicaRecord.from_bytes(text)


class IndexBackend(Protocol):
    """The IS's state: replica records by (holder-id, Block Key, producer), and instance statuses.

    Every method may raise `BackendUnavailable`; `put` raises ``ProblemError`` 507 when the index is full,
    `put_status` ``kvsp-stale-epoch`` for an epoch lower than one seen.  Times are the back-end's own.
    """

    @property
    def kind(self) -> str: ...

    async def put(self, record: ReplicaRecord, holder_id: str) -> Stored:
        """Publish or refresh the producer's replica at ``holder_id``; TTL capped (see `ReplicaIndex.put`)."""

    async def get(self, holder_id: str, block_key: bytes, producer: str | None = None) -> ReplicaRecord | None:
        """The unexpired record of ``producer`` (default: the holder itself) at ``holder_id``."""

    async def records(self, holder_id: str, block_key: bytes) -> list[ReplicaRecord]:
        """Every producer's unexpired record of ``block_key`` at ``holder_id``."""

    async def delete(self, holder_id: str, block_key: bytes, producer: str | None = None) -> bool:
        """Withdraw one producer's replica (default: the holder's own); False when none was unexpired."""

    async def withdraw(self, holder_id: str, block_key: bytes, producers: frozenset[str]) -> int:
        """Withdraw the replicas at ``holder_id`` of the producers in ``producers``, atomically; how many were live."""

    async def lookup(self, scope_id: bytes, compat_id: bytes, keys: Sequence[bytes]) -> Matches:
        """Longest prefix of ``keys`` with an unexpired replica of that scope and compat_id per key."""

    async def count(self) -> int:
        """Live replica records (the memory back-end: exact; Redis: see `RedisIndex.count`)."""

    async def put_status(self, status: InstanceStatus) -> InstanceStatus:
        """Keep ``status`` until its ttl_ms runs out, under the epoch rule of section 6.3."""

    async def statuses(self, instances: Sequence[str]) -> dict[str, InstanceStatus]:
        """The unexpired status of each of ``instances`` that has one."""

    async def maintain(self) -> None:
        """One background step (every ``sweep_interval_s``): expiry sweeps, counters, health probe."""

    def facts(self) -> dict[str, object]:
        """What ``GET {base}health`` says about the back-end (synchronous: the last known state)."""

    async def close(self) -> None: ...


class MemoryBackend:
    """`IndexBackend` over this process's `ReplicaIndex` and `StatusBoard`, read with the injected clock."""

    kind = "memory"

    def __init__(self, index: ReplicaIndex, board: StatusBoard, clock: Callable[[], float],
                 sweep_batch: int = 10_000) -> None:
        self.index = index
        self.board = board
        self.clock = clock
        self.sweep_batch = sweep_batch

    async def put(self, record: ReplicaRecord, holder_id: str) -> Stored:
        return self.index.put(record, holder_id, self.clock())

    async def get(self, holder_id: str, block_key: bytes, producer: str | None = None) -> ReplicaRecord | None:
        return self.index.get(holder_id, block_key, self.clock(), producer)

    async def records(self, holder_id: str, block_key: bytes) -> list[ReplicaRecord]:
        return self.index.records(holder_id, block_key, self.clock())

    async def delete(self, holder_id: str, block_key: bytes, producer: str | None = None) -> bool:
        return self.index.delete(holder_id, block_key, self.clock(), producer)

    async def withdraw(self, holder_id: str, block_key: bytes, producers: frozenset[str]) -> int:
        return self.index.withdraw(holder_id, block_key, self.clock(), producers.__contains__)

    async def lookup(self, scope_id: bytes, compat_id: bytes, keys: Sequence[bytes]) -> Matches:
        return Matches.of_records(self.index.lookup(scope_id, compat_id, keys, self.clock()))

    async def count(self) -> int:
        return len(self.index)

    async def put_status(self, status: InstanceStatus) -> InstanceStatus:
        return self.board.put(status, self.clock()).status

    async def statuses(self, instances: Sequence[str]) -> dict[str, InstanceStatus]:
        now = self.clock()
        found = {name: self.board.get(name, now) for name in instances}
        return {name: status for name, status in found.items() if status is not None}

    async def maintain(self) -> None:
        now = self.clock()
        self.index.sweep(now, self.sweep_batch)
        while self.index.due(now):
            await asyncio.sleep(0)  # bounded steps, so a mass expiry never stalls requests
            self.index.sweep(now, self.sweep_batch)
        self.board.sweep(now)

    def facts(self) -> dict[str, object]:
        return {"backend": "memory", "state": "up", "replicas": len(self.index)}

    async def close(self) -> None:
        return None
