"""Fuzz target ``records_session``: Session Checkpoints and their sampler (kvsp/records/session.py, 6.8).

Contract: see `fuzz.records`; every parameter an accepted sampler lists can be read back by name.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import check, fuzz_main
from fuzz.records import CHECKPOINT, SAMPLER, Parser, record_input, record_seeds
from kvsp.records import Sampler, SessionCheckpoint


def use_sampler(sampler: Sampler) -> None:
    for name, value in sampler.params:
        check(sampler.param(name) == value, f"param({name!r}) differs")  # JSON has no NaN: equality holds


def use_checkpoint(checkpoint: SessionCheckpoint) -> None:
    check(checkpoint.output_offset == len(checkpoint.generated), "output_offset disagrees with generated")
    use_sampler(checkpoint.sampler)


TARGET = "records_session"
INSTRUMENT = ("kvsp.records", "kvsp.reader", "kvsp.encoding", "kvsp.errors")
PARSERS: list[Parser[Any]] = [
    Parser("checkpoint", SessionCheckpoint.from_bytes, SessionCheckpoint.to_bytes, use_checkpoint),
    Parser("sampler", Sampler.from_bytes, Sampler.to_bytes, use_sampler),
]


def test_one_input(data: bytes) -> None:
    record_input(data, PARSERS)


def seeds() -> list[bytes]:
    return record_seeds(PARSERS, {
        "checkpoint": [CHECKPOINT, {**CHECKPOINT, "generated": [], "output_offset": 0, "prompt_blocks": []}],
        "sampler": [SAMPLER, {"method": "greedy", "params": {"a": None, "b": True, "c": "x", "d": -1},
                              "seed": 0, "step": 0, "deterministic": True}],
    })


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT)
