"""Sequence-sharded caches and resharding (spec section 6.9): Shard Map, reshard messages, and the plan.

Rules enforced beyond the member types:

- token ranges are half-open ``[start, end)`` with ``start < end``;
- a Shard Map has at least one shard and its ranges are sorted and contiguous: each starts where the
  previous one ends (which also makes them non-overlapping); the first may start anywhere;
- a reshard plan goes from version v to v+1 (``to == from + 1``), ``deadline_ms > 0``, and its
  retain, fetch and release ranges are mutually non-overlapping (an instance cannot both keep and
  fetch, or keep and release, the same tokens); a commit or abort names version 1 or later;
- a POST reshard body carries exactly one of "from" (a plan), "commit" and "abort".

`plan_reshard` computes every instance's plan from two consecutive maps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Self

from kvsp.errors import ValidationError
from kvsp.reader import ObjectReader
from kvsp.records.base import (
    MAX_SAFE_INT,
    JsonRecord,
    TokenRange,
    check_token_range,
    first_overlap,
    intersect_ranges,
    merge_ranges,
    read_count,
    read_positive,
    read_text,
    read_uri,
    subtract_ranges,
)

MAX_SHARDS: Final = 4096
MAX_MAP_ID: Final = 256


def _read_map_id(r: ObjectReader) -> str:
    return read_text(r, "map", max_length=MAX_MAP_ID)


def _read_ranges(r: ObjectReader, name: str) -> tuple[TokenRange, ...]:
    return tuple(check_token_range(v, p) for p, v in r.items(name, max_items=MAX_SHARDS))


@dataclass(frozen=True, slots=True)
class Shard(JsonRecord):
    """Tokens ``[tokens[0], tokens[1])`` of the context are held by ``instance``."""

    tokens: TokenRange
    instance: str

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        return cls(check_token_range(r.raw("tokens"), r.member("tokens")), read_uri(r, "instance"))

    def to_json(self) -> dict[str, object]:
        return {"tokens": list(self.tokens), "instance": self.instance}


@dataclass(frozen=True, slots=True)
class ShardMap(JsonRecord):
    """Version ``version`` of how one context (``map``) is split by token range across a group."""

    map: str
    version: int
    shards: tuple[Shard, ...]

    @property
    def span(self) -> TokenRange:
        """The whole token range the map covers."""
        return self.shards[0].tokens[0], self.shards[-1].tokens[1]

    def instances(self) -> tuple[str, ...]:
        """Member instances in order of first appearance."""
        return tuple(dict.fromkeys(shard.instance for shard in self.shards))

    def ranges_of(self, instance: str) -> tuple[TokenRange, ...]:
        """Token ranges held by ``instance``, adjacent ranges joined."""
        return merge_ranges(s.tokens for s in self.shards if s.instance == instance)

    def owner_of(self, token: int) -> str | None:
        for shard in self.shards:
            if shard.tokens[0] <= token < shard.tokens[1]:
                return shard.instance
        return None

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        shards = tuple(Shard.from_reader(o) for o in r.objects("shards", max_items=MAX_SHARDS, nonempty=True))
        for i in range(1, len(shards)):
            if shards[i].tokens[0] != shards[i - 1].tokens[1]:
                raise ValidationError(f"{r.member('shards')}[{i}].tokens",
                                      f"must start where shards[{i - 1}] ends (sorted and contiguous)")
        return cls(_read_map_id(r), read_count(r, "version"), shards)

    def to_json(self) -> dict[str, object]:
        return {"map": self.map, "version": self.version, "shards": [s.to_json() for s in self.shards]}


@dataclass(frozen=True, slots=True)
class ShardFetch(JsonRecord):
    """Tokens to load from ``source``, the instance that holds them in the current version."""

    tokens: TokenRange
    source: str

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        return cls(check_token_range(r.raw("tokens"), r.member("tokens")), read_uri(r, "from"))

    def to_json(self) -> dict[str, object]:
        return {"tokens": list(self.tokens), "from": self.source}


@dataclass(frozen=True, slots=True)
class ReshardPlan(JsonRecord):
    """One instance's part of the move from version ``from_version`` to ``to_version`` (JSON from/to)."""

    map: str
    from_version: int
    to_version: int
    deadline_ms: int
    retain: tuple[TokenRange, ...]
    fetch: tuple[ShardFetch, ...]
    release: tuple[TokenRange, ...]

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        from_version = read_count(r, "from")
        to_version = r.int("to", minimum=1, maximum=MAX_SAFE_INT)
        if to_version != from_version + 1:
            raise ValidationError(r.member("to"), 'must be "from" + 1')
        plan = cls(
            map=_read_map_id(r), from_version=from_version, to_version=to_version,
            deadline_ms=read_positive(r, "deadline_ms"),
            retain=_read_ranges(r, "retain"),
            fetch=tuple(ShardFetch.from_reader(o) for o in r.objects("fetch", max_items=MAX_SHARDS)),
            release=_read_ranges(r, "release"),
        )
        _check_disjoint(plan, r)
        return plan

    def to_json(self) -> dict[str, object]:
        return {
            "map": self.map, "from": self.from_version, "to": self.to_version, "deadline_ms": self.deadline_ms,
            "retain": [list(t) for t in self.retain],
            "fetch": [f.to_json() for f in self.fetch],
            "release": [list(t) for t in self.release],
        }


