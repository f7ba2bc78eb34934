"""BlockStore (sans-I/O): LRU across tiers, capacity, demotion by layer range, lease pinning, retention,
and the event order that keeps the Index Service truthful (Withdraw before Evict)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.holder.store import (
    BlockExistsError,
    BlockId,
    BlockMeta,
    BlockStore,
    Demote,
    Event,
    Evict,
    Place,
    Publish,
    Republish,
    Segment,
    Withdraw,
)
from kvsp.container import LayerRange
from kvsp.registry import Tier
from tests.support.holder import block_id, container, descriptor, meta_of

HOST, DISK = Tier.HOST, Tier.LOCAL_STORAGE
D = descriptor(layers=4, kv_heads=2, head_dim=8, block_tokens=4)  # 128-octet sections, 256 per layer
LAYER = 2 * D.section_length(D.block_tokens)
BLOCK = D.layers * LAYER  # 1024 octets of layer data


@dataclass
class Pins:
    keys: set[bytes] = field(default_factory=set)

    def is_leased(self, block_key: bytes, now: float) -> bool:
        return block_key in self.keys


def meta(n: int) -> BlockMeta:
    return meta_of(block_id(D, n), container(D, n), D)


def store(host: int | None = 2 * BLOCK, disk: int | None = 4 * BLOCK, pins: Pins | None = None,
          retention_s: float = 100.0) -> BlockStore:
    caps = {t: c for t, c in ((HOST, host), (DISK, disk)) if c is not None}
    return BlockStore(caps, retention_s=retention_s, pins=pins or Pins())


def kinds(events: tuple[Event, ...] | list[Event]) -> list[tuple[str, int | None]]:
    names = {block_id(D, n): n for n in range(64)}
    return [(type(e).__name__, names.get(e.block)) for e in events]


def test_put_places_in_the_fastest_tier_and_publishes() -> None:
    s = store()
    out = s.put(meta(1), now=0)
    assert out.tier is HOST
    assert out.events == (Place(meta(1), HOST, LayerRange(0, 3)), Publish(block_id(D, 1)))
    assert s.used(HOST) == BLOCK and s.used(DISK) == 0
    entry = s.get(block_id(D, 1), now=0)
    assert entry is not None and entry.placement == (Segment(HOST, LayerRange(0, 3)),)
    assert entry.meta.size == len(container(D, 1))


def test_second_put_of_a_live_block_is_refused() -> None:
    s = store()
    s.put(meta(1), now=0)
    with pytest.raises(BlockExistsError):
        s.put(meta(1), now=1)


def test_lru_block_is_demoted_whole_when_a_block_needs_its_room() -> None:
    s = store()
    s.put(meta(1), 0)
    s.put(meta(2), 1)
    out = s.put(meta(3), 2)
    assert kinds(out.events) == [("Demote", 1), ("Republish", 1), ("Place", 3), ("Publish", 3)]
    demote = out.events[0]
    assert isinstance(demote, Demote) and demote.layers == LayerRange(0, 3)
    assert (demote.source, demote.target) == (HOST, DISK)
    e1 = s.peek(block_id(D, 1))
    assert e1 is not None and e1.placement == (Segment(DISK, LayerRange(0, 3)),)
    assert s.used(HOST) == 2 * BLOCK and s.used(DISK) == BLOCK


def test_demotion_moves_only_the_top_layers_needed() -> None:
    s = store(host=2 * BLOCK + 2 * LAYER)  # room for 2.5 blocks
    s.put(meta(1), 0)
    s.put(meta(2), 1)
    out = s.put(meta(3), 2)  # needs 2 more layers' worth: the top half of block 1 moves down
    demote = out.events[0]
    assert isinstance(demote, Demote) and demote.layers == LayerRange(2, 3)
    e1 = s.peek(block_id(D, 1))
    assert e1 is not None
    assert e1.placement == (Segment(HOST, LayerRange(0, 1)), Segment(DISK, LayerRange(2, 3)))
    assert e1.octets_in(HOST) == 2 * LAYER and e1.octets_in(DISK) == 2 * LAYER
    assert [(g.tier, g.layers) for g in e1.segments(LayerRange(1, 2))] == [
        (HOST, LayerRange(1, 1)), (DISK, LayerRange(2, 2))]
    # A further squeeze moves the rest of block 1 down and joins the ranges.
    out = s.put(meta(4), 3)  # needs 4 layers: the rest of block 1 (2), then the top of block 2 (2)
    assert kinds(out.events) == [("Demote", 1), ("Republish", 1), ("Demote", 2), ("Republish", 2),
                                 ("Place", 4), ("Publish", 4)]
    e1, e2 = s.peek(block_id(D, 1)), s.peek(block_id(D, 2))
    assert e1 is not None and e1.placement == (Segment(DISK, LayerRange(0, 3)),)
    assert e2 is not None and e2.placement == (Segment(HOST, LayerRange(0, 1)), Segment(DISK, LayerRange(2, 3)))
    assert s.used(HOST) == 10 * LAYER == s.capacity(HOST) and s.used(DISK) == 6 * LAYER


def test_get_refreshes_lru_order() -> None:
    s = store()
    s.put(meta(1), 0)
    s.put(meta(2), 1)
    assert s.get(block_id(D, 1), 2) is not None  # 1 is now the most recently used
    out = s.put(meta(3), 3)
    assert kinds(out.events)[0] == ("Demote", 2)


def test_disk_pressure_evicts_lru_and_withdraws_before_evicting() -> None:
    s = store(host=BLOCK, disk=BLOCK)
    s.put(meta(1), 0)
    s.put(meta(2), 1)  # 1 -> disk
    out = s.put(meta(3), 2)  # 2 -> disk needs room: 1 is evicted
    assert kinds(out.events) == [("Withdraw", 1), ("Evict", 1), ("Demote", 2), ("Republish", 2),
                                 ("Place", 3), ("Publish", 3)]
    evict = out.events[1]
    assert isinstance(evict, Evict) and evict.reason == "capacity"
    assert block_id(D, 1) not in s and s.used(DISK) == BLOCK and s.used(HOST) == BLOCK


def test_host_only_store_evicts_lru() -> None:
    s = store(disk=None)
    s.put(meta(1), 0)
    s.put(meta(2), 1)
    out = s.put(meta(3), 2)
    assert kinds(out.events) == [("Withdraw", 1), ("Evict", 1), ("Place", 3), ("Publish", 3)]


def test_leased_replica_is_never_evicted() -> None:
    pins = Pins()
    s = store(disk=None, pins=pins)
    s.put(meta(1), 0)
    s.put(meta(2), 1)
    pins.keys.add(block_id(D, 1).block_key)  # 1 is the LRU, but leased
    out = s.put(meta(3), 2)
    assert kinds(out.events) == [("Withdraw", 2), ("Evict", 2), ("Place", 3), ("Publish", 3)]
    pins.keys.add(block_id(D, 3).block_key)
    out = s.put(meta(4), 3)  # everything leased: no room, nothing evicted
    assert out.tier is None and out.events == ()
    assert block_id(D, 1) in s and block_id(D, 3) in s


def test_leased_replica_may_be_demoted_but_not_evicted_from_disk() -> None:
    pins = Pins({block_id(D, 1).block_key})
    s = store(host=BLOCK, disk=BLOCK, pins=pins)
    s.put(meta(1), 0)
    out = s.put(meta(2), 1)  # demoting a leased block is allowed
    assert kinds(out.events)[:2] == [("Demote", 1), ("Republish", 1)]
    out = s.put(meta(3), 2)  # 2 cannot go to disk (leased 1 fills it), so 2 is evicted from host
    assert kinds(out.events) == [("Withdraw", 2), ("Evict", 2), ("Place", 3), ("Publish", 3)]
    assert block_id(D, 1) in s


def test_block_larger_than_every_tier_is_refused_without_side_effects() -> None:
    s = store(host=BLOCK // 2, disk=BLOCK // 2)
    out = s.put(meta(1), 0)
    assert out.tier is None and out.events == () and len(s) == 0


def test_goes_straight_to_disk_when_the_block_does_not_fit_in_host() -> None:
    s = store(host=BLOCK // 2, disk=2 * BLOCK)
    out = s.put(meta(1), 0)
    assert out.tier is DISK and out.events == (Place(meta(1), DISK, LayerRange(0, 3)), Publish(block_id(D, 1)))
    assert s.used(DISK) == BLOCK and s.used(HOST) == 0


def test_no_room_when_every_tier_is_pinned() -> None:
    pins = Pins({block_id(D, 1).block_key, block_id(D, 2).block_key})
    s = store(host=BLOCK, disk=BLOCK, pins=pins)
    s.put(meta(1), 0)
    s.put(meta(2), 1)  # leased 1 moves down: moving is not evicting
    out = s.put(meta(3), 2)
    assert out.tier is None and out.events == ()
    assert block_id(D, 1) in s and block_id(D, 2) in s


def test_retention_expiry_and_leases() -> None:
    pins = Pins()
    s = store(retention_s=10, pins=pins)
    s.put(meta(1), 0)
    s.put(meta(2), 5)
    assert s.get(block_id(D, 1), 9.9) is not None
    assert s.get(block_id(D, 1), 10) is None  # expired: no longer served
    pins.keys.add(block_id(D, 1).block_key)
    assert s.get(block_id(D, 1), 10) is not None  # ... unless leased
    assert s.expire(12) == []  # leased: kept
    pins.keys.clear()
    events = s.expire(12)
    assert kinds(events) == [("Withdraw", 1), ("Evict", 1)]
    assert isinstance(events[1], Evict) and events[1].reason == "expired"
    assert s.expire(12) == [] and block_id(D, 2) in s
    assert kinds(s.expire(15)) == [("Withdraw", 2), ("Evict", 2)]
    assert s.used(HOST) == 0


def test_expired_block_can_be_stored_again() -> None:
    s = store(retention_s=10)
    s.put(meta(1), 0)
    out = s.put(meta(1), 11)
    assert kinds(out.events) == [("Withdraw", 1), ("Evict", 1), ("Place", 1), ("Publish", 1)]
    assert s.used(HOST) == BLOCK


def test_force_evict_withdraws_first_even_when_leased() -> None:
    pins = Pins({block_id(D, 1).block_key})
    s = store(pins=pins)
    s.put(meta(1), 0)
    events = s.force_evict(block_id(D, 1))
    assert events == [Withdraw(block_id(D, 1)), Evict(block_id(D, 1), "fault")]
    assert len(s) == 0 and s.used(HOST) == 0
    assert s.force_evict(block_id(D, 1)) == []


def test_with_key_finds_entries_across_compat_and_scope() -> None:
    s = store(host=4 * BLOCK)
    m1 = meta(1)
    other = BlockId(m1.block.compat_id, bytes(16), m1.block.block_key)
    s.put(m1, 0)
    s.put(meta_of(other, container(D, 1), D), 0)
    assert {e.block for e in s.with_key(m1.block.block_key, 0)} == {m1.block, other}
    s.force_evict(other)
    assert [e.block for e in s.with_key(m1.block.block_key, 0)] == [m1.block]


# -- invariants under random operation sequences ------------------------------------------------------

OPS = st.lists(st.tuples(st.sampled_from(["put", "get", "lease", "unlease", "expire", "fault"]),
                         st.integers(0, 9)), max_size=60)


@settings(max_examples=150)
@given(ops=OPS, host=st.integers(0, 5), disk=st.integers(0, 5), half=st.booleans())
def test_store_invariants(ops: list[tuple[str, int]], host: int, disk: int, half: bool) -> None:
    """Capacity holds, placements partition the layers (faster tier first), every Evict follows its
    Withdraw, and no leased block is ever evicted except through the fault path."""
    pins = Pins()
    extra = 2 * LAYER if half else 0
    s = store(host=host * BLOCK + extra, disk=disk * BLOCK or None, pins=pins, retention_s=30)
    now = 0.0
    for op, n in ops:
        now += 1
        b = block_id(D, n)
        events: list[Event] = []
        if op == "put" and s.get(b, now, touch=False) is None:
            events = list(s.put(meta(n), now).events)
        elif op == "get":
            s.get(b, now)
        elif op == "lease":
            pins.keys.add(b.block_key)
        elif op == "unlease":
            pins.keys.discard(b.block_key)
        elif op == "expire":
            now += 10
            events = s.expire(now)
        elif op == "fault":
            events = s.force_evict(b)
            assert all(not isinstance(e, Evict) or e.reason == "fault" for e in events)
        _check_events(events, pins, op)
        _check_state(s)


def _check_events(events: list[Event], pins: Pins, op: str) -> None:
    withdrawn: set[BlockId] = set()
    for e in events:
        if isinstance(e, Withdraw):
            withdrawn.add(e.block)
        if isinstance(e, Evict):
            assert e.block in withdrawn
            if op != "fault":
                assert e.block.block_key not in pins.keys
        if isinstance(e, (Publish, Republish, Place, Demote)):
            assert e.block not in withdrawn or isinstance(e, (Place, Publish))


def _check_state(s: BlockStore) -> None:
    used = dict.fromkeys(s.tiers, 0)
    for entry in s:
        layers = [layer for seg in entry.placement for layer in seg.layers]
        assert layers == list(entry.meta.layers)
        order = [s.tiers.index(seg.tier) for seg in entry.placement]
        assert order == sorted(order) and len(set(order)) == len(order)
        for seg in entry.placement:
            used[seg.tier] += entry.meta.octets(seg.layers)
    for tier in s.tiers:
        assert used[tier] == s.used(tier) <= s.capacity(tier)
