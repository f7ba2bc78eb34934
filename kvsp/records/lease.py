"""Lease bodies (spec section 6.6).  The spec says what they carry, not their shape; we use:

- POST leases request:      ``{"block_keys": ["<hex32>", ...], "ttl_ms": 2000}``
- PUT leases/{id} request:  ``{"ttl_ms": 2000}``
- response to both:         ``{"lease": "<id>", "block_keys": ["<hex32>", ...], "ttl_ms": <granted>}``

The lease identifier is also the last path segment of leases/{id}, so it is a path-safe token of
1..128 characters from ``[A-Za-z0-9_-]``.  Block keys are distinct (a repeated key would be counted
twice against the leased-octets quota) and at most max_keys (the configured quota, decision D2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Self

from kvsp.errors import ValidationError
from kvsp.reader import ObjectReader
from kvsp.records.base import DEFAULT_MAX_KEYS, JsonRecord, KeyedRecord, hex_list, read_keys, read_positive

MAX_LEASE_ID: Final = 128
_LEASE_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")


def check_lease_id(value: str, member: str = "lease") -> str:
    """A lease identifier that can stand as one path segment without escaping."""
    if not _LEASE_ID.fullmatch(value):
        raise ValidationError(member, f"must be 1 to {MAX_LEASE_ID} characters of A-Z, a-z, 0-9, '_' and '-'")
    return value


@dataclass(frozen=True, slots=True)
class LeaseRequest(KeyedRecord):
    """Body of POST leases: protect these blocks from eviction for ``ttl_ms``."""

    block_keys: tuple[bytes, ...]
    ttl_ms: int

    @classmethod
    def from_reader(cls, r: ObjectReader, *, max_keys: int = DEFAULT_MAX_KEYS) -> Self:
        return cls(read_keys(r, "block_keys", max_items=max_keys, unique=True), read_positive(r, "ttl_ms"))

    def to_json(self) -> dict[str, object]:
        return {"block_keys": hex_list(self.block_keys), "ttl_ms": self.ttl_ms}


@dataclass(frozen=True, slots=True)
class LeaseRenewal(JsonRecord):
    """Body of PUT leases/{id}: extend the lease by ``ttl_ms`` from now."""

    ttl_ms: int

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        return cls(read_positive(r, "ttl_ms"))

    def to_json(self) -> dict[str, object]:
        return {"ttl_ms": self.ttl_ms}


@dataclass(frozen=True, slots=True)
class Lease(KeyedRecord):
    """A granted lease: identifier, the leased keys and the TTL the holder granted (may be capped)."""

    lease: str
    block_keys: tuple[bytes, ...]
    ttl_ms: int

    @classmethod
    def from_reader(cls, r: ObjectReader, *, max_keys: int = DEFAULT_MAX_KEYS) -> Self:
        return cls(check_lease_id(r.str("lease", max_length=MAX_LEASE_ID), r.member("lease")),
                   read_keys(r, "block_keys", max_items=max_keys, unique=True), read_positive(r, "ttl_ms"))

    def to_json(self) -> dict[str, object]:
        return {"lease": self.lease, "block_keys": hex_list(self.block_keys), "ttl_ms": self.ttl_ms}


LeaseResponse = Lease
