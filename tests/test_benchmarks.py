"""The benchmark harness itself (discovery, isolation, reports), on tiny fake suites: no figures are timed."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from benchmarks.__main__ import discover, run_all, select
from benchmarks.report import evaluate_goals, format_value, markdown, rate_pairs
from benchmarks.timing import Sample, add_check, case, measure, measure_async, paired
from control.cli import find_benchmarks

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

OK_SUITE = """
from benchmarks.timing import Sample, add_check, case

def run(quick=False):
    fast, slow = Sample.of([0.001, 0.002, 0.003]), Sample.of([0.004, 0.004, 0.005])
    met = case("met", fast, slow, "at most the baseline (ratio <= 1.0)", goal_max_ratio=1.0)
    missed = case("missed", slow, fast, "throughput >= 2x", higher_is_better=True, goal_min_ratio=2.0)
    met["mib_per_s"] = {"ours": 100.0, "theirs": 80.0}
    text = case("from-text", fast, slow, "ratio <= 1.1 and first_over_whole <= 0.125")
    text["first_over_whole"] = 0.5
    info = case("informative", 12.0, 10.0, "reported", unit="octets")
    extra = add_check(case("extra", fast, None, "below 2.5 ms"), "us", "<", 2500.0)
    extra["us"] = 2000.0
    return {"name": "ok", "params": {"quick": quick}, "cases": [met, missed, text, info, extra]}
"""
FAIL_SUITE = """
def run(quick=False):
    raise RuntimeError("the benchmark servers did not start")
"""
HANG_SUITE = """
import os, subprocess, sys, time

def run(quick=False):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(os.environ["KVSP_TEST_PIDFILE"], "w") as f:
        f.write(str(child.pid))
    time.sleep(120)
"""
DIES_SUITE = """
import os

def run(quick=False):
    os._exit(3)
"""
BAD_RESULT_SUITE = """
def run(quick=False):
    return {"name": "bad"}
