"""Fuzz target ``problem``: Problem Details bodies (kvsp/problems.py, RFC 9457, spec section 7).

Contract: see `fuzz.records`: parse or ``ValidationError``, and an accepted problem round-trips; its
``kind`` is the KVSP problem type its ``type`` URI names, or None.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import check, fuzz_main
from fuzz.records import Parser, record_input, record_seeds
from kvsp.problems import Problem, ProblemType

TARGET = "problem"
INSTRUMENT = ("kvsp.problems", "kvsp.reader", "kvsp.encoding", "kvsp.errors")


def use_problem(problem: Problem) -> None:
    kind = problem.kind
    check(kind is None or kind.uri == problem.type, "kind does not match the type URI")


PARSERS: list[Parser[Any]] = [Parser("problem", Problem.from_bytes, Problem.to_bytes, use_problem)]


def test_one_input(data: bytes) -> None:
    record_input(data, PARSERS)


def seeds() -> list[bytes]:
    return record_seeds(PARSERS, {"problem": [
        Problem.of(kind, "detail").to_json() for kind in ProblemType] + [{"status": 500}, {
            "type": "about:blank", "status": 413, "title": "Content Too Large", "detail": "body limit is 1 octets"}]})


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT)
