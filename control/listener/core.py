"""The decisions of a guarded listener, sans-I/O: every method is handed ``now`` (seconds, monotonic).

`ConnectionClock` follows one connection through its phases and says when it has taken too long:

- ``handshake``: TCP accepted, TLS not yet established: ``handshake_timeout_ms`` in all;
- ``headers``: from a request's first octet (a new connection: from its start) to its last header line:
  ``header_timeout_ms`` in all, however the octets trickle in;
- ``body``: the handler runs and the body is not complete: no octet for ``body_timeout_ms`` closes it,
  and so does a body slower than ``body_min_octets_per_s`` on average once ``body_timeout_ms`` has
  passed (a trickle of one octet a second must not hold a connection for days).  While the server
  itself holds the body back (reading paused: the handler is not consuming it), the clock restarts;
- ``handling``: the body is complete and the handler works: no deadline of the connection's own;
- ``idle``: between requests of a kept-alive connection: ``idle_timeout_ms``.

In every phase after the handshake, an answer the client does not take (writing paused and the write
buffer not shrinking) for ``send_timeout_ms`` closes the connection too.

`PeerTable` counts concurrent connections per client address against a cap, and `classify_tls` turns
an OpenSSL handshake error into a metric label and the words of a log line.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from kvsp.service.config import ListenerLimits


class Phase(Enum):
    HANDSHAKE = "handshake"
    HEADERS = "headers"
    BODY = "body"
    HANDLING = "handling"
    IDLE = "idle"


# Metric labels of the connections a listener closes because they took too long.
HANDSHAKE_TIMEOUT: Final = "handshake_timeout"
HEADER_TIMEOUT: Final = "header_timeout"
BODY_TIMEOUT: Final = "body_timeout"
IDLE_TIMEOUT: Final = "idle_timeout"
SEND_TIMEOUT: Final = "send_timeout"
EXPIRY_REASONS: Final = (HANDSHAKE_TIMEOUT, HEADER_TIMEOUT, BODY_TIMEOUT, IDLE_TIMEOUT, SEND_TIMEOUT)
_PHASE_REASON: Final = {Phase.HANDSHAKE: HANDSHAKE_TIMEOUT, Phase.HEADERS: HEADER_TIMEOUT, Phase.BODY: BODY_TIMEOUT,
                        Phase.IDLE: IDLE_TIMEOUT}


@dataclass(frozen=True, slots=True)
class Timeouts:
    """`ListenerLimits` in seconds and octets per second."""

    handshake_s: float
    header_s: float
    body_s: float
    body_min_rate: float
    idle_s: float
    send_s: float

    @classmethod
    def of(cls, limits: ListenerLimits) -> Timeouts:
        return cls(limits.handshake_timeout_ms / 1000, limits.header_timeout_ms / 1000, limits.body_timeout_ms / 1000,
                   float(limits.body_min_octets_per_s), limits.idle_timeout_ms / 1000, limits.send_timeout_ms / 1000)


@dataclass(frozen=True, slots=True)
class Io:
    """What the adapter sees of a connection when it checks it."""

    body_octets: int = 0  # body octets of the request being handled, received so far
    body_complete: bool = True
    reading: bool = True  # False: the server holds the body back (backpressure), which is not the client's time
    write_buffered: int = 0  # octets of the answer written and not yet taken by the client


@dataclass(frozen=True, slots=True)
class Verdict:
    reason: str  # one of EXPIRY_REASONS
    answer_408: bool  # a request had begun: it deserves "408 Request Timeout" (if no answer has started)


class ConnectionClock:
    """One connection's phase and deadline (module docstring)."""

    __slots__ = ("body_base", "body_octets", "last_in", "pending", "phase", "request_octets", "send_ref",
                 "send_since", "since", "t")

    def __init__(self, timeouts: Timeouts, now: float, *, tls: bool) -> None:
        self.t = timeouts
        self.phase = Phase.HANDSHAKE if tls else Phase.HEADERS
        self.since = now  # when the current phase's clock started
        self.request_octets = False  # headers: octets of a request have arrived
        self.pending = False  # handling: octets of a next (pipelined) request arrived meanwhile
        self.last_in = now  # body: the last octet
        self.body_base = 0  # body: octets already counted when the clock last (re)started
        self.body_octets = 0
        self.send_since: float | None = None  # writing paused since, and the buffer then (or at the last drain)
        self.send_ref = 0

    # -- events ---------------------------------------------------------------------------------------
    def ready(self, now: float) -> None:
        """The TLS handshake finished (or a plain connection was accepted): the first request's clock starts."""
        self.phase, self.since = Phase.HEADERS, now

    def received(self, now: float) -> bool:
        """Octets of the HTTP stream arrived; True when that moved the deadline earlier (idle -> headers)."""
        phase = self.phase
        if phase is Phase.BODY:  # the hot path: a body arriving
            self.last_in = now
        elif phase is Phase.IDLE:
            self.phase, self.since, self.request_octets = Phase.HEADERS, now, True
            return True
        elif phase is Phase.HEADERS:
            self.request_octets = True
        elif phase is Phase.HANDLING:
            self.pending = True
        return False

    def request_started(self, now: float, *, body_complete: bool = False) -> None:
        """The headers are parsed and the handler runs (with its body already in, or not)."""
        self.phase, self.since, self.last_in = (Phase.HANDLING if body_complete else Phase.BODY), now, now
        self.body_base = self.body_octets = 0
        self.request_octets = self.pending = False

    def request_ended(self, now: float) -> None:
        """The handler returned: the connection waits for the next request (or already has its first octets)."""
        self.phase, self.since = (Phase.HEADERS, now) if self.pending else (Phase.IDLE, now)
        self.request_octets, self.pending = self.pending, False

    def write_paused(self, now: float, buffered: int) -> None:
        self.send_since, self.send_ref = now, buffered

    def write_resumed(self) -> None:
        self.send_since = None

    # -- decisions ------------------------------------------------------------------------------------
    def observe(self, now: float, io: Io) -> None:
        """Take in what the adapter sees now: a body complete or held back, an answer still draining."""
        if self.phase is Phase.BODY:
            if io.body_complete:
                self.phase = Phase.HANDLING
            elif not io.reading:
                self.since = self.last_in = now
                self.body_base = io.body_octets
            self.body_octets = io.body_octets
        elif self.phase is Phase.IDLE and (io.write_buffered > 0 or self.send_since is not None):
            self.since = now  # the last answer is still going out: the send rule watches it, not the idle one
        if self.send_since is not None and io.write_buffered < self.send_ref:
            self.send_since, self.send_ref = now, io.write_buffered

    def deadline(self) -> float | None:
        """The earliest moment the connection may expire (given what was last observed); None: no deadline."""
        t, phase = self.t, self.phase  # called on every request: plain comparisons, no allocation
        if phase is Phase.HANDLING:
            at: float | None = None
        elif phase is Phase.IDLE:
            at = self.since + t.idle_s
        elif phase is Phase.HEADERS:
            at = self.since + t.header_s
        elif phase is Phase.BODY:
            allowance = self.since + t.body_s + (self.body_octets - self.body_base) / t.body_min_rate
            at = min(self.last_in + t.body_s, allowance)
        else:
            return self.since + t.handshake_s
        if self.send_since is None:
            return at
        send = self.send_since + t.send_s
        return send if at is None or send < at else at

    def expired(self, now: float, io: Io) -> Verdict | None:
        """Whether the connection has taken too long, observing ``io`` first; None: not (yet)."""
        self.observe(now, io)
        t = self.t
        if self.send_since is not None and self.phase is not Phase.HANDSHAKE and now >= self.send_since + t.send_s:
            return Verdict(SEND_TIMEOUT, False)
        deadline = self.deadline()
        if deadline is None or now < deadline or self.phase is Phase.HANDLING:
            return None
        answer = self.phase is Phase.BODY or (self.phase is Phase.HEADERS and self.request_octets)
        return Verdict(_PHASE_REASON[self.phase], answer)


