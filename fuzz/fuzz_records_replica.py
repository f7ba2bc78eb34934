"""Fuzz target ``records_replica``: the Replica Record and its residency entries (kvsp/records/replica.py).

Contract: see `fuzz.records` (parse or ``ValidationError``; written records round-trip canonically),
and the residency queries (``layers_held``, ``holds``, ``tier_of``, ``producer_id``...) answer for
every layer of an accepted record without raising, consistently with each other.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import check, fuzz_main
from fuzz.records import K1, Parser, moqt_replica, record_input, record_seeds, replica
from kvsp.records import ReplicaRecord, Residency

TARGET = "records_replica"
INSTRUMENT = ("kvsp.records", "kvsp.reader", "kvsp.encoding", "kvsp.identifiers", "kvsp.errors", "urllib.parse")


def use_replica(record: ReplicaRecord) -> None:
    held = record.layers_held()
    check(all(a <= b for a, b in held), "layers_held returned an empty range")
    check(record.layer_count() == sum(r.layer_count for r in record.residency), "layer_count disagrees")
    check(record.verify_digest_chain(), "an accepted record fails its own digest chain")
    record.producer_id  # noqa: B018  # the property is the query: it must not raise
    for entry in record.residency:
        for layer in {entry.first, entry.last, entry.last + 1}:
            tier = record.tier_of(layer)
            check((tier is not None) == any(a <= layer <= b for a, b in held), "tier_of and layers_held disagree")
        check(record.holds(entry.first, entry.last), "a record does not hold its own residency range")


PARSERS: list[Parser[Any]] = [
    Parser("replica", ReplicaRecord.from_bytes, ReplicaRecord.to_bytes, use_replica),
    Parser("residency", Residency.from_bytes, Residency.to_bytes),
]


def test_one_input(data: bytes) -> None:
    record_input(data, PARSERS)


def seeds() -> list[bytes]:
    bare = replica(K1)
    del bare["layer_digests"]
    return record_seeds(PARSERS, {
        "replica": [replica(), bare, moqt_replica()],
        "residency": [{"tier": "device", "layers": [0, 15]},
                      {"tier": "host", "layers": [16, 31], "read_mbit_per_s": 4e5}],
    })


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT)
