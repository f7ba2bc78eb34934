"""The KVSP binding to MOQT (decision D3): names and per-layer checks, then the real holder role serving its
blocks over MOQT beside HTTPS (loopback, mutual TLS, the real IS), the block client and its fallbacks, and a
block streamed layer by layer while it is produced.

Every await is bounded (``T``): a publisher that misbehaves must end in a fallback, never in a hang.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from control.deploy.pki import DevPki
from control.deploy.ports import free_udp_port
from control.holder.settings import HolderSettings
from kvsp.client.fetch import BlockFetcher, FetchOptions, Outcome
from kvsp.client.holder import BlockMiss, HolderClient
from kvsp.client.http import KvspSession, TransportError
from kvsp.client.moqt import MoqtBlockClient, MoqtClientOptions, MoqtRefusedError
from kvsp.client.ranking import HTTPS_AND_MOQT, LinkTable, rank_replicas
from kvsp.client.verify import ReplicaDigestMismatchError
from kvsp.container import Geometry, LayerDigestMismatchError, LayerRange, decode_container, encode_container
from kvsp.descriptor import CompatDescriptor
from kvsp.errors import ContainerError, ValidationError
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.moqt_binding import (
    K_LENGTH_EXTENSION,
    BlockAssembly,
    LayerCheck,
    LiveBlockPublisher,
    block_namespace,
    k_length_of,
    kvsp_authorizer,
    kvsp_token_rule,
    layer_object,
    layer_range_of,
    layer_window,
    track_name,
)
from kvsp.records import Link, LookupRequest, ReplicaRecord, Residency
from kvsp.registry import Codec, Tier
from kvsp.service.config import RoleConfig
from kvsp.service.policy import Policy, ScopeGrant
from moqt.api import Action, MemoryTrackSource, MoqtObject, Publisher, PublisherSettings, StoredTrack
from moqt.api.memory import MemoryNet
from moqt.auth import issue_token, verify_token
from moqt.kinds import RequestError
from moqt.profiles import PROFILES, Profile
from moqt.quic import EndpointConfig, QuicSettings
from moqt.testing import make_test_certificate
from moqt.tls import PeerTrust
from moqt.wire import Location, Namespace
from tests.support.drafts import DRAFTS
from tests.support.servers import role_config, running

T = 30.0
SCOPE = bytes(range(16))
DESCRIPTOR = CompatDescriptor(model="moqt-model", model_digest=hashlib.sha256(b"moqt").digest(),
                              tokenizer_digest=bytes(32), layers=6, kv_heads=2, head_dim=8, kv_dtype="bf16",
                              positional="rope", block_tokens=4)
COMPAT = DESCRIPTOR.compat_id
GEOMETRY = Geometry.for_dtype(DESCRIPTOR.kv_heads, DESCRIPTOR.head_dim, DESCRIPTOR.kv_dtype, DESCRIPTOR.layers)
SECTION = GEOMETRY.section_length(DESCRIPTOR.block_tokens)
HOLDER_ID = role_id("https://h.example/kvsp/")


def key(i: int) -> bytes:
    return hashlib.sha256(b"moqt block %d" % i).digest()


def sections(i: int) -> list[tuple[bytes, bytes]]:
    rng = random.Random(i)
    return [(rng.randbytes(SECTION), rng.randbytes(SECTION)) for _ in range(DESCRIPTOR.layers)]


def container(i: int) -> bytes:
    return encode_container(Codec.RAW, 0, DESCRIPTOR.block_tokens, sections(i), geometry=GEOMETRY)


def record_of(i: int, holder: str = "moqt://127.0.0.1:1/h", holder_id: str = HOLDER_ID) -> ReplicaRecord:
    c = decode_container(container(i))
    digests = c.layer_digests()
    return ReplicaRecord(key(i), COMPAT, SCOPE, holder, Codec.RAW, len(container(i)),
                         hashlib.sha256(b"".join(digests)).digest(), (Residency(Tier.HOST, (0, 5)),), 60_000,
                         digests, TrackNamespace(COMPAT, SCOPE, holder_id, key(i)))


def objects_of(i: int) -> list[MoqtObject]:
    return [layer_object(view.layer, view.payload, view.k_length, Codec.RAW)
            for view in decode_container(container(i)).layers]


# -- the binding, sans I/O ----------------------------------------------------------------------------
def test_names_follow_d3() -> None:
    ns = block_namespace(COMPAT, SCOPE, HOLDER_ID, key(0))
    assert ns == (b"kvsp", COMPAT.hex().encode(), SCOPE.hex().encode(), HOLDER_ID.encode(), key(0).hex().encode())
    assert TrackNamespace.from_fields(ns).encode() == TrackNamespace(COMPAT, SCOPE, HOLDER_ID, key(0)).encode()
    assert track_name(Codec.RAW) == b"raw" and track_name(0xFF01) == b"codec-ff01"
    assert layer_window(LayerRange(2, 4)) == (Location(0, 2), Location(0, 5))
    assert layer_range_of(Location(0, 2), Location(0, 5), 5) == LayerRange(2, 4)
    assert layer_range_of(Location(0, 0), Location(1, 0), 5) == LayerRange(0, 5)
    assert layer_range_of(Location(1, 0), Location(2, 0), 5) is None


def test_layer_objects_and_k_length() -> None:
    raw = layer_object(3, b"k" * 4 + b"v" * 4, 4, Codec.RAW)
    assert (raw.group, raw.object_id, raw.extensions, k_length_of(raw, Codec.RAW)) == (0, 3, (), 4)
    coded = layer_object(3, b"k" * 3 + b"v" * 5, 3, 0xFF01)
    assert coded.extension(K_LENGTH_EXTENSION) == 3 and k_length_of(coded, 0xFF01) == 3
    with pytest.raises(ContainerError):
        k_length_of(MoqtObject(0, 0, memoryview(b"odd")), Codec.RAW)
    with pytest.raises(ContainerError):
        k_length_of(MoqtObject(0, 0, memoryview(b"no extension")), 0xFF01)


def test_block_assembly_rebuilds_the_container_and_checks_every_digest() -> None:
    record = record_of(0)
    assembly = BlockAssembly.for_replica(record, LayerRange(0, 5), geometry=GEOMETRY)
    for obj in objects_of(0):
        slot = assembly.allocate(obj.group, obj.object_id, obj.payload.nbytes)
        assert slot is not None
        slot[:] = obj.payload
        assert assembly.accept(dataclasses.replace(obj, payload=slot)).layer == obj.object_id
    block = assembly.finish()
    assert block.replica_verified and bytes(block.container.header.encode()) + bytes(block.container.data) \
        == container(0)
    assert assembly.allocate(0, 0, 10) is None  # nothing more is expected

    bad = [dataclasses.replace(o, payload=memoryview(bytes(o.payload[:-1]) + b"\0")) if o.object_id == 2 else o
           for o in objects_of(0)]
    check = BlockAssembly.for_replica(record, LayerRange(0, 5), token_count=4, geometry=GEOMETRY)
    with pytest.raises(LayerDigestMismatchError):
        for obj in bad:
            check.accept(obj)
    with pytest.raises(ContainerError):  # out of order
        BlockAssembly.for_replica(record, LayerRange(0, 5), geometry=GEOMETRY).accept(objects_of(0)[1])
    short = BlockAssembly.for_replica(record, LayerRange(0, 5), geometry=GEOMETRY)
    short.accept(objects_of(0)[0])
    with pytest.raises(ContainerError):
        short.finish()
    forged = dataclasses.replace(record, digest=bytes(32))  # layer digests right, replica digest wrong
    whole = BlockAssembly.for_replica(forged, LayerRange(0, 5), geometry=GEOMETRY)
    for obj in objects_of(0):
        whole.accept(obj)
    with pytest.raises(ReplicaDigestMismatchError):
        whole.finish()


def test_layer_check_of_a_live_block_computes_digests() -> None:
    check = LayerCheck(Codec.RAW, LayerRange(0, 5), geometry=GEOMETRY)
    for obj in objects_of(1):
        check.check(obj)
    assert tuple(check.digests) == decode_container(container(1)).layer_digests()
    assert check.expected is None and check.token_count == DESCRIPTOR.block_tokens


def test_authorization_rules() -> None:
    ns = block_namespace(COMPAT, SCOPE, HOLDER_ID, key(0))
    authorize = kvsp_authorizer(lambda who, scope: who == "https://reader/" and scope == SCOPE)
    assert authorize("https://reader/", ns, Action.FETCH)
    assert not authorize("https://other/", ns, Action.FETCH)
    assert not authorize("https://reader/", (b"not", b"kvsp"), Action.SUBSCRIBE)
    issuer = ec.generate_private_key(ec.SECP256R1())
    now = int(time.time())
    by_scope = verify_token(issue_token(issuer, "https://t/", [SCOPE], expires_at=now + 60, now=now),
                            [issuer.public_key()], now)
    by_prefix = verify_token(issue_token(issuer, "https://t/", namespaces=[ns[:2]], expires_at=now + 60, now=now),
                             [issuer.public_key()], now)
    other = verify_token(issue_token(issuer, "https://t/", [bytes(16)], expires_at=now + 60, now=now),
                         [issuer.public_key()], now)
    assert kvsp_token_rule(by_scope, ns) and kvsp_token_rule(by_prefix, ns) and not kvsp_token_rule(other, ns)


def test_moqt_replicas_rank_by_cost_beside_https() -> None:
    moqt = record_of(0, "moqt://127.0.0.1:1/h")
    https = dataclasses.replace(moqt, holder="https://h.example/kvsp/", moqt_namespace=None)
    links = LinkTable.of([Link("moqt://127.0.0.1:1/h", 100_000, 10), Link("https://h.example/kvsp/", 1_000, 500)])
    assert rank_replicas([https, moqt], links) == (https,)  # without a MOQT client: https only
    assert rank_replicas([https, moqt], links, schemes=HTTPS_AND_MOQT) == (moqt, https)
    no_digests = dataclasses.replace(moqt, layer_digests=(), digest=moqt.digest)
    assert rank_replicas([no_digests], links, schemes=HTTPS_AND_MOQT) == ()


def test_holder_moqt_settings(tmp_path: Path) -> None:
    pki = DevPki.make(tmp_path / "pki", ["h"])
    descriptor = tmp_path / "d.json"
    descriptor.write_text(json.dumps(DESCRIPTOR.to_json()))

    def settings(**extra: object) -> HolderSettings:
        return HolderSettings.from_config(role_config(pki, "h", ("holder",), Policy(), {"holder": {
            "descriptors": [str(descriptor)], **extra}}))

    ok = settings(moqt_listen="127.0.0.1:4433", moqt_uri="moqt://127.0.0.1:4433/holder")
    assert ok.moqt is not None and (ok.moqt.host, ok.moqt.port, ok.moqt.uri) == ("127.0.0.1", 4433,
                                                                                "moqt://127.0.0.1:4433/holder")
    assert settings().moqt is None
    for bad in ({"moqt_listen": "127.0.0.1:4433"}, {"moqt_listen": "nope", "moqt_uri": "moqt://h:1/"},
                {"moqt_listen": "h:1", "moqt_uri": "https://h:1/"}, {"moqt_token_keys": ["k.pem"]}):
        with pytest.raises(ValidationError):
            settings(**bad)


# -- the real holder over MOQT and HTTPS ----------------------------------------------------------------
@dataclass
class Deployment:
    pki: DevPki
    session: KvspSession
    moqt_uri: str
    issuer: ec.EllipticCurvePrivateKey

    @property
    def holder(self) -> str:
        return self.pki.uri("h1")

    def client(self, name: str | None = "client", token: bytes | None = None,
               profile: Profile | None = None) -> MoqtBlockClient:
        """A block client; with ``profile`` it offers that draft alone (the holder accepts every one)."""
        d = self.pki.dir
        cert, key_file = (d / f"{name}.pem", d / f"{name}.key") if name else (None, None)
        drafts = (profile.draft,) if profile is not None else None
        config = EndpointConfig.from_files(cert, key_file, d / "ca.pem", QuicSettings(auth_timeout_s=2.0,
                                                                                      drafts=drafts))
        return MoqtBlockClient(config, token=token)

    async def put(self, i: int) -> tuple[ReplicaRecord, ReplicaRecord]:
        """Store block i over HTTPS; (its https record, its moqt record) once both are at the IS."""
        await HolderClient(self.session).put_block(self.holder, COMPAT, SCOPE, key(i), container(i))
        request = LookupRequest(SCOPE, COMPAT, (key(i),))
        index = BlockFetcher(self.session, self.pki.uri("is")).index
        for _ in range(250):
            answer = await index.lookup(request)
            if answer.matched and len(answer.replicas[0]) == 2:
                by_scheme = {r.holder.split(":")[0]: r for r in answer.replicas[0]}
                return by_scheme["https"], by_scheme["moqt"]
            await asyncio.sleep(0.02)
        raise AssertionError("the holder did not publish both records")


def holder_config(pki: DevPki, tmp: Path, policy: Policy, port: int, key_file: Path, **tiers: object) -> RoleConfig:
    descriptor = tmp / "model.json"
    descriptor.write_text(json.dumps(DESCRIPTOR.to_json()))
    return role_config(pki, "h1", ("holder",), policy, {"holder": {
        "index": pki.uri("is"), "descriptors": [str(descriptor)], "host_capacity_octets": 1 << 24,
        "moqt_listen": f"127.0.0.1:{port}", "moqt_uri": f"moqt://127.0.0.1:{port}/holder",
        "moqt_token_keys": [str(key_file)], **tiers}})


@pytest.fixture(name="world")
async def world_fixture(tmp_path: Path) -> AsyncIterator[tuple[Deployment, Path, Policy, int, Path]]:
    pki = DevPki.make(tmp_path / "pki", ["client", "stranger", "is", "h1", "double"])
    client, holder = pki.uri("client"), pki.uri("h1")
    policy = Policy(scopes={SCOPE: ScopeGrant(lookup=frozenset({client}), read=frozenset({client, "https://tok/"}),
                                              store=frozenset({client, holder}))})
    issuer = ec.generate_private_key(ec.SECP256R1())
    key_file = tmp_path / "issuer.pub.pem"
    key_file.write_bytes(issuer.public_key().public_bytes(serialization.Encoding.PEM,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo))
    port = free_udp_port()
    async with running(role_config(pki, "is", ("is",), policy)):
        session = pki.session("client")
        try:
            yield Deployment(pki, session, f"moqt://127.0.0.1:{port}/holder", issuer), tmp_path, policy, port, key_file
        finally:
            await session.close()


@pytest.fixture(name="deployment")
async def deployment_fixture(world: tuple[Deployment, Path, Policy, int, Path]) -> AsyncIterator[Deployment]:
    deployment, tmp, policy, port, key_file = world
    async with running(holder_config(deployment.pki, tmp, policy, port, key_file)):
        yield deployment


@DRAFTS
async def test_moqt_fetch_is_byte_identical_to_https(deployment: Deployment, profile: Profile) -> None:
    https, moqt = await deployment.put(0)
    assert moqt.holder == deployment.moqt_uri and moqt.moqt_namespace is not None
    assert moqt.moqt_namespace.holder_id == role_id(deployment.holder)  # the producer: the https identity
    assert (moqt.layer_digests, moqt.digest, moqt.size) == (https.layer_digests, https.digest, https.size)
    client = deployment.client(profile=profile)
    try:
        async with asyncio.timeout(T):
            over_https = await HolderClient(deployment.session).get_block(https.holder, COMPAT, SCOPE, key(0),
                                                                         expect=https)
            over_moqt = await client.fetch_block(moqt, geometry=GEOMETRY)
            assert not isinstance(over_https, BlockMiss) and not isinstance(over_moqt, BlockMiss)
            for block in (over_https, over_moqt):
                assert bytes(block.container.header.encode()) + bytes(block.container.data) == container(0)
                assert block.layer_digests == https.layer_digests and block.replica_verified
            async with client.open_block(moqt, layers=LayerRange(2, 4), geometry=GEOMETRY) as stream:
                layers = [(view.layer, bytes(view.k), bytes(view.v)) async for view in stream.layers()]
            assert layers == [(i, *sections(0)[i]) for i in range(2, 5)]
            assert not stream.block.replica_verified and stream.block.container.layer_range == LayerRange(2, 4)
    finally:
        await client.close()


async def test_block_fetcher_prefers_the_cheaper_moqt_replica(deployment: Deployment) -> None:
    await deployment.put(1)
    client = deployment.client()
    options = FetchOptions(geometry=GEOMETRY, links=(Link(deployment.moqt_uri, 100_000, 10),),
                           default_mbit_per_s=1_000, default_rtt_us=2_000)
    fetcher = BlockFetcher(deployment.session, deployment.pki.uri("is"), options=options, moqt=client)
    try:
        async with asyncio.timeout(T):
            result = await fetcher.fetch(SCOPE, COMPAT, [key(1)], block_tokens=DESCRIPTOR.block_tokens)
    finally:
        await client.close()
    assert result.loaded_blocks == 1 and result.blocks[0].replica.holder == deployment.moqt_uri
    assert [a.outcome for a in result.attempts] == [Outcome.LOADED]
    assert bytes(result.blocks[0].container.data) == container(1)[decode_container(container(1)).header_length:]


async def test_refusals_from_the_holder(deployment: Deployment) -> None:
    _, moqt = await deployment.put(2)
    now = int(time.time())
    good = issue_token(deployment.issuer, "https://tok/", [SCOPE], expires_at=now + 60, now=now)
    narrow = issue_token(deployment.issuer, "https://tok/", [bytes(16)], expires_at=now + 60, now=now)
    clients = stranger, anonymous, reader, with_token, with_narrow_token = (
        deployment.client("stranger"), deployment.client(None), deployment.client(),
        deployment.client(None, good), deployment.client(None, narrow))
    try:
        async with asyncio.timeout(T):
            with pytest.raises(MoqtRefusedError) as info:  # authenticated, but may not read the scope
                await stranger.fetch_block(moqt, geometry=GEOMETRY)
            assert info.value.error is RequestError.UNAUTHORIZED
            with pytest.raises((MoqtRefusedError, TransportError)):  # neither certificate nor token
                await anonymous.fetch_block(moqt, geometry=GEOMETRY)
            foreign = dataclasses.replace(moqt, moqt_namespace=TrackNamespace(COMPAT, SCOPE, HOLDER_ID, key(2)))
            assert isinstance(await reader.fetch_block(foreign, geometry=GEOMETRY), BlockMiss)  # not its producer
            block = await with_token.fetch_block(moqt, geometry=GEOMETRY)
            assert not isinstance(block, BlockMiss) and block.replica_verified
            with pytest.raises(MoqtRefusedError):  # a token that does not name the scope
                await with_narrow_token.fetch_block(moqt, geometry=GEOMETRY)
    finally:
        for client in clients:
            await client.close()


async def test_both_records_are_withdrawn_at_shutdown(world: tuple[Deployment, Path, Policy, int, Path]) -> None:
    deployment, tmp, policy, port, key_file = world
    async with running(holder_config(deployment.pki, tmp, policy, port, key_file)):
        await deployment.put(3)
    index = BlockFetcher(deployment.session, deployment.pki.uri("is")).index
    assert (await index.lookup(LookupRequest(SCOPE, COMPAT, (key(3),)))).matched == 0


async def test_moqt_fetch_from_encrypted_local_storage(world: tuple[Deployment, Path, Policy, int, Path]) -> None:
    deployment, tmp, policy, port, key_file = world
    config = holder_config(deployment.pki, tmp, policy, port, key_file, host_capacity_octets=0,
                           storage_dir=str(tmp / "blocks"))
    client = deployment.client()
    try:
        async with running(config), asyncio.timeout(T):
            _, moqt = await deployment.put(6)
            block = await client.fetch_block(moqt, layers=LayerRange(1, 5), geometry=GEOMETRY)
            assert not isinstance(block, BlockMiss)
            assert [(bytes(v.k), bytes(v.v)) for v in block.layers] == sections(6)[1:]
    finally:
        await client.close()


# -- fallback from misbehaving MOQT publishers ------------------------------------------------------------
class Vanishing:
    """A stored track whose publisher closes the connection after layer 3."""

    def __init__(self, objects: list[MoqtObject], publisher: Publisher) -> None:
        self.objects, self.publisher = objects, publisher
        self.largest = objects[-1].location
        self.complete = True

    async def read(self, start: Location, end: Location) -> AsyncIterator[MoqtObject]:
        for obj in self.objects:
            yield obj
            if obj.object_id == 3:
                await asyncio.sleep(0.05)
                for endpoint in self.publisher.endpoints:
                    endpoint.close(0x1, "vanished")
                await asyncio.sleep(3600)


async def double(deployment: Deployment, objects: list[MoqtObject], *, vanish: bool = False) -> Publisher:
    source = MemoryTrackSource()
    publisher = Publisher(source, authorize=lambda who, ns, action: True)

    async def lookup(namespace: Namespace, name: bytes) -> Vanishing | None:
        return Vanishing(objects, publisher)

    if vanish:
        source.lookup = lookup  # type: ignore[method-assign, assignment]
    else:
        source.lookup = lambda ns, name: _found(source, objects)  # type: ignore[method-assign, assignment]
    d = deployment.pki.dir
    await publisher.listen("127.0.0.1", 0, EndpointConfig.from_files(d / "double.pem", d / "double.key", d / "ca.pem"))
    return publisher


async def _found(source: MemoryTrackSource, objects: list[MoqtObject]) -> StoredTrack:
    return source.put((b"any",), b"raw", objects)


@pytest.mark.parametrize("vanish", [False, True])
async def test_bad_moqt_publisher_falls_back_to_https(deployment: Deployment, vanish: bool) -> None:
    https, moqt = await deployment.put(4)
    objects = objects_of(4)
    if not vanish:  # flip one byte of layer 2
        flipped = bytearray(objects[2].payload)
        flipped[7] ^= 0x01
        objects[2] = dataclasses.replace(objects[2], payload=memoryview(bytes(flipped)))
    publisher = await double(deployment, objects, vanish=vanish)
    bad = dataclasses.replace(moqt, holder=f"moqt://127.0.0.1:{publisher.port}/")
    client = deployment.client()
    fetcher = BlockFetcher(deployment.session, deployment.pki.uri("is"), options=FetchOptions(geometry=GEOMETRY),
                           moqt=client)
    try:
        async with asyncio.timeout(T):
            result = await fetcher.load(SCOPE, COMPAT, [[bad, https]], block_tokens=DESCRIPTOR.block_tokens)
    finally:
        await client.close()
        await publisher.close()
    expected = Outcome.TRANSPORT if vanish else Outcome.DIGEST_MISMATCH
    assert [a.outcome for a in result.attempts] == [expected, Outcome.LOADED]
    assert result.loaded_blocks == 1 and result.blocks[0].replica.holder == https.holder
    assert bytes(result.blocks[0].container.data) == container(4)[decode_container(container(4)).header_length:]


# -- every draft, in memory (issue 18 item 3) -------------------------------------------------------------
async def _memory_client(publisher: Publisher, profile: Profile, uri: str) -> MoqtBlockClient:
    """A block client whose session to ``uri`` is an in-memory pair at ``profile``'s draft."""
    net = MemoryNet(profile=profile)
    net.serve(publisher)
    unused = EndpointConfig(PeerTrust([make_test_certificate()[0]]))  # the session is adopted, never dialled
    client = MoqtBlockClient(unused, options=MoqtClientOptions(stall_timeout_s=None))
    client.adopt(uri, await net.subscriber(timeout_s=T))
    return client