class PeerTable:
    """Concurrent connections per client address, each at most ``cap``."""

    __slots__ = ("_counts", "cap")

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError("the cap must be at least 1")
        self.cap = cap
        self._counts: dict[str, int] = {}

    def admit(self, peer: str) -> bool:
        """Count one more connection of ``peer``; False (and nothing counted) when it has ``cap`` already."""
        held = self._counts.get(peer, 0)
        if held >= self.cap:
            return False
        self._counts[peer] = held + 1
        return True

    def release(self, peer: str) -> None:
        held = self._counts.get(peer, 0)
        if held <= 1:
            self._counts.pop(peer, None)
        else:
            self._counts[peer] = held - 1

    def held(self, peer: str) -> int:
        return self._counts.get(peer, 0)

    @property
    def total(self) -> int:
        return sum(self._counts.values())


# -- TLS refusals -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TlsRefusal:
    label: str  # metric label, one of TLS_REFUSAL_LABELS
    reason: str  # the words of the log line
    plain_http: bool = False  # the client spoke HTTP without TLS: it can read a plain HTTP answer


TLS_REFUSAL_LABELS: Final = ("no_certificate", "certificate_rejected", "protocol_version", "not_tls",
                             "no_shared_cipher", "no_application_protocol", "peer_alert", "other")
_NOT_TLS: Final = frozenset({"WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL", "PACKET_LENGTH_TOO_LONG",
                             "RECORD_LAYER_FAILURE", "UNEXPECTED_RECORD"})
_VERSION: Final = frozenset({"UNSUPPORTED_PROTOCOL", "NO_PROTOCOLS_AVAILABLE", "VERSION_TOO_LOW",
                             "WRONG_SSL_VERSION", "TLSV1_ALERT_PROTOCOL_VERSION"})


def classify_tls(reason: str | None, verify_message: str | None, minimum: str) -> TlsRefusal:
    """An OpenSSL handshake error (``SSLError.reason``, and ``verify_message`` of a certificate that did
    not verify) as a label and the words of a log line; ``minimum`` names the listener's lowest version."""
    code = (reason or "").upper()
    if code == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
        return TlsRefusal("no_certificate", "no client certificate (this listener requires one)")
    if code == "CERTIFICATE_VERIFY_FAILED":
        return TlsRefusal("certificate_rejected", f"client certificate rejected: {verify_message or 'did not verify'}")
    if code in _VERSION:
        return TlsRefusal("protocol_version", f"no TLS version in common (this listener: {minimum} or later)")
    if code in ("HTTP_REQUEST", "HTTPS_PROXY_REQUEST"):
        return TlsRefusal("not_tls", "plain HTTP on a TLS port", plain_http=True)
    if code in _NOT_TLS:
        return TlsRefusal("not_tls", f"not a TLS handshake ({code.lower()})")
    if code == "NO_SHARED_CIPHER":
        return TlsRefusal("no_shared_cipher", "no cipher suite in common")
    if code == "NO_APPLICATION_PROTOCOL":
        return TlsRefusal("no_application_protocol", "no application protocol (ALPN) in common")
    if "_ALERT_" in code:
        return TlsRefusal("peer_alert", f"the client ended the handshake with an alert ({code.lower()})")
    return TlsRefusal("other", code.lower() or "handshake failed")
