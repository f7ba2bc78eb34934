"""The embedded store (``[pc] backend = "memory"``, the default): the PC's durable state in its own memory.

It applies exactly the rules the Redis scripts apply (`control.pc.core.durable`), so the one suite in
tests/test_pc_backend_rules.py holds both to them; the lease expires by ``clock`` like a Redis PX
lease.  It survives nothing the process does not: one embedded PC is its own only leader.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from control.pc.core.durable import (
    DirectiveRecord,
    InstanceRecord,
    MapRecord,
    Refusal,
    Refused,
    SessionRecord,
    Snapshot,
    WriteRefused,
    checkpoint_rule,
    instance_rule,
    map_rule,
    open_rule,
    session_rule,
)
from control.pc.store.base import Fence, LeaseView, leader_of_holder, parse_lease
from kvsp.records import SessionCheckpoint

R = TypeVar("R")


class MemoryStore:
    """`PcStore` in a few dictionaries; ``clock`` (seconds) times the lease and directive lifetimes."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lease: tuple[str, float] | None = None  # (value, expires at)
        self._fence = 0
        self._sessions: dict[str, SessionRecord] = {}
        self._instances: dict[str, InstanceRecord] = {}
        self._maps: dict[str, MapRecord] = {}
        self._directives: dict[str, tuple[DirectiveRecord, float]] = {}

    # -- lease -------------------------------------------------------------------------------------
    def _current(self) -> str | None:
        if self._lease is not None and self.clock() >= self._lease[1]:
            self._lease = None
        return None if self._lease is None else self._lease[0]

    async def acquire(self, holder: str, ttl_ms: int) -> LeaseView:
        current = self._current()
        if current is not None:
            held = parse_lease(current)
            if held is not None and held.holder == holder:
                return LeaseView(held, held.leader)
            return LeaseView(None, None if held is None else held.leader)
        self._fence += 1
        fence = Fence(self._fence, holder)
        self._lease = (fence.value, self.clock() + ttl_ms / 1000)
        return LeaseView(fence, leader_of_holder(holder))

    async def renew(self, fence: Fence, ttl_ms: int) -> bool:
        if self._current() != fence.value:
            return False
        self._lease = (fence.value, self.clock() + ttl_ms / 1000)
        return True

    async def release(self, fence: Fence) -> None:
        if self._current() == fence.value:
            self._lease = None

    async def leader(self) -> str | None:
        current = self._current()
        held = None if current is None else parse_lease(current)
        return None if held is None else held.leader

    def _check(self, fence: Fence, what: str) -> None:
        if self._current() != fence.value:
            raise WriteRefused(Refused(Refusal.FENCED), what)

    # -- state ---------------------------------------------------------------------------------------
    async def load(self) -> Snapshot:
        now = self.clock()
        return Snapshot(tuple(self._sessions.values()), tuple(self._instances.values()), tuple(self._maps.values()),
                        tuple(d for d, expires in self._directives.values() if expires > now))

    async def open_session(self, fence: Fence, record: SessionRecord) -> None:
        self._check(fence, f"open session {record.session}")
        self._sessions[record.session] = _accepted(open_rule(self._sessions.get(record.session), record),
                                                   f"session {record.session}")

    async def record_checkpoint(self, fence: Fence, sender: str, checkpoint: SessionCheckpoint) -> int:
        what = f"checkpoint of {checkpoint.session} at epoch {checkpoint.epoch}"
        self._check(fence, what)
        record = _accepted(checkpoint_rule(self._sessions.get(checkpoint.session), sender, checkpoint), what)
        self._sessions[checkpoint.session] = record
        return record.output_offset

    async def save_session(self, fence: Fence, record: SessionRecord) -> None:
        what = f"session {record.session} at epoch {record.epoch}"
        self._check(fence, what)
        self._sessions[record.session] = _accepted(session_rule(self._sessions.get(record.session), record), what)

    async def drop_sessions(self, fence: Fence, sessions: Sequence[str]) -> None:
        self._check(fence, "drop sessions")
        for session in sessions:
            self._sessions.pop(session, None)

    async def save_instance(self, fence: Fence, record: InstanceRecord) -> None:
        what = f"instance {record.instance} at epoch {record.epoch}"
        self._check(fence, what)
        self._instances[record.instance] = _accepted(instance_rule(self._instances.get(record.instance), record),
                                                     what)

    async def save_map(self, fence: Fence, record: MapRecord) -> None:
        what = f"map {record.map} at version {record.version}"
        self._check(fence, what)
        self._maps[record.map] = _accepted(map_rule(self._maps.get(record.map), record), what)

    async def save_directive(self, fence: Fence, record: DirectiveRecord) -> None:
        self._check(fence, f"directive {record.id}")
        now = self.clock()
        for gone in [k for k, (_, expires) in self._directives.items() if expires <= now]:
            del self._directives[gone]
        self._directives[record.id] = (record, now + record.lifetime_ms / 1000)

    async def close(self) -> None:
        return None


def _accepted(verdict: R | Refused, what: str) -> R:
    if isinstance(verdict, Refused):
        raise WriteRefused(verdict, what)
    return verdict
