"""The PC's store interface: the leader lease and the fenced writes of its durable state (decision D7).

A store keeps two things for a group of PC processes:

- the **leader lease**: at most one holder at a time, for ``ttl_ms`` unless renewed; each grant comes
  with a **fencing token** (a counter incremented on every acquire), and `Fence` is what a holder
  presents with every write;
- the **durable state** (`control.pc.core.durable`): every write names the caller's `Fence` and is
  refused (`WriteRefused` with `Refusal.FENCED`) unless that fence is the current lease, whatever the
  caller believes; the epoch rules of `control.pc.core.durable` are applied in the same atomic step.

`MemoryStore` (the embedded default) and `RedisStore` implement it; `StoreUnavailable` is every
failure to reach the store within its bound, so the PC can tell "refused" from "unknown".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from control.pc.core.durable import (
    DirectiveRecord,
    InstanceRecord,
    MapRecord,
    SessionRecord,
    Snapshot,
)
from kvsp.records import SessionCheckpoint


class StoreUnavailable(Exception):
    """The store did not answer within its bound (unreachable, timed out, failed): the outcome of the
    operation is unknown, so the PC must not act as if it had succeeded."""


@dataclass(frozen=True, slots=True)
class Fence:
    """A lease grant: the fencing token and the holder it was granted to (``"NONCE BASE_URI"``).

    ``value`` is what the lease holds while it is this grant's; a write carries it and is refused when
    the lease holds anything else (expired, or granted to another holder with a higher token)."""

    token: int
    holder: str

    @property
    def value(self) -> str:
        return f"{self.token} {self.holder}"

    @property
    def leader(self) -> str:
        return leader_of_holder(self.holder)


@dataclass(frozen=True, slots=True)
class LeaseView:
    """The outcome of an acquire: ``fence`` when it was granted; ``leader`` names the holder's base URI."""

    fence: Fence | None
    leader: str | None


def make_holder(nonce: str, base_uri: str) -> str:
    if " " in nonce or not nonce:
        raise ValueError("the nonce must be a non-empty word")
    return f"{nonce} {base_uri}"


def leader_of_holder(holder: str) -> str:
    return holder.partition(" ")[2]


def parse_lease(value: str) -> Fence | None:
    """The `Fence` a lease value ``"TOKEN NONCE BASE_URI"`` stands for, or None when it is malformed."""
    token, _, holder = value.partition(" ")
    if not token.isdigit() or " " not in holder:
        return None
    return Fence(int(token), holder)


class PcStore(Protocol):
    """The lease and the fenced writes; every method is bounded in time or raises `StoreUnavailable`."""

    # -- the leader lease ------------------------------------------------------------------------
    async def acquire(self, holder: str, ttl_ms: int) -> LeaseView:
        """Take the lease when nobody holds it (a new, higher fencing token), else say who does."""
        ...

    async def renew(self, fence: Fence, ttl_ms: int) -> bool:
        """Extend the lease by ``ttl_ms`` if ``fence`` still holds it; False when it was lost."""
        ...

    async def release(self, fence: Fence) -> None:
        """Give the lease up now (a clean shutdown), if ``fence`` still holds it."""
        ...

    async def leader(self) -> str | None:
        """The base URI of the current lease holder, or None."""
        ...

    # -- the durable state -----------------------------------------------------------------------
    async def load(self) -> Snapshot: ...

    async def open_session(self, fence: Fence, record: SessionRecord) -> None: ...

    async def record_checkpoint(self, fence: Fence, sender: str, checkpoint: SessionCheckpoint) -> int:
        """Record ``checkpoint`` from ``sender``; the output_offset the store now holds for the session."""
        ...

    async def save_session(self, fence: Fence, record: SessionRecord) -> None: ...

    async def drop_sessions(self, fence: Fence, sessions: Sequence[str]) -> None: ...

    async def save_instance(self, fence: Fence, record: InstanceRecord) -> None: ...

    async def save_map(self, fence: Fence, record: MapRecord) -> None: ...

    async def save_directive(self, fence: Fence, record: DirectiveRecord) -> None: ...

    async def close(self) -> None: ...
