"""A holder restart keeps its local-storage cache: blocks are adopted, verified, fitted to capacity and
published again; files a restart must not trust (tampered, truncated, interrupted writes, orphans, an
unconfigured compat, incomplete or expired blocks) are removed, never served.

The first part drives `DiskTier` and `BlockStore` directly; the second runs holder processes (in
process, over mutual TLS) on one storage folder with the real Index Service."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from control.deploy.pki import DevPki
from control.holder import disk as disk_module
from control.holder.app import HOLDER
from control.holder.disk import (
    DROP_EXPIRED,
    DROP_INCOMPATIBLE,
    DROP_INCOMPLETE,
    DROP_ORPHAN,
    DROP_PARTIAL,
    DROP_TAMPERED,
    DROP_TRUNCATED,
    RECORD_SUFFIX,
    Adoption,
    DiskTier,
    VerifyError,
)
from control.holder.service import Holder, stored_accepts
from control.holder.store import BlockId, BlockMeta, BlockStore, Evict, Segment, Withdraw
from control.holder.tiers import HostTier, StorageCorruptError
from control.holder.tierset import TierSet
from kvsp.client.http import KvspSession
from kvsp.client.index import IndexClient
from kvsp.container import ContainerHeader, LayerRange, decode_container
from kvsp.records import LookupRequest
from kvsp.registry import Tier
from kvsp.service.policy import Policy, Quotas, ScopeGrant
from tests.support.holder import SCOPE, block_id, container, descriptor, meta_of, write_descriptor
from tests.support.servers import FakeClock, role_config, running

D = descriptor(layers=6, kv_heads=2, head_dim=8, block_tokens=4)
D2 = descriptor(layers=6, kv_heads=2, head_dim=8, block_tokens=4, model="another-model")
KEY = bytes(range(32))
DATA = D.block_octets()
PUT_HEADERS = {"If-None-Match": "*", "Content-Type": "application/kvsp-block"}


def block(n: int, d: object = D) -> tuple[BlockMeta, bytes]:
    desc = D2 if d is D2 else D
    body = container(desc, n)
    return meta_of(block_id(desc, n), body, desc), body


def data_of(body: bytes) -> bytes:
    return bytes(decode_container(body).slice(0, D.layers - 1)[1])


def accept_d(block: BlockId, header: ContainerHeader) -> bool:
    return stored_accepts({D.compat_id: D})(block, header)


def adopt(directory: Path, accepts: Callable[[BlockId, ContainerHeader], bool] = accept_d,
          retention_s: float = 3600.0) -> tuple[DiskTier, Adoption]:
    tier = DiskTier(directory, KEY)
    return tier, tier.adopt(accepts, retention_s, time.time())


def our_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*") if p.is_file())


# -- DiskTier: what is adopted ----------------------------------------------------------------------


def test_complete_blocks_are_adopted_with_their_metadata(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path / "blocks", KEY)
    disk.prepare()
    meta, body = block(1)
    stored_at = time.time() - 5.25
    disk.write(meta, meta.layers, data_of(body), stored_at=stored_at)
    (tmp_path / "blocks" / "notes.txt").write_text("not ours")
    again, adoption = adopt(tmp_path / "blocks")
    assert adoption.dropped == {}
    (found,) = adoption.adopted
    assert found.meta == meta and found.stored_at == stored_at
    assert (found.meta.digest, found.meta.repr_digest, found.meta.layer_digests) == \
           (meta.digest, meta.repr_digest, meta.layer_digests)
    assert again.held(meta.block) == meta.layers
    assert bytes(again.read(found.meta, LayerRange(2, 4))) == bytes(decode_container(body).slice(2, 4)[1])
    assert (tmp_path / "blocks" / "notes.txt").exists()


def test_a_record_is_sealed_and_private(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path / "blocks", KEY)
    disk.prepare()
    meta, body = block(1)
    disk.write(meta, meta.layers, data_of(body))
    record = disk.path(meta.block).with_suffix(RECORD_SUFFIX)
    assert record.stat().st_mode & 0o777 == 0o600
    assert meta.layer_digests[0] not in record.read_bytes()  # digests are not readable at rest
    adoption = DiskTier(tmp_path / "blocks", bytes(32)).adopt(accept_d, 3600.0, time.time())
    assert adoption.adopted == () and adoption.dropped == {DROP_TAMPERED: 1}  # another key: not ours


Damage = Callable[[DiskTier, BlockMeta], None]


def _flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x20
    path.write_bytes(bytes(raw))


DAMAGE: dict[str, tuple[Damage, str]] = {
    "ciphertext": (lambda t, m: _flip(t.path(m.block), m.header.header_length + 40), DROP_TAMPERED),
    "last tag": (lambda t, m: _flip(t.path(m.block), -1), DROP_TAMPERED),
    "header": (lambda t, m: _flip(t.path(m.block), 18), DROP_TAMPERED),
    "record": (lambda t, m: _flip(t.path(m.block).with_suffix(RECORD_SUFFIX), 30), DROP_TAMPERED),
    "truncated": (lambda t, m: os.truncate(t.path(m.block), t.path(m.block).stat().st_size - 10), DROP_TRUNCATED),
    "no record": (lambda t, m: t.path(m.block).with_suffix(RECORD_SUFFIX).unlink(), DROP_ORPHAN),
    "no file": (lambda t, m: t.path(m.block).unlink(), DROP_ORPHAN),
    "moved to another scope": (lambda t, m: _move(t, m, BlockId(m.block.compat_id, bytes(16), m.block.block_key)),
                               DROP_TAMPERED),
}


def _move(tier: DiskTier, meta: BlockMeta, to: BlockId) -> None:
    for suffix in (".kvsb", RECORD_SUFFIX):
        tier.path(meta.block).with_suffix(suffix).rename(tier.path(to).with_suffix(suffix))


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_files_are_removed_not_adopted(tmp_path: Path, damage: str) -> None:
    disk = DiskTier(tmp_path / "blocks", KEY)
    disk.prepare()
    meta, body = block(1)
    good, good_body = block(2)
    disk.write(meta, meta.layers, data_of(body))
    disk.write(good, good.layers, data_of(good_body))
    harm, reason = DAMAGE[damage]
    harm(disk, meta)
    again, adoption = adopt(tmp_path / "blocks")
    assert [a.meta.block for a in adoption.adopted] == [good.block]
    assert adoption.dropped == {reason: 1}
    assert again.held(meta.block) is None
    assert all(good.block.block_key.hex() in name for name in our_files(tmp_path / "blocks"))  # the rest is gone


def test_without_verification_a_damaged_segment_is_found_by_the_read(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path / "blocks", KEY)
    disk.prepare()
    meta, body = block(1)
    short, short_body = block(2)
    disk.write(meta, meta.layers, data_of(body))
    disk.write(short, short.layers, data_of(short_body))
    _flip(disk.path(meta.block), meta.header.header_length + 40)  # layer 0's ciphertext
    os.truncate(disk.path(short.block), disk.path(short.block).stat().st_size - 1)
    again = DiskTier(tmp_path / "blocks", KEY)
    adoption = again.adopt(accept_d, 3600.0, time.time(), verify=False)
    assert [a.meta.block for a in adoption.adopted] == [meta.block]  # structure is checked, data is not
    assert adoption.dropped == {DROP_TRUNCATED: 1}
    assert bytes(again.read(meta, LayerRange(1, 5))) == bytes(decode_container(body).slice(1, 5)[1])
    with pytest.raises(StorageCorruptError):
        again.read(meta, meta.layers)


@pytest.mark.parametrize("damage", ["ciphertext", "last tag"])
def test_verify_finds_damaged_segments_that_metadata_adoption_accepts(tmp_path: Path, damage: str) -> None:
    disk = DiskTier(tmp_path / "blocks", KEY)
    disk.prepare()
    meta, body = block(1)
    good, good_body = block(2)
    disk.write(meta, meta.layers, data_of(body))
    disk.write(good, good.layers, data_of(good_body))
    DAMAGE[damage][0](disk, meta)
    again = DiskTier(tmp_path / "blocks", KEY)
    adoption = again.adopt(accept_d, 3600.0, time.time(), verify=False)
    assert sorted(a.meta.block.block_key for a in adoption.adopted) == sorted((meta.block.block_key,
                                                                               good.block.block_key))
    again.verify(good)
    with pytest.raises(VerifyError) as caught:
        again.verify(meta)
    assert caught.value.reason == DROP_TAMPERED


def test_unconfigured_compat_expired_and_incomplete_blocks_are_removed(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path / "blocks", KEY)
    disk.prepare()
    other, other_body = block(1, D2)
    disk.write(other, other.layers, data_of(other_body))
    old, old_body = block(2)
    disk.write(old, old.layers, data_of(old_body), stored_at=time.time() - 100)
    split, split_body = block(3)  # layers 0-2 were in host memory: gone with the process
    disk.write(split, LayerRange(3, 5), bytes(decode_container(split_body).slice(3, 5)[1]))
    _, adoption = adopt(tmp_path / "blocks", retention_s=50)
    assert adoption.adopted == ()
    assert adoption.dropped == {DROP_INCOMPATIBLE: 1, DROP_EXPIRED: 1, DROP_INCOMPLETE: 1}
    assert our_files(tmp_path / "blocks") == []


def test_interrupted_writes_are_never_adopted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = DiskTier(tmp_path / "blocks", KEY)
    disk.prepare()
    meta, body = block(1)
    plain = decode_container(body)
    disk.write(meta, LayerRange(3, 5), bytes(plain.slice(3, 5)[1]))

    def crash(*args: object) -> None:
        raise OSError(5, "power lost before the commit record")

    monkeypatch.setattr(disk, "_commit", crash)
    with pytest.raises(OSError):  # layers 0-2 reached the file, the record still names 3-5 only
        disk.write(meta, LayerRange(0, 2), bytes(plain.slice(0, 2)[1]))
    # and a crash during the first write of another block leaves its temporary file behind
    fresh, _ = block(2)
    temp = disk.path(fresh.block).parent / (disk.path(fresh.block).name + ".tmp" + "ab" * 8)
    temp.parent.mkdir(exist_ok=True)
    temp.write_bytes(b"half a block")
    _, adoption = adopt(tmp_path / "blocks")
    assert adoption.adopted == ()
    assert adoption.dropped == {DROP_INCOMPLETE: 1, DROP_PARTIAL: 1}
    assert our_files(tmp_path / "blocks") == []


@pytest.mark.parametrize("punch", [True, False], ids=["hole-punched", "rewritten"])
def test_promoted_layers_are_freed_in_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, punch: bool) -> None:
    """After layers leave local storage, the file holds only what the store counts there."""
    if not punch:  # a platform or file system without hole punching: the file is rewritten instead
        monkeypatch.setattr(disk_module, "punch_holes", lambda path, ranges: False)
    disk = DiskTier(tmp_path / "blocks", KEY)
    disk.prepare()
    meta, body = block(1)
    plain = decode_container(body)
    disk.write(meta, meta.layers, data_of(body))
    disk.retain(meta, LayerRange(4, 5))  # layers 0-3 went to a faster tier
    assert disk.held(meta.block) == LayerRange(4, 5)
    assert bytes(disk.read(meta, LayerRange(4, 5))) == bytes(plain.slice(4, 5)[1])
    path = disk.path(meta.block)
    start = meta.header.header_length
    freed = path.read_bytes()[start : start + 4 * 28 + meta.octets(LayerRange(0, 3))]
    assert freed == bytes(len(freed))  # a hole (punched or rewritten), not the old ciphertext
    _, adoption = adopt(tmp_path / "blocks")  # the record says so too: incomplete, not adopted
    assert adoption.dropped == {DROP_INCOMPLETE: 1}
    disk2 = DiskTier(tmp_path / "b2", KEY)
    disk2.prepare()
    disk2.write(meta, meta.layers, data_of(body))
    disk2.retain(meta, None)
    assert our_files(tmp_path / "b2") == []


async def test_a_promotion_out_of_local_storage_shrinks_the_file(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path / "blocks", KEY)
    disk.prepare()
    host = HostTier()
    tier_set = TierSet(host=host, disk=disk)
    meta, body = block(1)
    await tier_set.place(meta, Tier.LOCAL_STORAGE, meta.layers, memoryview(body), time.time())
    await tier_set.move(meta, LayerRange(0, 2), Tier.LOCAL_STORAGE, Tier.HOST)
    assert host.held(meta.block) == LayerRange(0, 2) and disk.held(meta.block) == LayerRange(3, 5)
    assert bytes(await tier_set.read(meta, LayerRange(3, 5))) == bytes(decode_container(body).slice(3, 5)[1])
    await tier_set.move(meta, LayerRange(3, 5), Tier.LOCAL_STORAGE, Tier.HOST)
    assert disk.held(meta.block) is None and our_files(tmp_path / "blocks") == []


# -- BlockStore: adoption and trimming ---------------------------------------------------------------


def test_store_adopts_with_stored_times_and_trims_the_oldest() -> None:
    metas = [block(n)[0] for n in range(1, 5)]
    store = BlockStore({Tier.LOCAL_STORAGE: 2 * DATA}, retention_s=100)
    for i, meta in enumerate(metas):
        store.adopt(meta, (Segment(Tier.LOCAL_STORAGE, meta.layers),), stored_at=10.0 + i)
    assert store.used(Tier.LOCAL_STORAGE) == 4 * DATA
    events = store.trim(now=20.0)
    assert [e.block for e in events if isinstance(e, Evict)] == [metas[0].block, metas[1].block]
    assert [e.block for e in events if isinstance(e, Withdraw)] == [metas[0].block, metas[1].block]
    assert store.used(Tier.LOCAL_STORAGE) == 2 * DATA and store.trim(20.0) == []
    entry = store.peek(metas[2].block)
    assert entry is not None and entry.expires_at == 112.0
    assert [e.block for e in store.expire(112.5)] == [metas[2].block] * 2  # retention from stored_at


def test_store_adoption_out_of_order_keeps_expiry_order() -> None:
    a, b = block(1)[0], block(2)[0]
    store = BlockStore({Tier.LOCAL_STORAGE: 4 * DATA}, retention_s=10)
    store.adopt(a, (Segment(Tier.LOCAL_STORAGE, a.layers),), stored_at=50.0)
    store.adopt(b, (Segment(Tier.LOCAL_STORAGE, b.layers),), stored_at=40.0)
    assert [e.block for e in store.expire(55.0) if isinstance(e, Evict)] == [b.block]


# -- holder processes on one storage folder --------------------------------------------------------


class Cluster:
    """The IS (running throughout) and holder runs on one storage folder."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.pki = DevPki.make(tmp / "pki", ["holder", "client", "is"])
        client, holder = self.pki.uri("client"), self.pki.uri("holder")
        self.policy = Policy(scopes={SCOPE: ScopeGrant(lookup=frozenset({client}), read=frozenset({client}),
                                                       store=frozenset({client, holder}))},
                             quotas=Quotas(lease_octets_per_client=2 * DATA))  # unset: a quarter of 4 blocks
        self.d1 = str(write_descriptor(D, tmp / "d1.json"))
        self.d2 = str(write_descriptor(D2, tmp / "d2.json"))

    def holder(self, *, capacity_blocks: int = 4, both: bool = False,
               retention_ms: int = 3_600_000) -> AbstractAsyncContextManager[web.Application]:
        section = {"descriptors": [self.d1, self.d2] if both else [self.d1], "index": self.pki.uri("is"),
                   "host_capacity_octets": 0, "storage_dir": "blocks", "retention_ms": retention_ms,
                   "storage_capacity_octets": capacity_blocks * DATA}
        return running(role_config(self.pki, "holder", ("holder",), self.policy, {"holder": section}, self.tmp),
                       clock=FakeClock())

    def is_config(self) -> AbstractAsyncContextManager[web.Application]:
        return running(role_config(self.pki, "is", ("is",), self.policy, {"is": {}}, self.tmp), clock=FakeClock())

    def url(self, b: BlockId) -> str:
        return f"{self.pki.uri('holder')}blocks/{b.compat_id.hex()}/{b.scope_id.hex()}/{b.block_key.hex()}"


