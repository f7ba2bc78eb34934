"""Fuzz target ``records_status``: Instance Status, links and state changes (kvsp/records/status.py,
kvsp/records/lifecycle.py, spec section 6.3).

Contract: see `fuzz.records`; on an accepted status the link index is sound (``LinkIndex.sound``: a
parsed record always is) and ``link_to`` finds every holder it lists.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import check, fuzz_main
from fuzz.records import H1, STATUS, Parser, record_input, record_seeds
from kvsp.records import InstanceStatus, Link, StateChange

TARGET = "records_status"
INSTRUMENT = ("kvsp.records", "kvsp.reader", "kvsp.encoding", "kvsp.identifiers", "kvsp.errors", "urllib.parse")


def use_status(status: InstanceStatus) -> None:
    index = status.link_index()
    check(index.sound, "a parsed status has an unsound link index")
    for link in status.links:
        check(status.link_to(link.holder) == link, "link_to misses a listed holder")
    status.is_active  # noqa: B018  # the property is the query: it must not raise


PARSERS: list[Parser[Any]] = [
    Parser("status", InstanceStatus.from_bytes, InstanceStatus.to_bytes, use_status),
    Parser("link", Link.from_bytes, Link.to_bytes),
    Parser("state", StateChange.from_bytes, StateChange.to_bytes),
]


def test_one_input(data: bytes) -> None:
    record_input(data, PARSERS)


def seeds() -> list[bytes]:
    return record_seeds(PARSERS, {
        "status": [STATUS, {**STATUS, "requested_state": "draining", "links": []}],
        "link": [{"holder": H1, "mbit_per_s": 200000, "rtt_us": 12}],
        "state": [{"state": "draining"}, {"state": "active"}],
    })


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT)
