"""Fuzz target ``records_prefetch``: prefetch directives and their status (kvsp/records/prefetch.py, 6.5).

Contract: see `fuzz.records`; besides the records alone, a ``[directive, status]`` pair is parsed and
``PrefetchStatus.check_directive`` accepts the status for the directive or raises ``ValidationError``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import check, fuzz_main
from fuzz.records import H1, K0, PREFETCH, PREFETCH_STATUS, RELAY, Parser, record_input, record_seeds
from kvsp.encoding import canonical_json, parse_json
from kvsp.errors import ValidationError
from kvsp.records import PrefetchBlock, PrefetchDirective, PrefetchStatus

TARGET = "records_prefetch"
INSTRUMENT = ("kvsp.records", "kvsp.reader", "kvsp.encoding", "kvsp.identifiers", "kvsp.errors", "urllib.parse")
MAX_KEYS = 16


def parse_pair(data: bytes) -> tuple[PrefetchDirective, PrefetchStatus]:
    value = parse_json(data)
    if not isinstance(value, list) or len(value) != 2:
        raise ValidationError("$", "must be [directive, status]")
    pair = (PrefetchDirective.from_json(value[0], max_keys=MAX_KEYS),
            PrefetchStatus.from_json(value[1], max_keys=MAX_KEYS))
    pair[1].check_directive(pair[0])
    return pair


def write_pair(pair: tuple[PrefetchDirective, PrefetchStatus]) -> bytes:
    return canonical_json([pair[0].to_json(), pair[1].to_json()])


def use_directive(directive: PrefetchDirective) -> None:
    check(len(set(directive.block_keys)) == len(directive.blocks), "a directive repeats a block key")


PARSERS: list[Parser[Any]] = [
    Parser("directive", lambda d: PrefetchDirective.from_bytes(d, max_keys=MAX_KEYS), PrefetchDirective.to_bytes,
           use_directive),
    Parser("status", lambda d: PrefetchStatus.from_bytes(d, max_keys=MAX_KEYS), PrefetchStatus.to_bytes),
    Parser("block", PrefetchBlock.from_bytes, PrefetchBlock.to_bytes),
    Parser("pair", parse_pair, write_pair),
]


def test_one_input(data: bytes) -> None:
    record_input(data, PARSERS)


def seeds() -> list[bytes]:
    complete = {**PREFETCH_STATUS, "state": "complete"}
    return record_seeds(PARSERS, {
        "directive": [PREFETCH, {k: v for k, v in PREFETCH.items() if k not in ("request_ref", "layer_order")}],
        "status": [PREFETCH_STATUS, complete],
        "block": [{"block_key": K0, "sources": [H1, RELAY]}],
        "pair": [[PREFETCH, PREFETCH_STATUS], [PREFETCH, complete]],
    })


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT)
