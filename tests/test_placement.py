"""Placement cost model (spec section 6.4) and reshard planning (section 6.9), with numbers worked by hand."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsp.errors import ValidationError
from kvsp.placement import (
    Estimate,
    choose_instance,
    estimate,
    fetch_us,
    plan_fetch,
    recompute_us,
    target_estimate,
    wait_us,
)
from kvsp.records import (
    InstanceStatus,
    Link,
    ReplicaRecord,
    Residency,
    ShardFetch,
    ShardMap,
    parse_reshard_message,
    plan_reshard,
)
from kvsp.records.shard import Shard
from kvsp.registry import InstanceState, Tier

II = "https://ii7.example/kvsp/"
H1, H2, H3 = "https://h1.example/kvsp/", "https://h2.example/kvsp/", "https://h3.example/kvsp/"
MIB2 = 2_097_152  # the spec example's block size in octets
KEYS = [bytes([i]) * 32 for i in range(8)]


def status(*, state: InstanceState = InstanceState.ACTIVE, prefill: float = 42000.0, queued: int = 3,
           instance: str = II) -> InstanceStatus:
    # Links: H1 at 200000 Mbit/s and 12 us RTT, H2 at 100000 Mbit/s and 50 us; no link to H3.
    return InstanceStatus(instance, 1, state, 0, queued, 8, 0.5, prefill, 3000.0,
                          (Link(H1, 200000.0, 12), Link(H2, 100000.0, 50)), 3000)


def replica(key: bytes, holder: str, *residency: Residency, size: int = MIB2) -> ReplicaRecord:
    tiers = residency or (Residency(Tier.DEVICE, (0, 31)),)
    return ReplicaRecord(key, bytes(32), bytes(16), holder, 1, size, bytes(32), tiers, 60000)


# -- the formula, by hand ---------------------------------------------------------------------
def test_one_block_from_one_source() -> None:
    # rtt + 8 * bytes / mbit_per_s = 12 + 8 * 2097152 / 200000 = 12 + 83.88608
    assert fetch_us(status(), [[replica(KEYS[0], H1)]]) == pytest.approx(95.88608)


def test_greedy_source_choice_spreads_blocks() -> None:
    both = [[replica(k, H1), replica(k, H2)] for k in KEYS[:3]]
    plan = plan_fetch(status(), both)
    # Per block: H1 adds 83.88608 us (after 12 us RTT), H2 adds 167.77216 us (after 50 us RTT).
    # block 0: H1 -> 95.88608 vs H2 -> 217.77216: H1.
    # block 1: H1 -> 179.77216 vs H2 -> 217.77216: H1.
    # block 2: H1 -> 263.65824 vs H2 -> 217.77216: H2; max(179.77216, 217.77216) = 217.77216.
    assert [r.holder for r in plan.sources if r is not None] == [H1, H1, H2]
    assert plan.fetch_us == pytest.approx(217.77216)


def test_storage_tier_is_read_at_its_rate() -> None:
    split = replica(KEYS[0], H1, Residency(Tier.DEVICE, (0, 15)), Residency(Tier.LOCAL_STORAGE, (16, 31), 100000.0))
    # Half the octets at the 200000 Mbit/s link, half at the 100000 Mbit/s storage read rate:
    # 12 + 8 * 1048576 / 200000 + 8 * 1048576 / 100000 = 12 + 41.94304 + 83.88608
    assert fetch_us(status(), [[split]]) == pytest.approx(137.82912)
    remote = replica(KEYS[0], H1, Residency(Tier.REMOTE_STORAGE, (0, 31), 50000.0))
    assert fetch_us(status(), [[remote]]) == pytest.approx(12 + 8 * MIB2 / 50000)


@pytest.mark.parametrize("entry", [
    Residency(Tier.HOST, (0, 31), 50000.0),  # not a storage tier: the spec reduces storage tiers only
    Residency(Tier.LOCAL_STORAGE, (0, 31)),  # storage tier without a stated read rate
    Residency(Tier.LOCAL_STORAGE, (0, 31), 900000.0),  # faster than the link: the link limits
])
def test_rate_is_not_reduced(entry: Residency) -> None:
    assert fetch_us(status(), [[replica(KEYS[0], H1, entry)]]) == pytest.approx(95.88608)


def test_cost_by_hand() -> None:
    both = [[replica(k, H1), replica(k, H2)] for k in KEYS[:3]]
    # 3 blocks of 16 tokens plus a 10-token tail; 42000 tokens/s; 3 queued at 1000 us each.
    est = estimate(status(), both, prompt_tokens=58, block_tokens=16, mean_service_us=1000.0)
    residual = 1e6 * 10 / 42000  # 238.095... us for the tail
    everything = 1e6 * 58 / 42000  # 1380.95... us for the whole prompt
    assert est.wait_us == 3000.0 and est.fetch_us == pytest.approx(217.77216)
    assert est.residual_us == pytest.approx(residual) and est.recompute_us == pytest.approx(everything)
    assert est.cost_us == pytest.approx(3000 + 217.77216 + residual)
    assert est.uses_cache and est.loaded_blocks == 3


def test_recompute_wins_when_fetch_is_slow() -> None:
    slow = InstanceStatus(II, 1, InstanceState.ACTIVE, 0, 0, 8, 0.5, 1e6, 1.0, (Link(H1, 1.0, 0),), 3000)
    # 8 * 2097152 / 1 Mbit/s = 16.8 s against 1e6 * 16 / 1e6 = 16 us of prefill.
    est = estimate(slow, [[replica(KEYS[0], H1)]], prompt_tokens=16, block_tokens=16, mean_service_us=0.0)
    assert est.cost_us == pytest.approx(16.0) and not est.uses_cache and est.loaded_blocks == 0


def test_unreachable_source_is_skipped_and_ends_the_prefix() -> None:
    blocks = [[replica(KEYS[0], H1)], [replica(KEYS[1], H3)], [replica(KEYS[2], H1)]]
    plan = plan_fetch(status(), blocks)
    assert plan.loaded_blocks == 1 and plan.fetch_us == pytest.approx(95.88608)
    assert fetch_us(status(), blocks) == math.inf  # not every matched block can be made resident
    est = estimate(status(), blocks, prompt_tokens=48, block_tokens=16, mean_service_us=0.0)
    assert est.residual_us == pytest.approx(1e6 * 32 / 42000)


def test_resident_blocks_need_no_fetch() -> None:
    blocks = [[replica(KEYS[0], H1)], [replica(KEYS[1], H2), replica(KEYS[1], II)], [replica(KEYS[2], H3)]]
    # Block 0 is in the instance's own set, block 1 has a replica held by the instance itself;
    # block 2 is only at H3 (no link), so it cannot be loaded.
    plan = plan_fetch(status(), blocks, resident={KEYS[0]})
    assert plan.sources == (None, None) and plan.fetch_us == 0.0


def test_layers_and_block_bytes() -> None:
    partial = replica(KEYS[0], H1, Residency(Tier.DEVICE, (0, 15)))
    assert fetch_us(status(), [[partial]], layers=32) == math.inf  # does not hold layers 16..31
    assert fetch_us(status(), [[partial]], layers=16) == pytest.approx(95.88608)
    # bytes_from = block_bytes instead of the record's size: 12 + 8 * 1000000 / 200000 = 52
    assert fetch_us(status(), [[partial]], block_bytes=1_000_000) == pytest.approx(52.0)


def test_recompute_and_wait() -> None:
    assert recompute_us(status(), 42000) == pytest.approx(1e6)
    assert recompute_us(status(prefill=0.0), 1) == math.inf and recompute_us(status(prefill=0.0), 0) == 0.0
    assert wait_us(status(queued=4), 250.0) == 1000.0
    with pytest.raises(ValueError):
        recompute_us(status(), -1)
    with pytest.raises(ValueError):
        estimate(status(), [[replica(KEYS[0], H1)]], prompt_tokens=15, block_tokens=16, mean_service_us=0)


def test_target_estimate() -> None:
    blocks = [[replica(KEYS[0], H1)]]
    target = target_estimate(status(), blocks, block_tokens=16)
    assert target.instance == II and target.fetch_us == pytest.approx(95.88608)
    assert target.recompute_us == pytest.approx(1e6 * 16 / 42000)
    none = target_estimate(status(prefill=0.0), [[replica(KEYS[0], H3)]], block_tokens=16)
    assert none.fetch_us is None and none.recompute_us is None
    assert none.to_bytes() == b'{"fetch_us":null,"instance":"https://ii7.example/kvsp/","recompute_us":null}'


# -- choosing an instance ---------------------------------------------------------------------
def _estimate(instance: str, state: InstanceState, cost: float) -> Estimate:
    return Estimate(instance, state, 0.0, 0.0, 0.0, cost, cost, (), False)


def test_non_active_instances_are_never_chosen() -> None:
    cheap = [_estimate(f"https://ii{i}.example/", s, 1.0) for i, s in enumerate(InstanceState) if s != "active"]
    costly = _estimate("https://busy.example/", InstanceState.ACTIVE, 1e9)
    assert choose_instance([*cheap, costly]) == costly
    assert choose_instance(cheap) is None
    assert choose_instance([_estimate(II, InstanceState.ACTIVE, math.inf)]) is None


def test_ties_are_broken_by_instance_uri() -> None:
    a, b = _estimate("https://a.example/", InstanceState.ACTIVE, 5.0), _estimate("https://b.example/",
                                                                                  InstanceState.ACTIVE, 5.0)
    assert choose_instance([b, a]) == a == choose_instance([a, b])


def test_estimates_feed_choice() -> None:
    blocks = [[replica(KEYS[0], H1)]]
    candidates = [estimate(status(instance=f"https://ii{q}.example/", queued=q), blocks, prompt_tokens=16,
                           block_tokens=16, mean_service_us=100.0) for q in (5, 1, 3)]
    sleeping = estimate(status(state=InstanceState.SLEEPING, queued=0), blocks, prompt_tokens=16,
                        block_tokens=16, mean_service_us=100.0)
    chosen = choose_instance([*candidates, sleeping])
    assert chosen is not None and chosen.instance == "https://ii1.example/"


@given(st.lists(st.tuples(st.sampled_from(list(InstanceState)), st.floats(0, 1e9) | st.just(math.inf)),
                max_size=8))
def test_choice_is_the_cheapest_active(rows: list[tuple[InstanceState, float]]) -> None:
    estimates = [_estimate(f"https://ii{i}.example/", s, c) for i, (s, c) in enumerate(rows)]
    chosen = choose_instance(estimates)
    finite_active = [e for e in estimates if e.state is InstanceState.ACTIVE and math.isfinite(e.cost_us)]
    if not finite_active:
        assert chosen is None
    else:
        assert chosen is not None and chosen.state is InstanceState.ACTIVE
        assert chosen.cost_us == min(e.cost_us for e in finite_active)


# -- plan_reshard (section 6.9) ---------------------------------------------------------------
def shard_map(version: int, *shards: tuple[int, int, str]) -> ShardMap:
    return ShardMap("c3f8...e1", version, tuple(Shard((a, b), uri) for a, b, uri in shards))


I1, I2, I3 = "https://ii1.example/kvsp/", "https://ii2.example/kvsp/", "https://ii3.example/kvsp/"
OLD = shard_map(4, (0, 32768, I1), (32768, 65536, I2), (65536, 98304, I3))


def test_spec_example_plan() -> None:
    new = shard_map(5, (0, 49152, I1), (49152, 98304, I2))
    plans = plan_reshard(OLD, new, deadline_ms=200)
    assert set(plans) == {I1, I2, I3}
    # Exactly the plan the spec shows for ii1.
    assert plans[I1].to_json() == {"map": "c3f8...e1", "from": 4, "to": 5, "deadline_ms": 200,
                                   "retain": [[0, 32768]],
                                   "fetch": [{"tokens": [32768, 49152], "from": I2}], "release": []}
    assert plans[I2].retain == ((49152, 65536),) and plans[I2].release == ((32768, 49152),)
    assert plans[I2].fetch == (ShardFetch((65536, 98304), I3),)
    assert plans[I3].retain == () and plans[I3].fetch == () and plans[I3].release == ((65536, 98304),)


def test_fetch_is_split_by_old_owner_and_growth_has_no_source() -> None:
    new = shard_map(5, (0, 10000, I2), (10000, 120000, I3))
    plans = plan_reshard(OLD, new, deadline_ms=50)
    assert plans[I2].fetch == (ShardFetch((0, 10000), I1),)
    # I3 keeps 65536..98304; 10000..32768 comes from I1, 32768..65536 from I2; 98304..120000 is new.
    assert plans[I3].retain == ((65536, 98304),)
    assert plans[I3].fetch == (ShardFetch((10000, 32768), I1), ShardFetch((32768, 65536), I2))
    assert plans[I1].release == ((0, 32768),)


def test_plan_reshard_rejects_wrong_versions() -> None:
    with pytest.raises(ValidationError) as info:
        plan_reshard(OLD, shard_map(6, (0, 98304, I1)), deadline_ms=1)
    assert info.value.member == "version"
    with pytest.raises(ValidationError) as info:
        plan_reshard(OLD, ShardMap("other", 5, OLD.shards), deadline_ms=1)
    assert info.value.member == "map"


@st.composite
def map_pairs(draw: st.DrawFn) -> tuple[ShardMap, ShardMap]:
    pool = [f"https://ii{i}.example/" for i in range(4)]

    def one(version: int) -> ShardMap:
        cuts = sorted(draw(st.lists(st.integers(0, 200), min_size=2, max_size=7, unique=True)))
        return shard_map(version, *((a, b, draw(st.sampled_from(pool))) for a, b in itertools.pairwise(cuts)))

    return one(7), one(8)


def _inside(ranges: tuple[tuple[int, int], ...], a: int, b: int) -> bool:
    return any(s <= a and b <= e for s, e in ranges)


@given(map_pairs())
def test_plan_reshard_properties(maps: tuple[ShardMap, ShardMap]) -> None:
    old, new = maps
    plans = plan_reshard(old, new, deadline_ms=100)
    assert set(plans) == set(old.instances()) | set(new.instances())
    cuts = sorted({t for m in maps for s in m.shards for t in s.tokens})
    for instance, plan in plans.items():
        assert parse_reshard_message(plan.to_json()) == plan  # valid: disjoint ranges, to == from + 1
        fetched = tuple(f.tokens for f in plan.fetch)
        for a, b in itertools.pairwise(cuts):  # elementary segments: each is inside a range or outside
            was, will = old.owner_of(a) == instance, new.owner_of(a) == instance
            # Retained = held in both versions, and never transferred.
            assert _inside(plan.retain, a, b) == (was and will)
            assert not (_inside(plan.retain, a, b) and _inside(fetched, a, b))
            # Fetch + retain partition the new ranges (except tokens no old shard holds).
            assert _inside(fetched, a, b) == (will and not was and old.owner_of(a) is not None)
            # Retain + release partition the old ranges.
            assert _inside(plan.release, a, b) == (was and not will)
        for f in plan.fetch:
            assert f.source != instance
            assert all(old.owner_of(t) == f.source for t in (f.tokens[0], f.tokens[1] - 1))
