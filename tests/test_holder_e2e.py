"""The holder with the real Index Service and the real block client, each its own role over mutual TLS:
store through `HolderClient.put_block`, find the replica with a lookup, lease it, fetch it verified
(whole and by layer range), then watch eviction withdraw it from the index."""

from __future__ import annotations

from pathlib import Path

import pytest

from control.deploy.pki import DevPki
from control.holder.app import HOLDER
from kvsp.client.http import KvspSession
from kvsp.client.index import IndexClient
from kvsp.container import decode_container
from kvsp.records import LookupRequest
from kvsp.service.policy import Policy, Quotas, ScopeGrant
from tests.support.holder import SCOPE, block_id, container, descriptor, write_descriptor
from tests.support.servers import FakeClock, role_config, running

pytest.importorskip("control.index.app")
holder_client = pytest.importorskip("kvsp.client.holder")

D = descriptor(layers=4, kv_heads=2, head_dim=8, block_tokens=4)
DATA = 2 * D.layers * D.section_length(D.block_tokens)


async def test_store_lookup_lease_fetch_and_withdraw(tmp_path: Path) -> None:
    pki = DevPki.make(tmp_path / "pki", ["holder", "client", "is"])
    client, holder = pki.uri("client"), pki.uri("holder")
    policy = Policy(scopes={SCOPE: ScopeGrant(lookup=frozenset({client}), read=frozenset({client}),
                                              store=frozenset({client, holder}))},
                    quotas=Quotas(lease_octets_per_client=2 * DATA))  # the one block it holds (unset: a quarter)
    section = {"descriptors": [str(write_descriptor(D, tmp_path / "d.json"))], "index": pki.uri("is"),
               "host_capacity_octets": DATA}
    clock = FakeClock()
    is_config = role_config(pki, "is", ("is",), policy, {"is": {}}, tmp_path)
    holder_config = role_config(pki, "holder", ("holder",), policy, {"holder": section}, tmp_path)
    async with running(is_config, clock=clock), running(holder_config, clock=clock) as app, \
            KvspSession(pki.client_ssl("client")) as session:
        blocks = holder_client.HolderClient(session)
        index = IndexClient(session, pki.uri("is"))
        b1, body = block_id(D, 1), container(D, 1)
        stored = await blocks.put_block(holder, b1.compat_id, b1.scope_id, b1.block_key, body)
        assert stored is holder_client.StoreOutcome.STORED
        again = await blocks.put_block(holder, b1.compat_id, b1.scope_id, b1.block_key, container(D, 2))
        assert again is holder_client.StoreOutcome.ALREADY_PRESENT
        await app[HOLDER].publisher.drain()

        found = await index.lookup(LookupRequest(SCOPE, D.compat_id, (b1.block_key,)))
        assert found.matched == 1
        (record,) = found.replicas[0]
        assert record.holder == holder and record.layer_digests == decode_container(body).layer_digests()

        lease = await blocks.lease(holder, [b1.block_key], 5000)
        whole = await blocks.get_block(holder, b1.compat_id, b1.scope_id, b1.block_key, expect=record)
        assert not isinstance(whole, holder_client.BlockMiss) and whole.replica_verified
        assert [bytes(v.payload) for v in whole.layers] == [bytes(v.payload) for v in decode_container(body).layers]
        part = await blocks.get_block(holder, b1.compat_id, b1.scope_id, b1.block_key, layers=(1, 2),
                                      expect=record)
        assert not isinstance(part, holder_client.BlockMiss)
        assert [v.layer for v in part.layers] == [1, 2]
        assert await blocks.release(holder, lease.lease)

        b3 = block_id(D, 3)  # room for one block only: block 1 is evicted and withdrawn first
        await blocks.put_block(holder, b3.compat_id, b3.scope_id, b3.block_key, container(D, 3))
        await app[HOLDER].publisher.drain()
        assert (await index.lookup(LookupRequest(SCOPE, D.compat_id, (b1.block_key,)))).matched == 0
        miss = await blocks.get_block(holder, b1.compat_id, b1.scope_id, b1.block_key)
        assert isinstance(miss, holder_client.BlockMiss)
