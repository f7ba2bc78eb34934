"""A holder behind its rack relay withdraws the MOQT records it published (spec 6.1, issue 14).

Its MOQT records name the relay's ``moqt://`` URI; the withdrawal must go to that same resource, as the
producer's, or the IS keeps listing a replica the holder no longer has until the TTL runs out.  Real
processes-in-one-loop over mutual TLS: IS, relay, holder; records are read back with lookups.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from control.deploy.pki import DevPki
from control.deploy.ports import free_udp_port
from control.holder.app import HOLDER
from control.holder.metrics import HolderMetrics
from control.holder.publisher import Publisher
from control.holder.store import BlockId
from kvsp.client.holder import HolderClient
from kvsp.client.http import KvspSession
from kvsp.client.index import IndexClient
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.records import LookupRequest, ReplicaRecord
from kvsp.service.metrics import Metrics
from kvsp.service.policy import Policy, ScopeGrant
from tests.support.relay import start_relay
from tests.support.servers import role_config, running
from tests.test_moqt_kvsp import COMPAT, DESCRIPTOR, SCOPE, SECTION, container, key, record_of

ONE_BLOCK = 2 * DESCRIPTOR.layers * SECTION  # K and V of every layer: the host tier holds one block


async def records(session: KvspSession, pki: DevPki, i: int) -> list[ReplicaRecord]:
    answer = await IndexClient(session, pki.uri("is")).lookup(LookupRequest(SCOPE, COMPAT, (key(i),)))
    return list(answer.replicas[0]) if answer.matched else []


async def both_published(session: KvspSession, pki: DevPki, i: int, relay: str) -> None:
    for _ in range(500):
        if sorted(r.holder for r in await records(session, pki, i)) == sorted([pki.uri("h1"), relay]):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"block {i}: the https and the moqt record were not both published")


async def test_records_behind_a_relay_are_withdrawn_on_eviction_and_shutdown(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pki = DevPki.make(tmp_path / "pki", ["client", "is", "h1", "relay-a"])
    client, holder = pki.uri("client"), pki.uri("h1")
    policy = Policy(scopes={SCOPE: ScopeGrant(lookup=frozenset({client}), read=frozenset({client}),
                                              store=frozenset({client, holder}))})
    node = await start_relay(pki, "relay-a", policy=policy)
    descriptor = tmp_path / "model.json"
    descriptor.write_text(json.dumps(DESCRIPTOR.to_json()))
    port = free_udp_port()
    holder_config = role_config(pki, "h1", ("holder",), policy, {"holder": {
        "index": pki.uri("is"), "descriptors": [str(descriptor)], "host_capacity_octets": ONE_BLOCK,
        "replica_ttl_ms": 600_000, "moqt_listen": f"127.0.0.1:{port}",
        "moqt_uri": f"moqt://127.0.0.1:{port}/holder", "moqt_relay": node.uri}})
    session = pki.session("client")
    caplog.set_level(logging.WARNING, logger="kvsp.holder.publisher")
    try:
        async with running(role_config(pki, "is", ("is",), policy)):
            async with running(holder_config) as app:
                # A block this process never published (stale in local storage after a crash) is
                # withdrawn where the holder publishes: its own URI and the relay's.
                assert app[HOLDER].publisher.targets(BlockId(COMPAT, SCOPE, key(7))) == (holder, node.uri)
                await HolderClient(session).put_block(holder, COMPAT, SCOPE, key(0), container(0))
                await both_published(session, pki, 0, node.uri)
                [moqt] = [r for r in await records(session, pki, 0) if r.holder == node.uri]
                assert moqt.producer_id == role_id(holder)
                # Block 1 takes the only room: block 0 is evicted, withdrawn first (section 6.1).
                await HolderClient(session).put_block(holder, COMPAT, SCOPE, key(1), container(1))
                assert await records(session, pki, 0) == []
                await both_published(session, pki, 1, node.uri)
            # A clean shutdown withdraws the rest; the records' TTL (10 minutes) has not run out.
            assert await records(session, pki, 1) == []
        assert not [r for r in caplog.records if "withdrawing" in r.getMessage()]
    finally:
        await session.close()
        await node.close()


# -- the publisher's withdrawals, with a recording IS client -------------------------------------------
class RecordingIndex(IndexClient):
    def __init__(self) -> None:
        super().__init__(None, "https://is.example/")  # type: ignore[arg-type]  # no request is sent
        self.calls: list[tuple[str, str, bytes, str | None]] = []

    async def publish(self, record: ReplicaRecord) -> ReplicaRecord:
        self.calls.append(("PUT", record.holder, record.block_key, record.producer_id))
        return record

    async def withdraw(self, holder: str, block_key: bytes, *, producer: str | None = None) -> bool:
        self.calls.append(("DELETE", holder, block_key, producer))
        return True


async def test_withdrawal_goes_where_the_records_were_sent() -> None:
    """Whatever URI a variant declares, records sent elsewhere are withdrawn there, as this producer's."""
    base, relay = "https://h1.example/kvsp/", "moqt://10.0.0.1:4443/relay"
    producer = role_id(base)
    block = BlockId(COMPAT, SCOPE, key(0))
    https = replace(record_of(0, base), moqt_namespace=None)
    publisher = Publisher(base, lambda b: https if b == block else None, lambda: 0.0, 10.0,
                          HolderMetrics.register(Metrics()))
    publisher.add_variant("moqt://10.0.0.7:4433/holder", lambda r: replace(
        r, holder=relay, moqt_namespace=TrackNamespace(r.compat_id, r.scope_id, producer, r.block_key)))
    index = publisher.index = RecordingIndex()
    assert await publisher.publish(block)
    assert publisher.targets(block) == (base, relay)
    assert await publisher.withdraw(block)
    assert index.calls == [("PUT", base, key(0), producer), ("PUT", relay, key(0), producer),
                           ("DELETE", base, key(0), producer), ("DELETE", relay, key(0), producer)]
    assert publisher.targets(block) == (base, "moqt://10.0.0.7:4433/holder")  # forgotten once withdrawn
