"""kvsp/service/logs.py without a server: the rate limiter (sans-I/O), its filter, the JSON format, the
choice of format, and `configure`.  The served roles' records are in test_logs_served.py, ``kvsp serve``
in test_logs_processes.py, MOQT in test_logs_moqt.py."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from control.cli import main as kvsp_main
from kvsp.errors import ValidationError
from kvsp.service.logs import (
    FORMAT_ENV,
    PEER_KEY,
    FailureStreak,
    JsonFormatter,
    RateLimiter,
    RateLimitFilter,
    configure,
    log_format,
    one_line,
)


def record(msg: str = "bad request %s", *args: object, key: str | None = "http.400", created: float = 100.0,
           level: int = logging.INFO, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    rec = logging.LogRecord("kvsp.http", level, __file__, 1, msg, args, exc_info)
    rec.created = created
    if key is not None:
        setattr(rec, PEER_KEY, key)
    return rec


# -- a background loop's failures -------------------------------------------------------------------
def test_a_failing_loop_logs_its_traceback_once_then_a_count_then_its_recovery(
        caplog: pytest.LogCaptureFixture) -> None:
    streak = FailureStreak(logging.getLogger("kvsp.test"), "maintenance", interval_s=60.0)
    caplog.set_level(logging.INFO, "kvsp.test")
    for now in range(0, 130, 5):  # 26 rounds, one cause
        streak.failed(OSError("disk full"), float(now))
    lines = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert lines == [("ERROR", "maintenance failed", True),
                     ("ERROR", "maintenance still failing (13 rounds in a row): OSError: disk full", False),
                     ("ERROR", "maintenance still failing (25 rounds in a row): OSError: disk full", False)]
    caplog.clear()
    streak.failed(ValueError("another cause"), 131.0)  # a new kind shows its traceback at once
    streak.succeeded(132.0)
    streak.succeeded(133.0)
    assert [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        ("ERROR", "maintenance failed", True), ("WARNING", "maintenance recovered after 27 failed rounds", False)]
    caplog.clear()
    streak.failed(OSError("disk full"), 134.0)  # after a recovery the old cause is new again
    assert [r.exc_info is not None for r in caplog.records] == [True]


# -- the limiter ------------------------------------------------------------------------------------
def test_the_limiter_lets_a_burst_through_then_counts_what_it_suppresses() -> None:
    limiter = RateLimiter(burst=3, interval_s=10.0)
    assert [limiter.admit("a", 0.0 + i / 10) for i in range(6)] == [0, 0, 0, None, None, None]
    assert limiter.admit("b", 1.0) == 0  # keys are independent
    assert limiter.admit("a", 9.9) is None  # still the first window
    assert limiter.admit("a", 10.0) == 4  # the next window's first line reports the four
    assert limiter.admit("a", 10.1) == 0


def test_the_limiter_forgets_the_oldest_key_beyond_its_bound() -> None:
    limiter = RateLimiter(burst=1, interval_s=60.0, max_keys=2)
    assert limiter.admit("a", 0.0) == 0 and limiter.admit("a", 0.1) is None
    assert limiter.admit("b", 0.2) == 0 and limiter.admit("c", 0.3) == 0  # "a" is forgotten
    assert limiter.admit("a", 0.4) == 0


@pytest.mark.parametrize(("burst", "interval", "keys"), [(0, 1.0, 1), (1, 0.0, 1), (1, 1.0, 0)])
def test_the_limiter_refuses_settings_that_admit_nothing(burst: int, interval: float, keys: int) -> None:
    with pytest.raises(ValueError):
        RateLimiter(burst, interval, keys)


def test_the_filter_limits_peer_faults_by_record_time_and_passes_everything_else() -> None:
    flt = RateLimitFilter(RateLimiter(burst=2, interval_s=60.0))
    flood = [record("bad request %d", i, created=100.0 + i) for i in range(50)]
    passed = [r for r in flood if flt.filter(r)]
    assert [r.getMessage() for r in passed] == ["bad request 0", "bad request 1"]
    assert all(flt.filter(record("ours", key=None, level=logging.ERROR, created=101.0)) for _ in range(50))
    later = record("bad request %d", 99, created=160.0)
    assert flt.filter(later)
    assert later.getMessage() == "bad request 99 (48 similar lines suppressed before this one)"


def test_one_line_escapes_what_a_peer_wrote_and_bounds_it() -> None:
    assert one_line("a\r\nINFO forged line\x00") == "a\\r\\nINFO forged line\\x00"
    assert "\n" not in one_line(ValueError("x\ny"))
    long = one_line("z" * 1000, 50)
    assert len(long) == 50 and long.endswith("...")


# -- formats ----------------------------------------------------------------------------------------
def test_json_lines_carry_time_level_logger_message_key_and_traceback() -> None:
    fmt = JsonFormatter()
    try:
        raise RuntimeError("our bug")
    except RuntimeError as exc:
        ours = record("unhandled error in %s", "GET /x", key=None, level=logging.ERROR, exc=exc, created=0.25)
    lines = [fmt.format(ours), fmt.format(record("bad request %s", "line\nbreak", created=86400.0))]
    assert all("\n" not in line for line in lines)
    error, peer = (json.loads(line) for line in lines)
    assert error["ts"] == "1970-01-01T00:00:00.250Z" and error["level"] == "ERROR"
    assert error["logger"] == "kvsp.http" and error["msg"] == "unhandled error in GET /x"
    assert "Traceback" in error["exc"] and "RuntimeError: our bug" in error["exc"] and "key" not in error
    assert peer == {"ts": "1970-01-02T00:00:00.000Z", "level": "INFO", "logger": "kvsp.http",
                    "msg": "bad request line\nbreak", "key": "http.400"}


def test_the_format_comes_from_the_flag_then_the_environment() -> None:
    assert log_format(None, {}) == "text"
    assert log_format(None, {FORMAT_ENV: "json"}) == "json"
    assert log_format("text", {FORMAT_ENV: "json"}) == "text"
    with pytest.raises(ValidationError, match=FORMAT_ENV):
        log_format(None, {FORMAT_ENV: "yaml"})


def test_configure_writes_one_json_object_per_record_and_limits_peer_faults() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure("json", stream=stream, limiter=RateLimiter(burst=3, interval_s=3600.0))
        log = logging.getLogger("kvsp.test")
        for i in range(20):
            log.info("bad input %d", i, extra={PEER_KEY: "test.flood"})
        log.warning("ours")
        lines = stream.getvalue().splitlines()
        docs = [json.loads(line) for line in lines]
        assert [d["msg"] for d in docs] == ["bad input 0", "bad input 1", "bad input 2", "ours"]
        assert logging.getLogger("quic").level == logging.WARNING  # aioquic's per-connection lines
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
        logging.getLogger("quic").setLevel(logging.NOTSET)


def test_configure_refuses_an_unknown_format() -> None:
    with pytest.raises(ValidationError):
        configure("xml", stream=sys.stderr)


def test_kvsp_serve_refuses_a_bad_format_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(FORMAT_ENV, "yaml")
    assert kvsp_main(["serve", "holder", "--config", "absent.toml"]) == 2
    assert capsys.readouterr().err == f"kvsp: {FORMAT_ENV}: must be one of ['text', 'json'], not 'yaml'\n"
    assert kvsp_main(["serve", "holder", "--config", "absent.toml", "--log-format", "yaml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsp: argument --log-format: invalid choice") and err.count("\n") == 1
