"""Every MOQT draft end to end over loopback (issue 18 items 2-4): a real holder role serves one block
over each draft on its one MOQT port and over HTTPS, octet for octet and digest for digest; a live
block streams layer by layer over each draft; and a relay bridges drafts, with a holder that speaks
one draft upstream and block clients that speak another downstream (miss, then cache hit). Where
aiopquic imports (the picoquic venv: .ci/pico-suites), all of it over picoquic too, and a holder role and
a block client on different QUIC stacks.

Each client is pinned to one draft (``QuicSettings(drafts=(n,))``), so the draft a test names is the
draft on the wire; the listeners' per-draft session counts show it from the other end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from pathlib import Path

import pytest
from aiohttp import web

from control.deploy.pki import DevPki
from control.deploy.ports import free_udp_port
from control.holder.moqt import HOLDER_MOQT
from kvsp.client.holder import BlockMiss, HolderClient
from kvsp.client.moqt import BLOCK_CLIENT_QUIC, MoqtBlockClient
from kvsp.container import decode_container
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.moqt_binding import LiveBlockPublisher, kvsp_authorizer
from kvsp.registry import Codec
from kvsp.service.policy import Policy, ScopeGrant
from moqt.api import Publisher
from moqt.profiles import PROFILES
from moqt.quic import EndpointConfig, QuicSettings
from moqt.quic.backend import QuicServer
from tests.support import backends
from tests.support.relay import start_relay
from tests.support.servers import role_config, running
from tests.test_moqt_kvsp import COMPAT, DESCRIPTOR, GEOMETRY, SCOPE, container, key
from tests.test_relay_holder import lookup_moqt

pytestmark = pytest.mark.loopback

DRAFTS = sorted(p.draft for p in PROFILES)
T = 30.0


def client_for(pki: DevPki, draft: int, name: str = "client") -> MoqtBlockClient:
    """A block client pinned to ``draft`` on the test's back-end (on picoquic with a token for its
    identity and every KVSP namespace, its only way to authenticate there)."""
    files = pki.files(name)
    settings = dataclasses.replace(BLOCK_CLIENT_QUIC, drafts=(draft,), quic=backends.CURRENT)
    return MoqtBlockClient(EndpointConfig.from_files(files.cert, files.key, files.ca, settings),
                           token=backends.token_for(pki.uri(name), namespaces=[(b"kvsp",)]))


def _policy(pki: DevPki) -> Policy:
    client, holder = pki.uri("client"), pki.uri("h1")
    return Policy(scopes={SCOPE: ScopeGrant(lookup=frozenset({client}), read=frozenset({client}),
                                            store=frozenset({client, holder}))})


def _holder(pki: DevPki, tmp: Path, policy: Policy, **moqt: object) -> tuple[dict[str, object], int]:
    descriptor = tmp / "model.json"
    descriptor.write_text(json.dumps(DESCRIPTOR.to_json()))
    port = free_udp_port()
    section = {"index": pki.uri("is"), "descriptors": [str(descriptor)], "host_capacity_octets": 1 << 24,
               "moqt_listen": f"127.0.0.1:{port}", "moqt_uri": f"moqt://127.0.0.1:{port}/holder",
               **backends.holder_keys(tmp), **moqt}
    return section, port


async def test_one_block_is_the_same_over_every_draft_and_https(tmp_path: Path, quic_backend: str) -> None:
    pki = DevPki.make(tmp_path / "pki", ["client", "is", "h1"])
    policy = _policy(pki)
    section, _ = _holder(pki, tmp_path, policy)
    session = pki.session("client")
    clients = {d: client_for(pki, d) for d in DRAFTS}
    try:
        async with running(role_config(pki, "is", ("is",), policy)), \
                running(role_config(pki, "h1", ("holder",), policy, {"holder": section},
                                    moqt=backends.role_moqt(tmp_path, pki.uri("h1")))) as holder_app:
            holder = pki.uri("h1")
            await HolderClient(session).put_block(holder, COMPAT, SCOPE, key(0), container(0))
            record = await lookup_moqt(pki, session, 0)
            https_record = dataclasses.replace(record, holder=holder, moqt_namespace=None)
            https = await HolderClient(session).get_block(holder, COMPAT, SCOPE, key(0), expect=https_record)
            assert not isinstance(https, BlockMiss) and https.replica_verified
            expected = bytes(https.container.header.encode()) + bytes(https.container.data)
            assert expected == container(0)
            for draft, client in clients.items():
                block = await asyncio.wait_for(client.fetch_block(record, geometry=GEOMETRY), T)
                assert not isinstance(block, BlockMiss) and block.replica_verified, draft
                assert bytes(block.container.header.encode()) + bytes(block.container.data) == expected, draft
                assert block.container.layer_digests() == https.container.layer_digests() == record.layer_digests
                assert _drafts(client) == {draft}
            server = _holder_server(holder_app)
            assert server.sessions_by_draft == {d: 1 for d in DRAFTS}  # one session per client, each its draft
            async with session.http.get(holder + "metrics") as response:
                exposition = await response.text()
            for draft in DRAFTS:  # and the operator sees it
                assert f'kvsp_holder_moqt_sessions_total{{draft="{draft}"}} 1.0' in exposition
    finally:
        for client in clients.values():
            await client.close()
        await session.close()


@pytest.mark.parametrize("draft", DRAFTS)
async def test_a_live_block_streams_layer_by_layer_over_each_draft(tmp_path: Path, draft: int,
                                                                   quic_backend: str) -> None:
    pki = DevPki.make(tmp_path / "pki", ["client", "producer"])
    files = pki.files("producer")
    publisher = Publisher(authorize=kvsp_authorizer(lambda identity, scope: scope == SCOPE))
    config = EndpointConfig.from_files(files.cert, files.key, files.ca, QuicSettings(quic=quic_backend),
                                       token_keys=backends.token_keys())
    port = await publisher.listen("127.0.0.1", 0, config)
    namespace = TrackNamespace(COMPAT, SCOPE, role_id(pki.uri("producer")), key(7))
    producer = LiveBlockPublisher(publisher, namespace)
    layers = decode_container(container(7)).layers
    client = client_for(pki, draft)
    try:
        async with client.subscribe_block(f"moqt://127.0.0.1:{port}/", namespace, Codec.RAW,
                                          layer_count=DESCRIPTOR.layers, geometry=GEOMETRY,
                                          token_count=DESCRIPTOR.block_tokens) as stream:
            received = []
            producer.publish_view(layers[0])
            async for layer in stream.layers():
                received.append(layer)
                if len(received) < len(layers):  # the next layer exists only once this one has arrived
                    producer.publish_view(layers[len(received)])
                else:
                    producer.finish()
            assert stream.complete
        assert [bytes(r.payload) for r in received] == [bytes(v.payload) for v in layers]
        assert tuple(stream.layer_digests) == decode_container(container(7)).layer_digests()
        assert _drafts(client) == {draft}
    finally:
        await client.close()
        await publisher.close()


BRIDGES = [(up, down) for up, down in itertools.product(DRAFTS, DRAFTS) if up != down]


@pytest.mark.parametrize(("upstream", "downstream"), BRIDGES, ids=[f"d{u}-to-d{d}" for u, d in BRIDGES])
async def test_the_relay_bridges_a_holder_at_one_draft_to_clients_at_another(
        tmp_path: Path, upstream: int, downstream: int, quic_backend: str) -> None:
    pki = DevPki.make(tmp_path / "pki", ["client", "other", "is", "h1", "relay-a"])
    policy = _policy(pki)
    policy = dataclasses.replace(policy, scopes={SCOPE: dataclasses.replace(
        policy.scopes[SCOPE], read=policy.scopes[SCOPE].read | {pki.uri("other")})})
    node = await start_relay(pki, "relay-a", policy=policy)
    section, _ = _holder(pki, tmp_path, policy, moqt_relay=node.uri, moqt_drafts=[upstream])
    session = pki.session("client")
    clients = [client_for(pki, downstream), client_for(pki, downstream, "other")]
    try:
        async with running(role_config(pki, "is", ("is",), policy)), \
                running(role_config(pki, "h1", ("holder",), policy, {"holder": section},
                                    moqt=backends.role_moqt(tmp_path, pki.uri("h1")))):
            prefix = (b"kvsp", COMPAT.hex().encode(), SCOPE.hex().encode(), role_id(pki.uri("h1")).encode())
            async with asyncio.timeout(20):
                while prefix not in node.relay.table.under(()):
                    await asyncio.sleep(0.02)
            await HolderClient(session).put_block(pki.uri("h1"), COMPAT, SCOPE, key(0), container(0))
            record = await lookup_moqt(pki, session, 0)
            assert record.holder == node.uri
            for client in clients:  # the first misses and goes upstream, the second hits the cache
                block = await asyncio.wait_for(client.fetch_block(record, geometry=GEOMETRY), T)
                assert not isinstance(block, BlockMiss) and block.replica_verified
                assert bytes(block.container.header.encode()) + bytes(block.container.data) == container(0)
            stats = node.relay.stats
            assert (stats.upstream_fetches, stats.cache_hits) == (1, 1)
            server = node.relay.server
            assert server is not None
            # the holder's upstream session at its draft, the two block clients at theirs
            assert server.sessions_by_draft == {upstream: 1, downstream: 2}
    finally:
        for client in clients:
            await client.close()
        await session.close()
        await node.close()


def _drafts(client: MoqtBlockClient) -> set[int]:
    """The drafts of the client's sessions (one per URI it has talked to)."""
    return {s.endpoint.session.profile.draft for s in client._subscribers.values()}


