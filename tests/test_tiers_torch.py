"""Torch tiers (decision D5): host tensors served as views of their storage, the device tier only with
CUDA, moves between tiers (promotion, demotion, the section 4.4 split) that change the published
residency, measured rates, the ``[holder]`` keys, and the instance's own tiers in the same classes.

Device and pinned-memory tests run only where CUDA is; elsewhere they are skipped with the reason,
and the tests that a CPU machine can make (the device tier refuses to exist, nothing is faked) run.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import numpy as np
import pytest
import torch

from control.deploy.pki import DevPki
from control.holder.app import HOLDER
from control.holder.disk import DiskTier
from control.holder.settings import HolderSettings
from control.holder.store import (
    BlockMeta,
    BlockStore,
    Demote,
    Move,
    Place,
    PlacementError,
    Publish,
    Republish,
    Segment,
)
from control.holder.tiers import HostTier, TierError, joined_range, remaining_range
from control.holder.tierset import TierSet, memory_tiers
from control.holder.torch_tiers import DeviceTier, TorchHostTier, cuda_available, view_of
from control.instance.blocks import HolderBlocks, MemoryBlocks
from kvsp.container import LayerRange, decode_container
from kvsp.errors import ValidationError
from kvsp.registry import Tier
from kvsp.service.config import RoleConfig
from tests.support.holder import (
    block_id,
    container,
    descriptor,
    geometry,
    index_double,
    meta_of,
    restricted_policy,
    write_descriptor,
)
from tests.support.servers import FakeClock, role_config, running

D = descriptor(layers=4, kv_heads=2, head_dim=8, block_tokens=4)
LAYER = 2 * D.section_length(D.block_tokens)  # layer data octets
DATA = D.layers * LAYER
CUDA = cuda_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine: the device tier and pinned "
                                                  "host memory cannot exist here")
PUT_HEADERS = {"If-None-Match": "*", "Content-Type": "application/kvsp-block"}


def block(n: int = 1) -> tuple[BlockMeta, bytes]:
    body = container(D, n)
    return meta_of(block_id(D, n), body, D), body


def data_of(body: bytes, first: int, last: int) -> bytes:
    return bytes(decode_container(body).slice(first, last)[1])


def address(buffer: bytes | memoryview) -> int:
    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)


# -- the torch host tier -----------------------------------------------------------------------------


def test_torch_host_tier_views_the_received_octets_and_serves_views_of_its_storage() -> None:
    meta, body = block()
    tier = TorchHostTier(pin=False)
    tier.put(meta, memoryview(body))
    stored = tier.tensor(meta, meta.layers)
    assert stored is not None and stored.dtype == torch.uint8
    assert stored.data_ptr() == address(body) + meta.header.header_length  # no copy without CUDA
    whole = tier.whole(meta)
    assert whole is not None and bytes(whole) == body and address(whole) == address(body)
    part = tier.read(meta, LayerRange(1, 2))
    assert part is not None and bytes(part) == data_of(body, 1, 2)
    assert address(part) == stored.data_ptr() + LAYER  # a view into the tensor's storage
    assert tier.held(meta.block) == meta.layers and len(tier) == 1 and meta.block in tier


def test_torch_host_tier_layer_ranges_join_and_retain_frees() -> None:
    meta, body = block()
    tier = TorchHostTier(pin=False)
    tier.put_layers(meta, LayerRange(2, 3), memoryview(body)[meta.header.header_length + 2 * LAYER :])
    assert tier.whole(meta) is None and tier.read(meta, LayerRange(1, 2)) is None
    with pytest.raises(TierError, match="adjacent"):
        tier.put_layers(meta, LayerRange(0, 0), data_of(body, 0, 0))
    with pytest.raises(TierError, match="expected"):
        tier.put_layers(meta, LayerRange(1, 1), b"short")
    tier.put_layers(meta, LayerRange(1, 1), data_of(body, 1, 1))
    assert tier.held(meta.block) == LayerRange(1, 3)
    joined = tier.read(meta, LayerRange(1, 3))
    assert joined is not None and bytes(joined) == data_of(body, 1, 3)
    before = tier.tensor(meta, LayerRange(1, 3))
    tier.retain(meta, LayerRange(2, 3))
    after = tier.tensor(meta, LayerRange(2, 3))
    assert before is not None and after is not None and after.numel() == 2 * LAYER
    assert after.data_ptr() != before.data_ptr() + LAYER  # copied: the dropped layer's memory is freed
    assert bytes(view_of(after)) == data_of(body, 2, 3)
    tier.retain(meta, None)
    assert meta.block not in tier and tier.read(meta, LayerRange(2, 3)) is None


def test_host_tier_holds_any_contiguous_range() -> None:
    meta, body = block()
    tier = HostTier()
    tier.put(meta, memoryview(body))
    tier.retain(meta, LayerRange(1, 3))  # the bottom went up to the device, say
    assert tier.whole(meta) is None and tier.read(meta, LayerRange(0, 1)) is None
    part = tier.read(meta, LayerRange(2, 3))
    assert part is not None and bytes(part) == data_of(body, 2, 3)
    tier.put_layers(meta, LayerRange(0, 0), data_of(body, 0, 0))
    full = tier.read(meta, meta.layers)
    assert full is not None and bytes(full) == data_of(body, 0, 3)


def test_torch_host_calibration_measures_a_copy() -> None:
    tier = TorchHostTier(pin=False)
    assert tier.rate.mbit_per_s is None
    rate = tier.calibrate(1 << 20)
    assert rate is not None and rate > 0 and tier.rate.mbit_per_s == rate
    tiers = TierSet(host=tier)
    assert tiers.rate(Tier.HOST) == float(max(1, round(rate)))
    assert TierSet(host=HostTier()).rate(Tier.HOST) is None  # plain views: nothing measured, nothing stated


# -- without CUDA the device tier is absent, never faked ----------------------------------------------


@pytest.mark.skipif(CUDA, reason="CUDA is present: the refusal applies only where it is absent")
def test_without_cuda_the_device_tier_and_pinned_memory_refuse_to_exist() -> None:
    with pytest.raises(TierError, match="no CUDA"):
        DeviceTier()
    with pytest.raises(TierError, match="pinned"):
        TorchHostTier(pin=True)
    assert TorchHostTier().pin is False


def test_memory_tiers_follow_the_settings_and_the_machine() -> None:
    base = HolderSettings(index=None, descriptors={})
    device, host = memory_tiers(base)
    assert device is None and isinstance(host, HostTier)
    device, host = memory_tiers(HolderSettings(index=None, descriptors={}, torch_tiers=True))
    assert device is None and isinstance(host, TorchHostTier) and host.pin is CUDA
    device, host = memory_tiers(HolderSettings(index=None, descriptors={}, device_capacity_octets=1 << 20))
    assert (device is not None) is CUDA  # absent without CUDA, not emulated in host memory
    assert isinstance(host, TorchHostTier if CUDA else HostTier)


# -- the store: split on arrival, explicit moves --------------------------------------------------------


def test_store_splits_new_blocks_first_layers_on_the_fast_tier() -> None:
    meta, _ = block()
    store = BlockStore({Tier.HOST: DATA, Tier.LOCAL_STORAGE: 4 * DATA}, retention_s=60, fast_layers=1)
    outcome = store.put(meta, 0.0)
    assert outcome.tier is Tier.HOST
    assert outcome.events == (Place(meta, Tier.HOST, LayerRange(0, 0)), Place(meta, Tier.LOCAL_STORAGE,
                                                                                 LayerRange(1, 3)),
                              Publish(meta.block))
    entry = store.peek(meta.block)
    assert entry is not None and entry.placement == (Segment(Tier.HOST, LayerRange(0, 0)),
                                                     Segment(Tier.LOCAL_STORAGE, LayerRange(1, 3)))
    assert store.used(Tier.HOST) == LAYER and store.used(Tier.LOCAL_STORAGE) == 3 * LAYER
    # four blocks' first layers fit the fast tier that holds one whole block
    for n in range(2, 5):
        store.put(block(n)[0], 0.0)
    assert all(e.segment_in(Tier.HOST) == Segment(Tier.HOST, LayerRange(0, 0)) for e in store)


def test_store_falls_back_to_whole_placement_when_the_split_does_not_fit() -> None:
    meta, _ = block()
    store = BlockStore({Tier.HOST: DATA}, retention_s=60, fast_layers=2)  # one tier: nothing to split
    assert store.put(meta, 0.0).events[0] == Place(meta, Tier.HOST, meta.layers)


def test_arrange_moves_layers_both_ways_and_republishes() -> None:
    meta, _ = block()
    store = BlockStore({Tier.HOST: 2 * DATA, Tier.LOCAL_STORAGE: 4 * DATA}, retention_s=60)
    store.put(meta, 0.0)
    target = (Segment(Tier.HOST, LayerRange(0, 1)), Segment(Tier.LOCAL_STORAGE, LayerRange(2, 3)))
    outcome = store.arrange(meta.block, target, 1.0)
    assert outcome.done and outcome.events == (Move(meta, LayerRange(2, 3), Tier.HOST, Tier.LOCAL_STORAGE),
                                               Republish(meta.block))
    assert store.used(Tier.HOST) == 2 * LAYER and store.used(Tier.LOCAL_STORAGE) == 2 * LAYER
    outcome = store.arrange(meta.block, (Segment(Tier.HOST, meta.layers),), 2.0)  # promote them back
    assert outcome.events == (Move(meta, LayerRange(2, 3), Tier.LOCAL_STORAGE, Tier.HOST), Republish(meta.block))
    assert store.arrange(meta.block, (Segment(Tier.HOST, meta.layers),), 3.0).events == ()  # no change


@pytest.mark.parametrize("placement, problem", [
    ((Segment(Tier.LOCAL_STORAGE, LayerRange(0, 1)), Segment(Tier.HOST, LayerRange(2, 3))), "faster"),
    ((Segment(Tier.HOST, LayerRange(0, 1)),), "contiguously"),
    ((Segment(Tier.HOST, LayerRange(1, 3)),), "contiguously"),
    ((Segment(Tier.DEVICE, LayerRange(0, 3)),), "no device tier"),
    ((Segment(Tier.HOST, LayerRange(0, 1)), Segment(Tier.HOST, LayerRange(2, 3))), "faster"),
])
def test_arrange_refuses_placements_the_store_cannot_take(placement: tuple[Segment, ...], problem: str) -> None:
    meta, _ = block()
    store = BlockStore({Tier.HOST: 2 * DATA, Tier.LOCAL_STORAGE: 4 * DATA}, retention_s=60)
    store.put(meta, 0.0)
    with pytest.raises(PlacementError, match=problem):
        store.arrange(meta.block, placement, 1.0)
    with pytest.raises(KeyError):
        store.arrange(block(9)[0].block, (Segment(Tier.HOST, meta.layers),), 1.0)


def test_arrange_makes_room_by_demoting_others_or_reports_none() -> None:
    first, _ = block(1)
    second, _ = block(2)
    store = BlockStore({Tier.HOST: DATA, Tier.LOCAL_STORAGE: 2 * DATA}, retention_s=60)
    store.put(first, 0.0)
    store.put(second, 1.0)  # first is demoted entirely to make room
    outcome = store.arrange(first.block, (Segment(Tier.HOST, first.layers),), 2.0)
    assert outcome.done
    assert outcome.events[0] == Demote(second, LayerRange(0, 3), Tier.HOST, Tier.LOCAL_STORAGE)
    assert Move(first, first.layers, Tier.LOCAL_STORAGE, Tier.HOST) in outcome.events
    assert store.used(Tier.HOST) == DATA and store.used(Tier.LOCAL_STORAGE) == DATA
    tiny = BlockStore({Tier.HOST: LAYER, Tier.LOCAL_STORAGE: 2 * DATA}, retention_s=60)
    tiny.put(first, 0.0)
    assert not tiny.arrange(first.block, (Segment(Tier.HOST, first.layers),), 1.0).done


# -- moving data between tiers --------------------------------------------------------------------------


async def test_tier_set_moves_data_between_host_tensors_and_local_storage(tmp_path: Path) -> None:
    meta, body = block()
    disk = DiskTier(tmp_path / "blocks", bytes(range(32)))
    disk.prepare()
    host = TorchHostTier(pin=False)
    tiers = TierSet(host=host, disk=disk)
    assert tiers.tiers == (Tier.HOST, Tier.LOCAL_STORAGE)
    await tiers.place(meta, Tier.HOST, LayerRange(0, 1), memoryview(body))
    await tiers.place(meta, Tier.LOCAL_STORAGE, LayerRange(2, 3), memoryview(body))
    assert bytes(await tiers.read(meta, LayerRange(2, 3))) == data_of(body, 2, 3)
    assert host.held(meta.block) == LayerRange(0, 1)
    await tiers.move(meta, LayerRange(1, 1), Tier.HOST, Tier.LOCAL_STORAGE)
    assert host.held(meta.block) == LayerRange(0, 0)
    assert bytes(disk.read(meta, LayerRange(1, 3))) == data_of(body, 1, 3)
    await tiers.move(meta, LayerRange(1, 3), Tier.LOCAL_STORAGE, Tier.HOST)  # promotion
    assert host.held(meta.block) == meta.layers
    view = await tiers.read(meta, meta.layers)
    stored = host.tensor(meta, meta.layers)
    assert stored is not None and bytes(view) == data_of(body, 0, 3) and address(view) == stored.data_ptr()
    await tiers.drop(meta.block)
    assert meta.block not in host and not disk.exists(meta.block)


def test_range_arithmetic_of_a_tier() -> None:
    held = LayerRange(2, 5)
    assert joined_range(None, LayerRange(0, 1)) == LayerRange(0, 1)
    assert joined_range(held, LayerRange(0, 1)) == LayerRange(0, 5)
    assert joined_range(held, LayerRange(6, 7)) == LayerRange(2, 7)
    with pytest.raises(TierError):
        joined_range(held, LayerRange(7, 7))  # a gap
    assert remaining_range(held, LayerRange(2, 3)) == LayerRange(4, 5)
    assert remaining_range(held, LayerRange(5, 9)) == LayerRange(2, 4)
    assert remaining_range(held, LayerRange(0, 9)) is None
    with pytest.raises(TierError):
        remaining_range(held, LayerRange(3, 4))  # would leave two ranges


async def test_a_torch_failure_is_a_tier_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    meta, body = block()
    host = TorchHostTier(pin=False)

    def out_of_memory(octets: int) -> torch.Tensor:
        raise torch.OutOfMemoryError("no memory left")

    monkeypatch.setattr(host, "_empty", out_of_memory)
    with pytest.raises(TierError, match="host tier failed"):
        await TierSet(host=host).place(meta, Tier.HOST, LayerRange(0, 1), memoryview(body))
    assert meta.block not in host


@needs_cuda
async def test_device_tier_round_trip_and_moves() -> None:
    meta, body = block()
    device, host = DeviceTier(), TorchHostTier()
    assert host.pin and device.rate.mbit_per_s is None
    tiers = TierSet(device=device, host=host)
    assert tiers.tiers == (Tier.DEVICE, Tier.HOST)
    await tiers.place(meta, Tier.HOST, meta.layers, memoryview(body))
    stored = host.tensor(meta, meta.layers)
    assert stored is not None and stored.is_pinned()
    await tiers.move(meta, LayerRange(0, 1), Tier.HOST, Tier.DEVICE)
    on_device = device.tensor(meta, LayerRange(0, 1))
    assert on_device is not None and on_device.is_cuda and host.held(meta.block) == LayerRange(2, 3)
    assert tiers.whole(meta) is None
    assert bytes(await tiers.read(meta, LayerRange(0, 1))) == data_of(body, 0, 1)
    assert device.rate.mbit_per_s is not None and device.rate.mbit_per_s > 0  # the read was timed
    copied = host.to_device(meta, LayerRange(2, 3))
    assert copied is not None and bytes(copied.cpu().numpy()) == data_of(body, 2, 3)
    assert device.calibrate(1 << 20) and host.calibrate(1 << 20)


# -- the holder: HTTP, the published residency, the split -------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return DevPki.make(tmp_path_factory.mktemp("pki"), ["holder", "client", "other", "is"])


def config(pki: DevPki, tmp: Path, **holder: object) -> RoleConfig:
    section: dict[str, object] = {"descriptors": [str(write_descriptor(D, tmp / "d.json"))],
                                  "index": pki.uri("is"), "replica_ttl_ms": 30_000}
    section.update(holder)
    return role_config(pki, "holder", ("holder",), restricted_policy(pki), {"holder": section}, tmp)


def url(base: str, n: int) -> str:
    b = block_id(D, n)
    return f"{base}blocks/{b.compat_id.hex()}/{b.scope_id.hex()}/{b.block_key.hex()}"


async def test_holder_publishes_the_split_and_republishes_after_moves(pki: DevPki, tmp_path: Path) -> None:
    cfg = config(pki, tmp_path, torch_tiers=True, fast_layers=1, host_capacity_octets=2 * DATA,
                 storage_dir="blocks", storage_capacity_octets=4 * DATA)
    async with index_double(pki) as index, running(cfg, clock=FakeClock()) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        holder = app[HOLDER]
        assert isinstance(holder.host, TorchHostTier)
        body = container(D, 1)
        async with http.put(url(pki.uri("holder"), 1), data=body, headers=PUT_HEADERS) as r:
            assert r.status == 201
        await holder.publisher.drain()

        def residency(i: int) -> list[tuple[Tier, tuple[int, int]]]:
            record = index.puts()[i].record
            assert record is not None
            assert all(e.read_mbit_per_s is not None and e.read_mbit_per_s > 0 for e in record.residency)
            return [(e.tier, e.layers) for e in record.residency]

        assert residency(0) == [(Tier.HOST, (0, 0)), (Tier.LOCAL_STORAGE, (1, 3))]  # the split, reported
        for query, expected in (("", body), ("?layers=0-1", decode_container(body).slice_bytes(0, 1))):
            async with http.get(url(pki.uri("holder"), 1) + query) as r:
                assert r.status == 200 and await r.read() == expected
        b = block_id(D, 1)
        assert await holder.arrange(b, (Segment(Tier.HOST, LayerRange(0, 3)),))  # promote all to host
        await holder.publisher.drain()
        assert len(index.puts()) == 2 and residency(1) == [(Tier.HOST, (0, 3))]
        assert await holder.arrange(b, (Segment(Tier.HOST, LayerRange(0, 2)), Segment(Tier.LOCAL_STORAGE,
                                                                                      LayerRange(3, 3))))
        await holder.publisher.drain()
        assert residency(2) == [(Tier.HOST, (0, 2)), (Tier.LOCAL_STORAGE, (3, 3))]
        async with http.get(url(pki.uri("holder"), 1)) as r:
            assert await r.read() == body
        with pytest.raises(PlacementError):
            await holder.arrange(b, (Segment(Tier.DEVICE, LayerRange(0, 3)),))


@needs_cuda
async def test_holder_with_a_device_tier_splits_device_and_host(pki: DevPki, tmp_path: Path) -> None:
    cfg = config(pki, tmp_path, device_capacity_octets=4 * DATA, fast_layers=2)
    async with index_double(pki) as index, running(cfg, clock=FakeClock()) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        holder = app[HOLDER]
        assert isinstance(holder.device, DeviceTier) and isinstance(holder.host, TorchHostTier)
        body = container(D, 1)
        async with http.put(url(pki.uri("holder"), 1), data=body, headers=PUT_HEADERS) as r:
            assert r.status == 201
        await holder.publisher.drain()
        record = index.puts()[0].record
        assert record is not None
        assert [(e.tier, e.layers) for e in record.residency] == [(Tier.DEVICE, (0, 1)), (Tier.HOST, (2, 3))]
        assert all(e.read_mbit_per_s is not None and e.read_mbit_per_s > 0 for e in record.residency)
        async with http.get(url(pki.uri("holder"), 1)) as r:
            assert await r.read() == body  # device layers copied out, host layers viewed
        assert await holder.arrange(block_id(D, 1), (Segment(Tier.HOST, LayerRange(0, 3)),))
        await holder.publisher.drain()
        last = index.puts()[-1].record
        assert last is not None and [(e.tier, e.layers) for e in last.residency] == [(Tier.HOST, (0, 3))]


def test_settings_read_the_tier_keys(pki: DevPki, tmp_path: Path) -> None:
    s = HolderSettings.from_config(config(pki, tmp_path, torch_tiers=True, device_capacity_octets=1 << 30,
                                          device="cuda:1", fast_layers=16))
    assert (s.torch_tiers, s.device_capacity_octets, s.device, s.fast_layers) == (True, 1 << 30, "cuda:1", 16)
    plain = HolderSettings.from_config(config(pki, tmp_path))
    assert (plain.torch_tiers, plain.device_capacity_octets, plain.fast_layers) == (False, 0, 0)
    for bad in ({"torch_tiers": 1}, {"fast_layers": -1}, {"device_capacity_octets": "1G"}):
        with pytest.raises(ValidationError):
            HolderSettings.from_config(config(pki, tmp_path, **bad))


# -- the instance's own tiers -------------------------------------------------------------------------------


async def test_instance_memory_blocks_live_in_a_torch_tier() -> None:
    tier = TorchHostTier(pin=False)
    blocks = MemoryBlocks(2 * len(container(D, 1)), geometry(D), tier)
    assert await blocks.place(block_id(D, 1), container(D, 1))
    assert await blocks.place(block_id(D, 2), container(D, 2))
    assert len(tier) == 2
    read = await blocks.read(block_id(D, 1))  # now the most recently used
    assert read is not None and read.slice_bytes(0, 3) == container(D, 1)
    assert await blocks.place(block_id(D, 3), container(D, 3))  # evicts block 2 from the tier too
    assert block_id(D, 2) not in tier and len(tier) == 2 and not blocks.held(block_id(D, 2))
    assert not await blocks.place(block_id(D, 1), container(D, 1))  # already held


async def test_instance_holder_blocks_split_republishes(pki: DevPki, tmp_path: Path) -> None:
    cfg = config(pki, tmp_path, torch_tiers=True, storage_dir="blocks")
    async with index_double(pki) as index, running(cfg, clock=FakeClock()) as app:
        holder = app[HOLDER]
        blocks = HolderBlocks(holder, geometry(D))
        b = block_id(D, 1)
        assert await blocks.place(b, container(D, 1))
        await holder.publisher.drain()  # records are built when sent: let the first go before the move
        assert await blocks.split(b, 2)
        await holder.publisher.drain()
        records = [c.record for c in index.puts()]
        assert [[(e.tier, e.layers) for e in r.residency] for r in records if r is not None] == [
            [(Tier.HOST, (0, 3))], [(Tier.HOST, (0, 1)), (Tier.LOCAL_STORAGE, (2, 3))]]
        read = await blocks.read(b)
        assert read is not None and read.slice_bytes(0, 3) == container(D, 1)
        assert not await blocks.split(block_id(D, 2), 2)  # not held
