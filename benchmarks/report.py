"""Reports of a benchmark run: the machine, goal outcomes, results.json, results.md and PNG plots.

A run is a document ``{"machine": ..., "quick": ..., "suites": [suite, ...]}``; each suite is what its
module's ``run`` returned (``name``, ``cases``, optional ``params``) plus ``module``, ``elapsed_s`` and,
where it failed, ``error`` (then ``cases`` is empty).  Rows come from `benchmarks.timing.case`;
older rows with plain numbers are accepted as they are.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, TypeGuard

Row = dict[str, Any]
PACKAGES = ("torch", "transformers", "aioquic", "aiohttp", "uvloop", "cryptography", "numpy", "matplotlib")
# "name op number" in a goal's words, e.g. "(ratio >= 1.0)", "(first_over_whole <= 0.125)".
_GOAL_TERM = re.compile(r"\b([a-z_][a-z0-9_]*)\s*(<=|>=|<|>)\s*(\d+(?:\.\d+)?)(?![\d.]*x)")


# -- machine facts ------------------------------------------------------------------------------------
def machine_facts(repo: Path | None = None) -> dict[str, object]:
    """What limits every figure: cores, CPU model, memory, kernel, Python and library versions, load."""
    facts: dict[str, object] = {
        "cpu_count": os.cpu_count(), "cpu_model": _cpu_model(), "memory_gib": _memory_gib(),
        "python": sys.version.split()[0], "implementation": platform.python_implementation(),
        "kernel": platform.release(), "platform": platform.platform(), "machine": platform.machine(),
        "packages": {name: _version(name) for name in PACKAGES},
    }
    if hasattr(os, "sched_getaffinity"):
        facts["usable_cpus"] = len(os.sched_getaffinity(0))
    if hasattr(os, "getloadavg"):
        facts["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    if repo is not None:
        facts["git_commit"] = _git_commit(repo)
    return facts


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1 << 20), 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _git_commit(repo: Path) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


# -- goals ------------------------------------------------------------------------------------------------
def evaluate_goals(doc: dict[str, Any]) -> None:
    """Give every row a ``met`` (True, False or None: no number to check) and ``met_source``.

    Rows with machine checks (``case(..., goal_min_ratio=...)``, `add_check`) keep them.  Otherwise the
    checks are read from the goal's words, where they say "FIELD OP NUMBER" for a numeric field of
    the row ("ratio <= 1.1", "first_over_whole <= 0.125"); a number followed by "x" is prose.
    """
    for row in rows(doc):
        if row.get("checks") and row.get("met_source") != "goal text":  # idempotent: reports are rewritten
            row["met"] = all(_holds(row, c) for c in row["checks"])  # fields may be set after the check
            row["met_source"] = "checks"
            continue
        terms = [{"field": f, "op": op, "bound": float(n)} for f, op, n in _GOAL_TERM.findall(str(row.get("goal")))
                 if _numeric(row.get(f))]
        if terms:
            row["checks"] = terms
            row["met"] = all(_holds(row, c) for c in terms)
            row["met_source"] = "goal text"
        else:
            row["met"] = None
            row["met_source"] = "none"


def _numeric(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _holds(row: Row, check: dict[str, Any]) -> bool:
    raw = row.get(check["field"])
    if not _numeric(raw):
        return False
    value, bound = float(raw), float(check["bound"])
    return {"<=": value <= bound, ">=": value >= bound, "<": value < bound, ">": value > bound}[check["op"]]


def rows(doc: dict[str, Any]) -> Iterator[Row]:
    for suite in doc.get("suites", []):
        yield from suite.get("cases", [])


# -- Markdown ---------------------------------------------------------------------------------------------
def markdown(doc: dict[str, Any]) -> str:
    """The results table: one line per case, and one per failed suite."""
    m = doc.get("machine", {})
    packages = ", ".join(f"{k} {v}" for k, v in m.get("packages", {}).items() if v)
    lines = [
        f"# Benchmark results{' (--quick)' if doc.get('quick') else ''}", "",
        f"Machine: {m.get('cpu_count')} CPUs ({m.get('cpu_model')}), {m.get('memory_gib')} GiB, "
        f"Linux {m.get('kernel')}, Python {m.get('python')}; {packages}.",
        f"Load average at start: {m.get('loadavg_at_start')}; commit {m.get('git_commit')}; "
        f"started {doc.get('started')}, {doc.get('elapsed_s')} s in all.", "",
        "Value and baseline: median [p25-p75] of the repetitions, measured in the same run. Ratio: value / "
        "baseline, or baseline / value where higher is better (throughput); above 1 is better than the "
        "baseline then, below 1 better otherwise. Met: the goal's numeric check (- where the goal is "
        "informative).", "",
        "| suite | case | value | baseline | ratio | goal | met? | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for suite in doc.get("suites", []):
        name = _cell(suite.get("name", suite.get("module", "?")))
        if suite.get("error"):
            lines.append(f"| {name} | (suite failed) | - | - | - | - | ERROR | {_cell(suite['error'])} |")
        for row in suite.get("cases", []):
            unit = str(row.get("unit", ""))
            lines.append("| " + " | ".join([
                name, _cell(row.get("case")), _cell(format_value(row.get("value"), unit)),
                _cell(format_value(row.get("baseline"), unit)), _cell(row.get("ratio", "-")),
                _cell(row.get("goal", "")), _met(row.get("met")), _cell(_notes(row))]) + " |")
    summary = _summary(doc)
    return "\n".join([*lines, "", summary, ""])


def _summary(doc: dict[str, Any]) -> str:
    outcomes = [row.get("met") for row in rows(doc)]
    failed = [s.get("name", s.get("module")) for s in doc.get("suites", []) if s.get("error")]
    text = (f"Goals met: {outcomes.count(True)}; not met: {outcomes.count(False)}; informative: "
            f"{outcomes.count(None)}.")
    return text + (f" Failed suites: {', '.join(map(str, failed))}." if failed else "")


def _met(met: object) -> str:
    if met is True:
        return "yes"
    return "**no**" if met is False else "-"


def _cell(value: object) -> str:
    text = "-" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


_SKIP_NOTES = {"case", "unit", "value", "baseline", "ratio", "goal", "met", "met_source", "checks",
               "higher_is_better"}


def _notes(row: Row) -> str:
    """The row's other scalar figures (throughputs, fractions), compact."""
    parts = []
    for key, value in row.items():
        if key in _SKIP_NOTES:
            continue
        if isinstance(value, dict) and all(_numeric(v) for v in value.values()):
            parts.append(f"{key}: " + ", ".join(f"{k} {v}" for k, v in value.items()))
        elif _numeric(value) or isinstance(value, str | bool):
            parts.append(f"{key}: {value}")
    return "; ".join(parts)


