"""The command line of the suites that measure a source tree against a baseline tree in one run.

``python -m benchmarks.bench_NAME [--quick] [--tree DIR] [--compare DIR]``: ``--tree`` is the checkout
whose ``kvsp serve`` (and client) is measured, this one by default; ``--compare`` measures a second
checkout too, e.g. the tree before a change, so both figures come from the same sitting.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

Run = Callable[..., dict[str, object]]


def tree_parser(doc: str | None, what: str = "the checkout whose kvsp serve to measure") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(doc or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tree", type=Path, default=ROOT, help=what)
    parser.add_argument("--compare", type=Path, help="also measure this checkout (the baseline), in the same run")
    return parser


def print_run(run: Run, args: argparse.Namespace) -> None:
    """``run(quick, tree=, compare=)``'s result as JSON on stdout, with the wall time it took."""
    started = time.monotonic()
    out = run(args.quick, tree=args.tree, compare=args.compare)
    out["elapsed_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out, indent=2))
