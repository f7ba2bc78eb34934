"""When a connection PINGs its peer and when it gives a silent peer up: the rules, without I/O.

Why: aioquic ends a connection whose peer vanished (SIGKILL, a frozen process, a pulled cable) only at
the idle timeout. A long one keeps every request sent to a dead peer waiting that long; a short one
tears down live sessions that merely have nothing to say. So the two jobs are split:

* **keepalive** (client connections, which hold the long-lived sessions: a holder's or relay's
  `UpstreamLink`, a block client's cached sessions): a PING after ``interval_s`` without receiving
  anything -- a third of the negotiated idle timeout -- so an idle but live session never reaches it
  (the peer's ACK restarts both ends' idle timers, RFC 9000 section 10.1);
* **liveness** (every connection): one that has ack-eliciting packets in flight and has received
  nothing for ``timeout_s`` since the first of them left gives the peer up. A live peer ACKs within
  an RTT plus its ACK delay (25 ms at most) whatever its application is doing, so seconds of silence
  mean it is gone or frozen. This bounds how long a request sent to a vanished peer waits (a relay
  answers its subscribers with an error instead), whatever the idle timeout. A PING is ack-eliciting:
  keepalive doubles as the probe of a silent session.

`moqt.quic.MoqtConnection` tells it what it sends and receives and asks `check` at `next_check`;
nothing here reads a clock (every method takes ``now``).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class Verdict(enum.Enum):
    PING = "ping"  # send a PING now
    DEAD = "dead"  # the peer owes an ACK for longer than timeout_s: close the connection


@dataclass(slots=True)
class Liveness:
    """The keepalive and liveness state of one connection (see the module docstring).

    ``interval_s`` None: never PING (server connections); ``timeout_s`` None: no liveness verdict.
    ``next_check`` is never later than the next thing due, so the connection arms one timer at it.
    """

    interval_s: float | None
    timeout_s: float | None
    last_received: float
    last_ping: float = -math.inf
    awaiting_since: float | None = None  # the first ack-eliciting send since we last heard the peer
    next_check: float | None = None

    def __post_init__(self) -> None:
        for name in ("interval_s", "timeout_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive or None")
        self._plan()

    @property
    def watching(self) -> bool:
        """Whether a send should be reported with `sent` (liveness on, not already awaiting an answer)."""
        return self.timeout_s is not None and self.awaiting_since is None

    def received(self, now: float) -> None:
        """Anything arrived from the peer: it is alive, and owes nothing for what was sent before."""
        self.last_received = now
        self.awaiting_since = None

    def sent(self, now: float) -> None:
        """Ack-eliciting packets are in flight and nothing owed was pending: the peer owes an answer."""
        if self.timeout_s is None or self.awaiting_since is not None:
            return
        self.awaiting_since = now
        due = now + self.timeout_s
        if self.next_check is None or due < self.next_check:
            self.next_check = due

    def check(self, now: float, in_flight: bool) -> Verdict | None:
        """What is due at ``now`` (``in_flight``: ack-eliciting packets still unacknowledged);
        `next_check` moves to the next due time (None after DEAD)."""
        awaiting, timeout = self.awaiting_since, self.timeout_s
        if awaiting is not None and timeout is not None and now - awaiting >= timeout:
            if in_flight:
                self.next_check = None
                return Verdict.DEAD
            self.awaiting_since = None  # only ACKs were sent since: nothing was owed after all
        verdict = None
        if self.interval_s is not None and now - max(self.last_received, self.last_ping) >= self.interval_s:
            self.last_ping = now
            verdict = Verdict.PING
        self._plan()
        return verdict

    def _plan(self) -> None:
        due = math.inf
        if self.interval_s is not None:
            due = max(self.last_received, self.last_ping) + self.interval_s
        if self.awaiting_since is not None and self.timeout_s is not None:
            due = min(due, self.awaiting_since + self.timeout_s)
        self.next_check = None if due == math.inf else due
