"""Fuzz target ``records_lookup``: Lookup Request and Response (kvsp/records/lookup.py, spec section 6.2).

Contract: see `fuzz.records`; besides the two records alone, a ``[request, response]`` pair is parsed
and ``LookupResponse.check_request`` either accepts the response as an answer to the request or raises
``ValidationError`` (never an IndexError on a response longer than the request, for instance).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import check, fuzz_main
from fuzz.records import II7, LOOKUP, LOOKUP_RESPONSE, Parser, record_input, record_seeds
from kvsp.encoding import canonical_json, parse_json
from kvsp.errors import ValidationError
from kvsp.records import LookupRequest, LookupResponse, TargetEstimate

TARGET = "records_lookup"
INSTRUMENT = ("kvsp.records", "kvsp.reader", "kvsp.encoding", "kvsp.identifiers", "kvsp.errors")
MAX_KEYS = 16  # a small quota (decision D2), so that the quota's refusal is reached too


def parse_pair(data: bytes) -> tuple[LookupRequest, LookupResponse]:
    """``[request, response]``; the response is then checked against the request."""
    value = parse_json(data)
    if not isinstance(value, list) or len(value) != 2:
        raise ValidationError("$", "must be [request, response]")
    pair = LookupRequest.from_json(value[0], max_keys=MAX_KEYS), LookupResponse.from_json(value[1], max_keys=MAX_KEYS)
    pair[1].check_request(pair[0])
    return pair


def write_pair(pair: tuple[LookupRequest, LookupResponse]) -> bytes:
    return canonical_json([pair[0].to_json(), pair[1].to_json()])


def use_response(response: LookupResponse) -> None:
    check(response.matched == len(response.replicas), "matched disagrees with replicas")


PARSERS: list[Parser[Any]] = [
    Parser("request", lambda d: LookupRequest.from_bytes(d, max_keys=MAX_KEYS), LookupRequest.to_bytes),
    Parser("response", lambda d: LookupResponse.from_bytes(d, max_keys=MAX_KEYS), LookupResponse.to_bytes,
           use_response),
    Parser("target", TargetEstimate.from_bytes, TargetEstimate.to_bytes),
    Parser("pair", parse_pair, write_pair),
]


def test_one_input(data: bytes) -> None:
    record_input(data, PARSERS)


def seeds() -> list[bytes]:
    return record_seeds(PARSERS, {
        "request": [LOOKUP, {**LOOKUP, "targets": None}],
        "response": [LOOKUP_RESPONSE, {"matched": 0, "replicas": []}],
        "target": [{"instance": II7, "fetch_us": 850.5, "recompute_us": 12000}],
        "pair": [[LOOKUP, LOOKUP_RESPONSE]],
    })


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT)