async def _put(http: aiohttp.ClientSession, c: Cluster, n: int, d: object = D) -> BlockId:
    desc = D2 if d is D2 else D
    b = block_id(desc, n)
    async with http.put(c.url(b), data=container(desc, n), headers=PUT_HEADERS) as r:
        assert r.status == 201, await r.text()
    return b


async def _listed(index: IndexClient, b: BlockId) -> bool:
    found = await index.lookup(LookupRequest(b.scope_id, b.compat_id, (b.block_key,)))
    return found.matched == 1


async def _started(holder: Holder) -> None:
    """The adopted blocks are published and checked, and the IS has answered."""
    await asyncio.wait_for(holder.adoption_published.wait(), 10)
    await asyncio.wait_for(holder.verification_done.wait(), 10)
    await holder.publisher.drain()


def _metric(text: str, line: str) -> float:
    return next(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(line))


pytest.importorskip("control.index.app")


async def test_a_restarted_holder_serves_publishes_and_leases_its_stored_blocks(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    async with c.is_config(), KvspSession(c.pki.client_ssl("client")) as session:
        index = IndexClient(session, c.pki.uri("is"))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=c.pki.client_ssl("client"))) as http:
            async with c.holder() as app:
                blocks = [await _put(http, c, n) for n in (1, 2, 3)]
                await app[HOLDER].publisher.drain()
                assert [await _listed(index, b) for b in blocks] == [True] * 3
            assert [await _listed(index, b) for b in blocks] == [False] * 3  # clean shutdown withdrew them
            async with c.holder() as app:
                holder = app[HOLDER]
                await _started(holder)
                assert len(holder.store) == 3 and holder.store.used(Tier.LOCAL_STORAGE) == 3 * DATA
                assert [await _listed(index, b) for b in blocks] == [True] * 3
                record = holder.record_of(blocks[0])
                assert record is not None and record.ttl_ms > 0
                for n, b in zip((1, 2, 3), blocks, strict=True):
                    async with http.get(c.url(b)) as r:
                        body = await r.read()
                        assert r.status == 200 and body == container(D, n)
                        assert r.headers["Repr-Digest"] == \
                               f"sha-256=:{base64.b64encode(hashlib.sha256(body).digest()).decode()}:"
                async with http.post(c.pki.uri("holder") + "leases",
                                     json={"block_keys": [blocks[0].block_key.hex()], "ttl_ms": 5000}) as r:
                    assert r.status == 201
                async with http.get(c.pki.uri("holder") + "metrics") as r:
                    assert _metric(await r.text(), "kvsp_holder_blocks_adopted_total") == 3
                async with http.put(c.url(blocks[0]), data=container(D, 1), headers=PUT_HEADERS) as r:
                    assert r.status == 412  # held again, as before the restart