async def test_a_block_fetched_over_every_draft_is_identical() -> None:
    record = record_of(7)
    source = MemoryTrackSource()
    source.put(record.moqt_namespace.fields(), track_name(Codec.RAW), objects_of(7))  # type: ignore[union-attr]
    publisher = Publisher(source, authorize=lambda who, ns, action: True)
    blocks = {}
    for profile in PROFILES:
        client = await _memory_client(publisher, profile, record.holder)
        try:
            async with asyncio.timeout(T):
                block = await client.fetch_block(record, geometry=GEOMETRY)
        finally:
            await client.close()
        assert not isinstance(block, BlockMiss) and block.replica_verified
        blocks[profile.draft] = (bytes(block.container.header.encode()) + bytes(block.container.data),
                                 block.container.layer_digests())
    assert len(set(blocks.values())) == 1 and next(iter(blocks.values()))[0] == container(7)
    assert next(iter(blocks.values()))[1] == record.layer_digests
    await publisher.close()


@DRAFTS
async def test_live_layers_over_subscribe_at_each_draft(profile: Profile) -> None:
    publisher = Publisher(authorize=lambda who, ns, action: True)
    namespace = TrackNamespace(COMPAT, SCOPE, HOLDER_ID, key(8))
    producer = LiveBlockPublisher(publisher, namespace)
    uri = "moqt://producer.test/live"
    client = await _memory_client(publisher, profile, uri)
    data, digests = sections(8), decode_container(container(8)).layer_digests()
    try:
        async with asyncio.timeout(T), client.subscribe_block(uri, namespace, Codec.RAW, layer_count=len(data),
                                                               layer_digests=digests, geometry=GEOMETRY) as stream:
            producer.publish_layer(0, data[0][0] + data[0][1])
            got = []
            async for view in stream.layers():
                got.append((bytes(view.k), bytes(view.v)))
                if view.layer + 1 < len(data):  # the next layer exists only once this one arrived
                    producer.publish_layer(view.layer + 1, b"".join(data[view.layer + 1]))
                else:
                    producer.finish()
        assert got == data and stream.complete and stream.layer_digests == producer.layer_digests == digests
    finally:
        await client.close()
        await publisher.close()


