"""Sequence shards at the instance (spec section 6.9), alone and driven by the PC's coordinator."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pytest

from control.instance.core import (
    Aborted,
    AckPlan,
    CancelFetches,
    Committed,
    FetchRange,
    PlanFailed,
    ShardAction,
    ShardStore,
)
from control.pc.core import ReshardAction, ReshardCoordinator, SendCommit, SendPlan
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import ReshardAbort, ReshardCommit, ReshardPlan, Shard, ShardFetch, ShardMap, parse_reshard_message

II1, II2, II3 = "https://ii1.example/kvsp/", "https://ii2.example/kvsp/", "https://ii3.example/kvsp/"
MAP = "c3f8e1"
BPT = 4  # octets of KV per token in these tests: the token index as uint32, so content is checkable
V4 = ShardMap(MAP, 4, (Shard((0, 8), II1), Shard((8, 16), II2), Shard((16, 24), II3)))
V5 = ShardMap(MAP, 5, (Shard((0, 12), II1), Shard((12, 24), II2)))


def kv(start: int, end: int) -> bytes:
    return struct.pack(f"<{end - start}I", *range(start, end))


def stores(shard_map: ShardMap = V4) -> dict[str, ShardStore]:
    out = {inst: ShardStore(inst, MAP, shard_map.version, bytes_per_token=BPT) for inst in (II1, II2, II3)}
    for shard in shard_map.shards:
        out[shard.instance].put(shard.tokens, kv(*shard.tokens))
    return out


def content(store: ShardStore) -> bytes:
    return b"".join(bytes(v) for r in store.held() for v in store.read(r))


def plan(instance: str, **kw: object) -> ReshardPlan:
    defaults: dict[str, object] = {"map": MAP, "from_version": 4, "to_version": 5, "deadline_ms": 200,
                                   "retain": (), "fetch": (), "release": ()}
    defaults.update(kw)
    return ReshardPlan(**defaults)  # type: ignore[arg-type]


# -- the store alone --------------------------------------------------------------------------------
def test_retain_only_plan_moves_no_bytes_and_keeps_the_buffer() -> None:
    store = ShardStore(II1, MAP, 4, bytes_per_token=BPT)
    original = bytearray(kv(0, 16))
    store.put((0, 16), original)
    assert store.apply_plan(plan(II1, retain=((0, 8),), release=((8, 16),)), 0.0) == [AckPlan(MAP, 5)]
    [committed] = store.commit(ReshardCommit(MAP, 5), 0.1)
    assert committed == Committed(MAP, 5, ((8, 16),), 8 * BPT)
    assert store.bytes_moved == 0 and store.bytes_retained == 8 * BPT
    [view] = store.read((0, 8))
    assert view.obj is original  # the same memory, not a copy
    original[0:4] = b"\xff" * 4
    assert bytes(store.read((0, 1))[0]) == b"\xff" * 4
    assert store.held() == ((0, 8),) and store.version == 5


def test_acknowledges_only_after_every_fetch() -> None:
    store = ShardStore(II1, MAP, 4, bytes_per_token=BPT)
    store.put((0, 8), kv(0, 8))
    fetch = (ShardFetch((8, 12), II2), ShardFetch((12, 16), II3))
    actions = store.apply_plan(plan(II1, retain=((0, 8),), fetch=fetch), 0.0)
    assert actions == [FetchRange(MAP, 5, (8, 12), II2), FetchRange(MAP, 5, (12, 16), II3)]
    assert store.fetched((8, 12), kv(8, 12), 0.01) == []
    assert store.held() == ((0, 8),)  # v stays in force until the commit; staged apart
    assert store.fetched((12, 16), kv(12, 16), 0.02) == [AckPlan(MAP, 5)]
    assert store.bytes_moved == 8 * BPT
    store.commit(ReshardCommit(MAP, 5), 0.03)
    assert content(store) == kv(0, 16)


def test_abort_discards_everything_fetched() -> None:
    store = ShardStore(II1, MAP, 4, bytes_per_token=BPT)
    store.put((0, 8), kv(0, 8))
    store.apply_plan(plan(II1, retain=((0, 8),), fetch=(ShardFetch((8, 12), II2), ShardFetch((12, 16), II3))), 0.0)
    store.fetched((8, 12), kv(8, 12), 0.01)
    assert store.staged_bytes == 4 * BPT
    actions = store.abort(ReshardAbort(MAP, 5), 0.3)
    assert actions == [CancelFetches(MAP, 5, ((12, 16),)), Aborted(MAP, 5, 4 * BPT)]
    assert store.staged_bytes == 0 and store.version == 4 and content(store) == kv(0, 8)
    assert store.fetched((12, 16), kv(12, 16), 0.4) == []  # late data is dropped, not kept
    assert store.abort(ReshardAbort(MAP, 5), 0.5) == []  # repeated abort


def test_deadline_without_acknowledgement_discards_so_a_lost_abort_leaks_nothing() -> None:
    store = ShardStore(II1, MAP, 4, bytes_per_token=BPT)
    store.put((0, 8), kv(0, 8))
    store.apply_plan(plan(II1, retain=((0, 8),), fetch=(ShardFetch((8, 12), II2),)), 1.0)
    assert store.next_deadline() == pytest.approx(1.2)
    assert store.tick(1.19) == []
    assert store.tick(1.2) == [CancelFetches(MAP, 5, ((8, 12),)), Aborted(MAP, 5, 0)]
    assert store.staged_bytes == 0 and store.next_deadline() is None
    assert store.abort(ReshardAbort(MAP, 5), 1.3) == []


def test_acknowledged_plan_waits_for_commit_or_abort_past_the_deadline() -> None:
    store = ShardStore(II1, MAP, 4, bytes_per_token=BPT)
    store.put((0, 8), kv(0, 8))
    store.apply_plan(plan(II1, retain=((0, 8),), fetch=(ShardFetch((8, 12), II2),)), 0.0)
    store.fetched((8, 12), kv(8, 12), 0.1)
    assert store.tick(5.0) == []  # acknowledged: the PC may have committed; only it decides now
    store.commit(ReshardCommit(MAP, 5), 5.1)
    assert store.held() == ((0, 12),)


def test_failed_fetch_is_reported_and_prevents_acknowledgement() -> None:
    store = ShardStore(II1, MAP, 4, bytes_per_token=BPT)
    store.apply_plan(plan(II1, fetch=(ShardFetch((8, 12), II2),)), 0.0)
    assert store.fetch_failed((8, 12), "connection refused", 0.1) == [PlanFailed(MAP, 5, (8, 12), "connection refused")]
    with pytest.raises(ProblemError) as info:
        store.commit(ReshardCommit(MAP, 5), 0.2)
    assert info.value.problem.kind is ProblemType.PLAN_CONFLICT


@pytest.mark.parametrize(("message", "setup"), [
    (plan(II1, from_version=3, to_version=4), False),
    (plan(II1, retain=((0, 9),)), False),
    (plan(II1, release=((8, 9),)), False),
    (ReshardPlan("other", 4, 5, 200, (), (), ()), False),
    (ReshardCommit(MAP, 5), False),
    (ReshardCommit(MAP, 6), True),
    (ReshardAbort(MAP, 7), False),
    (plan(II1, deadline_ms=100), True),
], ids=["old-version", "retain-not-held", "release-not-held", "other-map", "commit-no-plan",
        "commit-wrong-version", "abort-wrong-version", "different-plan-in-progress"])
def test_messages_that_do_not_match_are_plan_conflicts(message: object, setup: bool) -> None:
    store = ShardStore(II1, MAP, 4, bytes_per_token=BPT)
    store.put((0, 8), kv(0, 8))
    if setup:
        store.apply_plan(plan(II1, retain=((0, 8),)), 0.0)
    with pytest.raises(ProblemError) as info:
        store.handle(message, 0.0)  # type: ignore[arg-type]
    assert info.value.problem.kind is ProblemType.PLAN_CONFLICT


def test_repeated_plan_and_commit_are_idempotent() -> None:
    store = ShardStore(II1, MAP, 4, bytes_per_token=BPT)
    store.put((0, 8), kv(0, 8))
    p = plan(II1, retain=((0, 8),))
    assert store.handle(parse_reshard_message(p.to_json()), 0.0) == [AckPlan(MAP, 5)]
    assert store.handle(p, 0.1) == [AckPlan(MAP, 5)]
    store.handle(parse_reshard_message({"map": MAP, "commit": 5}), 0.2)
    assert store.handle(ReshardCommit(MAP, 5), 0.3) == []


def test_buffers_must_match_the_token_count() -> None:
    store = ShardStore(II1, MAP, 4, bytes_per_token=BPT)
    with pytest.raises(ValueError):
        store.put((0, 8), kv(0, 7))
    store.put((0, 8), kv(0, 8))
    with pytest.raises(ValueError):
        store.put((4, 12), kv(4, 12))  # overlaps


# -- driven by the coordinator ----------------------------------------------------------------------
class Group:
    """The PC's coordinator and three instances' stores, with the adapters' work done in memory."""

    def __init__(self, silent: frozenset[str] = frozenset()) -> None:
        self.coord = ReshardCoordinator()
        self.coord.register(V4)
        self.stores = stores()
        self.silent = silent  # instances whose fetches never complete

    def deliver(self, actions: Sequence[ReshardAction], now: float) -> None:
        for action in actions:
            store = self.stores[action.instance]
            if isinstance(action, SendPlan):
                self.run(action.instance, store.apply_plan(action.plan, now), now)
            elif isinstance(action, SendCommit):
                store.commit(action.commit, now)
            else:
                store.abort(action.abort, now)

    def run(self, instance: str, actions: list[ShardAction], now: float) -> None:
        for action in actions:
            if isinstance(action, FetchRange) and instance not in self.silent:
                data = b"".join(bytes(v) for v in self.stores[action.source].read(action.tokens))
                self.run(instance, self.stores[instance].fetched(action.tokens, data, now), now)
            elif isinstance(action, AckPlan):
                self.deliver(self.coord.ack(instance, action.map, action.version, now), now)


