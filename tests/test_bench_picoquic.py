"""benchmarks/bench_picoquic.py end to end in its tiny configuration: every party started in the picoquic venv,
every row made, nothing timed against a goal (the figures of one repetition mean nothing).

Skipped with one line when no Python >= 3.12 exists here (a failure instead with ``KVSP_REQUIRE_PICO=1``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks.bench_picoquic import Options, run
from tests.support.pico_venv import pico_python

pytestmark = pytest.mark.process  # starts the benchmark's parties as child processes


@pytest.fixture(scope="module")
def result() -> dict[str, object]:
    pico_python()  # skips without a picoquic venv (fails instead under KVSP_REQUIRE_PICO)
    return run(options=Options.tiny())


def _rows(result: dict[str, object]) -> dict[str, dict[str, Any]]:
    cases = result["cases"]
    assert isinstance(cases, list)
    return {row["case"]: row for row in cases}


def test_every_row_of_the_tiny_run_is_there_with_its_goal(result: dict[str, object]) -> None:
    rows = _rows(result)
    assert set(rows) == {
        "fetch-2MiB-c1-picoquic", "fetch-2MiB-c1-aioquic", "fetch-2MiB-c2-picoquic", "fetch-2MiB-c2-aioquic",
        "first-layer-2MiB-c1-picoquic", "first-layer-2MiB-c1-aioquic", "relay-hop-block-picoquic",
        "relay-hop-first-object-picoquic", "relay-hop-block-aioquic", "relay-hop-first-object-aioquic",
        "cpu-per-block-2MiB", "fetch-2MiB-c1-ethernet-mtu"}
    goals = result["goals"]
    assert isinstance(goals, list)
    assert {g["case"] for g in goals} == {name for name, row in rows.items() if "met" in row}
    assert {"fetch-2MiB-c1-picoquic", "first-layer-2MiB-c1-picoquic", "relay-hop-block-picoquic",
            "relay-hop-first-object-picoquic"} <= {g["case"] for g in goals}
    assert all(isinstance(g["met"], bool) for g in goals)
    json.dumps(result)  # what the benchmark prints


def test_throughput_and_cpu_cover_every_transport_and_process(result: dict[str, object]) -> None:
    rows = _rows(result)
    fetch = rows["fetch-2MiB-c1-picoquic"]
    assert set(fetch["mib_per_s"]) == {"picoquic", "aioquic", "https"}
    assert all(v > 0 for v in fetch["mib_per_s"].values())
    ethernet = rows["fetch-2MiB-c1-ethernet-mtu"]
    assert set(ethernet["mib_per_s"]) == {"picoquic", "aioquic-ethernet", "https"}
    assert set(ethernet["cpu_ms_per_block"]["aioquic-ethernet"]) == {"publisher", "subscriber"}
    assert set(fetch["cpu_ms_per_block"]["picoquic"]) == {"publisher", "subscriber"}
    relay = rows["relay-hop-block-picoquic"]
    assert set(relay["cpu_ms_per_block"]["relay"]) == {"publisher", "relay", "subscriber"}
    stats = relay["relay_stats"]
    assert isinstance(stats, dict)
    rounds = Options.tiny().relay_reps + 1  # the untimed round too
    assert stats["cache_misses"] == stats["upstream_fetches"] == rounds and stats["cache_hits"] == 0  # all misses
    params = result["params"]
    assert isinstance(params, dict)
    drafts = params["drafts"]
    assert isinstance(drafts, dict) and set(drafts) == {"picoquic", "aioquic"}
    assert drafts["picoquic"] == drafts["aioquic"]  # the same draft on both back-ends


def test_the_profile_covers_the_picoquic_parties(result: dict[str, object]) -> None:
    profile = result["profile"]
    assert isinstance(profile, dict)
    for target in ("direct", "relay"):
        parties = profile[target]["parties"]
        assert set(parties) == {"publisher", "relay", "subscriber"}
        assert parties["subscriber"]["top_self_time"]
