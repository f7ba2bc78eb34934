"""Timing helpers shared by the benchmarks: warm-up, repetitions, median and spread, goal checks.

Every figure is a `Sample`: the median of ``reps`` repetitions after ``warmup`` untimed ones, with
min/max and the quartiles (p25/p75) as its spread.  `case` makes one result row: the figure, its
baseline from the same run, their ratio, the goal in words and, where the goal is a number, the
machine check (``checks``) whose outcome is ``met``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

Op = Literal["<=", ">=", "<", ">"]
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, ">": lambda a, b: a > b}


@dataclass(frozen=True, slots=True)
class Sample:
    """Seconds per run: the median and spread over ``reps`` timed repetitions."""

    median_s: float
    min_s: float
    max_s: float
    reps: int
    p25_s: float | None = None  # None where a caller built the Sample from median/min/max only
    p75_s: float | None = None

    @classmethod
    def of(cls, times: Sequence[float]) -> Sample:
        """The Sample of raw timings (seconds), quartiles included."""
        if not times:
            raise ValueError("a Sample needs at least one timing")
        ordered = sorted(times)
        return cls(statistics.median(ordered), ordered[0], ordered[-1], len(ordered),
                   _quantile(ordered, 0.25), _quantile(ordered, 0.75))


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default), defined for one timing too."""
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


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
    return Sample.of(times)


async def measure_async(fn: Callable[[], Awaitable[object]], *, reps: int = 7, warmup: int = 2,
                        inner: int = 1) -> Sample:
    """`measure` for coroutine functions, inside a running event loop (``await fn()`` per call)."""
    for _ in range(warmup):
        await fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(inner):
            await fn()
        times.append((time.perf_counter() - start) / inner)
    return Sample.of(times)


def paired(candidate: Callable[[], object], baseline: Callable[[], object], *, reps: int = 7, warmup: int = 1,
           inner: int = 1) -> tuple[Sample, Sample]:
    """Both measured in alternation, one repetition each in turn, so that load from elsewhere on the
    machine (other processes on the same cores) and drift hit both alike."""
    times: tuple[list[float], list[float]] = ([], [])
    for rep in range(warmup + reps):
        for index, fn in enumerate((candidate, baseline)):
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            if rep >= warmup:
                times[index].append((time.perf_counter() - start) / inner)
    return Sample.of(times[0]), Sample.of(times[1])


def case(name: str, value: Sample | float, baseline: Sample | float | None, goal: str, unit: str = "s",
         higher_is_better: bool = False, *, goal_min_ratio: float | None = None,
         goal_max_ratio: float | None = None) -> dict[str, object]:
    """One result row: the case, its baseline from the same run, and the ratio to check the goal.

    ``value`` and ``baseline`` are Samples (seconds) or plain numbers in ``unit`` (octets, records).
    ``ratio`` is value / baseline, or baseline / value with ``higher_is_better`` (times where the goal
    is a throughput), so a ratio above 1 always means "better than the baseline" in that case.
    ``goal_min_ratio`` / ``goal_max_ratio`` make the goal machine-checked: the row gets ``checks``
    and ``met``.  Further checks on other numeric fields: `add_check`.
    """
    row: dict[str, object] = {"case": name, "unit": unit, "value": _plain(value), "goal": goal}
    if baseline is not None:
        row["baseline"] = _plain(baseline)
        ratio = _number(value) / _number(baseline)
        row["ratio"] = round(1 / ratio if higher_is_better else ratio, 3)
    if higher_is_better:
        row["higher_is_better"] = True
    if goal_min_ratio is not None:
        add_check(row, "ratio", ">=", goal_min_ratio)
    if goal_max_ratio is not None:
        add_check(row, "ratio", "<=", goal_max_ratio)
    return row


def add_check(row: dict[str, object], field: str, op: Op, bound: float) -> dict[str, object]:
    """Add the machine check ``row[field] op bound`` and recompute ``row["met"]`` (all checks hold);
    a check on a field the row lacks, or that is not a number, is unmet."""
    checks = row.setdefault("checks", [])
    assert isinstance(checks, list)
    checks.append({"field": field, "op": op, "bound": bound})
    row["met"] = all(_holds(row, c["field"], c["op"], c["bound"]) for c in checks)
    return row


def _holds(row: dict[str, object], field: str, op: str, bound: float) -> bool:
    value = row.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return _OPS[op](float(value), bound)


def _plain(value: Sample | float) -> dict[str, object] | float:
    return asdict(value) if isinstance(value, Sample) else value


def _number(value: Sample | float) -> float:
    return value.median_s if isinstance(value, Sample) else float(value)
