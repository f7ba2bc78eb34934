"""Run every benchmark and write the results as JSON.

    python -m benchmarks [--quick] [--out benchmarks/results/results.json] [--only NAME ...]

Each module in SUITES exposes ``run(quick: bool) -> dict``; every case is measured beside its
baseline in the same run, so the ratios are comparable across machines.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from pathlib import Path

SUITES = ["bench_keys", "bench_container", "bench_index", "bench_holder", "bench_client", "bench_placement",
          "bench_quic", "bench_failover", "bench_moqt"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="CI-sized runs")
    parser.add_argument("--out", default="benchmarks/results/results.json")
    parser.add_argument("--only", nargs="*", choices=SUITES)
    args = parser.parse_args(argv)
    results = []
    for name in args.only or SUITES:
        module = importlib.import_module(f"benchmarks.{name}")
        start = time.perf_counter()
        result = module.run(quick=args.quick)
        result["elapsed_s"] = round(time.perf_counter() - start, 2)
        results.append(result)
        for row in result["cases"]:
            print(f"{result['name']:>14} {row['case']:<40} ratio={row.get('ratio', '-')!s:<8} goal: {row['goal']}")
    doc = {"machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                       "processor": platform.processor()},
           "quick": args.quick, "suites": results}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
