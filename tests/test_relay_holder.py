"""KVSP through a relay (issue 6, item 5): a holder publishes through its rack relay, its MOQT records
name the relay, the block client fetches the block there (verified layer by layer), the second time
from the relay's cache; a client of another rack ranks its own rack's relay first."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

from control.deploy.pki import DevPki
from control.deploy.ports import free_udp_port
from kvsp.client.fetch import BlockFetcher
from kvsp.client.holder import BlockMiss, HolderClient
from kvsp.client.moqt import MoqtBlockClient
from kvsp.client.ranking import HTTPS_AND_MOQT, LinkTable, rank_replicas, via_relay
from kvsp.identifiers import role_id
from kvsp.records import LookupRequest, ReplicaRecord
from kvsp.registry import Codec
from kvsp.service.policy import Policy, ScopeGrant
from moqt.quic import EndpointConfig
from tests.support.relay import start_relay
from tests.support.servers import role_config, running
from tests.test_moqt_kvsp import COMPAT, DESCRIPTOR, GEOMETRY, SCOPE, container, key, record_of


async def lookup_moqt(pki: DevPki, session: object, i: int) -> ReplicaRecord:
    index = BlockFetcher(session, pki.uri("is")).index  # type: ignore[arg-type]
    for _ in range(250):
        answer = await index.lookup(LookupRequest(SCOPE, COMPAT, (key(i),)))
        moqt = [r for r in answer.replicas[0] if r.holder.startswith("moqt:")] if answer.matched else []
        if moqt:
            return moqt[0]
        await asyncio.sleep(0.02)
    raise AssertionError("no moqt record was published")


async def test_holder_publishes_through_its_rack_relay(tmp_path: Path) -> None:
    pki = DevPki.make(tmp_path / "pki", ["client", "is", "h1", "relay-a"])
    client, holder = pki.uri("client"), pki.uri("h1")
    policy = Policy(scopes={SCOPE: ScopeGrant(lookup=frozenset({client}), read=frozenset({client}),
                                              store=frozenset({client, holder}))})
    node = await start_relay(pki, "relay-a", policy=policy)
    descriptor = tmp_path / "model.json"
    descriptor.write_text(json.dumps(DESCRIPTOR.to_json()))
    port = free_udp_port()
    holder_config = role_config(pki, "h1", ("holder",), policy, {"holder": {
        "index": pki.uri("is"), "descriptors": [str(descriptor)], "host_capacity_octets": 1 << 24,
        "moqt_listen": f"127.0.0.1:{port}", "moqt_uri": f"moqt://127.0.0.1:{port}/holder", "moqt_relay": node.uri}})
    files = pki.files("client")
    block_client = MoqtBlockClient(EndpointConfig.from_files(files.cert, files.key, files.ca))
    session = pki.session("client")
    try:
        async with running(role_config(pki, "is", ("is",), policy)), running(holder_config):
            prefix = (b"kvsp", COMPAT.hex().encode(), SCOPE.hex().encode(), role_id(holder).encode())
            async with asyncio.timeout(20):
                while prefix not in node.relay.table.under(()):  # announced at connect time
                    await asyncio.sleep(0.02)
            await HolderClient(session).put_block(holder, COMPAT, SCOPE, key(0), container(0))
            record = await lookup_moqt(pki, session, 0)
            assert record.holder == node.uri  # the record names the relay, not the holder's endpoint
            for _ in range(2):
                block = await asyncio.wait_for(block_client.fetch_block(record, geometry=GEOMETRY), 30)
                assert not isinstance(block, BlockMiss) and block.replica_verified
                assert bytes(block.container.header.encode()) + bytes(block.container.data) == container(0)
            stats = node.relay.stats
            assert (stats.upstream_fetches, stats.cache_hits) == (1, 1)
    finally:
        await block_client.close()
        await session.close()
        await node.close()


def test_client_ranks_its_own_rack_relay_first() -> None:
    rack_a, rack_b = "moqt://10.0.1.1:4443/relay", "moqt://10.0.2.1:4443/relay"
    behind_a = record_of(0, rack_a)
    direct = record_of(0, "moqt://10.0.1.7:4433/holder")  # the same namespace, the producer's own endpoint
    https = dataclasses.replace(behind_a, holder="https://h.example/kvsp/", moqt_namespace=None)
    plain = LinkTable.of(default_rtt_us=100)
    assert rank_replicas([https, behind_a], plain, schemes=HTTPS_AND_MOQT)[0] == https  # equal cost: lookup order
    local = LinkTable.of(default_rtt_us=100, local_relay=rack_b)
    ranked = rank_replicas([https, behind_a, direct], local, schemes=HTTPS_AND_MOQT)
    assert [r.holder for r in ranked] == [rack_b, "https://h.example/kvsp/"]  # one moqt replica, via rack B
    assert ranked[0].moqt_namespace == behind_a.moqt_namespace and ranked[0].digest == behind_a.digest
    assert rank_replicas([https, behind_a], local) == (https,)  # without a MOQT client nothing changes
    assert via_relay(behind_a, rack_a) is behind_a and record_of(0).codec == Codec.RAW

