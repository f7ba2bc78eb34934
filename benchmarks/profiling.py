"""Where CPU goes in a benchmark: cProfile summaries by area, and paired timings with CPU seconds.

Used by the MOQT benchmarks (bench_moqt) to say what limits a figure: the share of aioquic's Python,
our session and codecs, hashing, sockets and the event loop in client and server alike.
"""

from __future__ import annotations

import cProfile
import pstats
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.timing import Sample

AREAS = (("aioquic packet/crypto (C)", ("aioquic/_crypto", "aioquic/_buffer", "{method 'encrypt", "{method 'decrypt",
                                        "{built-in method aioquic")),
         ("aioquic connection (Python)", ("aioquic/",)),
         ("moqt session and codecs", ("moqt/session", "moqt/data", "moqt/wire", "moqt/messages", "moqt/profiles",
                                      "moqt/tracks")),
         ("moqt adapter and API", ("moqt/quic", "moqt/api", "moqt/tls")),
         ("kvsp (binding, holder, verify)", ("kvsp/", "control/")),
         ("sha256 (hashlib)", ("_hashlib", "sha256")),
         ("socket send/recv", ("sendto", "recvfrom", "'send'", "'recv", "sock_")),
         ("aiohttp/TLS", ("aiohttp", "ssl")),
         ("event loop (uvloop; client: includes waiting)", ("asyncio/runners.py", "uvloop", "asyncio/")),
         ("rest", ("",)))


COUNTED = ("_readable", "_transmit", "_on_timer", "drain", "_receive", "_write_stream_frame")
"""Adapter functions whose call counts show batching: datagrams per wake-up, timers, waits for ACKs."""


def _short(label: str) -> str:
    """A profile row's file path relative to site-packages or to this repository."""
    for root in ("site-packages/", str(Path(__file__).resolve().parents[1]) + "/"):
        label = label.rpartition(root)[2] or label
    return label


def summarize(profiler: cProfile.Profile, top: int = 12) -> dict[str, object]:
    """Total time per area (self time of the functions in it), the top functions by self time, and the
    API's and binding's own functions (``moqt/api``, ``kvsp``, ``control``) by self time."""
    stats = pstats.Stats(profiler)
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, object]] = stats.stats  # type: ignore[attr-defined]
    areas: dict[str, float] = {name: 0.0 for name, _ in AREAS}
    rows = []
    for (filename, line, name), (_, calls, tottime, cumtime, _) in raw.items():
        label = f"{filename}:{line}({name})"
        area = next(a for a, needles in AREAS if any(n in label for n in needles))
        areas[area] += tottime
        rows.append((tottime, cumtime, calls, _short(label)))
    total = sum(areas.values()) or 1.0
    rows.sort(reverse=True)
    ours = [row for row in rows if row[3].startswith(("moqt/api", "kvsp/", "control/"))]
    counts = {name: sum(c for (f, _, n), (_, c, *_) in raw.items() if n == name and "moqt/" in f) for name in COUNTED}
    return {"total_s": round(total, 3), "calls": counts,
            "areas_pct": {a: round(100 * t / total, 1) for a, t in sorted(areas.items(), key=lambda x: -x[1]) if t},
            "top_self_time": [_row(row) for row in rows[:top]],
            "api_and_binding": [_row(row) for row in ours[:top // 2]]}


def _row(row: tuple[float, float, int, str]) -> dict[str, object]:
    tottime, cumtime, calls, function = row
    return {"function": function, "self_s": round(tottime, 4), "cum_s": round(cumtime, 4), "calls": calls}


def paired_cpu(first: Callable[[], object], second: Callable[[], object], reps: int,
            cpu: Callable[[], float]) -> tuple[Sample, Sample, list[float]]:
    """Both measured in alternation, one repetition each in turn, so that load from elsewhere on the
    machine (other processes on the same cores) hits both alike. Also: CPU seconds of both processes
    (client + server) per repetition of each."""
    times: tuple[list[float], list[float]] = ([], [])
    cpu_s = [0.0, 0.0]
    for rep in range(reps + 1):
        for index, fn in enumerate((first, second)):
            start, cpu_start = time.perf_counter(), time.process_time() + cpu()
            fn()
            if rep:  # the first round warms both paths up
                times[index].append(time.perf_counter() - start)
                cpu_s[index] += time.process_time() + cpu() - cpu_start
    return Sample.of(times[0]), Sample.of(times[1]), [c / reps for c in cpu_s]
