"""Fuzz target ``records_shard``: Shard Maps and reshard messages (kvsp/records/shard.py, section 6.9).

Contract: see `fuzz.records`; an accepted map answers ``owner_of`` and ``ranges_of`` consistently;
and for an ``[old, new]`` pair of maps, ``plan_reshard`` either refuses with ``ValidationError`` or
returns plans that are themselves valid reshard messages (their retain, fetch and release ranges
disjoint: they parse back), that retain and fetch exactly what the instance holds in ``new``, and that
retain and release exactly what it holds in ``old``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import check, fuzz_main
from fuzz.records import PLAN, SHARD_MAP, Parser, record_input, record_seeds
from kvsp.encoding import canonical_json, parse_json
from kvsp.errors import ValidationError
from kvsp.records import ReshardPlan, ShardFetch, ShardMap, parse_reshard_message, plan_reshard
from kvsp.records.base import intersect_ranges, merge_ranges

TARGET = "records_shard"
INSTRUMENT = ("kvsp.records", "kvsp.reader", "kvsp.encoding", "kvsp.identifiers", "kvsp.errors")
Plans = tuple[ShardMap, ShardMap, dict[str, ReshardPlan]]


def use_map(shard_map: ShardMap) -> None:
    for shard in shard_map.shards:
        check(shard_map.owner_of(shard.tokens[0]) == shard.instance, "owner_of misses a shard's first token")
    start, end = shard_map.span
    check(shard_map.owner_of(end) is None and (start == 0 or shard_map.owner_of(start - 1) is None),
          "owner_of answers outside the span")
    total = sum(e - s for i in shard_map.instances() for s, e in shard_map.ranges_of(i))
    check(total == end - start, "ranges_of does not cover the span exactly once")


def parse_plans(data: bytes) -> Plans:
    value = parse_json(data)
    if not isinstance(value, list) or len(value) != 2:
        raise ValidationError("$", "must be [old map, new map]")
    old, new = ShardMap.from_json(value[0]), ShardMap.from_json(value[1])
    return old, new, plan_reshard(old, new, deadline_ms=200)


def write_plans(plans: Plans) -> bytes:
    return canonical_json([plans[0].to_json(), plans[1].to_json()])


def use_plans(plans: Plans) -> None:
    old, new, by_instance = plans
    check(set(by_instance) == set(old.instances()) | set(new.instances()), "an instance of either map has no plan")
    for instance, plan in by_instance.items():
        check(parse_reshard_message(parse_json(plan.to_bytes())) == plan, f"the plan for {instance} does not parse")
        kept = merge_ranges([*plan.retain, *(f.tokens for f in plan.fetch)])
        # Tokens of new that no old shard held have no source: the instance computes them (plan_reshard).
        check(kept == intersect_ranges(new.ranges_of(instance), (old.span,)),
              f"retain + fetch of {instance} is not what it holds in new")
        check(merge_ranges([*plan.retain, *plan.release]) == old.ranges_of(instance),
              f"retain + release of {instance} is not what it held in old")
        for fetch in plan.fetch:
            check(any(s <= fetch.tokens[0] and fetch.tokens[1] <= e for s, e in old.ranges_of(fetch.source)),
                  f"{instance} fetches {fetch.tokens} from {fetch.source}, which did not hold them")


PARSERS: list[Parser[Any]] = [
    Parser("map", ShardMap.from_bytes, ShardMap.to_bytes, use_map),
    Parser("message", lambda d: parse_reshard_message(parse_json(d)), lambda m: m.to_bytes()),
    Parser("fetch", ShardFetch.from_bytes, ShardFetch.to_bytes),
    Parser("plans", parse_plans, write_plans, use_plans),
]


def test_one_input(data: bytes) -> None:
    record_input(data, PARSERS)


def seeds() -> list[bytes]:
    moved = {**SHARD_MAP, "version": 5, "shards": [
        {"tokens": [0, 49152], "instance": "https://ii1.example/kvsp/"},
        {"tokens": [49152, 131072], "instance": "https://ii3.example/kvsp/"}]}
    return record_seeds(PARSERS, {
        "map": [SHARD_MAP],
        "message": [PLAN, {"map": "c3f8...e1", "commit": 5}, {"map": "c3f8...e1", "abort": 5}],
        "fetch": [{"tokens": [32768, 49152], "from": "https://ii2.example/kvsp/"}],
        "plans": [[SHARD_MAP, moved]],
    })


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT)
