"""The holder over real mutual TLS on loopback: block PUT/GET (byte-exact, Repr-Digest, Cache-Control,
layer ranges, preconditions, limits, authorization) and the lease resources."""

from __future__ import annotations

import base64
import hashlib
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from control.deploy.pki import DevPki
from control.holder.app import HOLDER, format_repr_digest, parse_repr_digest
from control.holder.moqt import BlockTrack
from control.holder.service import Holder
from kvsp.container import LayerRange, decode_container
from kvsp.errors import ValidationError
from kvsp.problems import PROBLEM_TYPE_BASE
from kvsp.records import ReplicaRecord
from kvsp.service.config import RoleConfig
from kvsp.service.policy import Quotas
from moqt.wire import Location
from tests.support.holder import (
    OTHER_SCOPE,
    SCOPE,
    block_id,
    container,
    descriptor,
    restricted_policy,
    write_descriptor,
)
from tests.support.servers import FakeClock, role_config, running

D = descriptor(layers=4, kv_heads=2, head_dim=8, block_tokens=4)
JSON = {"Content-Type": "application/kvsp+json"}
PUT_HEADERS = {"If-None-Match": "*", "Content-Type": "application/kvsp-block"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return DevPki.make(tmp_path_factory.mktemp("pki"), ["holder", "client", "other", "is"])


def config(pki: DevPki, tmp: Path, quotas: Quotas | None = None, **holder: object) -> RoleConfig:
    section: dict[str, object] = {"descriptors": [str(write_descriptor(D, tmp / "d.json"))]}
    section.update(holder)
    return role_config(pki, "holder", ("holder",), restricted_policy(pki, quotas), {"holder": section}, tmp)


@dataclass
class Client:
    http: aiohttp.ClientSession
    base: str
    holder: Holder

    def url(self, n: int, scope: bytes = SCOPE, query: str = "") -> str:
        b = block_id(D, n, scope)
        return f"{self.base}blocks/{b.compat_id.hex()}/{b.scope_id.hex()}/{b.block_key.hex()}{query}"

    async def put(self, n: int, body: bytes, headers: dict[str, str] | None = None,
                  scope: bytes = SCOPE) -> tuple[int, dict[str, object]]:
        async with self.http.put(self.url(n, scope), data=body, headers=PUT_HEADERS | (headers or {})) as r:
            raw = await r.read()
            return r.status, (json.loads(raw) if raw else {})

    async def get(self, n: int, query: str = "", scope: bytes = SCOPE) -> tuple[int, bytes, aiohttp.ClientResponse]:
        async with self.http.get(self.url(n, scope, query)) as r:
            return r.status, await r.read(), r

    async def json(self, method: str, path: str, body: object) -> tuple[int, dict[str, object]]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with self.http.request(method, self.base + path, data=data, headers=JSON) as r:
            raw = await r.read()
            return r.status, (json.loads(raw) if raw else {})


@pytest.fixture
async def client(pki: DevPki, tmp_path: Path) -> AsyncIterator[Client]:
    async with running(config(pki, tmp_path), clock=FakeClock()) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        yield Client(http, pki.uri("holder"), app[HOLDER])


def problem_type(body: dict[str, object]) -> object:
    return body.get("type", "").removeprefix(PROBLEM_TYPE_BASE)  # type: ignore[attr-defined]


def b64_sha256(data: bytes) -> str:
    return f"sha-256=:{base64.b64encode(hashlib.sha256(data).digest()).decode()}:"


# -- store and serve -----------------------------------------------------------------------------------


async def test_put_then_get_full_block_byte_exact(client: Client) -> None:
    body = container(D, 1)
    status, record_json = await client.put(1, body, {"Repr-Digest": b64_sha256(body)})
    assert status == 201
    record = ReplicaRecord.from_json(record_json)
    c = decode_container(body)
    assert record.layer_digests == tuple(hashlib.sha256(v.payload).digest() for v in c.layers)
    assert record.digest == hashlib.sha256(b"".join(record.layer_digests)).digest()
    assert record.size == len(body) and record.codec == 1 and record.holder == client.base
    assert [(r.tier.value, r.layers) for r in record.residency] == [("host", (0, 3))]
    status, got, resp = await client.get(1)
    assert status == 200 and got == body
    assert resp.headers["Content-Type"] == "application/kvsp-block"
    assert resp.headers["Repr-Digest"] == b64_sha256(body)  # checked independently of the holder's code
    assert resp.headers["Cache-Control"] == "private, immutable, max-age=120"
    assert int(resp.headers["Content-Length"]) == len(body)


@pytest.mark.parametrize("first,last", [(0, 0), (1, 2), (3, 3), (0, 3)])
async def test_get_layer_range_byte_exact(client: Client, first: int, last: int) -> None:
    body = container(D, 2)
    assert (await client.put(2, body))[0] == 201
    status, got, resp = await client.get(2, f"?layers={first}-{last}")
    assert status == 200
    assert got == decode_container(body).slice_bytes(first, last)
    assert resp.headers["Repr-Digest"] == b64_sha256(got)
    part = decode_container(got)
    assert (part.first_layer, part.last_layer) == (first, last)


async def test_layers_not_held_and_unknown_blocks(client: Client) -> None:
    assert (await client.put(3, container(D, 3)))[0] == 201
    status, got, _ = await client.get(3, "?layers=2-4")
    assert status == 404 and problem_type(json.loads(got)) == "kvsp-layers-unavailable"
    status, got, _ = await client.get(3, "?layers=3-1")
    assert status == 400
    status, got, _ = await client.get(99)
    assert status == 404 and problem_type(json.loads(got)) == "kvsp-not-found"


async def test_codec_parameter_serves_the_stored_codec(client: Client) -> None:
    body = container(D, 4)
    await client.put(4, body)
    status, got, _ = await client.get(4, "?codec=65280")
    assert status == 200 and got == body and decode_container(got).codec == 1
    assert (await client.get(4, "?codec=raw"))[0] == 400


async def test_head_sends_headers_only(client: Client) -> None:
    body = container(D, 5)
    await client.put(5, body)
    async with client.http.head(client.url(5)) as r:
        assert r.status == 200 and await r.read() == b""
        assert r.headers["Repr-Digest"] == b64_sha256(body)


async def test_put_requires_if_none_match(client: Client) -> None:
    async with client.http.put(client.url(6), data=container(D, 6),
                               headers={"Content-Type": "application/kvsp-block"}) as r:
        assert r.status == 428
    assert (await client.get(6))[0] == 404


async def test_second_put_is_412_and_keeps_the_old_copy(client: Client) -> None:
    first, second = container(D, 7), container(D, 8)
    assert (await client.put(7, first))[0] == 201
    assert (await client.put(7, second))[0] == 412
    assert (await client.get(7))[1] == first


@pytest.mark.parametrize("body", [
    container(descriptor(layers=4, kv_heads=2, head_dim=16), 9),  # wrong section size
    container(D, 9, count=2),  # not the whole block
    container(D, 9, first=1, count=3),
    container(D, 9, tokens=3),  # not a whole block of tokens
    container(descriptor(layers=5, kv_heads=2, head_dim=8), 9),  # more layers than the model
    b"KVB1 not a container",
    container(D, 9) + b"\x00",
])
async def test_container_not_matching_the_descriptor_is_refused(client: Client, body: bytes) -> None:
    status, problem = await client.put(9, body)
    assert status == 400, problem
    assert (await client.get(9))[0] == 404


async def test_repr_digest_mismatch_is_422_and_nothing_is_stored(client: Client) -> None:
    body = bytearray(container(D, 10))
    digest = b64_sha256(bytes(body))
    body[-1] ^= 1
    status, problem = await client.put(10, bytes(body), {"Repr-Digest": digest})
    assert status == 422 and problem_type(problem) == "kvsp-digest-mismatch"
    assert (await client.get(10))[0] == 404
    status, _ = await client.put(10, bytes(body), {"Repr-Digest": "sha-512=:AAAA:, " + b64_sha256(bytes(body))})
    assert status == 201
    assert (await client.put(11, container(D, 11), {"Repr-Digest": "sha-256=nonsense"}))[0] == 400


async def test_unknown_compat_is_409(client: Client) -> None:
    url = client.url(12).replace(D.compat_id.hex(), "ab" * 32)
    async with client.http.put(url, data=container(D, 12), headers=PUT_HEADERS) as r:
        assert r.status == 409 and problem_type(await r.json(content_type=None)) == "kvsp-incompatible"


async def test_bad_identifiers_are_400(client: Client) -> None:
    async with client.http.get(client.url(1).replace(D.compat_id.hex(), "XY" * 32)) as r:
        assert r.status == 400


async def test_unauthorized_scope_is_403(client: Client, pki: DevPki) -> None:
    status, problem = await client.put(13, container(D, 13), scope=OTHER_SCOPE)
    assert status == 403 and problem_type(problem) == "kvsp-scope-denied"
    await client.put(13, container(D, 13))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("other"))) as other:
        async with other.get(client.url(13)) as r:
            assert r.status == 403 and problem_type(await r.json(content_type=None)) == "kvsp-scope-denied"
        async with other.put(client.url(13), data=container(D, 13), headers=PUT_HEADERS) as r:
            assert r.status == 403