async def test_a_restart_drops_what_it_cannot_trust(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    async with c.is_config(), KvspSession(c.pki.client_ssl("client")) as session:
        index = IndexClient(session, c.pki.uri("is"))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=c.pki.client_ssl("client"))) as http:
            async with c.holder(both=True) as app:
                good, tampered, truncated = [await _put(http, c, n) for n in (1, 2, 3)]
                other = await _put(http, c, 4, D2)
                disk = app[HOLDER].disk
                assert disk is not None
                await app[HOLDER].publisher.drain()

                async def crash(timeout_s: float) -> None:  # no clean shutdown: the IS keeps the records
                    pass

                app[HOLDER].publisher.withdraw_all = crash  # type: ignore[method-assign]
            assert [await _listed(index, b) for b in (good, tampered, truncated)] == [True] * 3
            _flip(disk.path(tampered), disk.path(tampered).stat().st_size - 100)
            os.truncate(disk.path(truncated), disk.path(truncated).stat().st_size - 1)
            crashed = block_id(D, 5)
            temp = disk.path(crashed).with_name(disk.path(crashed).name + ".tmp" + "cd" * 8)
            temp.parent.mkdir(exist_ok=True)
            temp.write_bytes(os.urandom(200))
            async with c.holder() as app:
                await _started(app[HOLDER])
                assert list(app[HOLDER].store) and [e.block for e in app[HOLDER].store] == [good]
                async with http.get(c.url(good)) as r:
                    assert r.status == 200 and await r.read() == container(D, 1)
                for b in (tampered, truncated, crashed):
                    async with http.get(c.url(b)) as r:
                        assert r.status == 404
                # re-published with a fresh TTL, and the removed blocks withdrawn at once (not left to expire)
                assert [await _listed(index, b) for b in (good, tampered, truncated)] == [True, False, False]
                async with http.get(c.pki.uri("holder") + "metrics") as r:
                    text = await r.text()
                for reason in (DROP_TAMPERED, DROP_TRUNCATED, DROP_INCOMPATIBLE, DROP_PARTIAL):
                    assert _metric(text, f'kvsp_holder_adoption_drops_total{{reason="{reason}"}}') == 1
            assert not temp.exists() and not disk.exists(other) and not disk.exists(tampered)