# -- a block streamed while it is produced -----------------------------------------------------------------
async def test_live_block_layer_by_layer(deployment: Deployment) -> None:
    d, client_uri = deployment.pki.dir, deployment.pki.uri("client")
    publisher = Publisher(authorize=kvsp_authorizer(lambda who, scope: who == client_uri and scope == SCOPE))
    port = await publisher.listen("127.0.0.1", 0, EndpointConfig.from_files(d / "double.pem", d / "double.key",
                                                                           d / "ca.pem"))
    namespace = TrackNamespace(COMPAT, SCOPE, role_id(deployment.pki.uri("double")), key(5))
    producer = LiveBlockPublisher(publisher, namespace)
    data = sections(5)
    produced = 0
    received = [asyncio.Event() for _ in data]

    async def produce() -> None:
        nonlocal produced
        for layer, (k, v) in enumerate(data):
            producer.publish_layer(layer, k + v)
            produced = layer + 1
            await received[layer].wait()  # layer l+1 is computed only after layer l arrived
        producer.finish()

    client = deployment.client()
    digests = decode_container(container(5)).layer_digests()
    try:
        async with asyncio.timeout(T):
            async with client.subscribe_block(f"moqt://127.0.0.1:{port}/", namespace, Codec.RAW,
                                              layer_count=DESCRIPTOR.layers, layer_digests=digests,
                                              geometry=GEOMETRY) as stream:
                task = asyncio.create_task(produce())
                async for view in stream.layers():
                    assert produced == view.layer + 1  # yielded before the next layer exists
                    assert (bytes(view.k), bytes(view.v)) == data[view.layer]
                    received[view.layer].set()
                await task
            assert stream.complete and stream.layer_digests == producer.layer_digests == digests
    finally:
        await client.close()
        await publisher.close()


