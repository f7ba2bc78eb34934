"""Placement and prefetch decisions (spec sections 6.3 and 6.4), with numbers worked by hand."""

from __future__ import annotations

import math

import pytest

from control.pc.core import (
    Assign,
    InstanceRegistry,
    NoPlacement,
    PlacementRequest,
    Placer,
    PlacerConfig,
    Wake,
)
from kvsp.records import (
    InstanceStatus,
    Link,
    LookupResponse,
    PrefetchBlock,
    ReplicaRecord,
    Residency,
    TargetEstimate,
)
from kvsp.registry import InstanceState, Tier

A, S, D = InstanceState.ACTIVE, InstanceState.SLEEPING, InstanceState.DRAINING
II1, II2, II3 = "https://ii1.example/kvsp/", "https://ii2.example/kvsp/", "https://ii3.example/kvsp/"
H1, H2 = "https://h1.example/kvsp/", "https://h2.example/kvsp/"
KEYS = [bytes([i + 1]) * 32 for i in range(4)]
SIZE = 2_000_000  # octets per block
B = 16  # tokens per block
REQ = PlacementRequest(scope_id=bytes(16), compat_id=bytes(32), prompt_tokens=4 * B + 8, request_ref="r-1")


def status(instance: str, *, state: InstanceState = A, queued: int = 0, prefill: float = 10_000.0,
           links: tuple[Link, ...] = (Link(H1, 100_000.0, 10), Link(H2, 10_000.0, 100)),
           kv_utilization: float = 0.5) -> InstanceStatus:
    return InstanceStatus(instance, 1, state, 0, queued, 8, kv_utilization, prefill, 1000.0, links, 3000)


def replica(key: bytes, holder: str) -> ReplicaRecord:
    return ReplicaRecord(key, bytes(32), bytes(16), holder, 1, SIZE, bytes(32), (Residency(Tier.HOST, (0, 31)),), 60000)


def lookup(matched: int = 4, holders: tuple[str, ...] = (H1, H2), targets: tuple[TargetEstimate, ...] = ()
           ) -> LookupResponse:
    return LookupResponse(tuple(tuple(replica(k, h) for h in holders) for k in KEYS[:matched]), targets)


def placer(**kw: object) -> Placer:
    ids = iter(f"00000000-0000-4000-8000-00000000000{i}" for i in range(10))
    return Placer(PlacerConfig(block_tokens=B, **kw), new_id=lambda: next(ids))  # type: ignore[arg-type]


def test_lowest_cost_active_instance_gets_the_request_and_a_prefetch() -> None:
    # ii1: loads 4 blocks from H1: 10 + 4 * 8 * 2e6 / 1e5 = 650 us, then recomputes 8 tokens (800 us)
    #      = 1450 us, against 72 tokens recomputed = 7200 us.  ii2 is the same but has 3 queued requests.
    decision = placer(mean_service_us=1000.0).place(REQ, lookup(), [status(II2, queued=3), status(II1)])
    assert isinstance(decision, Assign) and decision.instance == II1
    assert decision.cost_us == pytest.approx(1450.0)
    directive = decision.prefetch
    assert directive is not None
    assert directive.directive == "00000000-0000-4000-8000-000000000000" and directive.request_ref == "r-1"
    assert directive.blocks == tuple(PrefetchBlock(k, (H1, H2)) for k in KEYS)
    assert directive.deadline_ms == 50  # 0.65 ms x 2, raised to the minimum
    assert directive.lease_ms == 2000 and directive.scope_id == REQ.scope_id and directive.compat_id == REQ.compat_id


def test_no_prefetch_when_recompute_is_cheaper() -> None:
    # Only a slow link (H2 at 10 Mbit/s): 100 + 4 * 8 * 2e6 / 10 = 6.4 s to load, 7.2 ms to recompute.
    slow = status(II1, links=(Link(H2, 10.0, 100),))
    decision = placer().place(REQ, lookup(holders=(H2,)), [slow])
    assert isinstance(decision, Assign) and decision.prefetch is None
    assert decision.cost_us == pytest.approx(7200.0)


def test_no_prefetch_without_a_match() -> None:
    decision = placer().place(REQ, lookup(matched=0), [status(II1)])
    assert isinstance(decision, Assign) and decision.prefetch is None


