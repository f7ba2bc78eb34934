"""Logs an operator can read: a peer's fault is one rate-limited INFO line, ours an ERROR with its traceback.

Every role process logs through `configure` (``kvsp serve``, control/cli.py), one record per line:

* **text** (the default): ``2026-01-02 10:11:12,345 kvsp.http INFO message``;
* **json** (``kvsp serve --log-format json`` or ``KVSP_LOG_FORMAT=json``): one object per line with
  ``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``, ``msg``, ``exc`` (the formatted
  traceback, when the record has one) and ``key`` (the rate-limit key of a peer's fault).

Records come in two kinds (docs/operations.md, "Logs"):

* **a peer's fault**: malformed input, a client that went away, a MOQT peer that breaks the protocol.
  The code that sees it calls `peer_fault`: one INFO line without a traceback, whose record carries
  its rate-limit key as the attribute `PEER_KEY`.  moqt, below kvsp in the layers, sets the same
  attribute by name (``extra={"kvsp_peer": KEY}``).  `RateLimitFilter` lets at most ``burst`` lines of
  one key through per ``interval_s`` (`RateLimiter`); the first line of the key after that says how
  many were suppressed.  Lines suppressed last, with no line of their key after them, are not reported.
* **everything else is our own fault**: ERROR with the traceback, never rate-limited.  A background
  loop that fails round after round for one cause (`FailureStreak`) logs the traceback once, then one
  line per ``interval_s`` with the count, and one line when it recovers.

The limiter is sans-I/O: it is handed ``now`` (the record's creation time), so it is tested without a
clock.  Text written by a peer goes through `one_line` before it reaches a message, so a peer cannot
split a line or forge one.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TextIO

from kvsp.errors import ValidationError

PEER_KEY: Final = "kvsp_peer"  # LogRecord attribute: the rate-limit key of a peer's fault
LOG_FORMATS: Final = ("text", "json")
FORMAT_ENV: Final = "KVSP_LOG_FORMAT"
TEXT_FORMAT: Final = "%(asctime)s %(name)s %(levelname)s %(message)s"
DEFAULT_BURST: Final = 10
DEFAULT_INTERVAL_S: Final = 60.0
MAX_KEYS: Final = 1024  # distinct keys remembered; keys are constants of our code, this is a backstop
ONE_LINE_LIMIT: Final = 300
# aioquic logs three INFO lines for every QUIC connection (version, ALPN, close): per-connection
# chatter that the metrics count instead; its warnings and errors still show.
QUIET_LOGGERS: Final[Mapping[str, int]] = {"quic": logging.WARNING}


def one_line(text: object, limit: int = ONE_LINE_LIMIT) -> str:
    """``text`` for a log line: control characters escaped, at most ``limit`` characters (a peer wrote it)."""
    raw = str(text)
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in raw[: limit + 1])
    return out if len(out) <= limit else out[: limit - 3] + "..."


def peer_fault(logger: logging.Logger, key: str, msg: str, *args: object) -> None:
    """Log a peer's fault: one INFO line, no traceback, rate-limited under ``key``."""
    logger.info(msg, *args, extra={PEER_KEY: key})


@dataclass(slots=True)
class _Window:
    start: float
    lines: int
    suppressed: int = 0


class RateLimiter:
    """At most ``burst`` lines per key in each window of ``interval_s`` seconds (sans-I/O: pass ``now``)."""

    __slots__ = ("_windows", "burst", "interval_s", "max_keys")

    def __init__(self, burst: int = DEFAULT_BURST, interval_s: float = DEFAULT_INTERVAL_S,
                 max_keys: int = MAX_KEYS) -> None:
        if burst < 1 or interval_s <= 0 or max_keys < 1:
            raise ValueError("burst and max_keys must be at least 1 and interval_s positive")
        self.burst, self.interval_s, self.max_keys = burst, interval_s, max_keys
        self._windows: dict[str, _Window] = {}

    def admit(self, key: str, now: float) -> int | None:
        """None: suppress this line.  Otherwise log it, saying that the returned number of lines of
        ``key`` (usually 0) were suppressed since the last one logged."""
        window = self._windows.get(key)
        if window is None or now - window.start >= self.interval_s:
            suppressed = window.suppressed if window is not None else 0
            self._windows.pop(key, None)
            if len(self._windows) >= self.max_keys:
                del self._windows[next(iter(self._windows))]  # the key whose window opened longest ago
            self._windows[key] = _Window(now, 1)
            return suppressed
        if window.lines < self.burst:
            window.lines += 1
            return 0
        window.suppressed += 1
        return None


