"""The holder and the Index Service: publication on store, refresh every ttl/3 on the clock, republication
when residency changes (demotion to encrypted local storage), withdrawal before eviction, on expiry, on
corruption at rest, and on clean shutdown.  Real mutual TLS on loopback; the IS is an in-test double."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from control.deploy.pki import DevPki
from control.holder.app import HOLDER
from control.holder.publisher import RefreshSchedule
from control.holder.service import Holder
from control.holder.store import BlockId
from kvsp.container import decode_container
from kvsp.identifiers import role_id
from kvsp.registry import Tier
from kvsp.service.config import RoleConfig
from tests.support.holder import (
    IndexDouble,
    block_id,
    container,
    descriptor,
    index_double,
    restricted_policy,
    write_descriptor,
)
from tests.support.servers import FakeClock, role_config, running

D = descriptor(layers=4, kv_heads=2, head_dim=8, block_tokens=4)
DATA = 2 * D.layers * D.section_length(D.block_tokens)  # layer data octets of one block
PUT_HEADERS = {"If-None-Match": "*", "Content-Type": "application/kvsp-block"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return DevPki.make(tmp_path_factory.mktemp("pki"), ["holder", "client", "other", "is"])


def config(pki: DevPki, tmp: Path, **holder: object) -> RoleConfig:
    section: dict[str, object] = {"descriptors": [str(write_descriptor(D, tmp / "d.json"))],
                                  "index": pki.uri("is"), "replica_ttl_ms": 30_000}
    section.update(holder)
    return role_config(pki, "holder", ("holder",), restricted_policy(pki), {"holder": section}, tmp)


@dataclass
class World:
    http: aiohttp.ClientSession
    holder: Holder
    index: IndexDouble
    clock: FakeClock
    base: str

    def url(self, n: int) -> str:
        b = block_id(D, n)
        return f"{self.base}blocks/{b.compat_id.hex()}/{b.scope_id.hex()}/{b.block_key.hex()}"

    async def put(self, n: int) -> int:
        async with self.http.put(self.url(n), data=container(D, n), headers=PUT_HEADERS) as r:
            await r.read()
        await self.holder.publisher.drain()
        return r.status

    async def get(self, n: int, query: str = "") -> tuple[int, bytes]:
        async with self.http.get(self.url(n) + query) as r:
            return r.status, await r.read()

    def keys(self, method: str) -> list[str]:
        return [c.block_key for c in self.index.calls if c.method == method]


def key(n: int) -> str:
    return block_id(D, n).block_key.hex()


async def test_store_publishes_a_complete_record_and_refreshes_every_third_of_the_ttl(
        pki: DevPki, tmp_path: Path) -> None:
    clock = FakeClock()
    async with index_double(pki) as index, running(config(pki, tmp_path), clock=clock) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        w = World(http, app[HOLDER], index, clock, pki.uri("holder"))
        assert await w.put(1) == 201
        [call] = index.puts()
        assert call.holder_id == role_id(pki.uri("holder")) and call.block_key == key(1)
        assert call.identity == pki.uri("holder")  # the IS client uses the role's own certificate
        record = call.record
        assert record is not None and record.holder == pki.uri("holder") and record.ttl_ms == 30_000
        c = decode_container(container(D, 1))
        assert record.layer_digests == c.layer_digests() and record.verify_digest_chain()
        clock.advance(9.9)
        await w.holder.maintain()
        await w.holder.publisher.drain()
        assert len(index.puts()) == 1
        clock.advance(0.1)  # ttl/3 = 10 s after the publication
        await w.holder.maintain()
        await w.holder.publisher.drain()
        assert len(index.puts()) == 2 and index.puts()[1].record == record
        clock.advance(10)
        await w.holder.maintain()
        await w.holder.publisher.drain()
        assert len(index.puts()) == 3


async def test_eviction_withdraws_before_the_bytes_are_gone(pki: DevPki, tmp_path: Path) -> None:
    clock = FakeClock()
    async with index_double(pki) as index, \
            running(config(pki, tmp_path, host_capacity_octets=DATA), clock=clock) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        w = World(http, app[HOLDER], index, clock, pki.uri("holder"))
        host = w.holder.host
        assert host is not None

        def still_held(block_key: str) -> bool:
            return BlockId(D.compat_id, block_id(D, 1).scope_id, bytes.fromhex(block_key)) in host

        index.on_delete = still_held
        await w.put(1)
        await w.put(2)  # 1 must go: host-only holder with room for one block
        [delete] = index.deletes()
        assert delete.block_key == key(1) and delete.observed is True
        assert not still_held(key(1)) and (await w.get(1))[0] == 404
        assert (await w.get(2))[1] == container(D, 2)
        async with http.get(w.base + "metrics") as r:
            assert 'kvsp_holder_evictions_total{reason="capacity"} 1.0' in await r.text()


async def test_demotion_republishes_with_measured_storage_rate(pki: DevPki, tmp_path: Path) -> None:
    clock = FakeClock()
    cfg = config(pki, tmp_path, host_capacity_octets=DATA + DATA // 2, storage_dir="blocks",
                 storage_capacity_octets=4 * DATA)
    async with index_double(pki) as index, running(cfg, clock=clock) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        w = World(http, app[HOLDER], index, clock, pki.uri("holder"))
        await w.put(1)
        await w.put(2)  # half of block 1 (its top layers) moves to local storage
        records = [c.record for c in index.puts() if c.block_key == key(1)]
        assert len(records) == 2 and records[1] is not None
        residency = [(r.tier, r.layers, r.read_mbit_per_s) for r in records[1].residency]
        assert residency[0] == (Tier.HOST, (0, 1), None)
        assert residency[1][:2] == (Tier.LOCAL_STORAGE, (2, 3))
        assert residency[1][2] is not None and residency[1][2] > 0  # measured at startup
        body = container(D, 1)
        assert (await w.get(1))[1] == body  # from memory and disk together
        status, part = await w.get(1, "?layers=1-3")
        assert status == 200 and part == decode_container(body).slice_bytes(1, 3)
        files = list((tmp_path / "blocks").rglob("*.kvsb"))
        assert len(files) == 1 and decode_container(body).layer(3).payload.tobytes()[:32] not in files[0].read_bytes()
        await w.put(3)  # block 1 now entirely on disk
        assert (await w.get(1))[1] == body


async def test_corruption_at_rest_is_withdrawn_and_dropped(pki: DevPki, tmp_path: Path) -> None:
    clock = FakeClock()
    cfg = config(pki, tmp_path, host_capacity_octets=0, storage_dir="blocks")
    async with index_double(pki) as index, running(cfg, clock=clock) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        w = World(http, app[HOLDER], index, clock, pki.uri("holder"))
        assert await w.put(1) == 201
        assert (await w.get(1))[1] == container(D, 1)
        disk = w.holder.disk
        assert disk is not None
        index.on_delete = lambda k: disk.exists(block_id(D, 1))
        path = disk.path(block_id(D, 1))
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        path.write_bytes(bytes(raw))
        status, problem = await w.get(1)
        assert status == 404 and "integrity" in json.loads(problem)["detail"]
        [delete] = index.deletes()
        assert delete.block_key == key(1) and delete.observed is True  # withdrawn before the file went
        assert not path.exists() and (await w.get(1))[0] == 404
        assert await w.put(1) == 201  # may be stored again
        async with http.get(w.base + "metrics") as r:
            text = await r.text()
        assert 'kvsp_holder_digest_failures_total{where="storage"} 1.0' in text
        assert 'kvsp_holder_evictions_total{reason="fault"} 1.0' in text


async def test_retention_expiry_withdraws_and_drops(pki: DevPki, tmp_path: Path) -> None:
    clock = FakeClock()
    async with index_double(pki) as index, running(config(pki, tmp_path, retention_ms=50_000), clock=clock) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        w = World(http, app[HOLDER], index, clock, pki.uri("holder"))
        await w.put(1)
        clock.advance(45)
        async with http.get(w.url(1)) as r:
            assert r.headers["Cache-Control"] == "private, immutable, max-age=5"  # no longer than what is left
        clock.advance(5)
        assert (await w.get(1))[0] == 404  # expired: not served even before the sweep
        await w.holder.maintain()
        await w.holder.publisher.drain()
        assert w.keys("DELETE") == [key(1)] and len(w.holder.store) == 0


async def test_clean_shutdown_withdraws_everything(pki: DevPki, tmp_path: Path) -> None:
    async with index_double(pki) as index:
        async with running(config(pki, tmp_path), clock=FakeClock()) as app, \
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
            w = World(http, app[HOLDER], index, FakeClock(), pki.uri("holder"))
            await w.put(1)
            await w.put(2)
            assert index.deletes() == []
        assert sorted(c.block_key for c in index.deletes()) == sorted([key(1), key(2)])


async def test_index_failures_do_not_fail_stores(pki: DevPki, tmp_path: Path) -> None:
    clock = FakeClock()
    async with index_double(pki) as index, running(config(pki, tmp_path), clock=clock) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        w = World(http, app[HOLDER], index, clock, pki.uri("holder"))
        index.fail = True
        assert await w.put(1) == 201 and (await w.get(1))[0] == 200
        index.fail = False
        clock.advance(1.0)  # a failed publication is retried soon, not only at the next refresh
        await w.holder.maintain()
        await w.holder.publisher.drain()
        assert w.keys("PUT") == [key(1)]
        async with http.get(w.base + "metrics") as r:
            assert 'kvsp_holder_index_failures_total{operation="publish"} 1.0' in await r.text()


def test_refresh_schedule() -> None:
    a, b = block_id(D, 1), block_id(D, 2)
    s = RefreshSchedule(10)
    assert s.delay(0) is None and s.due(100) == []
    s.published(a, 0)
    s.published(b, 5)
    assert s.delay(0) == 10 and s.due(9.9) == []
    assert s.due(10) == [a] and s.delay(10) == 5
    s.remove(b)
    assert s.due(100) == [a] and s.due(100) == [] and b not in s
    assert s.delay(100) == 10 and len(s) == 1
    with pytest.raises(ValueError):
        RefreshSchedule(0)


async def test_block_is_served_while_its_demotion_is_in_flight(pki: DevPki, tmp_path: Path) -> None:
    cfg = config(pki, tmp_path, host_capacity_octets=DATA, storage_dir="blocks")
    async with index_double(pki) as index, running(cfg, clock=FakeClock()) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        w = World(http, app[HOLDER], index, FakeClock(), pki.uri("holder"))
        disk = w.holder.disk
        assert disk is not None
        await w.put(1)
        gate, entered = threading.Event(), threading.Event()
        real_write = disk.write

        def slow_write(*args: Any) -> None:
            entered.set()
            gate.wait(10)
            real_write(*args)

        disk.write = slow_write  # type: ignore[method-assign, assignment]
        put = asyncio.ensure_future(w.put(2))
        await asyncio.to_thread(entered.wait, 10)
        entry = w.holder.store.peek(block_id(D, 1))
        assert entry is not None and entry.placement[0].tier is Tier.LOCAL_STORAGE  # decided, not yet written
        assert (await w.get(1))[1] == container(D, 1)  # served from the host copy meanwhile
        gate.set()
        assert await put == 201
        assert w.holder.host is not None and block_id(D, 1) not in w.holder.host
        assert (await w.get(1))[1] == container(D, 1)  # now from disk


async def test_a_failing_disk_loses_the_demoted_block_not_the_new_one(pki: DevPki, tmp_path: Path) -> None:
    cfg = config(pki, tmp_path, host_capacity_octets=DATA, storage_dir="blocks")
    async with index_double(pki) as index, running(cfg, clock=FakeClock()) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        w = World(http, app[HOLDER], index, FakeClock(), pki.uri("holder"))
        disk = w.holder.disk
        assert disk is not None
        await w.put(1)

        def broken(*args: Any) -> None:
            raise OSError(28, "No space left on device")

        disk.write = broken  # type: ignore[method-assign, assignment]
        assert await w.put(2) == 201
        assert w.keys("DELETE") == [key(1)] and (await w.get(1))[0] == 404
        assert (await w.get(2))[1] == container(D, 2)


async def test_a_failing_disk_refuses_blocks_it_cannot_write(pki: DevPki, tmp_path: Path) -> None:
    cfg = config(pki, tmp_path, host_capacity_octets=0, storage_dir="blocks")
    async with index_double(pki) as index, running(cfg, clock=FakeClock()) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        w = World(http, app[HOLDER], index, FakeClock(), pki.uri("holder"))
        disk = w.holder.disk
        assert disk is not None

        def broken(*args: Any) -> None:
            raise OSError(5, "Input/output error")

        disk.write = broken  # type: ignore[method-assign, assignment]
        assert await w.put(3) == 503
        assert len(w.holder.store) == 0 and w.holder.store.used(Tier.LOCAL_STORAGE) == 0
        assert w.keys("PUT") == []  # never published


async def test_refresh_follows_the_ttl_the_index_granted(pki: DevPki, tmp_path: Path) -> None:
    clock = FakeClock()
    async with index_double(pki) as index, running(config(pki, tmp_path), clock=clock) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        w = World(http, app[HOLDER], index, clock, pki.uri("holder"))
        index.cap_ttl_ms = 9_000  # we ask for 30 s; the IS keeps 9 s: refresh after 3 s, not 10 s
        await w.put(1)
        clock.advance(3.0)
        await w.holder.maintain()
        await w.holder.publisher.drain()
        assert len(index.puts()) == 2


async def test_concurrent_stores_and_reads_stay_consistent(pki: DevPki, tmp_path: Path) -> None:
    """Many PUTs and GETs at once against small tiers: every answer is the exact block or a miss,
    capacities hold, and every evicted block was withdrawn."""
    cfg = config(pki, tmp_path, host_capacity_octets=2 * DATA + DATA // 4, storage_dir="blocks",
                 storage_capacity_octets=3 * DATA)
    async with index_double(pki) as index, running(cfg, clock=FakeClock()) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        w = World(http, app[HOLDER], index, FakeClock(), pki.uri("holder"))

        async def put(n: int) -> None:
            async with http.put(w.url(n), data=container(D, n), headers=PUT_HEADERS) as r:
                assert r.status == 201

        async def get(n: int) -> None:
            for query in ("", "?layers=1-3"):
                status, body = await w.get(n, query)
                whole = container(D, n)
                assert status == 404 or body == (whole if not query else decode_container(whole).slice_bytes(1, 3))

        await asyncio.gather(*(put(n) for n in range(20)), *(get(n) for n in range(20) for _ in range(3)))
        await w.holder.publisher.drain()
        store = w.holder.store
        assert len(store) == 5  # 2.25 blocks in memory + 3 on disk, all layers accounted for
        for tier in store.tiers:
            assert store.used(tier) <= store.capacity(tier)
        evicted = {key(n) for n in range(20)} - {e.block.block_key.hex() for e in store}
        assert evicted == set(w.keys("DELETE"))
        for entry in store:
            n = next(i for i in range(20) if key(i) == entry.block.block_key.hex())
            assert (await w.get(n))[1] == container(D, n)