def _check_disjoint(plan: ReshardPlan, r: ObjectReader) -> None:
    members = ([f"{r.member('retain')}[{i}]" for i in range(len(plan.retain))]
               + [f"{r.member('fetch')}[{i}].tokens" for i in range(len(plan.fetch))]
               + [f"{r.member('release')}[{i}]" for i in range(len(plan.release))])
    ranges = [*plan.retain, *(f.tokens for f in plan.fetch), *plan.release]
    overlap = first_overlap(ranges, inclusive=False)
    if overlap is not None:
        raise ValidationError(members[overlap], "must not overlap another retain, fetch or release range")


@dataclass(frozen=True, slots=True)
class ReshardCommit(JsonRecord):
    """``{"map": ..., "commit": v+1}``: version v+1 is authoritative; release the "release" ranges."""

    map: str
    commit: int

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        return cls(_read_map_id(r), r.int("commit", minimum=1, maximum=MAX_SAFE_INT))

    def to_json(self) -> dict[str, object]:
        return {"map": self.map, "commit": self.commit}


@dataclass(frozen=True, slots=True)
class ReshardAbort(JsonRecord):
    """``{"map": ..., "abort": v+1}``: discard what was fetched for version v+1."""

    map: str
    abort: int

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        return cls(_read_map_id(r), r.int("abort", minimum=1, maximum=MAX_SAFE_INT))

    def to_json(self) -> dict[str, object]:
        return {"map": self.map, "abort": self.abort}


ReshardMessage = ReshardPlan | ReshardCommit | ReshardAbort


def parse_reshard_message(value: object) -> ReshardMessage:
    """Decode a POST reshard body; the one of "from", "commit" or "abort" it carries says which it is."""
    r = ObjectReader(value)
    kinds = [name for name in ("from", "commit", "abort") if r.has(name)]
    if len(kinds) != 1:
        raise ValidationError("$", 'must have exactly one of "from" (a plan), "commit" and "abort"')
    if kinds[0] == "commit":
        return ReshardCommit.from_reader(r)
    if kinds[0] == "abort":
        return ReshardAbort.from_reader(r)
    return ReshardPlan.from_reader(r)


def _sources(need: tuple[TokenRange, ...], old: ShardMap) -> tuple[ShardFetch, ...]:
    """Split needed ranges by their owner in ``old``; adjacent pieces from one owner are joined.

    Tokens that no old shard holds (the context grew) have no source and are left out: the instance
    computes them as new tokens.
    """
    fetch: list[ShardFetch] = []
    for start, end in need:
        for shard in old.shards:
            lo, hi = max(start, shard.tokens[0]), min(end, shard.tokens[1])
            if lo >= hi:
                continue
            if fetch and fetch[-1].source == shard.instance and fetch[-1].tokens[1] == lo:
                fetch[-1] = ShardFetch((fetch[-1].tokens[0], hi), shard.instance)
            else:
                fetch.append(ShardFetch((lo, hi), shard.instance))
    return tuple(fetch)


def plan_reshard(old: ShardMap, new: ShardMap, *, deadline_ms: int) -> dict[str, ReshardPlan]:
    """Each instance's plan for moving from ``old`` to ``new`` (section 6.9).

    retain = what the instance holds in both versions (never transferred); fetch = what it holds
    only in ``new``, from the old owner; release = what it holds only in ``old``.  Every instance of
    either version gets a plan, possibly empty.
    """
    if old.map != new.map:
        raise ValidationError("map", "must be the same map in both versions")
    if new.version != old.version + 1:
        raise ValidationError("version", "new version must be the old version + 1")
    plans: dict[str, ReshardPlan] = {}
    for instance in _union(old.instances(), new.instances()):
        held, wanted = old.ranges_of(instance), new.ranges_of(instance)
        retain = intersect_ranges(held, wanted)
        plans[instance] = ReshardPlan(
            map=old.map, from_version=old.version, to_version=new.version, deadline_ms=deadline_ms,
            retain=retain,
            fetch=_sources(subtract_ranges(wanted, retain), old),
            release=subtract_ranges(held, retain),
        )
    return plans


def _union(*groups: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item for group in groups for item in group))
