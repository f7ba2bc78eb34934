"""Timing helpers shared by the benchmarks: warm-up, repetitions, median and spread."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class Sample:
    median_s: float
    min_s: float
    max_s: float
    reps: int


def measure(fn: Callable[[], object], *, reps: int = 7, warmup: int = 2, inner: int = 1) -> Sample:
    """Median wall time of ``inner`` calls of ``fn``, over ``reps`` repetitions after ``warmup``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return Sample(statistics.median(times), min(times), max(times), reps)


def case(name: str, value: Sample, baseline: Sample | None, goal: str, unit: str = "s",
         higher_is_better: bool = False) -> dict[str, object]:
    """One result row: the case, its baseline from the same run, and the ratio to check the goal."""
    row: dict[str, object] = {"case": name, "unit": unit, "value": asdict(value), "goal": goal}
    if baseline is not None:
        row["baseline"] = asdict(baseline)
        ratio = value.median_s / baseline.median_s
        row["ratio"] = round(1 / ratio if higher_is_better else ratio, 3)
    return row