"""


@pytest.fixture
def fake_package(tmp_path: Path) -> Path:
    package = tmp_path / "fakebench"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, source in (("bench_ok", OK_SUITE), ("bench_fail", FAIL_SUITE), ("bench_hang", HANG_SUITE),
                         ("bench_dies", DIES_SUITE), ("bench_bad", BAD_RESULT_SUITE)):
        (package / f"{name}.py").write_text(textwrap.dedent(source))
    (package / "bench_norun.py").write_text("def main():\n    pass\n")
    (package / "helper.py").write_text("def run(quick=False):\n    return {}\n")
    return package


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_discover_finds_bench_modules_with_run(fake_package: Path) -> None:
    assert discover(fake_package) == ["bench_bad", "bench_dies", "bench_fail", "bench_hang", "bench_ok"]
    real = discover()
    assert {"bench_keys", "bench_client", "bench_index", "bench_records"} <= set(real)
    assert real == sorted(real)


def test_select_accepts_names_with_or_without_prefix() -> None:
    assert select(["bench_a", "bench_b"], ["b", "bench_a"]) == ["bench_b", "bench_a"]
    assert select(["bench_a"], None) == ["bench_a"]
    with pytest.raises(SystemExit, match="no suite 'c'"):
        select(["bench_a"], ["c"])


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="suites run in process groups (POSIX)")
def test_failing_suites_are_recorded_and_the_others_run(fake_package: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    pidfile = tmp_path / "grandchild.pid"
    monkeypatch.setenv("KVSP_TEST_PIDFILE", str(pidfile))
    out = tmp_path / "out"
    start = time.monotonic()
    doc = run_all(["bench_fail", "bench_hang", "bench_dies", "bench_bad", "bench_ok"], quick=True, out=out,
                  timeout_s=4.0, package="fakebench", pythonpath=[str(fake_package.parent)])
    assert time.monotonic() - start < 60
    suites = {s["module"]: s for s in doc["suites"]}
    assert suites["bench_fail"]["error"] == "RuntimeError: the benchmark servers did not start"
    assert "Traceback" in suites["bench_fail"]["traceback"]
    assert suites["bench_hang"]["error"] == "timed out after 4 s"
    assert suites["bench_dies"]["error"] == "the suite's process ended (status 3) without a result"
    assert "'cases' list" in suites["bench_bad"]["error"]
    assert "error" not in suites["bench_ok"] and len(suites["bench_ok"]["cases"]) == 5
    assert suites["bench_ok"]["params"] == {"quick": True}
    # The timed-out suite's own child went with it.
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)

    saved = json.loads((out / "results.json").read_text())
    assert saved["quick"] is True and saved["machine"]["cpu_count"] == os.cpu_count()
    assert saved["machine"]["python"] == sys.version.split()[0]
    assert {"torch", "aioquic", "aiohttp"} <= set(saved["machine"]["packages"])
    rows = {r["case"]: r for s in saved["suites"] for r in s["cases"]}
    assert rows["met"]["met"] is True and rows["missed"]["met"] is False
    assert rows["from-text"]["met"] is False and rows["from-text"]["met_source"] == "goal text"
    assert [c["field"] for c in rows["from-text"]["checks"]] == ["ratio", "first_over_whole"]
    assert rows["informative"]["met"] is None and rows["extra"]["met"] is True

    table = (out / "results.md").read_text()
    assert "| fail | (suite failed) | - | - | - | - | ERROR | RuntimeError: the benchmark servers did not start |" \
        in table
    assert "| ok | met | 2 [1.5-2.5] ms | 4 [4-4.5] ms | 0.5 | at most the baseline (ratio <= 1.0) | yes |" in table
    assert "| ok | missed |" in table and "| **no** |" in table
    assert "Goals met: 2; not met: 2; informative: 1. Failed suites: fail, hang, dies, bad." in table
    assert (out / "logs" / "bench_fail.log").is_file()
    for name in ("ok-ratio.png", "ok-times.png", "ok-throughput.png"):
        assert (out / "plots" / name).read_bytes().startswith(PNG_MAGIC), name
    assert not (out / "plots" / "fail-ratio.png").exists()


def test_timing_quartiles_and_calls() -> None:
    s = Sample.of([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s.median_s, s.min_s, s.max_s, s.reps, s.p25_s, s.p75_s) == (3.0, 1.0, 5.0, 5, 2.0, 4.0)
    assert Sample.of([2.0]).p75_s == 2.0
    with pytest.raises(ValueError):
        Sample.of([])
    assert Sample(1.0, 0.5, 2.0, 3).p25_s is None  # the positional form the suites use still works
    calls: list[str] = []
    sample = measure(lambda: calls.append("x"), reps=4, warmup=2, inner=3)
    assert len(calls) == 2 + 4 * 3 and sample.reps == 4
    order: list[str] = []
    a, b = paired(lambda: order.append("a"), lambda: order.append("b"), reps=3, warmup=1)
    assert order == ["a", "b"] * 4 and a.reps == b.reps == 3


async def test_measure_async_awaits_each_call() -> None:
    calls: list[int] = []

    async def once() -> None:
        await asyncio.sleep(0)
        calls.append(1)

    sample = await measure_async(once, reps=3, warmup=1, inner=2)
    assert len(calls) == 1 + 3 * 2 and sample.reps == 3 and sample.min_s <= sample.median_s <= sample.max_s


def test_case_ratio_and_checks() -> None:
    fast, slow = Sample.of([1.0]), Sample.of([4.0])
    assert case("t", fast, slow, "g")["ratio"] == 0.25
    row = case("t", fast, slow, "g", higher_is_better=True, goal_min_ratio=4.0)
    assert row["ratio"] == 4.0 and row["met"] is True and row["higher_is_better"] is True
    assert case("m", 130.0, 100.0, "g", unit="octets", goal_max_ratio=1.25)["met"] is False
    assert "met" not in case("i", fast, None, "reported")
    assert add_check(case("x", fast, None, "g"), "missing", "<", 1.0)["met"] is False


def test_goal_text_is_read_only_where_it_names_a_numeric_field() -> None:
    doc: dict[str, Any] = {"suites": [{"name": "s", "cases": [
        {"case": "a", "ratio": 1.05, "goal": "wall time <= 1.1x one sha256 pass (ratio <= 1.1)"},
        {"case": "b", "ratio": 1.2, "goal": "ours >= 1.0x stock (ratio = stock time / our time)"},
        {"case": "c", "ratio": 0.9, "goal": "speed >= 0.8x bare (ratio <= 1.25)", "checks": [
            {"field": "ratio", "op": ">=", "bound": 1.0}]},
    ]}]}
    evaluate_goals(doc)
    a, b, c = doc["suites"][0]["cases"]
    assert a["met"] is True and a["checks"] == [{"field": "ratio", "op": "<=", "bound": 1.1}]
    assert b["met"] is None and b["met_source"] == "none"
    assert c["met"] is False and c["met_source"] == "checks"  # explicit checks win over the words
    assert "| s | b | - | - | 1.2 |" in markdown(doc)


def test_value_formatting_and_rates() -> None:
    assert format_value({"median_s": 0.0012, "min_s": 0.001, "max_s": 0.002, "reps": 3}, "s") == "1.2 [1-2] ms"
    assert format_value(asdict(Sample(0.0012, 0.001, 0.002, 3)), "s") == "1.2 [1-2] ms"  # quartiles None
    assert format_value({"median_s": 2.0, "min_s": 1.0, "max_s": 3.0, "p25_s": 1.5, "p75_s": 2.5, "reps": 3},
                        "s per batch") == "2 [1.5-2.5] s per batch"
    assert format_value(1234.0, "octets/record") == "1234 octets/record"
    assert format_value(None, "s") == "-"
    row = {"requests_per_s": 900, "baseline_requests_per_s": 1000, "mb_per_s": {"ours": 5.0, "stock": 4.0},
           "baseline_mib_per_s": 3.0}
    assert sorted(rate_pairs(row)) == [("mb_per_s", 5.0, 4.0), ("requests_per_s", 900.0, 1000.0)]


def test_kvsp_bench_finds_the_checkout(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "benchmarks").mkdir(parents=True)
    (checkout / "benchmarks" / "__main__.py").write_text("")
    (checkout / "deep" / "er").mkdir(parents=True)
    assert find_benchmarks([checkout / "deep" / "er"]) == checkout
    assert find_benchmarks([tmp_path / "elsewhere", checkout]) == checkout
    assert find_benchmarks([tmp_path]) is None


def test_kvsp_bench_runs_the_harness() -> None:
    done = subprocess.run([sys.executable, "-m", "control.cli", "bench", "--list"], capture_output=True, text=True,
                          timeout=60, check=False, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    assert "bench_keys" in done.stdout.split()