def test_all_acknowledge_then_commit_moves_only_what_changed_owner() -> None:
    group = Group()
    retained_before = {i: [v.obj for v in group.stores[i].read(r)] for i, r in ((II1, (0, 8)), (II2, (12, 16)))}
    group.deliver(group.coord.start(V4, V5, 200, 0.0), 0.0)
    assert group.coord.authoritative(MAP) == V5
    s1, s2, s3 = (group.stores[i] for i in (II1, II2, II3))
    assert (s1.version, s2.version, s3.version) == (5, 5, 5)
    assert content(s1) == kv(0, 12) and content(s2) == kv(12, 24) and s3.held() == ()
    # Bytes moved: only [8,12) to ii1 and [16,24) to ii2; the retained ranges cost nothing.
    assert s1.bytes_moved == 4 * BPT and s2.bytes_moved == 8 * BPT and s3.bytes_moved == 0
    assert [v.obj for v in s1.read((0, 8))] == retained_before[II1]
    assert [v.obj for v in s2.read((12, 16))] == retained_before[II2]


def test_member_that_never_acknowledges_aborts_and_nothing_leaks() -> None:
    group = Group(silent=frozenset({II2}))
    group.deliver(group.coord.start(V4, V5, 200, 0.0), 0.0)
    s1, s2 = group.stores[II1], group.stores[II2]
    assert s1.staged_bytes == 4 * BPT  # ii1 fetched and acknowledged; ii2 never did
    assert group.coord.authoritative(MAP) == V4
    group.deliver(group.coord.tick(0.2), 0.2)
    for inst, store in group.stores.items():
        assert store.version == 4 and store.staged_bytes == 0, inst
    assert content(s1) == kv(0, 8) and content(s2) == kv(8, 16) and content(group.stores[II3]) == kv(16, 24)
    assert group.coord.in_progress(MAP) is None
