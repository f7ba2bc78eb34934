"""Instance Status Records as the Index Service (and later the PC) holds them (spec section 6.3), sans-I/O.

The IS needs each target instance's status (links and prefill rate) to answer a lookup with
``fetch_us`` and ``recompute_us`` (section 6.2).  The board keeps the newest record of each instance
until its ``ttl_ms`` runs out, and applies the epoch rule of section 6.3: a record whose epoch is
lower than the highest seen for that instance is discarded (``kvsp-stale-epoch``), so a delayed
report from before a restart can never replace a newer one.  The highest epoch of an instance is
remembered after its record expires, for the same reason; that memory is one integer per instance
identity, and only an instance itself may report its status.

When the PC runs in the same process, it shares this board (see ``control.index.app.STATUS_BOARD``).
An IS whose index lives in Redis registers a listener, so that what the PC accepts here also reaches
the board in Redis that every IS process reads (the board itself stays sans-I/O: a listener is a
plain callable, called after a record is accepted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvsp.problems import ProblemError, ProblemType
from kvsp.records import InstanceStatus


@dataclass(frozen=True, slots=True)
class BoardEntry:
    """The current record of one instance and when it expires (seconds on the caller's clock)."""

    status: InstanceStatus
    expires: float


class StatusBoard:
    """The newest unexpired Instance Status Record of each instance, by instance base URI."""

    def __init__(self) -> None:
        self._entries: dict[str, BoardEntry] = {}
        self._epochs: dict[str, int] = {}
        self.listeners: list[Callable[[InstanceStatus], None]] = []

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, status: InstanceStatus, now: float) -> BoardEntry:
        """Record ``status``; raise ``kvsp-stale-epoch`` when its epoch is lower than one seen before.

        An equal epoch is the same run of the instance reporting again, so it replaces the record.
        """
        seen = self._epochs.get(status.instance)
        if seen is not None and status.epoch < seen:
            raise ProblemError.of(ProblemType.STALE_EPOCH,
                                  f"epoch {status.epoch} is lower than {seen}, already seen for this instance")
        self._epochs[status.instance] = status.epoch
        entry = BoardEntry(status, now + status.ttl_ms / 1000)
        self._entries[status.instance] = entry
        for listener in self.listeners:
            listener(status)
        return entry

    def get(self, instance: str, now: float) -> InstanceStatus | None:
        """The unexpired record of ``instance``, or None (an expired record means a failed instance)."""
        entry = self._entries.get(instance)
        if entry is None:
            return None
        if entry.expires <= now:
            del self._entries[instance]
            return None
        return entry.status

    def highest_epoch(self, instance: str) -> int | None:
        return self._epochs.get(instance)

    def live(self, now: float) -> list[InstanceStatus]:
        """Every unexpired record, in the order the instances first reported."""
        return [e.status for e in self._entries.values() if e.expires > now]

    def sweep(self, now: float) -> int:
        """Drop expired records; O(instances), which is small next to the replica index."""
        expired = [name for name, entry in self._entries.items() if entry.expires <= now]
        for name in expired:
            del self._entries[name]
        return len(expired)
