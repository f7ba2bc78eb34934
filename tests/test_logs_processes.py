"""``kvsp serve --log-format json`` under a flood of bad requests: every line of its output is one JSON
object, nothing is an ERROR or carries a traceback, and each kind of peer fault is rate-limited
(kvsp/service/logs.py: ``DEFAULT_BURST`` lines per key per minute)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from benchmarks.bench_log_noise import Probe
from kvsp.service.logs import DEFAULT_BURST

FLOOD = 4 * DEFAULT_BURST


async def test_json_logs_of_a_flood_parse_and_are_rate_limited(tmp_path: Path) -> None:
    probe = Probe(tmp_path)
    try:
        await probe.start("--log-format", "json")
        for i in range(FLOOD):
            await probe.bad_json(i)
            await probe.cut_body(i)
            await probe.bad_http(i)
        for i in range(DEFAULT_BURST + 2):
            await probe.moqt_setup_fin(i)
    finally:
        log = probe.stop()
    docs = [json.loads(line) for line in log.splitlines()]  # every line is one JSON object
    assert all(set(d) >= {"ts", "level", "logger", "msg"} and d["ts"].endswith("Z") for d in docs)
    assert not [d for d in docs if d["level"] not in ("INFO", "WARNING") or "exc" in d], log[-3000:]
    keys = Counter(d["key"] for d in docs if "key" in d)
    assert set(keys) == {"http.400", "http.client-gone", "http.malformed", "moqt.closed-early"}, keys
    # a window is a minute: the whole flood fits in one or (on a very slow machine) two of them
    assert all(DEFAULT_BURST <= n <= 2 * DEFAULT_BURST for n in keys.values()), keys
    assert any(d["logger"] == "kvsp.serve" and d["msg"].startswith("serving holder at") for d in docs)