async def test_wrong_media_type_is_415(client: Client) -> None:
    status, _ = await client.put(14, container(D, 14), {"Content-Type": "application/json"})
    assert status == 415


async def test_oversized_body_is_413(pki: DevPki, tmp_path: Path) -> None:
    body = container(D, 15)
    cfg = config(pki, tmp_path, Quotas(block_body_limit_octets=len(body) - 1))
    async with running(cfg) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        c = Client(http, pki.uri("holder"), app[HOLDER])
        assert (await c.put(15, body))[0] == 413
        assert (await c.get(15))[0] == 404


async def test_no_client_certificate_fails_the_handshake(client: Client, pki: DevPki) -> None:
    ctx = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as anonymous:
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
            async with anonymous.get(client.url(1)) as r:
                await r.read()


async def test_metrics_count_stores_and_serves(client: Client) -> None:
    body = container(D, 16)
    await client.put(16, body)
    _, whole, _ = await client.get(16)
    _, first, _ = await client.get(16, "?layers=0-0")
    async with client.http.get(client.base + "metrics") as r:
        text = await r.text()
    assert "kvsp_holder_blocks_stored_total 1.0" in text
    assert 'kvsp_holder_blocks_served_total{part="full"} 1.0' in text
    assert 'kvsp_holder_blocks_served_total{part="range"} 1.0' in text
    assert 'kvsp_holder_tier_used_octets{tier="host"}' in text
    https = _sample(text, 'kvsp_holder_bytes_served_total{transport="https"}')
    assert https == len(whole) + len(first) and whole == body  # the containers sent
    # the MOQT path (BlockTrack, what a FETCH reads) counts its layer payloads under transport="moqt"
    entry = client.holder.store.get(block_id(D, 16), client.holder.clock())
    assert entry is not None
    objects = [o async for o in BlockTrack(client.holder, entry).read(Location(0, 0), Location(0, 2))]
    assert len(objects) == 2
    async with client.http.get(client.base + "metrics") as r:
        text = await r.text()
    assert _sample(text, 'kvsp_holder_bytes_served_total{transport="moqt"}') == entry.meta.octets(LayerRange(0, 1))
    assert _sample(text, 'kvsp_holder_bytes_served_total{transport="https"}') == https


