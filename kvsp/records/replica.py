"""Replica Record (spec section 4.4): where a block, or some of its layers, resides at one holder.

Rules enforced beyond the member types (the spec states the first two, the others follow from it):

- residency layer ranges are inclusive, ``first <= last``, and MUST NOT overlap;
- when ``layer_digests`` is present, every residency range lies within ``[0, len(layer_digests) - 1]``
  and ``digest`` equals SHA-256 of the concatenated layer digests (section 4.3), so a record whose
  digests cannot both be right is refused at the boundary rather than at retrieval time;
- ``layer_digests``, when present, is non-empty (absent and empty would be two spellings of one thing);
- residency is non-empty: a record that holds no layer is a withdrawal, not a replica;
- an ``https`` holder has no ``moqt_namespace``; a ``moqt`` holder MUST have one (there is no other
  way to name the track), and its compat_id, scope_id and block_key fields equal the record's;
- codec 0x0000 is reserved in the registry and is refused; ``read_mbit_per_s`` is greater than 0.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Final, Self

from kvsp.encoding import format_digest
from kvsp.errors import ValidationError
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.reader import ObjectReader
from kvsp.records.base import (
    BLOCK_KEY_OCTETS,
    COMPAT_ID_OCTETS,
    HOLDER_SCHEMES,
    MAX_SAFE_INT,
    MAX_UINT32,
    SCOPE_ID_OCTETS,
    JsonRecord,
    LayerRange,
    check_layer_range,
    first_overlap,
    hex_list,
    read_finite,
    read_hex32_list,
    read_positive,
    read_uri,
    uri_scheme,
)
from kvsp.registry import TIERS, Tier

STORAGE_TIERS: Final = frozenset({Tier.LOCAL_STORAGE, Tier.REMOTE_STORAGE})
MAX_LAYER_DIGESTS: Final = 65536
MAX_RESIDENCY: Final = 1024
MAX_CODEC: Final = 0xFFFF
_TIER_OF: Final[dict[str, Tier]] = {t.value: t for t in Tier}
_NAMESPACE_MAX_CHARS: Final = 512  # five length-prefixed fields of at most 135 octets, base64url


@dataclass(frozen=True, slots=True)
class Residency(JsonRecord):
    """Layers ``layers[0]..layers[1]`` (inclusive) of a replica reside in ``tier``."""

    tier: Tier
    layers: LayerRange
    read_mbit_per_s: float | None = None

    @property
    def first(self) -> int:
        return self.layers[0]

    @property
    def last(self) -> int:
        return self.layers[1]

    @property
    def layer_count(self) -> int:
        return self.layers[1] - self.layers[0] + 1

    @property
    def is_storage(self) -> bool:
        """Storage tiers are the ones whose read rate can limit a fetch (spec section 6.4)."""
        return self.tier in STORAGE_TIERS

    def contains(self, layer: int) -> bool:
        return self.layers[0] <= layer <= self.layers[1]

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        # The common shape (exact JSON types, values in range) is accepted by a few inline checks that
        # imply the full rules below; anything else takes the full path, which names what is wrong.
        name, layers, rate = r.get("tier"), r.get("layers"), r.get("read_mbit_per_s")
        tier = _TIER_OF.get(name) if type(name) is str else None
        if tier is not None and type(layers) is list and len(layers) == 2:
            first, last = layers
            if type(first) is int and type(last) is int and 0 <= first <= last <= MAX_UINT32 and (
                    rate is None or (type(rate) is float and 0.0 < rate < math.inf)
                    or (type(rate) is int and 0 < rate <= MAX_SAFE_INT)):
                return cls(tier, (first, last), None if rate is None else float(rate))
        read = r.optional("read_mbit_per_s", lambda n: read_finite(r, n, positive=True))
        return cls(Tier(r.choice("tier", TIERS)), check_layer_range(r.raw("layers"), r.member("layers")), read)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"tier": self.tier.value, "layers": list(self.layers)}
        if self.read_mbit_per_s is not None:
            out["read_mbit_per_s"] = self.read_mbit_per_s
        return out


def digest_of_layers(layer_digests: tuple[bytes, ...]) -> bytes:
    """The replica digest: SHA-256 of the layer digests concatenated in layer order (section 4.3)."""
    return hashlib.sha256(b"".join(layer_digests)).digest()


@dataclass(frozen=True, slots=True)
class ReplicaRecord(JsonRecord):
    """One replica at one holder.  ``layer_digests == ()`` means the member is absent."""

    block_key: bytes
    compat_id: bytes
    scope_id: bytes
    holder: str
    codec: int
    size: int
    digest: bytes
    residency: tuple[Residency, ...]
    ttl_ms: int
    layer_digests: tuple[bytes, ...] = ()
    moqt_namespace: TrackNamespace | None = None

    @property
    def producer_id(self) -> str:
        """The holder-id of the replica's producer: the principal that answers for the record.

        For a ``moqt`` record it is the namespace's holder-id field, not ``role_id(holder)``: the holder
        URI names the endpoint or relay serving the track, which many producers share, and section 4.4
        makes the namespace's publisher the holder for authorization.  Otherwise it is the holder's.
        """
        namespace = self.moqt_namespace
        return namespace.holder_id if namespace is not None else role_id(self.holder)

    # -- residency queries ---------------------------------------------------------------------
    def layers_held(self) -> tuple[LayerRange, ...]:
        """Held layers as sorted inclusive ranges, adjacent ranges joined (tiers ignored)."""
        merged: list[LayerRange] = []
        for first, last in sorted(entry.layers for entry in self.residency):
            if merged and first <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], last))
            else:
                merged.append((first, last))
        return tuple(merged)

    def layer_count(self) -> int:
        """Number of layers held, in any tier."""
        return sum(entry.layer_count for entry in self.residency)

    def holds(self, first: int, last: int) -> bool:
        """Whether every layer of the inclusive range ``first..last`` resides somewhere here."""
        return first <= last and any(a <= first and last <= b for a, b in self.layers_held())

    def residency_of(self, layer: int) -> Residency | None:
        for entry in self.residency:
            if entry.contains(layer):
                return entry
        return None

    def tier_of(self, layer: int) -> Tier | None:
        """The tier holding ``layer``, or None when this replica does not hold it."""
        entry = self.residency_of(layer)
        return None if entry is None else entry.tier

    def verify_digest_chain(self) -> bool:
        """Whether ``digest`` matches the layer digests (True when they are absent: nothing to check)."""
        return not self.layer_digests or digest_of_layers(self.layer_digests) == self.digest

    # -- codec ---------------------------------------------------------------------------------
    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        layer_digests = r.optional(
            "layer_digests", lambda n: read_hex32_list(r, n, max_items=MAX_LAYER_DIGESTS, nonempty=True))
        namespace = r.optional("moqt_namespace", lambda n: TrackNamespace.decode(
            r.str(n, max_length=_NAMESPACE_MAX_CHARS), r.member(n)))
        record = cls(
            block_key=r.hex("block_key", BLOCK_KEY_OCTETS),
            compat_id=r.hex("compat_id", COMPAT_ID_OCTETS),
            scope_id=r.hex("scope_id", SCOPE_ID_OCTETS),
            holder=read_uri(r, "holder", HOLDER_SCHEMES),
            codec=r.int("codec", minimum=1, maximum=MAX_CODEC),
            size=r.int("size", maximum=MAX_SAFE_INT),
            digest=r.digest("digest"),
            residency=tuple(Residency.from_reader(o) for o in r.objects(
                "residency", max_items=MAX_RESIDENCY, nonempty=True)),
            ttl_ms=read_positive(r, "ttl_ms"),
            layer_digests=layer_digests or (),
            moqt_namespace=namespace,
        )
        _check_residency(record, r)
        _check_namespace(record, r)
        return record

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "block_key": self.block_key.hex(),
            "compat_id": self.compat_id.hex(),
            "scope_id": self.scope_id.hex(),
            "holder": self.holder,
            "codec": self.codec,
            "size": self.size,
            "digest": format_digest(self.digest),
            "residency": [entry.to_json() for entry in self.residency],
            "ttl_ms": self.ttl_ms,
        }
        if self.layer_digests:
            out["layer_digests"] = hex_list(self.layer_digests)
        if self.moqt_namespace is not None:
            out["moqt_namespace"] = self.moqt_namespace.encode()
        return out


def _check_residency(record: ReplicaRecord, r: ObjectReader) -> None:
    ranges = [entry.layers for entry in record.residency]
    overlap = first_overlap(ranges, inclusive=True)
    if overlap is not None:
        raise ValidationError(f"{r.member('residency')}[{overlap}].layers", "must not overlap another range")
    if not record.layer_digests:
        return
    top = len(record.layer_digests) - 1
    for i, (_, last) in enumerate(ranges):
        if last > top:
            raise ValidationError(f"{r.member('residency')}[{i}].layers",
                                  f"must lie within the {top + 1} layers listed in layer_digests")
    if not record.verify_digest_chain():
        raise ValidationError(r.member("digest"), "must be SHA-256 of the concatenated layer_digests")


def _check_namespace(record: ReplicaRecord, r: ObjectReader) -> None:
    namespace = record.moqt_namespace
    if uri_scheme(record.holder) == "moqt":
        if namespace is None:
            raise ValidationError(r.member("moqt_namespace"), "is required when holder is a moqt URI")
    elif namespace is not None:
        raise ValidationError(r.member("moqt_namespace"), "must be absent when holder is an https URI")
    if namespace is None:
        return
    for field, ours in (("compat_id", record.compat_id), ("scope_id", record.scope_id),
                        ("block_key", record.block_key)):
        if getattr(namespace, field) != ours:
            raise ValidationError(r.member("moqt_namespace"), f"{field} field must equal the record's {field}")
