"""Replica eligibility and cost order for the fetcher (spec sections 6.4 and 6.7), pure functions."""

from __future__ import annotations

from dataclasses import replace

from kvsp.client.ranking import LinkTable, eligible, estimate_us, full_range, needed_range, rank_replicas
from kvsp.container import LayerRange
from kvsp.records import Link, Residency
from kvsp.registry import Tier
from tests.support.client_doubles import LAYERS, key_of, make_container, make_record

DATA = make_container(0)


def record(holder: str, **kw: object):  # type: ignore[no-untyped-def]
    return make_record(holder, key_of(0), DATA, **kw)  # type: ignore[arg-type]


def test_full_and_needed_ranges() -> None:
    whole = record("https://a/")
    assert full_range(whole) == LayerRange(0, LAYERS - 1)
    split = record("https://b/", layer_digests=False,
                   residency=(Residency(Tier.DEVICE, (0, 1)), Residency(Tier.HOST, (2, 3))))
    assert full_range(split) == LayerRange(0, 3)  # adjacent ranges join
    gappy = record("https://c/", layer_digests=False,
                   residency=(Residency(Tier.DEVICE, (0, 0)), Residency(Tier.HOST, (2, 3))))
    assert full_range(gappy) is None
    assert needed_range([whole], LayerRange(1, 2), 99) == LayerRange(1, 2)
    assert needed_range([whole], None, 8) == LayerRange(0, 7)
    assert needed_range([gappy, whole], None, None) == LayerRange(0, LAYERS - 1)
    assert needed_range([gappy], None, None) is None


def test_eligibility() -> None:
    whole = record("https://a/")
    assert eligible(whole, LayerRange(0, 3)) and eligible(whole, LayerRange(1, 2))
    assert not eligible(whole, LayerRange(0, 4))  # beyond its layers
    partial = record("https://b/", residency=(Residency(Tier.HOST, (0, 1)),))
    assert eligible(partial, LayerRange(0, 1)) and not eligible(partial, LayerRange(0, 3))
    bare = record("https://c/", layer_digests=False)
    assert eligible(bare, LayerRange(0, 3))  # whole: the replica digest vouches for it
    assert not eligible(bare, LayerRange(1, 2))  # a range without layer digests: unverifiable


def test_cost_order_uses_links_and_storage_read_rates() -> None:
    near = record("https://near/")
    far = record("https://far/")
    disk = record("https://disk/", tier=Tier.LOCAL_STORAGE, read_mbit_per_s=0.5)
    links = LinkTable.of([Link("https://near/", 1000.0, 10), Link("https://far/", 1000.0, 5000),
                          Link("https://disk/", 1000.0, 10)])
    assert rank_replicas([far, disk, near], links) == (near, far, disk)
    assert estimate_us(near, LayerRange(0, 3), links.to("https://near/")) == 10 + 8 * len(DATA) / 1000


def test_faster_tier_breaks_ties_then_lookup_order() -> None:
    host = record("https://h/")
    device = record("https://d/", tier=Tier.DEVICE)
    mixed = record("https://m/", residency=(Residency(Tier.DEVICE, (0, 1)), Residency(Tier.HOST, (2, 3))))
    links = LinkTable.of()  # every holder on the default link: equal cost
    assert rank_replicas([host, mixed, device], links) == (device, host, mixed)
    # Only layers 0-1 needed: the mixed replica holds them in device memory too.
    assert rank_replicas([host, mixed, device], links, layers=LayerRange(0, 1))[:2] == (mixed, device)


def test_partial_range_volume_is_a_share_of_the_replica() -> None:
    near = record("https://near/")
    link = Link("https://near/", 8.0, 0)  # 1 octet per microsecond
    assert estimate_us(near, LayerRange(0, 0), link) == len(DATA) // LAYERS
    assert estimate_us(replace(near, size=4000), LayerRange(0, 1), link) == 2000


def test_default_link_for_unmeasured_holders() -> None:
    links = LinkTable.of(default_mbit_per_s=1.0, default_rtt_us=7)
    assert links.to("https://x/") == Link("https://x/", 1.0, 7)
    assert rank_replicas([], links) == ()
