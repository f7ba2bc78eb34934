"""Prefetch directive and its status (spec section 6.5).

The status resource (GET prefetch/{id}) has no shape in the spec; we use::

    {"directive": "<uuid>", "state": "partial", "loaded": ["<hex32>", ...]}

Rules enforced beyond the member types:

- ``directive`` is a UUID in canonical lowercase form (it names the status resource);
- ``blocks`` is non-empty, has at most max_keys entries and no repeated block key; each block's
  ``sources`` is a non-empty array of distinct https or moqt URIs;
- ``layer_order`` is optional and defaults to "ascending", the only order defined: the container
  carries layers in ascending order (section 4.3), so any other value cannot be honoured and is refused;
- ``deadline_ms`` and ``lease_ms`` are greater than 0; ``request_ref``, when present, is a non-empty
  string of at most 1024 characters;
- a status's ``loaded`` keys are distinct; `PrefetchStatus.check_directive` adds the rules that need
  the directive: same identifier, loaded keys are the directive's, and "complete" means all loaded.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Self

from kvsp.errors import ValidationError
from kvsp.reader import ObjectReader
from kvsp.records.base import (
    BLOCK_KEY_OCTETS,
    COMPAT_ID_OCTETS,
    DEFAULT_MAX_KEYS,
    HOLDER_SCHEMES,
    SCOPE_ID_OCTETS,
    JsonRecord,
    KeyedRecord,
    check_unique,
    hex_list,
    read_keys,
    read_positive,
    read_text,
    read_uri_list,
    read_uuid,
)

LAYER_ORDERS: Final = frozenset({"ascending"})
MAX_REQUEST_REF: Final = 1024


class PrefetchState(enum.StrEnum):
    """States of a prefetch directive (section 6.5)."""

    PENDING = "pending"
    PARTIAL = "partial"
    COMPLETE = "complete"
    FAILED = "failed"


PREFETCH_STATES: Final = frozenset(s.value for s in PrefetchState)


@dataclass(frozen=True, slots=True)
class PrefetchBlock(JsonRecord):
    """One block to load and the holders it may come from, in the PC's order of preference."""

    block_key: bytes
    sources: tuple[str, ...]

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        return cls(r.hex("block_key", BLOCK_KEY_OCTETS), read_uri_list(r, "sources", HOLDER_SCHEMES))

    def to_json(self) -> dict[str, object]:
        return {"block_key": self.block_key.hex(), "sources": list(self.sources)}


@dataclass(frozen=True, slots=True)
class PrefetchDirective(KeyedRecord):
    """Body of POST prefetch: load these blocks before ``deadline_ms``, leasing each for ``lease_ms``."""

    directive: str
    scope_id: bytes
    compat_id: bytes
    blocks: tuple[PrefetchBlock, ...]
    deadline_ms: int
    lease_ms: int
    request_ref: str | None = None
    layer_order: str = "ascending"

    @property
    def block_keys(self) -> tuple[bytes, ...]:
        return tuple(block.block_key for block in self.blocks)

    @classmethod
    def from_reader(cls, r: ObjectReader, *, max_keys: int = DEFAULT_MAX_KEYS) -> Self:
        blocks = tuple(PrefetchBlock.from_reader(o) for o in r.objects("blocks", max_items=max_keys, nonempty=True))
        check_unique([b.block_key for b in blocks], r.member("blocks"), "must not repeat a block key")
        return cls(
            directive=read_uuid(r, "directive"),
            scope_id=r.hex("scope_id", SCOPE_ID_OCTETS),
            compat_id=r.hex("compat_id", COMPAT_ID_OCTETS),
            blocks=blocks,
            deadline_ms=read_positive(r, "deadline_ms"),
            lease_ms=read_positive(r, "lease_ms"),
            request_ref=r.optional("request_ref", lambda n: read_text(r, n, max_length=MAX_REQUEST_REF)),
            layer_order=r.optional("layer_order", lambda n: r.choice(n, LAYER_ORDERS)) or "ascending",
        )

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "directive": self.directive,
            "scope_id": self.scope_id.hex(),
            "compat_id": self.compat_id.hex(),
            "blocks": [block.to_json() for block in self.blocks],
            "layer_order": self.layer_order,
            "deadline_ms": self.deadline_ms,
            "lease_ms": self.lease_ms,
        }
        if self.request_ref is not None:
            out["request_ref"] = self.request_ref
        return out


@dataclass(frozen=True, slots=True)
class PrefetchStatus(KeyedRecord):
    """Body of GET prefetch/{id}: the directive's state and the keys loaded so far."""

    directive: str
    state: PrefetchState
    loaded: tuple[bytes, ...] = ()

    @classmethod
    def from_reader(cls, r: ObjectReader, *, max_keys: int = DEFAULT_MAX_KEYS) -> Self:
        return cls(read_uuid(r, "directive"), PrefetchState(r.choice("state", PREFETCH_STATES)),
                   read_keys(r, "loaded", max_items=max_keys, nonempty=False, unique=True))

    def to_json(self) -> dict[str, object]:
        return {"directive": self.directive, "state": self.state.value, "loaded": hex_list(self.loaded)}

    def check_directive(self, directive: PrefetchDirective) -> None:
        """Raise `ValidationError` unless this status can describe ``directive``."""
        if self.directive != directive.directive:
            raise ValidationError("directive", "must equal the directive's identifier")
        wanted = set(directive.block_keys)
        for i, key in enumerate(self.loaded):
            if key not in wanted:
                raise ValidationError(f"loaded[{i}]", "must be a block of the directive")
        if self.state is PrefetchState.COMPLETE and len(self.loaded) != len(wanted):
            raise ValidationError("loaded", 'must list every block of the directive when state is "complete"')