def _sample(text: str, key: str) -> float:
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(key + " "))


def test_repr_digest_field_codec() -> None:
    digest = hashlib.sha256(b"x").digest()
    assert parse_repr_digest(format_repr_digest(digest)) == digest
    assert parse_repr_digest("sha-512=:AAAA:;p=1, sha-256=:" + base64.b64encode(digest).decode() + ":") == digest
    assert parse_repr_digest("sha-512=:AAAA:") is None and parse_repr_digest(None) is None
    for bad in ("sha-256", "sha-256=abc", "sha-256=:!!:", "sha-256=:AAAA:"):
        with pytest.raises(ValidationError):
            parse_repr_digest(bad)


# -- leases --------------------------------------------------------------------------------------------


async def test_lease_create_renew_release(client: Client) -> None:
    await client.put(20, container(D, 20))
    key = block_id(D, 20).block_key.hex()
    status, lease = await client.json("POST", "leases", {"block_keys": [key], "ttl_ms": 5000})
    assert status == 201 and lease["block_keys"] == [key] and lease["ttl_ms"] == 5000
    lease_id = lease["lease"]
    assert isinstance(lease_id, str) and client.holder.leases.is_leased(bytes.fromhex(key), client.holder.clock())
    status, renewed = await client.json("PUT", f"leases/{lease_id}", {"ttl_ms": 8000})
    assert status == 200 and renewed == {"lease": lease_id, "block_keys": [key], "ttl_ms": 8000}
    async with client.http.delete(f"{client.base}leases/{lease_id}") as r:
        assert r.status == 204 and r.headers["Cache-Control"] == "no-store"
    async with client.http.delete(f"{client.base}leases/{lease_id}") as r:
        assert r.status == 404