async def test_fetches_past_the_request_window_wait_for_ids_instead_of_failing(deployment: Deployment) -> None:
    # The publisher lets a peer have 2 requests open; 8 fetches at once must all succeed over MOQT on one
    # session (waiting for MAX_REQUEST_ID), not tear the session down and fail the fetches in flight.
    _https, moqt = await deployment.put(6)
    objects = objects_of(6)
    source = MemoryTrackSource()
    source.lookup = lambda ns, name: _found(source, objects)  # type: ignore[method-assign, assignment]
    publisher = Publisher(source, authorize=lambda who, ns, action: True, settings=PublisherSettings(request_window=2))
    d = deployment.pki.dir
    await publisher.listen("127.0.0.1", 0, EndpointConfig.from_files(d / "double.pem", d / "double.key", d / "ca.pem"))
    record = dataclasses.replace(moqt, holder=f"moqt://127.0.0.1:{publisher.port}/")
    client = deployment.client()
    try:
        async with asyncio.timeout(T):
            blocks = await asyncio.gather(*(client.fetch_block(record, geometry=GEOMETRY) for _ in range(8)))
            sessions = len(publisher.endpoints)
    finally:
        await client.close()
        await publisher.close()
    for block in blocks:
        assert not isinstance(block, BlockMiss) and block.replica_verified
        assert bytes(block.container.data) == container(6)[decode_container(container(6)).header_length:]
    assert sessions == 1


