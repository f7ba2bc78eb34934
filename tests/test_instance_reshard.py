"""Resharding at the instance (spec section 6.9) over HTTPS: retained ranges move nothing, fetched ranges
come from the other instance's shards (GET shards/{map}), 200 only after every fetch, commit and abort,
the deadline.  Two real instances on loopback with mutual TLS."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from control.deploy.pki import DevPki
from control.instance.resharding import ShardLayout
from kvsp.container import decode_container
from tests.support.instance import DESCRIPTOR, NAMES, World, stalled_holder, world

MAP = "c3f8e1"
LAYOUT = ShardLayout.of(DESCRIPTOR.geometry())
BPT = LAYOUT.bytes_per_token  # 2 (K, V) x 2 layers x 2 heads x 4 dims x 2 octets = 64


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return DevPki.make(tmp_path_factory.mktemp("pki"), NAMES)


def kv(start: int, end: int) -> bytes:
    """Token-major KV whose every octet says which token it belongs to (checkable after moves)."""
    return np.repeat(np.arange(start, end, dtype=np.uint8), BPT).tobytes()


def plan(w: World, frm: int, *, retain: list[list[int]], fetch: list[tuple[list[int], str]] | None = None,
         release: list[list[int]] | None = None, deadline_ms: int = 2000) -> dict[str, object]:
    return {"map": MAP, "from": frm, "to": frm + 1, "deadline_ms": deadline_ms, "retain": retain,
            "fetch": [{"tokens": t, "from": w.pki.uri(src)} for t, src in fetch or []], "release": release or []}


def seed(w: World) -> None:
    """Version 4: ii1 holds [0, 8), ii2 holds [8, 16)."""
    w.role("ii1").shards.put(MAP, 4, (0, 8), kv(0, 8))
    w.role("ii2").shards.put(MAP, 4, (8, 16), kv(8, 16))


def held(w: World, name: str, tokens: tuple[int, int]) -> bytes:
    return b"".join(bytes(v) for v in w.role(name).shards.stores[MAP].read(tokens))


async def test_retain_moves_nothing_fetch_loads_from_the_peer_and_commit_keeps_both(
        pki: DevPki, tmp_path: Path) -> None:
    async with world(pki, tmp_path) as w:
        seed(w)
        retained = w.role("ii1").shards.stores[MAP].read((0, 8))[0]
        status, body = await w.call("pc", "POST", w.url("ii2", "reshard"),
                                    plan(w, 4, retain=[[12, 16]], release=[[8, 12]]))
        assert status == 200 and body == {"map": MAP, "version": 5, "acknowledged": True}
        status, body = await w.call("pc", "POST", w.url("ii1", "reshard"),
                                    plan(w, 4, retain=[[0, 8]], fetch=[([8, 12], "ii2")]))
        assert status == 200, body  # answered only after the fetch arrived
        assert w.role("ii1").shards.stores[MAP].staged_bytes == 4 * BPT
        for name in ("ii1", "ii2"):
            assert (await w.call("pc", "POST", w.url(name, "reshard"), {"map": MAP, "commit": 5}))[0] == 200
        assert held(w, "ii1", (0, 12)) == kv(0, 12)
        assert w.role("ii1").shards.stores[MAP].read((0, 8))[0].obj is retained.obj  # the same buffer, in place
        assert w.role("ii2").shards.stores[MAP].held() == ((12, 16),)
        assert await w.metric("ii2", "kvsp_instance_reshard_bytes_moved_total") == 0
        assert await w.metric("ii2", "kvsp_instance_reshard_bytes_retained_total") == 4 * BPT
        assert await w.metric("ii1", "kvsp_instance_reshard_bytes_moved_total") == 4 * BPT
        assert await w.metric("ii1", "kvsp_instance_reshard_bytes_retained_total") == 8 * BPT
        # a plan from a version that is no longer current conflicts
        status, problem = await w.call("pc", "POST", w.url("ii1", "reshard"), plan(w, 4, retain=[[0, 8]]))
        assert status == 409 and isinstance(problem, dict) and problem["type"].endswith("kvsp-plan-conflict")


async def test_abort_discards_what_was_fetched(pki: DevPki, tmp_path: Path) -> None:
    async with world(pki, tmp_path) as w:
        seed(w)
        status, _ = await w.call("pc", "POST", w.url("ii1", "reshard"),
                                 plan(w, 4, retain=[[0, 8]], fetch=[([8, 16], "ii2")]))
        assert status == 200
        status, body = await w.call("pc", "POST", w.url("ii1", "reshard"), {"map": MAP, "abort": 5})
        assert status == 200 and isinstance(body, dict) and body["version"] == 4
        store = w.role("ii1").shards.stores[MAP]
        assert store.version == 4 and store.held() == ((0, 8),) and store.staged_bytes == 0
        assert (await w.call("pc", "POST", w.url("ii1", "reshard"), {"map": MAP, "abort": 5}))[0] == 200  # again


async def test_shard_ranges_travel_as_containers_to_peers_only(pki: DevPki, tmp_path: Path) -> None:
    async with world(pki, tmp_path) as w:
        seed(w)
        async with w.http["pc"].get(w.url("ii2", f"shards/{MAP}?tokens=9-11&version=4")) as resp:
            assert resp.status == 403  # the PC is not a peer of the group
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("ii1"))) as peer:
            async with peer.get(w.url("ii2", f"shards/{MAP}?tokens=9-11&version=4")) as resp:
                assert resp.status == 200 and resp.content_type == "application/kvsp-block"
                assert "Repr-Digest" in resp.headers
                body = await resp.read()
            c = decode_container(body, geometry=DESCRIPTOR.geometry())
            assert (c.first_layer, c.layer_count, c.token_count) == (0, DESCRIPTOR.layers, 2)
            assert LAYOUT.from_container(body, DESCRIPTOR.geometry(), 2) == kv(9, 11)
            async with peer.get(w.url("ii2", f"shards/{MAP}?tokens=9-11&version=3")) as resp:
                assert resp.status == 409
            async with peer.get(w.url("ii2", f"shards/{MAP}?tokens=0-4")) as resp:
                assert resp.status == 409  # not held by ii2


async def test_a_fetch_that_cannot_finish_fails_the_plan(pki: DevPki, tmp_path: Path) -> None:
    async with world(pki, tmp_path) as w, stalled_holder(pki) as slow:
        seed(w)
        # the source does not hold the range: 502 at once, the PC then aborts
        status, problem = await w.call("pc", "POST", w.url("ii1", "reshard"),
                                       plan(w, 4, retain=[[0, 8]], fetch=[([16, 20], "ii2")]))
        assert status == 502, problem
        assert (await w.call("pc", "POST", w.url("ii1", "reshard"), {"map": MAP, "abort": 5}))[0] == 200
        # a stalled source: no answer before the deadline, 504, and the fetched data (none) is discarded
        started = time.monotonic()
        body = plan(w, 4, retain=[[0, 8]], fetch=[([8, 12], "ii2")], deadline_ms=300)
        body["fetch"] = [{"tokens": [8, 12], "from": slow}]
        status, problem = await w.call("pc", "POST", w.url("ii1", "reshard"), body)
        assert status == 504 and time.monotonic() - started < 2.0, problem
        store = w.role("ii1").shards.stores[MAP]
        assert store.version == 4 and store.staged_bytes == 0 and store.next_deadline() is None
        assert await w.metric("ii1", 'kvsp_instance_reshard_plans_total{result="expired"}') == 1