def format_value(value: object, unit: str) -> str:
    """A Sample dict as "median [p25-p75] unit" (seconds scaled to ms/us), a number as itself."""
    if value is None:
        return "-"
    if isinstance(value, dict) and "median_s" in value:
        scale, shown = _time_scale(float(value["median_s"])) if unit == "s" else (1.0, unit)
        low = value.get("p25_s") if value.get("p25_s") is not None else value.get("min_s")
        high = value.get("p75_s") if value.get("p75_s") is not None else value.get("max_s")
        text = _fmt(float(value["median_s"]) * scale)
        if low is not None and high is not None:
            text += f" [{_fmt(float(low) * scale)}-{_fmt(float(high) * scale)}]"
        return f"{text} {shown}"
    if _numeric(value):
        return f"{_fmt(float(value))} {unit}".strip()
    return str(value)


def _time_scale(seconds: float) -> tuple[float, str]:
    if seconds >= 1:
        return 1.0, "s"
    if seconds >= 1e-3:
        return 1e3, "ms"
    return 1e6, "us"


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


# -- files ------------------------------------------------------------------------------------------------
def write_reports(doc: dict[str, Any], out: Path, *, plots: bool = True) -> list[Path]:
    """results.json, results.md and (unless ``plots`` is false or matplotlib is missing) PNGs in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    evaluate_goals(doc)
    written = [out / "results.json", out / "results.md"]
    written[0].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    written[1].write_text(markdown(doc))
    if plots:
        from benchmarks.plots import write_plots  # noqa: PLC0415 - matplotlib loads only when plotting

        written += write_plots(doc, out)
    return written


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "suite"


def ratio_bound(row: Row) -> tuple[str, float] | None:
    """The first check on ``ratio`` (op, bound), for the ratio-vs-goal chart."""
    for check in row.get("checks") or ():
        if check.get("field") == "ratio":
            return str(check["op"]), float(check["bound"])
    return None


def rate_pairs(row: Row) -> Sequence[tuple[str, float, float]]:
    """Throughputs a row carries: (name, value, baseline) from ``X_per_s`` + ``baseline_X_per_s`` or from
    ``X_per_s: {ours, theirs}`` (first entry the case, second the baseline)."""
    pairs = []
    for key, value in row.items():
        if not key.endswith("_per_s") or key.startswith("baseline_"):
            continue
        if isinstance(value, dict):
            numbers = [float(v) for v in value.values() if _numeric(v)]
            if len(numbers) == 2:
                pairs.append((key, numbers[0], numbers[1]))
        elif _numeric(value) and _numeric(row.get(f"baseline_{key}")):
            pairs.append((key, float(value), float(row[f"baseline_{key}"])))
    return pairs