async def test_a_restart_with_less_capacity_evicts_the_oldest(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    async with c.is_config(), KvspSession(c.pki.client_ssl("client")) as session:
        index = IndexClient(session, c.pki.uri("is"))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=c.pki.client_ssl("client"))) as http:
            async with c.holder(capacity_blocks=3):
                blocks = []
                for n in (1, 2, 3):
                    blocks.append(await _put(http, c, n))
                    time.sleep(0.01)  # distinct stored-at times (wall clock): the oldest goes first
            async with c.holder(capacity_blocks=2) as app:
                holder = app[HOLDER]
                await _started(holder)
                assert holder.store.used(Tier.LOCAL_STORAGE) == 2 * DATA
                assert [e.block for e in holder.store] == blocks[1:]
                async with http.get(c.url(blocks[0])) as r:
                    assert r.status == 404
                assert holder.disk is not None and not holder.disk.exists(blocks[0])
                assert [await _listed(index, b) for b in blocks] == [False, True, True]


class SlowVerifier:
    """`DiskTier.verify` held back until released: background verification outlasts the checks."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()
        original = DiskTier.verify

        def slowed(tier: DiskTier, meta: BlockMeta) -> None:
            self.started.set()
            self.gate.wait(10)  # bounded: a failing test must not leave the worker thread behind
            original(tier, meta)

        monkeypatch.setattr(DiskTier, "verify", slowed)


async def _stored(c: Cluster, http: aiohttp.ClientSession, ns: tuple[int, ...]) -> list[BlockId]:
    async with c.holder() as app:
        blocks = [await _put(http, c, n) for n in ns]
        await app[HOLDER].publisher.drain()
    return blocks


async def test_a_restarted_holder_serves_and_publishes_before_verification_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(tmp_path)
    slow = SlowVerifier(monkeypatch)
    async with c.is_config(), KvspSession(c.pki.client_ssl("client")) as session:
        index = IndexClient(session, c.pki.uri("is"))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=c.pki.client_ssl("client"))) as http:
            blocks = await _stored(c, http, (1, 2))
            try:
                async with c.holder() as app:
                    holder = app[HOLDER]
                    await asyncio.wait_for(holder.adoption_published.wait(), 10)
                    await holder.publisher.drain()
                    assert slow.started.wait(10) and not holder.verification_done.is_set()
                    for n, b in zip((1, 2), blocks, strict=True):
                        async with http.get(c.url(b)) as r:
                            assert r.status == 200 and await r.read() == container(D, n)
                    assert [await _listed(index, b) for b in blocks] == [True, True]
                    assert not holder.verification_done.is_set()  # all of that while the check was held back
                    slow.gate.set()
                    await asyncio.wait_for(holder.verification_done.wait(), 10)
                    assert len(holder.store) == 2
            finally:
                slow.gate.set()


async def test_tampered_data_found_in_the_background_is_dropped_and_withdrawn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(tmp_path)
    slow = SlowVerifier(monkeypatch)
    async with c.is_config(), KvspSession(c.pki.client_ssl("client")) as session:
        index = IndexClient(session, c.pki.uri("is"))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=c.pki.client_ssl("client"))) as http:
            good, tampered = await _stored(c, http, (1, 2))
            try:
                async with c.holder() as app:
                    holder = app[HOLDER]
                    assert holder.disk is not None
                    _flip(holder.disk.path(tampered), holder.disk.path(tampered).stat().st_size - 100)
                    await asyncio.wait_for(holder.adoption_published.wait(), 10)
                    await holder.publisher.drain()
                    assert tampered in holder.store and await _listed(index, tampered)  # metadata is intact
                    slow.gate.set()
                    await _started(holder)
                    assert [e.block for e in holder.store] == [good]
                    assert [await _listed(index, b) for b in (good, tampered)] == [True, False]
                    assert not holder.disk.exists(tampered)
                    async with http.get(c.url(tampered)) as r:
                        assert r.status == 404
                    async with http.get(c.pki.uri("holder") + "metrics") as r:
                        text = await r.text()
                    assert _metric(text, f'kvsp_holder_adoption_drops_total{{reason="{DROP_TAMPERED}"}}') == 1
                    assert _metric(text, 'kvsp_holder_digest_failures_total{where="storage"}') == 1
            finally:
                slow.gate.set()


async def test_adopted_records_are_published_once_the_listener_is_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(tmp_path)
    port = int(c.pki.uri("holder").split(":")[2].split("/")[0])
    accepting: list[bool] = []
    original = Holder.publish_adopted

    def publish_adopted(holder: Holder) -> int:
        try:  # a blocking connect: the kernel completes it when the port listens, whatever the event loop does
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            accepting.append(True)
        except OSError:
            accepting.append(False)
        return original(holder)

    monkeypatch.setattr(Holder, "publish_adopted", publish_adopted)
    async with c.is_config(), KvspSession(c.pki.client_ssl("client")) as session:
        index = IndexClient(session, c.pki.uri("is"))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=c.pki.client_ssl("client"))) as http:
            blocks = await _stored(c, http, (1, 2))
            accepting.clear()  # the first run (nothing adopted) may have ended before its publication
            async with c.holder() as app:
                await _started(app[HOLDER])
                assert accepting == [True]
                assert [await _listed(index, b) for b in blocks] == [True, True]
