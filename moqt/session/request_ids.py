"""Request ID allocation and MAX_REQUEST_ID flow control, both directions (draft-14 section 9.1, 9.5);
``StreamRequestIds`` for draft-18, which has no MAX_REQUEST_ID (its requests are flow controlled by
QUIC's bidirectional stream limit, each request being a stream of its own).

Why separate: the rules are pure arithmetic (client IDs even from 0, server IDs odd from 1, each new
request +2, the peer's bound is exclusive) and are easiest to get right -- and to test -- apart from
the session. A "Maximum Request ID" value here is always the exclusive bound the draft puts on the
wire ("the new Maximum Request ID plus 1"): IDs strictly below it may be used.
"""

from __future__ import annotations

from typing import Final

from moqt.errors import ProtocolViolation
from moqt.kinds import SessionError
from moqt.wire import VARINT_MAX

_PV: Final = SessionError.PROTOCOL_VIOLATION


def bound_for(next_id: int, count: int) -> int:
    """The exclusive bound that lets IDs ``next_id, next_id + 2, ...`` be used ``count`` times."""
    return max(0, next_id + 2 * count - 1)


class RequestIds:
    """Our own Request IDs (bounded by the peer) and the peer's (bounded by us)."""

    def __init__(self, *, local_first: int, peer_first: int, window: int, auto_grant: bool) -> None:
        self.next_local = local_first
        self.peer_max = 0  # the draft's default: no requests until the peer grants some
        self._blocked_reported: int | None = None
        self.next_peer = peer_first
        self.window = window
        self.auto_grant = auto_grant
        self.local_max = bound_for(peer_first, window)

    # -- our requests ---------------------------------------------------------------------------
    def can_allocate(self) -> bool:
        return self.next_local < self.peer_max

    def allocate(self) -> int:
        request_id = self.next_local
        self.next_local += 2
        return request_id

    def take_blocked_report(self) -> int | None:
        """The maximum to report in REQUESTS_BLOCKED, once per maximum (None: already reported)."""
        if self._blocked_reported == self.peer_max:
            return None
        self._blocked_reported = self.peer_max
        return self.peer_max

    def set_peer_initial(self, value: int | None) -> None:
        """The MAX_REQUEST_ID setup parameter (absent means 0)."""
        self.peer_max = value or 0

    def raise_peer_max(self, value: int) -> None:
        """A MAX_REQUEST_ID message: it must grow, else PROTOCOL_VIOLATION."""
        if value <= self.peer_max:
            raise ProtocolViolation(_PV, f"MAX_REQUEST_ID {value} does not exceed {self.peer_max}")
        self.peer_max = value

    def issued_locally(self, request_id: int) -> bool:
        return request_id % 2 == self.next_local % 2 and request_id < self.next_local

    # -- the peer's requests --------------------------------------------------------------------
    def accept_peer_request(self, request_id: int) -> None:
        """Check a new request's ID: right parity, below our bound, and exactly the next one."""
        if request_id % 2 != self.next_peer % 2:
            raise ProtocolViolation(SessionError.INVALID_REQUEST_ID,
                                    f"Request ID {request_id} has the wrong parity for the peer")
        if request_id >= self.local_max:
            raise ProtocolViolation(SessionError.TOO_MANY_REQUESTS,
                                    f"Request ID {request_id} is not below Maximum Request ID {self.local_max}")
        if request_id != self.next_peer:
            raise ProtocolViolation(SessionError.INVALID_REQUEST_ID,
                                    f"Request ID {request_id} where {self.next_peer} was expected")
        self.next_peer += 2

    def issued_by_peer(self, request_id: int) -> bool:
        return request_id % 2 == self.next_peer % 2 and request_id < self.next_peer

    def remaining_for_peer(self) -> int:
        return max(0, (self.local_max - self.next_peer + 1) // 2)

    def grant(self, count: int) -> int | None:
        """Allow ``count`` requests beyond those received; the new bound, or None if it would not grow."""
        value = bound_for(self.next_peer, count)
        if value <= self.local_max:
            return None
        self.local_max = value
        return value

    def auto_grant_due(self) -> int | None:
        """With auto-grant on, refill the window once half of it is used."""
        if not self.auto_grant or self.window == 0 or self.remaining_for_peer() * 2 > self.window:
            return None
        return self.grant(self.window)


class IdSet:
    """Which members of the sequence ``first, first + step, ...`` have been seen, in bounded memory:
    every member below ``floor`` was, and ``_above`` holds those seen past the first gap.

    Why: draft-18 requests each travel on their own stream, so they may arrive out of order; the draft
    still requires a duplicate Request ID to close the session, and a late octet of a request stream
    we have forgotten must not read as a new one. A peer may hold at most ``limit`` members out of
    order (QUIC's stream limit bounds honest peers far below it).
    """

    def __init__(self, first: int, step: int, *, limit: int = 4096) -> None:
        self.floor = first
        self._step = step
        self._above: set[int] = set()
        self._limit = limit

    def __contains__(self, value: int) -> bool:
        return value < self.floor or value in self._above

    def add(self, value: int) -> bool:
        """Record ``value``; False when it was already there. Raises past ``limit`` out of order."""
        if value in self:
            return False
        self._above.add(value)
        while self.floor in self._above:
            self._above.discard(self.floor)
            self.floor += self._step
        if len(self._above) > self._limit:
            raise ProtocolViolation(SessionError.INVALID_REQUEST_ID,
                                    f"more than {self._limit} IDs out of order (next missing: {self.floor})")
        return True


class StreamRequestIds(RequestIds):
    """Draft-18 Request IDs: no MAX_REQUEST_ID and no REQUESTS_BLOCKED (section "Request ID"); ours
    are never refused by the session (QUIC queues a request stream past the peer's limit), and the
    peer's need the right parity and no repeat, in any order."""

    def __init__(self, *, local_first: int, peer_first: int, window: int, auto_grant: bool) -> None:
        super().__init__(local_first=local_first, peer_first=peer_first, window=window, auto_grant=auto_grant)
        self.peer_max = self.local_max = VARINT_MAX
        self._peer_seen = IdSet(peer_first, 2)
        self._parity = peer_first % 2

    def can_allocate(self) -> bool:
        return self.next_local < VARINT_MAX

    def set_peer_initial(self, value: int | None) -> None:
        """SETUP has no MAX_REQUEST_ID option in this draft: nothing to set."""

    def raise_peer_max(self, value: int) -> None:
        raise ProtocolViolation(_PV, "MAX_REQUEST_ID in a draft without it")

    def accept_peer_request(self, request_id: int) -> None:
        """Right parity and never used before (section "Request ID": else INVALID_REQUEST_ID)."""
        if request_id % 2 != self._parity:
            raise ProtocolViolation(SessionError.INVALID_REQUEST_ID,
                                    f"Request ID {request_id} has the wrong parity for the peer")
        if not self._peer_seen.add(request_id):
            raise ProtocolViolation(SessionError.INVALID_REQUEST_ID, f"Request ID {request_id} used twice")

    @property
    def lowest_unseen_peer(self) -> int:
        """GOAWAY's Request ID: the smallest of the peer's IDs not yet processed (all below it were)."""
        return self._peer_seen.floor

    def issued_by_peer(self, request_id: int) -> bool:
        return request_id % 2 == self._parity and request_id in self._peer_seen

    def remaining_for_peer(self) -> int:
        return VARINT_MAX

    def grant(self, count: int) -> int | None:
        return None

    def auto_grant_due(self) -> int | None:
        return None