async def test_a_bad_block_through_the_local_relay_withdraws_the_published_record(deployment: Deployment) -> None:
    # The client reads moqt replicas through its rack relay (a rewritten record the IS never saw); a digest
    # mismatch there must withdraw the record that was published, then fall back to https.
    https, moqt = await deployment.put(7)
    objects = objects_of(7)
    flipped = bytearray(objects[1].payload)
    flipped[3] ^= 0x01
    objects[1] = dataclasses.replace(objects[1], payload=memoryview(bytes(flipped)))
    relay = await double(deployment, objects)
    relay_uri = f"moqt://127.0.0.1:{relay.port}/"
    client = deployment.client()
    fetcher = BlockFetcher(deployment.session, deployment.pki.uri("is"),
                           options=FetchOptions(geometry=GEOMETRY, local_relay=relay_uri), moqt=client)
    withdrawn: list[tuple[str, bytes, str | None]] = []

    async def withdraw(holder: str, block_key: bytes, *, producer: str | None = None) -> None:
        withdrawn.append((holder, block_key, producer))

    fetcher.index.withdraw = withdraw  # type: ignore[method-assign, assignment]
    try:
        async with asyncio.timeout(T):
            result = await fetcher.load(SCOPE, COMPAT, [[moqt, https]], block_tokens=DESCRIPTOR.block_tokens)
    finally:
        await client.close()
        await relay.close()
    assert [(a.holder, a.outcome) for a in result.attempts] == [(relay_uri, Outcome.DIGEST_MISMATCH),
                                                               (https.holder, Outcome.LOADED)]
    # only the bad replica's producer (the namespace's holder-id), not every record at the relay's path
    assert withdrawn == [(moqt.holder, key(7), moqt.producer_id)]
    assert moqt.producer_id != role_id(relay_uri)
