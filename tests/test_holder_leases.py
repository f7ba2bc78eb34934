"""LeaseTable (sans-I/O): grants, quotas on TTL and on leased octets per client, renewal, release,
ownership and expiry by the clock that is passed in."""

from __future__ import annotations

import itertools

import pytest

from control.holder.leases import LeaseQuotaError, LeaseTable, new_lease_id
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import LeaseRenewal, LeaseRequest
from kvsp.records.lease import check_lease_id
from kvsp.service.policy import Quotas

K1, K2, K3 = (bytes([i]) * 32 for i in (1, 2, 3))
SIZES = {K1: 100, K2: 200, K3: 300}
A, B = "https://a.example/", "https://b.example/"


def table(octets: int = 1000, ttl_ms: int = 10_000) -> LeaseTable:
    counter = itertools.count(1)
    return LeaseTable(Quotas(lease_octets_per_client=octets, lease_ttl_ms_max=ttl_ms),
                      new_id=lambda: f"lease-{next(counter)}")


def test_grant_pins_keys_until_expiry() -> None:
    t = table()
    state = t.grant(A, LeaseRequest((K1, K2), 2000), SIZES, now=10)
    assert state.lease_id == "lease-1" and state.octets == 300 and state.expires_at == 12
    assert state.to_record().to_json() == {"lease": "lease-1", "block_keys": [K1.hex(), K2.hex()], "ttl_ms": 2000}
    assert t.is_leased(K1, 11.9) and t.is_leased(K2, 11.9) and not t.is_leased(K3, 11.9)
    assert not t.is_leased(K1, 12)  # expired by the clock, before any sweep
    assert [s.lease_id for s in t.expire(12)] == ["lease-1"] and len(t) == 0


def test_ttl_above_the_maximum_is_a_quota_error() -> None:
    t = table(ttl_ms=5000)
    with pytest.raises(LeaseQuotaError) as info:
        t.grant(A, LeaseRequest((K1,), 5001), SIZES, now=0)
    assert info.value.reason == "ttl"
    assert info.value.problem.kind is ProblemType.LEASE_QUOTA and info.value.problem.status == 429
    t.grant(A, LeaseRequest((K1,), 5000), SIZES, now=0)  # at the limit is fine


def test_leased_octets_quota_is_per_client() -> None:
    t = table(octets=500)
    t.grant(A, LeaseRequest((K1, K2), 1000), SIZES, now=0)  # 300
    with pytest.raises(LeaseQuotaError) as info:
        t.grant(A, LeaseRequest((K3,), 1000), SIZES, now=0)  # 600 > 500
    assert info.value.reason == "octets"
    t.grant(B, LeaseRequest((K3,), 1000), SIZES, now=0)  # another client has its own quota
    assert t.leased_octets(A, 0) == 300 and t.leased_octets(B, 0) == 300
    # Expired leases no longer count.
    t.grant(A, LeaseRequest((K3,), 1000), SIZES, now=1.0)


def test_unknown_keys_are_not_found() -> None:
    t = table()
    with pytest.raises(ProblemError) as info:
        t.grant(A, LeaseRequest((K1, bytes(32)), 1000), SIZES, now=0)
    assert info.value.problem.kind is ProblemType.NOT_FOUND and bytes(32).hex() in str(info.value)
    assert len(t) == 0


def test_renew_extends_and_rechecks_ttl() -> None:
    t = table(ttl_ms=5000)
    state = t.grant(A, LeaseRequest((K1,), 1000), SIZES, now=0)
    renewed = t.renew(A, state.lease_id, LeaseRenewal(4000), now=0.5)
    assert renewed.expires_at == 4.5 and renewed.ttl_ms == 4000
    assert t.is_leased(K1, 4.4)
    with pytest.raises(LeaseQuotaError):
        t.renew(A, state.lease_id, LeaseRenewal(6000), now=1)
    with pytest.raises(ProblemError) as info:
        t.renew(A, state.lease_id, LeaseRenewal(1000), now=4.5)  # expired: gone
    assert info.value.problem.kind is ProblemType.NOT_FOUND


def test_only_the_creator_may_renew_or_release() -> None:
    t = table()
    state = t.grant(A, LeaseRequest((K1,), 1000), SIZES, now=0)
    with pytest.raises(ProblemError) as info:
        t.renew(B, state.lease_id, LeaseRenewal(1000), 0)
    assert info.value.problem.kind is ProblemType.NOT_FOUND
    with pytest.raises(ProblemError) as info:
        t.release(B, state.lease_id, 0)
    assert info.value.problem.kind is ProblemType.NOT_FOUND
    assert t.is_leased(K1, 0.5)
    t.release(A, state.lease_id, 0.5)
    assert not t.is_leased(K1, 0.5) and len(t) == 0
    with pytest.raises(ProblemError):
        t.release(A, state.lease_id, 0.5)


def test_overlapping_leases_pin_until_the_last_one_ends() -> None:
    t = table()
    first = t.grant(A, LeaseRequest((K1,), 1000), SIZES, now=0)
    t.grant(B, LeaseRequest((K1,), 3000), SIZES, now=0)
    t.release(A, first.lease_id, 0.1)
    assert t.is_leased(K1, 2.9) and not t.is_leased(K1, 3.0)


def test_lease_ids_are_random_path_safe_tokens() -> None:
    ids = {new_lease_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(check_lease_id(i) == i and len(i) == 32 for i in ids)