def test_resident_blocks_are_not_in_the_directive() -> None:
    decision = placer().place(REQ, lookup(), [status(II1)], resident={II1: {KEYS[0], KEYS[1]}})
    assert isinstance(decision, Assign) and decision.prefetch is not None
    assert [b.block_key for b in decision.prefetch.blocks] == KEYS[2:]


def test_directive_never_lists_the_instance_itself_as_a_source() -> None:
    decision = placer(max_sources=1).place(REQ, lookup(holders=(H1, II1)), [status(II2)])
    assert isinstance(decision, Assign) and decision.prefetch is not None
    assert all(b.sources == (H1,) for b in decision.prefetch.blocks)


def test_is_target_estimate_replaces_the_pcs_own() -> None:
    # The PC sees no link to any holder, but the IS says ii1 can load the 4 blocks in 300 us.
    lonely = status(II1, links=())
    decision = placer().place(REQ, lookup(targets=(TargetEstimate(II1, 300.0, 6400.0),)), [lonely])
    assert isinstance(decision, Assign) and decision.cost_us == pytest.approx(300.0 + 800.0)
    assert decision.prefetch is not None and len(decision.prefetch.blocks) == 4
    assert decision.prefetch.blocks[0].sources == (H1, H2)


def test_never_assigns_to_a_non_active_instance() -> None:
    decision = placer().place(REQ, lookup(), [status(II1, state=D), status(II2, state=S)])
    assert isinstance(decision, NoPlacement)


def test_wake_a_sleeping_instance_when_no_active_one_has_capacity() -> None:
    decision = placer(max_queued=2).place(REQ, lookup(), [status(II1, queued=5)], [status(II2, state=S)])
    assert isinstance(decision, Wake) and decision.instance == II2
    assert decision.prefetch is not None and len(decision.prefetch.blocks) == 4


def test_wake_when_the_best_active_cost_is_not_acceptable() -> None:
    p = placer(max_cost_us=2000.0, mean_service_us=1000.0)
    decision = p.place(REQ, lookup(), [status(II1, queued=2)], [status(II2, state=S)])
    assert isinstance(decision, Wake) and decision.cost_us == pytest.approx(1450.0)


def test_unacceptable_active_is_still_better_than_a_costlier_sleeper() -> None:
    p = placer(max_cost_us=100.0)
    sleeper = status(II2, state=S, links=())
    decision = p.place(REQ, lookup(), [status(II1)], [sleeper])
    assert isinstance(decision, Assign) and decision.instance == II1


def test_kv_utilization_limits_capacity() -> None:
    decision = placer(max_kv_utilization=0.9).place(REQ, lookup(), [status(II1, kv_utilization=0.95), status(II2)])
    assert isinstance(decision, Assign) and decision.instance == II2


def test_nothing_at_all_is_no_placement() -> None:
    assert isinstance(placer().place(REQ, lookup(), []), NoPlacement)
    never = status(II1, prefill=0.0, links=())
    assert isinstance(placer().place(REQ, lookup(), [never]), NoPlacement)  # infinite cost


def test_deadline_follows_the_fetch_estimate() -> None:
    # 10 + 4 * 16000 = 64010 us to load; 64 tokens at 500 tokens/s take 128000 us to recompute.
    slowish = status(II1, links=(Link(H1, 1000.0, 10),), prefill=500.0)
    decision = placer(deadline_slack=2.0, lease_ms=100).place(REQ, lookup(holders=(H1,)), [slowish])
    assert isinstance(decision, Assign) and decision.prefetch is not None
    assert decision.prefetch.deadline_ms == math.ceil(64.01 * 2)
    assert decision.prefetch.lease_ms == decision.prefetch.deadline_ms  # a lease outlives the load


def test_with_registry_views() -> None:
    reg = InstanceRegistry()
    reg.report(status(II1), 0.0)
    reg.report(status(II2), 0.0)
    reg.sleep(II1, 0.0)
    reg.report(status(II1, state=S), 0.1)
    decision = placer(max_queued=0).place(REQ, lookup(), reg.eligible(0.1), reg.sleeping(0.1))
    assert isinstance(decision, Assign) and decision.instance == II2
    reg.report(status(II2, queued=4), 0.2)
    decision = placer(max_queued=0).place(REQ, lookup(), reg.eligible(0.2), reg.sleeping(0.2))
    assert isinstance(decision, Wake) and decision.instance == II1
    assert reg.wake(decision.instance, 0.2).state is A  # what the adapter does first on Wake
