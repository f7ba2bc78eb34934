"""Lookup request and response (spec section 6.2).

The spec fixes the request; for the response it names the members but not their shape.  We use::

    {"matched": 2,
     "replicas": [[<Replica Record>, ...], [<Replica Record>, ...]],
     "targets": [{"instance": "https://ii7.example/kvsp/", "fetch_us": 850.5, "recompute_us": 12000}]}

``replicas[i]`` holds the replica records of ``block_keys[i]``, so ``len(replicas) == matched`` and the
response stays small (no key is repeated outside its records).  ``targets`` is absent when the
request had none; ``fetch_us``/``recompute_us`` are null when no finite estimate exists (no link to
any holder of a matched block, or a prefill rate of 0).

Rules enforced beyond the member types:

- ``block_keys`` has 1..max_keys entries (max_keys is the configured quota, decision D2);
- ``targets``, when present, is a non-empty array of distinct https URIs;
- in a response, each ``replicas[i]`` is non-empty (a key counts as matched only with a replica),
  its records all name one block key, and all records share one compat_id and scope_id;
- `LookupResponse.check_request` adds the rules that need the request: the i-th group names the
  i-th requested key, compat_id and scope_id are the request's, and targets were requested.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Self

from kvsp.errors import ValidationError
from kvsp.reader import ObjectReader
from kvsp.records.base import (
    COMPAT_ID_OCTETS,
    DEFAULT_MAX_KEYS,
    MAX_URIS,
    SCOPE_ID_OCTETS,
    JsonRecord,
    KeyedRecord,
    check_list,
    check_unique,
    hex_list,
    read_finite,
    read_keys,
    read_uri,
    read_uri_list,
)
from kvsp.records.replica import ReplicaRecord

MAX_REPLICAS_PER_KEY: Final = 1024


@dataclass(frozen=True, slots=True)
class LookupRequest(KeyedRecord):
    """Body of POST lookup: Block Keys of a prompt in prefix order, and optional target instances."""

    scope_id: bytes
    compat_id: bytes
    block_keys: tuple[bytes, ...]
    targets: tuple[str, ...] = ()

    @classmethod
    def from_reader(cls, r: ObjectReader, *, max_keys: int = DEFAULT_MAX_KEYS) -> Self:
        return cls(
            scope_id=r.hex("scope_id", SCOPE_ID_OCTETS),
            compat_id=r.hex("compat_id", COMPAT_ID_OCTETS),
            block_keys=read_keys(r, "block_keys", max_items=max_keys),
            targets=r.optional("targets", lambda n: read_uri_list(r, n)) or (),
        )

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"scope_id": self.scope_id.hex(), "compat_id": self.compat_id.hex(),
                                  "block_keys": hex_list(self.block_keys)}
        if self.targets:
            out["targets"] = list(self.targets)
        return out


@dataclass(frozen=True, slots=True)
class TargetEstimate(JsonRecord):
    """Estimated microseconds to load the matched blocks into ``instance`` and to recompute them.

    None (JSON null) means there is no finite estimate.
    """

    instance: str
    fetch_us: float | None
    recompute_us: float | None

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        return cls(read_uri(r, "instance"), r.optional("fetch_us", lambda n: read_finite(r, n)),
                   r.optional("recompute_us", lambda n: read_finite(r, n)))

    def to_json(self) -> dict[str, object]:
        return {"instance": self.instance, "fetch_us": self.fetch_us, "recompute_us": self.recompute_us}


def _read_group(value: object, member: str) -> tuple[ReplicaRecord, ...]:
    items = check_list(value, member, max_items=MAX_REPLICAS_PER_KEY, nonempty=True)
    group = tuple(ReplicaRecord.from_reader(ObjectReader(item, f"{member}[{j}]")) for j, item in enumerate(items))
    for j, record in enumerate(group):
        if record.block_key != group[0].block_key:
            raise ValidationError(f"{member}[{j}].block_key", "must equal the block key of the group")
    return group


@dataclass(frozen=True, slots=True)
class LookupResponse(KeyedRecord):
    """Answer to POST lookup.  ``matched`` is derived, so it can never disagree with ``replicas``."""

    replicas: tuple[tuple[ReplicaRecord, ...], ...]
    targets: tuple[TargetEstimate, ...] = ()

    @property
    def matched(self) -> int:
        """Number of leading requested keys with at least one replica."""
        return len(self.replicas)

    @classmethod
    def from_reader(cls, r: ObjectReader, *, max_keys: int = DEFAULT_MAX_KEYS) -> Self:
        matched = r.int("matched", maximum=max_keys)
        groups = tuple(_read_group(v, p) for p, v in r.items("replicas", max_items=max_keys))
        if len(groups) != matched:
            raise ValidationError(r.member("replicas"), "must have one entry per matched key")
        _check_same_ids(groups, r.member("replicas"))
        targets = r.optional("targets", lambda n: tuple(
            TargetEstimate.from_reader(o) for o in r.objects(n, max_items=MAX_URIS, nonempty=True))) or ()
        check_unique([t.instance for t in targets], r.member("targets"), "must not repeat an instance")
        return cls(groups, targets)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "matched": self.matched,
            "replicas": [[record.to_json() for record in group] for group in self.replicas],
        }
        if self.targets:
            out["targets"] = [target.to_json() for target in self.targets]
        return out

    def check_request(self, request: LookupRequest) -> None:
        """Raise `ValidationError` unless this response answers ``request`` (section 6.2)."""
        if self.matched > len(request.block_keys):
            raise ValidationError("matched", "must not exceed the number of requested keys")
        for i, group in enumerate(self.replicas):
            for j, record in enumerate(group):
                member = f"replicas[{i}][{j}]"
                if record.block_key != request.block_keys[i]:
                    raise ValidationError(f"{member}.block_key", f"must equal requested block_keys[{i}]")
                if record.compat_id != request.compat_id:
                    raise ValidationError(f"{member}.compat_id", "must equal the requested compat_id")
                if record.scope_id != request.scope_id:
                    raise ValidationError(f"{member}.scope_id", "must equal the requested scope_id")
        for i, target in enumerate(self.targets):
            if target.instance not in request.targets:
                raise ValidationError(f"targets[{i}].instance", "must be one of the requested targets")


def _check_same_ids(groups: tuple[tuple[ReplicaRecord, ...], ...], member: str) -> None:
    """A lookup is for one compat_id and one scope_id, so every record of the answer shares them."""
    if not groups:
        return
    first = groups[0][0]
    for i, group in enumerate(groups):
        for j, record in enumerate(group):
            if record.compat_id != first.compat_id:
                raise ValidationError(f"{member}[{i}][{j}].compat_id", "must equal the other records' compat_id")
            if record.scope_id != first.scope_id:
                raise ValidationError(f"{member}[{i}][{j}].scope_id", "must equal the other records' scope_id")

