"""The sans-I/O replica index and status board (spec sections 6.1-6.3), with explicit ``now`` values."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control.index.encode import WRITTEN_MEMBERS, lookup_json
from control.index.status import StatusBoard
from control.index.store import ReplicaIndex
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import (
    InstanceStatus,
    Link,
    LookupResponse,
    ReplicaRecord,
    Residency,
    TargetEstimate,
    digest_of_layers,
)
from kvsp.registry import InstanceState, Tier

SCOPE = bytes.fromhex("6d1c6481cd428737da312c089db3832a")
OTHER_SCOPE = bytes(16)
COMPAT = bytes.fromhex("5ed5c2f238839655d7c4029e12b7f31caf9e7421f4edb4057feee6dab760ee0f")
OTHER_COMPAT = bytes(32)
H1 = "https://h1.example/kvsp/"
H2 = "https://h2.example/kvsp/"


def key(i: int) -> bytes:
    return hashlib.sha256(b"key" + i.to_bytes(8, "big")).digest()


def record(i: int, holder: str = H1, *, ttl_ms: int = 10_000, scope: bytes = SCOPE,
           compat: bytes = COMPAT) -> ReplicaRecord:
    return ReplicaRecord(block_key=key(i), compat_id=compat, scope_id=scope, holder=holder, codec=1,
                         size=2 << 20, digest=hashlib.sha256(key(i)).digest(),
                         residency=(Residency(Tier.HOST, (0, 31)),), ttl_ms=ttl_ms)


def index(ttl_ms_max: int = 600_000, **kw: int) -> ReplicaIndex:
    return ReplicaIndex(ttl_ms_max=ttl_ms_max, **kw)


def publish(ix: ReplicaIndex, rec: ReplicaRecord, now: float) -> bool:
    return ix.put(rec, role_id(rec.holder), now).created


def lookup(ix: ReplicaIndex, keys: list[bytes], now: float, *, scope: bytes = SCOPE,
           compat: bytes = COMPAT) -> list[tuple[ReplicaRecord, ...]]:
    return ix.lookup(scope, compat, keys, now)


# -- publish and lookup ------------------------------------------------------------------------------
def test_longest_prefix_returns_every_leading_key() -> None:
    ix = index()
    for i in range(4):
        publish(ix, record(i), 0.0)
    groups = lookup(ix, [key(i) for i in range(4)], 1.0)
    assert [g[0].block_key for g in groups] == [key(i) for i in range(4)]


def test_lookup_stops_at_first_key_without_replica() -> None:
    ix = index()
    for i in (0, 1, 3, 4):  # key 2 is missing; 3 and 4 must not be returned although present
        publish(ix, record(i), 0.0)
    groups = lookup(ix, [key(i) for i in range(5)], 1.0)
    assert len(groups) == 2
    assert lookup(ix, [key(2), key(3)], 1.0) == []


def test_first_key_missing_matches_nothing() -> None:
    ix = index()
    publish(ix, record(1), 0.0)
    assert lookup(ix, [key(0), key(1)], 0.0) == []


def test_compat_mismatch_is_a_miss() -> None:
    ix = index()
    publish(ix, record(0), 0.0)
    publish(ix, record(1, compat=OTHER_COMPAT), 0.0)
    assert lookup(ix, [key(0)], 0.0, compat=OTHER_COMPAT) == []
    assert len(lookup(ix, [key(0), key(1)], 0.0)) == 1  # key 1 exists, but under another compat


def test_other_scope_is_a_miss() -> None:
    ix = index()
    publish(ix, record(0, scope=OTHER_SCOPE), 0.0)
    assert lookup(ix, [key(0)], 0.0) == []
    assert len(lookup(ix, [key(0)], 0.0, scope=OTHER_SCOPE)) == 1


def test_many_holders_per_key() -> None:
    ix = index()
    holders = [f"https://h{n}.example/kvsp/" for n in range(50)]
    for h in holders:
        assert publish(ix, record(0, h), 0.0)
    (group,) = lookup(ix, [key(0)], 0.0)
    assert [r.holder for r in group] == holders
    assert ix.delete(role_id(holders[7]), key(0), 0.0)
    (group,) = lookup(ix, [key(0)], 0.0)
    assert len(group) == 49 and holders[7] not in {r.holder for r in group}
    assert len(ix) == 49


def test_prefix_only_counts_replicas_of_the_request() -> None:
    ix = index()
    publish(ix, record(0, H1), 0.0)
    publish(ix, record(0, H2, scope=OTHER_SCOPE), 0.0)
    (group,) = lookup(ix, [key(0)], 0.0)
    assert [r.holder for r in group] == [H1]


# -- TTL, refresh, expiry ----------------------------------------------------------------------------
def test_expiry_without_sleeping() -> None:
    ix = index()
    publish(ix, record(0, ttl_ms=1000), 100.0)
    assert len(lookup(ix, [key(0)], 100.999)) == 1
    assert lookup(ix, [key(0)], 101.0) == []  # expires at exactly now + ttl
    assert len(ix) == 0  # the lookup removed what it found expired


def test_refresh_extends_expiry() -> None:
    ix = index()
    publish(ix, record(0, ttl_ms=1000), 0.0)
    assert not publish(ix, record(0, ttl_ms=1000), 0.9)  # a refresh, not a second record
    assert len(lookup(ix, [key(0)], 1.5)) == 1
    assert lookup(ix, [key(0)], 1.9) == []


def test_ttl_is_capped_and_the_capped_record_is_stored() -> None:
    ix = index(ttl_ms_max=5000)
    stored = ix.put(record(0, ttl_ms=600_000), role_id(H1), 0.0)
    assert stored.created and stored.ttl_ms == 5000 and stored.record.ttl_ms == 5000
    assert lookup(ix, [key(0)], 4.9)[0][0].ttl_ms == 5000
    assert lookup(ix, [key(0)], 5.0) == []


def test_ttl_below_cap_is_kept() -> None:
    stored = index(ttl_ms_max=5000).put(record(0, ttl_ms=1234), role_id(H1), 0.0)
    assert stored.ttl_ms == 1234


def test_refresh_is_idempotent() -> None:
    ix = index()
    rec = record(0)
    first = ix.put(rec, role_id(H1), 0.0)
    for t in range(1, 20):
        again = ix.put(rec, role_id(H1), float(t))
        assert not again.created and again.record == first.record
    assert len(ix) == 1 and ix.stats.created == 1 and ix.stats.refreshed == 19
    assert ix.heap_size == 1  # extending refreshes push nothing
    assert lookup(ix, [key(0)], 20.0) == [(first.record,)]


def test_refresh_can_move_the_record_to_another_scope() -> None:
    ix = index()
    publish(ix, record(0), 0.0)
    publish(ix, record(0, scope=OTHER_SCOPE), 1.0)
    assert lookup(ix, [key(0)], 1.0) == []
    assert len(lookup(ix, [key(0)], 1.0, scope=OTHER_SCOPE)) == 1
    assert len(ix) == 1


def test_sweep_reschedules_refreshed_records() -> None:
    ix = index()
    publish(ix, record(0, ttl_ms=1000), 0.0)
    publish(ix, record(0, ttl_ms=1000), 0.5)  # expires at 1.5; the heap item still says 1.0
    assert ix.sweep(1.2) == 0 and len(ix) == 1
    assert ix.sweep(1.6) == 1 and len(ix) == 0


def test_shortened_ttl_is_swept_at_the_new_time() -> None:
    ix = index()
    publish(ix, record(0, ttl_ms=10_000), 0.0)
    publish(ix, record(0, ttl_ms=1000), 0.0)
    assert ix.sweep(1.5) == 1 and len(ix) == 0
    assert ix.sweep(20.0) == 0  # the stale item of the long TTL is dropped without effect


def test_sweep_is_bounded_per_call_and_frees_everything() -> None:
    ix = index()
    for i in range(5000):
        publish(ix, record(i, ttl_ms=1000), 0.0)
    publish(ix, record(99_999, ttl_ms=100_000), 0.0)
    assert ix.sweep(2.0, limit=1000) == 1000
    assert ix.due(2.0)
    while ix.due(2.0):
        ix.sweep(2.0, limit=1000)
    assert len(ix) == 1 and ix.heap_size == 1 and len(ix._by_key) == 1
    assert ix.stats.expired == 5000


def test_churn_keeps_the_heap_bounded() -> None:
    """Withdraw/re-publish and alternating TTLs leave stale heap items; compaction bounds them."""
    ix = index()
    for t in range(20_000):
        rec = record(t % 10, ttl_ms=1000 if t % 2 else 100_000)
        publish(ix, rec, t * 1e-3)
        if t % 3 == 0:
            ix.delete(role_id(H1), rec.block_key, t * 1e-3)
        assert ix.heap_size <= 2 * len(ix) + 1025
    assert len(ix) <= 10


def test_delete() -> None:
    ix = index()
    publish(ix, record(0, ttl_ms=1000), 0.0)
    publish(ix, record(0, H2, ttl_ms=1000), 0.0)
    assert ix.delete(role_id(H1), key(0), 0.5)
    assert not ix.delete(role_id(H1), key(0), 0.5)
    assert not ix.delete(role_id(H1), key(1), 0.5)
    assert not ix.delete(role_id(H2), key(0), 1.0)  # expired: nothing to withdraw, but it is removed
    assert len(ix) == 0 and ix.stats.withdrawn == 1 and ix.stats.expired == 1
    assert ix.sweep(10.0) == 0 and ix.heap_size == 0


def test_get_sees_only_unexpired_records() -> None:
    ix = index()
    publish(ix, record(0, ttl_ms=1000), 0.0)
    assert ix.get(role_id(H1), key(0), 0.5) is not None
    assert ix.get(role_id(H2), key(0), 0.5) is None
    assert ix.get(role_id(H1), key(0), 1.0) is None


def test_capacity_refuses_new_records_but_not_refreshes() -> None:
    ix = index(capacity=2)
    publish(ix, record(0), 0.0)
    publish(ix, record(1), 0.0)
    assert not publish(ix, record(1), 1.0)
    with pytest.raises(ProblemError) as exc:
        publish(ix, record(2), 1.0)
    assert exc.value.problem.status == 507
    assert len(ix) == 2


def test_shared_identifiers_are_stored_once() -> None:
    ix = index()
    a = ix.put(record(0), role_id(H1), 0.0).record
    other = dataclasses.replace(record(1), compat_id=bytes(COMPAT), scope_id=bytes(SCOPE), holder=str(H1 + " ")[:-1])
    b = ix.put(other, role_id(H1), 0.0).record
    assert b.compat_id is a.compat_id and b.scope_id is a.scope_id and b.holder is a.holder
    assert b.residency is a.residency


# -- lookup cost -------------------------------------------------------------------------------------
class CountingDict(dict[bytes, object]):
    probes = 0

    def get(self, k: bytes, default: object = None) -> object:
        type(self).probes += 1
        return super().get(k, default)


@pytest.mark.parametrize("size", [10, 100_000])
def test_lookup_touches_only_requested_keys(size: int) -> None:
    ix = index()
    for i in range(size):
        publish(ix, record(1000 + i), 0.0)
    for i in range(4):
        publish(ix, record(i), 0.0)
    ix._by_key = CountingDict(ix._by_key)  # type: ignore[assignment]
    CountingDict.probes = 0
    groups = lookup(ix, [key(i) for i in range(8)], 1.0)
    assert len(groups) == 4
    assert CountingDict.probes == 5  # four hits and the first miss, whatever the index size


# -- the lookup answer's JSON text ---------------------------------------------------------------------
def _varied_records() -> list[ReplicaRecord]:
    digests = tuple(hashlib.sha256(bytes([n])).digest() for n in range(4))
    layered = dataclasses.replace(
        record(1), layer_digests=digests, digest=digest_of_layers(digests),
        residency=(Residency(Tier.DEVICE, (0, 1)), Residency(Tier.LOCAL_STORAGE, (2, 3), read_mbit_per_s=1.5e-3)))
    relay = "moqt://relay.example:4443/kvsp"
    moqt = dataclasses.replace(record(2, relay), moqt_namespace=TrackNamespace(COMPAT, SCOPE, role_id(H1), key(2)),
                               residency=(Residency(Tier.HOST, (0, 31), read_mbit_per_s=400000.0),))
    odd_holder = record(3, 'https://h.example/a"b\\c/')
    return [record(0), layered, moqt, odd_holder]


def test_lookup_json_is_the_canonical_response() -> None:
    groups = [(r,) for r in _varied_records()] + [(record(4), record(4, H2))]
    assert lookup_json(groups, ()) == LookupResponse(tuple(groups)).to_bytes()
    targets = (TargetEstimate("https://ii7.example/kvsp/", 850.5, None),
               TargetEstimate("https://ii9.example/", None, 3.0))
    parsed = LookupResponse.from_bytes(lookup_json(groups, targets))
    assert parsed == LookupResponse(tuple(groups), targets)


def test_lookup_json_writes_every_record_member() -> None:
    """Fails when ReplicaRecord gains a member that the lookup encoder would silently drop."""
    assert {f.name for f in dataclasses.fields(ReplicaRecord)} == WRITTEN_MEMBERS


# -- against a reference model -----------------------------------------------------------------------
OPS = st.lists(st.tuples(st.sampled_from(["put", "delete", "lookup", "sweep"]), st.integers(0, 5),
                         st.integers(0, 2), st.integers(1, 3000), st.floats(0, 0.8)), max_size=60)


@given(OPS)
def test_agrees_with_a_naive_model(ops: list[tuple[str, int, int, int, float]]) -> None:
    """Any sequence of operations gives the answers of a dict scanned in full."""
    ix = index(ttl_ms_max=2000)
    model: dict[tuple[int, int], tuple[ReplicaRecord, float]] = {}
    holders = [H1, H2, "https://h3.example/kvsp/"]
    now = 0.0
    for op, k, h, ttl, step in ops:
        now += step
        if op == "put":
            stored = ix.put(record(k, holders[h], ttl_ms=ttl), role_id(holders[h]), now)
            assert stored.created == ((k, h) not in model or model[(k, h)][1] <= now)
            model[(k, h)] = (stored.record, now + min(ttl, 2000) / 1000)
        elif op == "delete":
            live = (k, h) in model and model[(k, h)][1] > now
            assert ix.delete(role_id(holders[h]), key(k), now) == live
            model.pop((k, h), None)
        elif op == "sweep":
            ix.sweep(now, limit=3)
        expected: list[set[str]] = []
        for i in range(6):
            found = {holders[j] for j in range(3) if (i, j) in model and model[(i, j)][1] > now}
            if not found:
                break
            expected.append(found)
        assert [{r.holder for r in g} for g in lookup(ix, [key(i) for i in range(6)], now)] == expected
        assert ix.heap_size <= 2 * len(ix) + 1025


# -- status board ------------------------------------------------------------------------------------
def status(epoch: int, *, ttl_ms: int = 3000, state: InstanceState = InstanceState.ACTIVE) -> InstanceStatus:
    return InstanceStatus(instance="https://ii7.example/kvsp/", epoch=epoch, state=state, running=1, queued=0,
                          batch_size=8, kv_utilization=0.5, prefill_tokens_per_s=40_000.0,
                          decode_tokens_per_s=3000.0, links=(Link(H1, 200_000.0, 12),), ttl_ms=ttl_ms)


def test_board_expiry_and_refresh() -> None:
    board = StatusBoard()
    board.put(status(5), 0.0)
    assert board.get("https://ii7.example/kvsp/", 2.9) == status(5)
    board.put(status(5), 2.0)  # equal epoch: the same run reporting again
    assert board.get("https://ii7.example/kvsp/", 4.9) is not None
    assert board.get("https://ii7.example/kvsp/", 5.0) is None
    assert board.get("https://other.example/", 0.0) is None


def test_board_discards_lower_epoch() -> None:
    board = StatusBoard()
    board.put(status(7), 0.0)
    with pytest.raises(ProblemError) as exc:
        board.put(status(6, state=InstanceState.DRAINING), 1.0)
    assert exc.value.problem.kind is ProblemType.STALE_EPOCH
    assert board.get("https://ii7.example/kvsp/", 1.0) == status(7)
    board.put(status(8), 1.0)  # a restart
    assert board.highest_epoch("https://ii7.example/kvsp/") == 8


def test_board_remembers_epoch_after_expiry() -> None:
    board = StatusBoard()
    board.put(status(7), 0.0)
    assert board.sweep(10.0) == 1 and len(board) == 0
    with pytest.raises(ProblemError):
        board.put(status(6), 11.0)
    assert board.live(11.0) == []