async def test_lease_quotas_are_429(pki: DevPki, tmp_path: Path) -> None:
    body = container(D, 21)
    cfg = config(pki, tmp_path, Quotas(lease_octets_per_client=len(body) + 10, lease_ttl_ms_max=10_000))
    async with running(cfg, clock=FakeClock()) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        c = Client(http, pki.uri("holder"), app[HOLDER])
        await c.put(21, body)
        await c.put(22, container(D, 22))
        k21, k22 = block_id(D, 21).block_key.hex(), block_id(D, 22).block_key.hex()
        status, problem = await c.json("POST", "leases", {"block_keys": [k21], "ttl_ms": 10_001})
        assert status == 429 and problem_type(problem) == "kvsp-lease-quota"
        status, problem = await c.json("POST", "leases", {"block_keys": [k21, k22], "ttl_ms": 1000})
        assert status == 429 and problem_type(problem) == "kvsp-lease-quota"
        status, lease = await c.json("POST", "leases", {"block_keys": [k21], "ttl_ms": 1000})
        assert status == 201
        assert (await c.json("POST", "leases", {"block_keys": [k22], "ttl_ms": 1000}))[0] == 429
        status, _ = await c.json("PUT", f"leases/{lease['lease']}", {"ttl_ms": 20_000})
        assert status == 429
        async with http.get(c.base + "metrics") as r:
            text = await r.text()
        assert 'kvsp_holder_lease_rejections_total{reason="ttl"} 2.0' in text
        assert 'kvsp_holder_lease_rejections_total{reason="octets"} 2.0' in text


async def test_lease_expires_by_the_clock(pki: DevPki, tmp_path: Path) -> None:
    clock = FakeClock()
    async with running(config(pki, tmp_path), clock=clock) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        c = Client(http, pki.uri("holder"), app[HOLDER])
        await c.put(23, container(D, 23))
        key = block_id(D, 23).block_key
        _, lease = await c.json("POST", "leases", {"block_keys": [key.hex()], "ttl_ms": 2000})
        assert c.holder.leases.is_leased(key, clock())
        clock.advance(2.0)
        assert not c.holder.leases.is_leased(key, clock())
        assert (await c.json("PUT", f"leases/{lease['lease']}", {"ttl_ms": 1000}))[0] == 404


@pytest.mark.parametrize("body", [b"{not json", b"[]", json.dumps({"block_keys": [], "ttl_ms": 1}).encode(),
                                  json.dumps({"block_keys": ["zz"], "ttl_ms": 1}).encode(),
                                  json.dumps({"block_keys": ["00" * 32], "ttl_ms": 0}).encode()])