def _holder_server(app: web.Application) -> QuicServer:
    server = app[HOLDER_MOQT].publisher.server
    assert server is not None
    return server


MIXED = [("aioquic", "picoquic"), ("picoquic", "aioquic")]


@pytest.mark.skipif(backends.PICOQUIC not in backends.BACKENDS, reason="aiopquic is not importable here")
@pytest.mark.parametrize(("holder_quic", "client_quic"), MIXED, ids=[f"holder-{h}-client-{c}" for h, c in MIXED])
async def test_a_holder_role_and_a_block_client_on_different_back_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, holder_quic: str, client_quic: str) -> None:
    """Issue 19 item 4: the holder role on one QUIC stack, the block client on the other, one block
    verified; every client presents its token (a picoquic server sees no certificate, and a picoquic
    client has none to present), so the holder trusts the test issuer whichever stack it runs."""
    pki = DevPki.make(tmp_path / "pki", ["client", "is", "h1"])
    policy = _policy(pki)
    monkeypatch.setattr(backends, "CURRENT", backends.PICOQUIC)  # the issuer's keys and tokens, for both
    section, _ = _holder(pki, tmp_path, policy)
    holder_moqt = backends.role_moqt(tmp_path, pki.uri("h1")) if holder_quic == backends.PICOQUIC else None
    token = backends.token_for(pki.uri("client"), namespaces=[(b"kvsp",)])
    files = pki.files("client")
    settings = dataclasses.replace(BLOCK_CLIENT_QUIC, quic=client_quic)
    client = MoqtBlockClient(EndpointConfig.from_files(files.cert, files.key, files.ca, settings), token=token)
    session = pki.session("client")
    try:
        async with running(role_config(pki, "is", ("is",), policy)), \
                running(role_config(pki, "h1", ("holder",), policy, {"holder": section}, moqt=holder_moqt)) as app:
            await HolderClient(session).put_block(pki.uri("h1"), COMPAT, SCOPE, key(0), container(0))
            record = await lookup_moqt(pki, session, 0)
            block = await asyncio.wait_for(client.fetch_block(record, geometry=GEOMETRY), T)
            assert not isinstance(block, BlockMiss) and block.replica_verified
            assert bytes(block.container.header.encode()) + bytes(block.container.data) == container(0)
            server = _holder_server(app)
            assert type(server).__name__ == ("PicoServer" if holder_quic == backends.PICOQUIC else "MoqtServer")
            sub = next(iter(client._subscribers.values()))
            assert type(sub.endpoint.link).__name__ == ("PicoConnection" if client_quic == backends.PICOQUIC
                                                       else "MoqtConnection")
    finally:
        await client.close()
        await session.close()
