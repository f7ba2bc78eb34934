"""The PC's role in an active/standby group (decision D7), sans-I/O: the adapter feeds it the outcomes
of lease calls with the time each was sent, and asks it what this PC may do now.

Roles:

- ``standby``: no lease; role requests are answered 421 naming the leader (or 503 when none is known),
  and the adapter tries to acquire the lease every ``retry_every_s``;
- ``syncing``: the lease is ours but the state must be (re)loaded from the store before anything is
  granted: right after an acquire, and after a store error (whose outcome is unknown, so the
  in-memory state may be ahead of the store's);
- ``leader``: the lease is ours, unexpired by our own clock, and the state is loaded: grant.

The local deadline is the time an acquire or renew was *sent* plus the ttl, so it is never later than
the store's own expiry of the lease (which starts when the store executes the command).  When it
passes before a renewal got through (the store unreachable), the PC steps down: it lets the lease lapse
rather than act on state it can no longer write.  Writes are fenced by the store in any case; the
deadline only stops a PC that cannot reach the store from answering as if it could.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

MIN_RETRY_S = 0.02


class Role(enum.StrEnum):
    STANDBY = "standby"
    SYNCING = "syncing"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """The lease ttl; renewals at a third of it, acquire attempts (and re-syncs) at a tenth."""

    ttl_s: float

    @property
    def ttl_ms(self) -> int:
        return max(1, round(self.ttl_s * 1000))

    @property
    def renew_every_s(self) -> float:
        return self.ttl_s / 3

    @property
    def retry_every_s(self) -> float:
        return max(self.ttl_s / 10, MIN_RETRY_S)


class Leadership:
    """Role, fencing token, the leader's URI as last seen, and the local lease deadline."""

    __slots__ = ("deadline", "leader", "role", "timing", "token")

    def __init__(self, timing: LeaseTiming) -> None:
        self.timing = timing
        self.role = Role.STANDBY
        self.token: int | None = None
        self.leader: str | None = None
        self.deadline = -math.inf

    def granted(self, token: int, leader: str, sent_at: float, ttl_s: float | None = None) -> None:
        """An acquire sent at ``sent_at`` was granted (for ``ttl_s``, by default the timing's): sync
        before granting anything."""
        self.role, self.token, self.leader = Role.SYNCING, token, leader
        self.deadline = sent_at + (self.timing.ttl_s if ttl_s is None else ttl_s)

    def synced(self) -> None:
        if self.role is Role.SYNCING:
            self.role = Role.LEADER

    def renewed(self, sent_at: float) -> None:
        self.deadline = max(self.deadline, sent_at + self.timing.ttl_s)

    def store_failed(self) -> None:
        """A write's outcome is unknown: stop granting until the state is loaded again."""
        if self.role is Role.LEADER:
            self.role = Role.SYNCING

    def lost(self, leader: str | None = None) -> None:
        """The lease is gone (renew refused, a write fenced, the deadline passed): standby."""
        self.role, self.token, self.leader, self.deadline = Role.STANDBY, None, leader, -math.inf

    def saw_leader(self, leader: str | None) -> None:
        if self.role is Role.STANDBY:
            self.leader = leader

    def may_grant(self, now: float) -> bool:
        return self.role is Role.LEADER and now < self.deadline

    def lapsed(self, now: float) -> bool:
        return self.role is not Role.STANDBY and now >= self.deadline

    def next_wait(self, now: float) -> float:
        """How long the adapter sleeps before its next lease call."""
        if self.role is Role.STANDBY:
            return self.timing.retry_every_s
        every = self.timing.renew_every_s if self.role is Role.LEADER else self.timing.retry_every_s
        return max(MIN_RETRY_S, min(every, self.deadline - now))
