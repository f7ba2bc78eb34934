"""End to end on loopback: the real Index Service and the real holder role, mutual TLS, the block client.

A client PUTs blocks to the holder; the holder publishes their records to the IS; `BlockFetcher`
looks them up, leases, GETs and verifies them, and must get the stored octets back exactly.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from control.deploy.pki import DevPki
from kvsp.client.fetch import BlockFetcher, FetchOptions, Outcome
from kvsp.client.holder import BlockMiss, HolderClient, StoreOutcome
from kvsp.client.http import KvspSession
from kvsp.container import Geometry, LayerRange, encode_container
from kvsp.descriptor import CompatDescriptor
from kvsp.records import LookupRequest
from kvsp.registry import Codec
from kvsp.service.policy import Policy, ScopeGrant
from tests.support.servers import role_config, running

SCOPE = bytes(range(16))
DESCRIPTOR = CompatDescriptor(model="e2e-model", model_digest=hashlib.sha256(b"e2e").digest(),
                              tokenizer_digest=bytes(32), layers=6, kv_heads=2, head_dim=8, kv_dtype="bf16",
                              positional="rope", block_tokens=4)
COMPAT = DESCRIPTOR.compat_id
GEOMETRY = Geometry.for_dtype(DESCRIPTOR.kv_heads, DESCRIPTOR.head_dim, DESCRIPTOR.kv_dtype, DESCRIPTOR.layers)


def key(i: int) -> bytes:
    return hashlib.sha256(b"e2e block %d" % i).digest()


def container(i: int) -> bytes:
    rng = random.Random(i)
    section = GEOMETRY.section_length(DESCRIPTOR.block_tokens)
    layers = [(rng.randbytes(section), rng.randbytes(section)) for _ in range(DESCRIPTOR.layers)]
    return encode_container(Codec.RAW, 0, DESCRIPTOR.block_tokens, layers, geometry=GEOMETRY)


@dataclass
class Deployment:
    pki: DevPki
    session: KvspSession

    @property
    def holder(self) -> str:
        return self.pki.uri("h1")

    def fetcher(self, **options: object) -> BlockFetcher:
        return BlockFetcher(self.session, self.pki.uri("is"),
                            options=FetchOptions(geometry=GEOMETRY, **options))  # type: ignore[arg-type]

    async def wait_published(self, n: int) -> None:
        request = LookupRequest(SCOPE, COMPAT, tuple(key(i) for i in range(n)))
        index = self.fetcher().index
        for _ in range(200):
            if (await index.lookup(request)).matched == n:
                return
            await asyncio.sleep(0.02)
        raise AssertionError("the holder did not publish its replicas")


@pytest.fixture(name="deployment")
async def deployment_fixture(tmp_path: Path) -> AsyncIterator[Deployment]:
    pki = DevPki.make(tmp_path / "pki", ["client", "is", "h1"])
    client, holder = pki.uri("client"), pki.uri("h1")
    policy = Policy(scopes={SCOPE: ScopeGrant(lookup=frozenset({client}), read=frozenset({client}),
                                              store=frozenset({client, holder}))})
    descriptor_file = tmp_path / "model.json"
    descriptor_file.write_text(json.dumps(DESCRIPTOR.to_json()))
    is_config = role_config(pki, "is", ("is",), policy, {"is": {"descriptors": [str(descriptor_file)]}})
    holder_config = role_config(pki, "h1", ("holder",), policy, {"holder": {
        "index": pki.uri("is"), "descriptors": [str(descriptor_file)], "host_capacity_octets": 1 << 24}})
    async with running(is_config), running(holder_config):
        session = pki.session("client")
        try:
            yield Deployment(pki, session)
        finally:
            await session.close()


async def test_put_then_fetch_is_byte_exact(deployment: Deployment) -> None:
    holder = HolderClient(deployment.session)
    blocks = [container(i) for i in range(3)]
    for i, data in enumerate(blocks):
        assert await holder.put_block(deployment.holder, COMPAT, SCOPE, key(i), data) is StoreOutcome.STORED
    assert await holder.put_block(deployment.holder, COMPAT, SCOPE, key(0), blocks[0]) \
        is StoreOutcome.ALREADY_PRESENT
    await deployment.wait_published(3)

    fetcher = deployment.fetcher()
    result = await fetcher.fetch(SCOPE, COMPAT, [key(i) for i in range(4)], block_tokens=DESCRIPTOR.block_tokens)
    assert result.matched == 3 and result.loaded_blocks == 3
    assert result.recompute_from_token == 3 * DESCRIPTOR.block_tokens
    for i, loaded in enumerate(result.blocks):
        c = loaded.container
        assert bytes(c.header.encode()) + bytes(c.data) == blocks[i]
        assert loaded.block.replica_verified and loaded.replica.holder == deployment.holder
    assert [a.outcome for a in result.attempts] == [Outcome.LOADED] * 3
    stats = fetcher.stats
    assert stats.fetched_tokens == 3 * DESCRIPTOR.block_tokens and stats.recomputed_tokens == DESCRIPTOR.block_tokens
    assert stats.digest_failures == stats.misses == stats.lease_rejections == 0


async def test_layer_range_and_streaming_against_the_real_holder(deployment: Deployment) -> None:
    holder = HolderClient(deployment.session)
    data = container(7)
    await holder.put_block(deployment.holder, COMPAT, SCOPE, key(0), data)
    await deployment.wait_published(1)
    fetcher = deployment.fetcher()
    result = await fetcher.fetch(SCOPE, COMPAT, [key(0)], layers=(2, 4))
    assert result.loaded_blocks == 1
    (loaded,) = result.blocks
    assert loaded.container.layer_range == LayerRange(2, 4)
    assert loaded.block.layer_digests == loaded.replica.layer_digests[2:5]

    record = loaded.replica
    async with holder.open_block(record.holder, COMPAT, SCOPE, key(0), expect=record) as stream:
        assert not isinstance(stream, BlockMiss)
        layers = [view.layer async for view in stream.layers()]
    assert layers == list(range(DESCRIPTOR.layers)) and stream.block.replica_verified

    # codec=n asked; this holder does not transcode (a MAY) and serves raw: still fully verified.
    raw = await holder.get_block(record.holder, COMPAT, SCOPE, key(0), codec=0xFF01, expect=record)
    assert not isinstance(raw, BlockMiss) and raw.replica_verified and raw.container.codec == Codec.RAW

    lease = await holder.lease(record.holder, [key(0)], 1000)
    assert await holder.release(record.holder, lease.lease)
    missing = await holder.get_block(record.holder, COMPAT, SCOPE, key(99))
    assert isinstance(missing, BlockMiss)
