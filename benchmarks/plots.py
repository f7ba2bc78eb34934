"""PNG plots of a benchmark run (matplotlib, Agg backend: no display needed).

Per suite: ``<suite>-ratio.png`` (each case's ratio to its baseline, the goal's bound marked, bars
coloured by outcome), ``<suite>-times.png`` (medians of case and baseline with p25-p75 whiskers, log
scale) where rows carry timings, and ``<suite>-throughput.png`` where rows carry ``*_per_s`` figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from benchmarks.report import Row, rate_pairs, ratio_bound, safe_name

COLOURS = {True: "#2e7d32", False: "#c62828", None: "#757575"}


def write_plots(doc: dict[str, Any], out: Path) -> list[Path]:
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for suite in doc.get("suites", []):
        cases: list[Row] = suite.get("cases") or []
        name = safe_name(str(suite.get("name", suite.get("module", "suite"))))
        for kind, draw in (("ratio", _ratio_chart), ("times", _times_chart), ("throughput", _rate_chart)):
            path = plots / f"{name}-{kind}.png"
            if draw(name, cases, path):
                written.append(path)
    return written


def _height(n: int) -> float:
    return max(2.0, 0.45 * n + 1.2)


def _labels(ax: Any, names: list[str]) -> None:
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()


def _ratio_chart(suite: str, cases: list[Row], path: Path) -> bool:
    shown = [r for r in cases if isinstance(r.get("ratio"), int | float)]
    if not shown:
        return False
    fig, ax = plt.subplots(figsize=(8, _height(len(shown))))
    ratios = [float(r["ratio"]) for r in shown]
    ax.barh(range(len(shown)), ratios, color=[COLOURS.get(r.get("met"), COLOURS[None]) for r in shown])
    for i, row in enumerate(shown):
        bound = ratio_bound(row)
        if bound is not None:
            ax.plot([bound[1], bound[1]], [i - 0.45, i + 0.45], color="black", linewidth=2)
            ax.annotate(f"goal {bound[0]} {bound[1]:g}", (bound[1], i - 0.45), fontsize=7, va="bottom")
        ax.annotate(f"{ratios[i]:.3g}", (ratios[i], i), fontsize=7, va="center", ha="left")
    ax.axvline(1.0, color="#999999", linestyle=":", linewidth=1)
    if max(ratios) > 30 * max(min(ratios), 1e-9) and min(ratios) > 0:
        ax.set_xscale("log")
    _labels(ax, [str(r["case"]) for r in shown])
    ax.set_xlabel("ratio to baseline; black mark: goal bound; green met, red not met, grey no numeric goal",
                  fontsize=8)
    ax.set_title(f"{suite}: ratio vs goal")
    return _save(fig, path)


def _median_and_spread(value: object) -> tuple[float, float, float] | None:
    if not isinstance(value, dict) or "median_s" not in value:
        return None
    median = float(value["median_s"])
    low, high = (value.get(a) if value.get(a) is not None else value.get(b, median)
                 for a, b in (("p25_s", "min_s"), ("p75_s", "max_s")))
    return median, median - float(low or median), float(high or median) - median


def _times_chart(suite: str, cases: list[Row], path: Path) -> bool:
    shown = [(r, _median_and_spread(r.get("value")), _median_and_spread(r.get("baseline"))) for r in cases
             if str(r.get("unit", "s")).startswith("s")]
    shown = [s for s in shown if s[1] is not None]
    if not shown:
        return False
    fig, ax = plt.subplots(figsize=(8, _height(len(shown))))
    for offset, index, label, colour in ((-0.2, 1, "case", "#1565c0"), (0.2, 2, "baseline", "#9e9e9e")):
        ys, xs, lows, highs = [], [], [], []
        for i, item in enumerate(shown):
            figure = item[1] if index == 1 else item[2]
            if figure is None:
                continue
            median, low, high = figure
            ys.append(i + offset)
            xs.append(median)
            lows.append(low)
            highs.append(high)
        ax.barh(ys, xs, height=0.4, xerr=[lows, highs], color=colour, label=label, capsize=2)
    ax.set_xscale("log")
    _labels(ax, [str(item[0]["case"]) for item in shown])
    ax.set_xlabel("seconds per run (median, whiskers p25-p75; log scale)", fontsize=8)
    ax.set_title(f"{suite}: times")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _rate_chart(suite: str, cases: list[Row], path: Path) -> bool:
    bars = [(f"{r['case']} ({name})", value, base) for r in cases for name, value, base in rate_pairs(r)]
    if not bars:
        return False
    fig, ax = plt.subplots(figsize=(8, _height(len(bars))))
    ax.barh([i - 0.2 for i in range(len(bars))], [b[1] for b in bars], height=0.4, color="#1565c0", label="case")
    ax.barh([i + 0.2 for i in range(len(bars))], [b[2] for b in bars], height=0.4, color="#9e9e9e",
            label="baseline")
    _labels(ax, [b[0] for b in bars])
    ax.set_xlabel("per second, from the median run (unit in the label)", fontsize=8)
    ax.set_title(f"{suite}: throughput")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> bool:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
