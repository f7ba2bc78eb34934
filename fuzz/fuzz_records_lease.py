"""Fuzz target ``records_lease``: lease requests, renewals and leases (kvsp/records/lease.py, section 6.6).

Contract: see `fuzz.records`; a lease identifier that parses is also one path segment
(``check_lease_id`` accepts it), since holders route ``leases/{id}`` by it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import check, fuzz_main
from fuzz.records import LEASE, LEASE_REQUEST, Parser, record_input, record_seeds
from kvsp.records import Lease, LeaseRenewal, LeaseRequest
from kvsp.records.lease import check_lease_id

TARGET = "records_lease"
INSTRUMENT = ("kvsp.records", "kvsp.reader", "kvsp.encoding", "kvsp.errors")
MAX_KEYS = 16


def use_lease(lease: Lease) -> None:
    check(check_lease_id(lease.lease) == lease.lease, "a parsed lease id is not a valid path segment")
    check(len(set(lease.block_keys)) == len(lease.block_keys), "a lease repeats a block key")


PARSERS: list[Parser[Any]] = [
    Parser("request", lambda d: LeaseRequest.from_bytes(d, max_keys=MAX_KEYS), LeaseRequest.to_bytes),
    Parser("renewal", LeaseRenewal.from_bytes, LeaseRenewal.to_bytes),
    Parser("lease", lambda d: Lease.from_bytes(d, max_keys=MAX_KEYS), Lease.to_bytes, use_lease),
]


def test_one_input(data: bytes) -> None:
    record_input(data, PARSERS)


def seeds() -> list[bytes]:
    return record_seeds(PARSERS, {"request": [LEASE_REQUEST], "renewal": [{"ttl_ms": 2000}], "lease": [LEASE]})


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT)
