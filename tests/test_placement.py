"""Placement cost model (spec section 6.4) and reshard planning (section 6.9), with numbers worked by hand."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Collection, Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvsp.placement as placement_module
from control.pc.core import Assign, NoPlacement, Placement, PlacementRequest, Placer, PlacerConfig, Wake
from kvsp.errors import ValidationError
from kvsp.placement import (
    Estimate,
    FetchPlan,
    PreparedBlocks,
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
    LookupResponse,
    PrefetchBlock,
    PrefetchDirective,
    ReplicaRecord,
    Residency,
    ShardFetch,
    ShardMap,
    TargetEstimate,
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


# -- against a straightforward reference ------------------------------------------------------
# The cost model and the Placer as first written: every candidate priced in full, links found by a
# scan, layer facts derived per use.  The optimised code must give exactly these results.
def _ref_transfer_us(record: ReplicaRecord, link: Link, volume: int) -> float:
    held = sum(entry.layer_count for entry in record.residency)
    if held == 0:
        return 8 * volume / link.mbit_per_s
    total = 0.0
    for entry in record.residency:
        rate = link.mbit_per_s
        if entry.is_storage and entry.read_mbit_per_s is not None:
            rate = min(rate, entry.read_mbit_per_s)
        total += 8 * volume * entry.layer_count / held / rate
    return total


def _ref_link(status: InstanceStatus, holder: str) -> Link | None:
    for link in status.links:
        if link.holder == holder:
            return link
    return None


def _ref_holds_all(record: ReplicaRecord, layers: int) -> bool:
    merged: list[tuple[int, int]] = []
    for first, last in sorted(entry.layers for entry in record.residency):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return layers - 1 >= 0 and any(a <= 0 and layers - 1 <= b for a, b in merged)


def _ref_plan(status: InstanceStatus, blocks: Sequence[Sequence[ReplicaRecord]], resident: Collection[bytes],
              block_bytes: int | None, layers: int | None) -> FetchPlan:
    loads: dict[str, float] = {}
    sources: list[ReplicaRecord | None] = []
    for group in blocks:
        if not group:
            break
        if group[0].block_key in resident or any(r.holder == status.instance for r in group):
            sources.append(None)
            continue
        current = max(loads.values(), default=0.0)
        best: tuple[tuple[float, float, str], ReplicaRecord, float] | None = None
        for record in group:
            link = _ref_link(status, record.holder)
            if link is None or (layers is not None and not _ref_holds_all(record, layers)):
                continue
            volume = record.size if block_bytes is None else block_bytes
            finish = loads.get(record.holder, float(link.rtt_us)) + _ref_transfer_us(record, link, volume)
            rank = (max(current, finish), finish, record.holder)
            if best is None or rank < best[0]:
                best = (rank, record, finish)
        if best is None:
            break
        _, record, finish = best
        loads[record.holder] = finish
        sources.append(record)
    return FetchPlan(max(loads.values(), default=0.0), tuple(sources))


def _ref_estimate(status: InstanceStatus, blocks: Sequence[Sequence[ReplicaRecord]], prompt_tokens: int,
                  block_tokens: int, mean_service_us: float, resident: Collection[bytes], block_bytes: int | None,
                  layers: int | None) -> Estimate:
    plan = _ref_plan(status, blocks, resident, block_bytes, layers)
    residual = recompute_us(status, prompt_tokens - plan.loaded_blocks * block_tokens)
    everything = recompute_us(status, prompt_tokens)
    with_cache = plan.fetch_us + residual
    wait = status.queued * mean_service_us
    return Estimate(status.instance, status.state, wait, plan.fetch_us, residual, everything,
                    wait + min(with_cache, everything), plan.sources,
                    plan.loaded_blocks > 0 and with_cache <= everything)


def _ref_place(cfg: PlacerConfig, ids: Sequence[str], request: PlacementRequest, lookup: LookupResponse,
               active: Sequence[InstanceStatus], sleeping: Sequence[InstanceStatus],
               resident: Mapping[str, Collection[bytes]], service_us: Mapping[str, float]) -> Placement:
    new_id = iter(ids)

    def candidate(status: InstanceStatus) -> tuple[Estimate, int]:
        est = _ref_estimate(status, lookup.replicas, request.prompt_tokens, cfg.block_tokens,
                            service_us.get(status.instance, cfg.mean_service_us), resident.get(status.instance, ()),
                            cfg.block_bytes, cfg.layers)
        target = next((t for t in lookup.targets if t.instance == status.instance), None)
        if target is None or target.fetch_us is None:
            return est, est.loaded_blocks
        residual = recompute_us(status, request.prompt_tokens - lookup.matched * cfg.block_tokens)
        with_cache = target.fetch_us + residual
        uses_cache = lookup.matched > 0 and with_cache <= est.recompute_us
        est = dataclasses.replace(est, fetch_us=target.fetch_us, residual_us=residual, uses_cache=uses_cache,
                                  cost_us=est.wait_us + min(with_cache, est.recompute_us))
        return est, lookup.matched if uses_cache else 0

    def directive(c: tuple[Estimate, int]) -> PrefetchDirective | None:
        est, load_blocks = c
        blocks: list[PrefetchBlock] = []
        for i in range(load_blocks):
            chosen = est.sources[i] if i < len(est.sources) else None
            if i < len(est.sources) and chosen is None:
                continue
            holders = [chosen.holder] if chosen is not None else []
            holders.extend(r.holder for r in lookup.replicas[i])
            sources = tuple([h for h in dict.fromkeys(holders) if h != est.instance][: cfg.max_sources])
            if not sources:
                break
            blocks.append(PrefetchBlock(lookup.replicas[i][0].block_key, sources))
        if not blocks:
            return None
        fetch_ms = est.fetch_us / 1000 if math.isfinite(est.fetch_us) else 0.0
        deadline_ms = max(cfg.min_deadline_ms, math.ceil(fetch_ms * cfg.deadline_slack))
        return PrefetchDirective(next(new_id), request.scope_id, request.compat_id, tuple(blocks), deadline_ms,
                                 max(cfg.lease_ms, deadline_ms), request.request_ref)

    def capacity(s: InstanceStatus) -> bool:
        return (cfg.max_queued is None or s.queued <= cfg.max_queued) and s.kv_utilization <= cfg.max_kv_utilization

    active_c = {c[0].instance: c for c in (candidate(s) for s in active
                                            if s.state is InstanceState.ACTIVE and capacity(s))}
    best = choose_instance(c[0] for c in active_c.values())
    if best is not None and best.cost_us <= cfg.max_cost_us:
        return Assign(best.instance, best.cost_us, directive(active_c[best.instance]))
    finite = [c for c in (candidate(s) for s in sleeping if s.state is InstanceState.SLEEPING)
              if math.isfinite(c[0].cost_us)]
    wake = min(finite, key=lambda c: (c[0].cost_us, c[0].instance), default=None)
    if wake is not None and (best is None or wake[0].cost_us < best.cost_us):
        return Wake(wake[0].instance, wake[0].cost_us, directive(wake))
    if best is not None:
        return Assign(best.instance, best.cost_us, directive(active_c[best.instance]))
    return NoPlacement("no active instance with capacity and no sleeping instance to wake")


# Small pools, so that holders, rates and costs often tie and every tie-break is exercised.
_HOLDERS = [H1, H2, H3, "https://h4.example/kvsp/"]
_INSTANCES = [f"https://ii{i}.example/kvsp/" for i in range(5)]
_residency = st.builds(Residency, st.sampled_from(list(Tier)),
                       st.tuples(st.integers(0, 7), st.integers(0, 3)).map(lambda p: (p[0], min(7, p[0] + p[1]))),
                       st.sampled_from([None, None, 500.0, 1000.0, 4000.0]))
# Negative RTTs and zero-layer residency are not valid on the wire; they exercise the plain path.
_rtt = st.sampled_from([0, 5, 10, 10, 40]) | st.sampled_from([-3000, -7, 0])
_link = st.builds(Link, st.sampled_from(_HOLDERS + _INSTANCES[:1]), st.sampled_from([1000.0, 2000.0, 4000.0]), _rtt)


@st.composite
def _statuses(draw: st.DrawFn, sound: bool) -> InstanceStatus:
    links = draw(st.lists(_link, max_size=5))  # repeated holders: the first link counts
    if sound:
        links = [dataclasses.replace(link, rtt_us=abs(link.rtt_us)) for link in links]
    state = draw(st.sampled_from([InstanceState.ACTIVE] * 4 + [InstanceState.SLEEPING] * 2 + list(InstanceState)))
    return InstanceStatus(draw(st.sampled_from(_INSTANCES)), 1, state, 0,
                          draw(st.integers(0, 3)), 8, draw(st.sampled_from([0.0, 0.5, 0.5, 1.0])),
                          draw(st.sampled_from([0.0, 1000.0, 4000.0, 1e6])), 1.0, tuple(links), 3000)


@st.composite
def _blocks(draw: st.DrawFn, sound: bool) -> list[tuple[ReplicaRecord, ...]]:
    groups = []
    for b in range(draw(st.integers(0, 6))):
        group = []
        for _ in range(draw(st.integers(0 if b else 1, 3))):
            residency = draw(st.lists(_residency, min_size=1 if sound else 0, max_size=3))
            holder = draw(st.sampled_from(_HOLDERS + _INSTANCES[:2]))
            size = draw(st.sampled_from([0, 1000, 4096, 1 << 20]))
            group.append(ReplicaRecord(KEYS[b], bytes(32), bytes(16), holder, 1, size, bytes(32), tuple(residency),
                                       60000))
        groups.append(tuple(group))
    return groups


@settings(max_examples=300)
@given(st.booleans().flatmap(lambda sound: st.tuples(st.lists(_statuses(sound), min_size=1, max_size=4),
                                                     _blocks(sound))),
       st.sampled_from([None, 4, 8]), st.sampled_from([None, 2048]), st.integers(0, 20), st.sampled_from([1, 16]),
       st.sets(st.sampled_from(KEYS[:6])))
def test_cost_model_equals_the_reference(case: tuple[list[InstanceStatus], list[tuple[ReplicaRecord, ...]]],
                                         layers: int | None, block_bytes: int | None, extra: int,
                                         block_tokens: int, resident: set[bytes]) -> None:
    statuses, blocks = case
    prompt = len(blocks) * block_tokens + extra
    prepared = PreparedBlocks(blocks, block_bytes=block_bytes, layers=layers)
    for s in statuses:
        ref = _ref_plan(s, blocks, resident, block_bytes, layers)
        assert plan_fetch(s, blocks, resident=resident, block_bytes=block_bytes, layers=layers) == ref
        assert prepared.plan(s, resident) == ref
        loadable = ref.loaded_blocks == len(blocks)
        assert fetch_us(s, blocks, resident=resident, block_bytes=block_bytes, layers=layers) == (
            ref.fetch_us if loadable else math.inf)
        est = estimate(s, blocks, prompt_tokens=prompt, block_tokens=block_tokens, mean_service_us=100.0,
                       resident=resident, block_bytes=block_bytes, layers=layers)
        assert est == _ref_estimate(s, blocks, prompt, block_tokens, 100.0, resident, block_bytes, layers)
        floor = prepared.floor_us(s, prompt_tokens=prompt, block_tokens=block_tokens, mean_service_us=100.0)
        assert not math.isfinite(est.cost_us) or floor <= est.cost_us
        target = target_estimate(s, blocks, block_tokens=block_tokens, resident=resident, block_bytes=block_bytes,
                                 layers=layers)
        recompute = recompute_us(s, len(blocks) * block_tokens)
        assert target == TargetEstimate(s.instance, ref.fetch_us if loadable and math.isfinite(ref.fetch_us) else None,
                                        recompute if math.isfinite(recompute) else None)


@settings(max_examples=300)
@given(st.booleans().flatmap(lambda sound: st.tuples(st.lists(_statuses(sound), max_size=7),
                                                     st.lists(_statuses(sound), max_size=3), _blocks(sound))),
       st.sampled_from([None, 8]), st.sampled_from([None, 2048]), st.integers(0, 20),
       st.lists(st.tuples(st.sampled_from(_INSTANCES), st.sampled_from([None, 0.0, 30.0, 1e4, -3000.0])), max_size=4),
       st.dictionaries(st.sampled_from(_INSTANCES), st.sets(st.sampled_from(KEYS[:6])), max_size=3),
       st.dictionaries(st.sampled_from(_INSTANCES), st.sampled_from([0.0, 50.0, 5000.0]), max_size=3),
       st.sampled_from([math.inf, 3000.0]), st.sampled_from([None, 1]))
def test_placer_equals_the_reference(case: tuple[list[InstanceStatus], list[InstanceStatus],
                                                 list[tuple[ReplicaRecord, ...]]],
                                     layers: int | None, block_bytes: int | None, extra: int,
                                     targets: list[tuple[str, float | None]], resident: dict[str, set[bytes]],
                                     service_us: dict[str, float], max_cost_us: float, max_queued: int | None) -> None:
    active, sleeping, blocks = case
    while blocks and not blocks[-1]:
        blocks.pop()  # a lookup's groups are never empty; an empty one mid-way stays (code-built)
    lookup = LookupResponse(tuple(blocks), tuple(TargetEstimate(i, f, None) for i, f in targets))
    cfg = PlacerConfig(block_tokens=16, mean_service_us=100.0, max_cost_us=max_cost_us, max_queued=max_queued,
                       max_kv_utilization=0.5, layers=layers, block_bytes=block_bytes)
    request = PlacementRequest(bytes(16), bytes(32), len(blocks) * 16 + extra, "r")
    ids = [f"00000000-0000-4000-8000-00000000000{i}" for i in range(10)]
    it = iter(ids)
    decision = Placer(cfg, new_id=lambda: next(it)).place(request, lookup, active, sleeping, resident=resident,
                                                          service_us=service_us)
    assert decision == _ref_place(cfg, ids, request, lookup, active, sleeping, resident, service_us)


def test_placer_prunes_candidates_whose_wait_alone_loses(monkeypatch: pytest.MonkeyPatch) -> None:
    # 50 instances, queued 0..49 at 1 ms each: only the idle one can win, and few are priced.
    blocks = [[replica(k, H1), replica(k, H2)] for k in KEYS[:4]]
    active = [status(instance=f"https://ii{q}.example/kvsp/", queued=q) for q in range(50)]
    lookup = LookupResponse(tuple(tuple(g) for g in blocks))
    planned: list[str] = []
    plan_fast = PreparedBlocks._plan_fast

    def counting(self: PreparedBlocks, instance: str, *args: object) -> FetchPlan | None:
        planned.append(instance)
        return plan_fast(self, instance, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(PreparedBlocks, "_plan_fast", counting)
    cfg = PlacerConfig(block_tokens=16, mean_service_us=1000.0)
    request = PlacementRequest(bytes(16), bytes(32), 4 * 16 + 8, "r")
    decision = Placer(cfg, new_id=lambda: "id").place(request, lookup, active)
    assert isinstance(decision, Assign) and decision.instance == "https://ii0.example/kvsp/"
    assert 0 < len(planned) < 5
    monkeypatch.undo()
    assert decision == _ref_place(cfg, ["id"], request, lookup, active, (), {}, {})


def test_placer_keeps_a_tie_found_late() -> None:
    # ii3 is priced first (bound 0) at cost 100; ii1 (bound 60: 1 queued at 60 us) also costs 60 + 40 = 100
    # and wins the tie on its URI, so its plan must not stop when its partial cost reaches the best one.
    def idle(instance: str, queued: int, rtt: int) -> InstanceStatus:
        return InstanceStatus(instance, 1, InstanceState.ACTIVE, 0, queued, 8, 0.5, 42000.0, 1.0,
                              (Link(H1, 200000.0, rtt),), 3000)

    a, b = idle(_INSTANCES[3], 0, 100), idle(_INSTANCES[1], 1, 40)
    lookup = LookupResponse(((replica(KEYS[0], H1, size=0),),))
    cfg = PlacerConfig(block_tokens=16, mean_service_us=100.0)
    request = PlacementRequest(bytes(16), bytes(32), 16, "r")
    service = {b.instance: 60.0}
    decision = Placer(cfg, new_id=lambda: "id").place(request, lookup, [a, b], service_us=service)
    assert decision == _ref_place(cfg, ["id"], request, lookup, [a, b], (), {}, service)
    assert isinstance(decision, Assign) and decision.instance == b.instance and decision.cost_us == 100.0


def test_placer_prices_a_candidate_without_a_bound() -> None:
    # A negative fetch estimate (only in code: the parser refuses it) voids the bound wait + tail.
    a, b = status(instance=_INSTANCES[1], queued=3), status(instance=_INSTANCES[2], queued=0)
    lookup = LookupResponse(((replica(KEYS[0], H1),),), (TargetEstimate(a.instance, -3000.0, None),))
    cfg = PlacerConfig(block_tokens=16, mean_service_us=100.0)
    request = PlacementRequest(bytes(16), bytes(32), 16 + 5, "r")
    decision = Placer(cfg, new_id=lambda: "id").place(request, lookup, [a, b])
    assert decision == _ref_place(cfg, ["id"], request, lookup, [a, b], (), {}, {})
    assert isinstance(decision, Assign) and decision.instance == a.instance


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


def test_transfer_times_derived_for_a_link_set_serve_later_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Transfer times are kept per link set and replica profile: later requests with other sizes, residency,
    holders and block counts still plan exactly as the reference does, also after the profile numbers are
    forgotten and handed out afresh."""
    monkeypatch.setattr(placement_module, "_MAX_SHARES_IDS", 3)
    s = status()
    storage = (Residency(Tier.DEVICE, (0, 15)), Residency(Tier.LOCAL_STORAGE, (16, 31), 20_000.0))
    requests = [
        [(replica(KEYS[0], H1), replica(KEYS[0], H2)), (replica(KEYS[1], H2, *storage),)],
        [(replica(KEYS[0], H2, size=MIB2 // 2), replica(KEYS[0], H1, *storage)),
         (replica(KEYS[1], H1), replica(KEYS[1], H2), replica(KEYS[1], H3))],
        [(replica(KEYS[2], H3), replica(KEYS[2], H1, size=7)), (replica(KEYS[3], H1, *storage, size=3),)],
        [(replica(KEYS[0], H1), replica(KEYS[0], H2)), (replica(KEYS[1], H2, *storage),)],
    ]
    for _ in range(2):
        for blocks in requests:
            for block_bytes in (None, 4096):
                prepared = PreparedBlocks(blocks, block_bytes=block_bytes, layers=32)
                assert prepared.plan(s) == _ref_plan(s, blocks, (), block_bytes, 32)
    assert s.link_index().derived  # they were kept