class RateLimitFilter(logging.Filter):
    """A handler filter: records with a `PEER_KEY` pass through a `RateLimiter`; others always pass."""

    def __init__(self, limiter: RateLimiter | None = None) -> None:
        super().__init__()
        self.limiter = limiter or RateLimiter()
        self._lock = threading.Lock()  # worker threads log too

    def filter(self, record: logging.LogRecord) -> bool:
        key = getattr(record, PEER_KEY, None)
        if not isinstance(key, str):
            return True
        with self._lock:
            suppressed = self.limiter.admit(key, record.created)
        if suppressed is None:
            return False
        if suppressed:
            record.msg = f"{record.getMessage()} ({suppressed} similar lines suppressed before this one)"
            record.args = None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record and line: ``ts``, ``level``, ``logger``, ``msg``; ``exc``, ``key`` when set."""

    def format(self, record: logging.LogRecord) -> str:
        ts = dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds")
        doc: dict[str, object] = {"ts": ts.replace("+00:00", "Z"), "level": record.levelname, "logger": record.name,
                                  "msg": record.getMessage()}
        key = getattr(record, PEER_KEY, None)
        if isinstance(key, str):
            doc["key"] = key
        if record.exc_info:
            record.exc_text = record.exc_text or self.formatException(record.exc_info)
        if record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc)


def log_format(requested: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The format to use: ``requested`` (the command line), else ``KVSP_LOG_FORMAT``, else ``text``."""
    value = requested or (os.environ if environ is None else environ).get(FORMAT_ENV) or "text"
    if value not in LOG_FORMATS:
        member = "--log-format" if requested else FORMAT_ENV
        raise ValidationError(member, f"must be one of {list(LOG_FORMATS)}, not {one_line(value, 40)!r}")
    return value


def configure(fmt: str = "text", *, level: int = logging.INFO, stream: TextIO | None = None,
              limiter: RateLimiter | None = None) -> logging.Handler:
    """Send every record of the process to ``stream`` (stderr) in ``fmt``, peer faults rate-limited.

    Replaces the root logger's handlers (like ``logging.basicConfig(force=True)``); returns the handler.
    """
    if fmt not in LOG_FORMATS:
        raise ValidationError("log format", f"must be one of {list(LOG_FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(RateLimitFilter(limiter))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    for name, quiet in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(quiet)
    return handler


class FailureStreak:
    """The failures of one background loop (maintenance, lease rounds, status reports), logged so that a
    persistent cause shows once with its traceback instead of once per round.

    A failure of a new kind (exception type and message) logs ERROR with the traceback; the same kind
    again logs one ERROR line "still failing" with the count, at most once per ``interval_s``; the first
    round that succeeds after failures logs one WARNING line.  Sans-I/O: pass ``now``.
    """

    __slots__ = ("_kind", "_last_line", "count", "interval_s", "logger", "what")

    def __init__(self, logger: logging.Logger, what: str, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.logger, self.what, self.interval_s = logger, what, interval_s
        self.count = 0  # failures in a row
        self._kind: tuple[type[BaseException], str] | None = None
        self._last_line = 0.0

    def failed(self, exc: BaseException, now: float) -> None:
        kind = (type(exc), str(exc))
        self.count += 1
        if kind != self._kind:
            self._kind, self._last_line = kind, now
            self.logger.error("%s failed", self.what, exc_info=exc)
        elif now - self._last_line >= self.interval_s:
            self._last_line = now
            self.logger.error("%s still failing (%d rounds in a row): %s: %s", self.what, self.count,
                              type(exc).__name__, one_line(exc))

    def succeeded(self, now: float) -> None:
        if self.count:
            self.logger.warning("%s recovered after %d failed rounds", self.what, self.count)
        self.count, self._kind = 0, None