async def test_malformed_lease_json_is_400(client: Client, body: bytes) -> None:
    status, problem = await client.json("POST", "leases", body)
    assert status == 400, problem


async def test_lease_on_unknown_or_unreadable_blocks_is_404(client: Client, pki: DevPki) -> None:
    await client.put(24, container(D, 24))
    key = block_id(D, 24).block_key.hex()
    status, problem = await client.json("POST", "leases", {"block_keys": ["00" * 32], "ttl_ms": 1000})
    assert status == 404 and problem_type(problem) == "kvsp-not-found"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("other"))) as other:
        async with other.post(client.base + "leases", json={"block_keys": [key], "ttl_ms": 1000},
                              headers=JSON) as r:
            assert r.status == 404  # "other" may not read SCOPE: the block does not exist for it
        _, lease = await client.json("POST", "leases", {"block_keys": [key], "ttl_ms": 1000})
        async with other.put(f"{client.base}leases/{lease['lease']}", json={"ttl_ms": 1000}, headers=JSON) as r:
            assert r.status == 404  # only the creator may renew
        async with other.delete(f"{client.base}leases/{lease['lease']}") as r:
            assert r.status == 404
    assert (await client.json("PUT", "leases/bad%20id", {"ttl_ms": 1000}))[0] == 400


async def test_leased_block_is_not_evicted_for_a_new_one(pki: DevPki, tmp_path: Path) -> None:
    data = 2 * D.layers * D.section_length(D.block_tokens)
    whole = Quotas(lease_octets_per_client=2 * data)  # one client may pin the whole holder here (unset: a quarter)
    async with running(config(pki, tmp_path, whole, host_capacity_octets=data), clock=FakeClock()) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        c = Client(http, pki.uri("holder"), app[HOLDER])
        first = container(D, 25)
        await c.put(25, first)
        _, lease = await c.json("POST", "leases", {"block_keys": [block_id(D, 25).block_key.hex()], "ttl_ms": 5000})
        assert (await c.put(26, container(D, 26)))[0] == 507
        assert (await c.get(25))[1] == first
        await c.json("DELETE", f"leases/{lease['lease']}", b"")
        assert (await c.put(26, container(D, 26)))[0] == 201  # now the old one may go
        assert (await c.get(25))[0] == 404


async def test_range_digests_are_remembered_per_stored_content(client: Client) -> None:
    body = container(D, 30)
    await client.put(30, body)
    first = await client.get(30, "?layers=1-2")
    second = await client.get(30, "?layers=1-2")
    assert first[1] == second[1] and first[2].headers["Repr-Digest"] == second[2].headers["Repr-Digest"]
    assert len(client.holder._range_digests) == 1
    entry = client.holder.store.peek(block_id(D, 30))
    assert entry is not None
    (cached_key,) = client.holder._range_digests
    assert cached_key[1] == entry.meta.repr_digest  # a re-stored block with other octets cannot hit it


async def test_a_demotion_for_room_is_counted_once(pki: DevPki, tmp_path: Path) -> None:
    # `Demote` is the capacity-driven kind of `Move`: it moves the data and counts as a demotion.
    data = 2 * D.layers * D.section_length(D.block_tokens)
    async with running(config(pki, tmp_path, host_capacity_octets=data, storage_dir="blocks",
                              storage_capacity_octets=8 * data), clock=FakeClock()) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        c = Client(http, pki.uri("holder"), app[HOLDER])

        async def demotions() -> float:
            async with http.get(c.base + "metrics") as r:
                return _sample(await r.text(), "kvsp_holder_demotions_total")

        await c.put(40, container(D, 40))
        assert await demotions() == 0.0
        await c.put(41, container(D, 41))  # host holds one block: block 40 goes down to local storage
        assert await demotions() == 1.0
        assert (await c.get(40))[1] == container(D, 40) and (await c.get(41))[1] == container(D, 41)
