"""Fuzz target ``records_generation``: the generation extension records (kvsp/records/generation.py):
requests, session starts and resumes, session info and the NDJSON token stream lines.

Contract: see `fuzz.records` (for stream lines the writer is ``to_line``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import fuzz_main
from fuzz.records import CHECKPOINT, COMPAT, SAMPLER, SCOPE, UUID, Parser, record_input, record_seeds
from kvsp.records import GenerateRequest, ResumeRequest, SessionInfo, StartSession, parse_stream_line

TARGET = "records_generation"
INSTRUMENT = ("kvsp.records", "kvsp.reader", "kvsp.encoding", "kvsp.errors")
GENERATE: dict[str, object] = {"scope_id": SCOPE, "compat_id": COMPAT, "prompt": [1, 2, 3], "max_tokens": 8,
                               "sampler": {"method": "top-p", "params": {"p": 0.9}, "seed": 7}}

PARSERS: list[Parser[Any]] = [
    Parser("generate", GenerateRequest.from_bytes, GenerateRequest.to_bytes),
    Parser("start", StartSession.from_bytes, StartSession.to_bytes),
    Parser("resume", ResumeRequest.from_bytes, ResumeRequest.to_bytes),
    Parser("info", SessionInfo.from_bytes, SessionInfo.to_bytes),
    Parser("line", parse_stream_line, lambda line: line.to_line()),
]


def test_one_input(data: bytes) -> None:
    record_input(data, PARSERS)


def seeds() -> list[bytes]:
    return record_seeds(PARSERS, {
        "generate": [GENERATE, {**GENERATE, "session": UUID, "sampler": {"method": "greedy"}}],
        "start": [{"session": UUID, "epoch": 1, "scope_id": SCOPE, "compat_id": COMPAT, "prompt": [5], "max_tokens": 4,
                   "sampler": {**SAMPLER, "step": 0}}],
        "resume": [CHECKPOINT, {**CHECKPOINT, "max_tokens": 16}],
        "info": [{"session": UUID, "instance": "https://ii7.example/kvsp/", "epoch": 2, "output_offset": 3,
                  "state": "running"}, {"session": UUID, "instance": None, "epoch": 1, "output_offset": 0,
                                        "state": "stranded"}],
        "line": [{"index": 0, "epoch": 1, "token": 42}, {"end": True, "reason": "stop", "epoch": 1}],
    })


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT)
