"""HolderClient over real mutual TLS against the misbehaving holder double (spec sections 6.6, 6.7)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator

import pytest

from control.deploy.ports import free_port
from kvsp.client.holder import BlockMiss, BlockStream, HolderClient, HolderOptions, MissReason, StoreOutcome
from kvsp.client.http import TransportError
from kvsp.client.verify import (
    BlockCheck,
    ReprDigestMismatchError,
    ReprDigestMissingError,
    UnexpectedBlockError,
    VerifiedBlock,
    format_repr_digest,
)
from kvsp.container import LayerDigestMismatchError, LayerRange, decode_container, encode_parts
from kvsp.errors import ContainerError
from kvsp.problems import ProblemError, ProblemType
from tests.support.client_doubles import (
    COMPAT,
    LAYERS,
    SCOPE,
    TOKENS,
    Doubles,
    Mode,
    client_pki_fixture,  # noqa: F401 - the fixtures client_pki and doubles
    doubles_fixture,  # noqa: F401
    key_of,
    make_container,
    publish,
)


@pytest.fixture
async def client(doubles: Doubles) -> AsyncIterator[HolderClient]:
    session = doubles.pki.session("client")
    try:
        yield HolderClient(session, HolderOptions(read_timeout_s=0.5, block_timeout_s=5.0))
    finally:
        await session.close()


async def get(client: HolderClient, doubles: Doubles, i: int, holder: str = "h1",
              **kw: object) -> VerifiedBlock | BlockMiss:
    record = next(r for r in doubles.index.replicas[key_of(i)] if r.holder == doubles[holder].uri)
    return await client.get_block(record.holder, COMPAT, SCOPE, key_of(i), expect=record, **kw)  # type: ignore[arg-type]


async def test_get_block_verifies_and_returns_the_container(client: HolderClient, doubles: Doubles) -> None:
    publish(doubles, 0, "h1")
    block = await get(client, doubles, 0)
    assert not isinstance(block, BlockMiss)
    assert bytes(block.container.data) == bytes(decode_container(make_container(0)).data)
    assert block.replica_verified
    assert len(block.layer_digests) == LAYERS
    assert block.repr_digest == hashlib.sha256(make_container(0)).digest()
    # Mutual TLS: the holder saw the client's certificate identity.
    assert doubles["h1"].peers == [doubles.pki.uri("client")]


async def test_connection_is_reused_across_requests(client: HolderClient, doubles: Doubles) -> None:
    for i in range(3):
        publish(doubles, i, "h1")
    for i in range(3):
        assert not isinstance(await get(client, doubles, i), BlockMiss)
    connector = client.session.http.connector
    assert connector is not None
    assert sum(len(v) for v in connector._conns.values()) == 1  # one pooled TLS connection


@pytest.mark.parametrize(("mode", "reason"), [(Mode.NOT_FOUND, MissReason.NOT_FOUND),
                                              (Mode.LAYERS_UNAVAILABLE, MissReason.LAYERS_UNAVAILABLE)])
async def test_404_is_a_miss_value(client: HolderClient, doubles: Doubles, mode: Mode,
                                   reason: MissReason) -> None:
    publish(doubles, 0, "h1", modes={"h1": mode})
    answer = await get(client, doubles, 0)
    assert answer == BlockMiss(doubles["h1"].uri, reason, None)


async def test_unknown_block_is_a_miss(client: HolderClient, doubles: Doubles) -> None:
    answer = await client.get_block(doubles["h2"].uri, COMPAT, SCOPE, key_of(9))
    assert isinstance(answer, BlockMiss) and answer.reason is MissReason.NOT_FOUND


async def test_other_problems_raise_problem_error(client: HolderClient, doubles: Doubles) -> None:
    publish(doubles, 0, "h1", modes={"h1": Mode.FORBIDDEN})
    with pytest.raises(ProblemError) as info:
        await get(client, doubles, 0)
    assert info.value.problem.kind is ProblemType.SCOPE_DENIED


@pytest.mark.parametrize(("mode", "error"), [
    (Mode.WRONG_REPR, ReprDigestMismatchError),
    (Mode.NO_REPR, ReprDigestMissingError),
    (Mode.CORRUPT_LAYER, LayerDigestMismatchError),
    (Mode.CLOSE_MID_BODY, TransportError),
    (Mode.STALL, TransportError),
])
async def test_misbehaviour_is_a_typed_failure(client: HolderClient, doubles: Doubles, mode: Mode,
                                               error: type[Exception]) -> None:
    publish(doubles, 0, "h1", modes={"h1": mode})
    start = time.monotonic()
    with pytest.raises(error):
        await get(client, doubles, 0)
    assert time.monotonic() - start < 3  # a stalled holder fails after read_timeout_s, not never


async def test_without_a_record_only_repr_digest_protects(client: HolderClient,
                                                          doubles: Doubles) -> None:
    """Without the record, a corrupted body under a matching Repr-Digest passes: the record is what
    gives producer-level integrity, which is why the fetcher always passes it."""
    publish(doubles, 0, "h1", modes={"h1": Mode.CORRUPT_LAYER})
    block = await client.get_block(doubles["h1"].uri, COMPAT, SCOPE, key_of(0))
    assert not isinstance(block, BlockMiss)
    assert block.layer_digests == () and not block.replica_verified


async def test_layers_stream_one_at_a_time_before_the_next_is_sent(client: HolderClient,
                                                                   doubles: Doubles) -> None:
    """Octet-at-a-time delivery; the holder sends layer l+1 only after the client has yielded layer l."""
    holder = doubles["h1"]
    (record,) = publish(doubles, 0, "h1", modes={"h1": Mode.GATED})
    seen = []
    async with client.open_block(holder.uri, COMPAT, SCOPE, key_of(0), expect=record) as stream:
        assert isinstance(stream, BlockStream)
        async for view in stream.layers():
            seen.append(view.layer)
            assert view.digest() == record.layer_digests[view.layer]
            holder.gates.setdefault(view.layer, asyncio.Event()).set()
        block = stream.block
    assert seen == list(range(LAYERS))
    assert holder.gate_timeouts == 0 and len(holder.sent_before_gate) == LAYERS - 1
    assert block.replica_verified


async def test_trickled_body_yields_layers_in_order(client: HolderClient, doubles: Doubles) -> None:
    (record,) = publish(doubles, 0, "h1", modes={"h1": Mode.TRICKLE})
    async with client.open_block(record.holder, COMPAT, SCOPE, key_of(0), expect=record) as stream:
        assert isinstance(stream, BlockStream)
        layers = [view.layer async for view in stream.layers()]
        assert stream.header is not None and stream.header.token_count == TOKENS
    assert layers == list(range(LAYERS))


async def test_stream_can_be_read_once(client: HolderClient, doubles: Doubles) -> None:
    (record,) = publish(doubles, 0, "h1")
    async with client.open_block(record.holder, COMPAT, SCOPE, key_of(0), expect=record) as stream:
        assert isinstance(stream, BlockStream)
        with pytest.raises(RuntimeError):
            _ = stream.block
        await stream.read()
        with pytest.raises(RuntimeError):
            await stream.read()


async def test_layer_range_is_requested_and_verified(client: HolderClient, doubles: Doubles) -> None:
    (record,) = publish(doubles, 0, "h1")
    block = await get(client, doubles, 0, layers=(1, 2))
    assert not isinstance(block, BlockMiss)
    assert [v.layer for v in block.layers] == [1, 2]
    assert block.layer_digests == record.layer_digests[1:3]
    assert not block.replica_verified  # not all layers
    assert doubles["h1"].gets[-1][1] == "layers=1-2"


async def test_container_other_than_requested_is_refused(client: HolderClient, doubles: Doubles) -> None:
    (record,) = publish(doubles, 0, "h1", modes={"h1": Mode.IGNORE_RANGE})
    with pytest.raises(UnexpectedBlockError, match="layers 0-3, expected 1-2"):
        await get(client, doubles, 0, layers=(1, 2))
    with pytest.raises(UnexpectedBlockError, match="tokens"):
        await client.get_block(record.holder, COMPAT, SCOPE, key_of(0),
                               expect=BlockCheck.for_replica(record, token_count=TOKENS + 1))
    with pytest.raises(ValueError, match="disagree"):
        await client.get_block(record.holder, COMPAT, SCOPE, key_of(0), layers=(0, 1),
                               expect=BlockCheck(layers=LayerRange(1, 2)))


async def test_size_limit(doubles: Doubles) -> None:
    publish(doubles, 0, "h1")
    async with doubles.pki.session("client") as session:
        small = HolderClient(session, HolderOptions(max_block_size=100))
        with pytest.raises(ContainerError, match="exceeds the limit"):
            await get(small, doubles, 0)


async def test_unreachable_holder_is_a_transport_error(client: HolderClient) -> None:
    with pytest.raises(TransportError):
        await client.get_block(f"https://127.0.0.1:{free_port()}/gone/", COMPAT, SCOPE, key_of(0))


async def test_lease_renew_release(client: HolderClient, doubles: Doubles) -> None:
    publish(doubles, 0, "h1")
    publish(doubles, 1, "h1")
    holder = doubles["h1"]
    lease = await client.lease(holder.uri, [key_of(0), key_of(1)], 20_000)
    assert lease.block_keys == (key_of(0), key_of(1)) and lease.ttl_ms == 5000  # capped by the holder
    renewed = await client.renew(holder.uri, lease.lease, 3000)
    assert renewed.lease == lease.lease and renewed.ttl_ms == 3000
    assert await client.release(holder.uri, lease.lease) is True
    assert await client.release(holder.uri, "unknown") is False
    with pytest.raises(ProblemError) as info:
        await client.lease(holder.uri, [key_of(7)], 1000)
    assert info.value.problem.kind is ProblemType.NOT_FOUND
    holder.lease_status = 429
    with pytest.raises(ProblemError) as info:
        await client.lease(holder.uri, [key_of(0)], 1000)
    assert info.value.problem.kind is ProblemType.LEASE_QUOTA


@pytest.mark.parametrize("as_parts", [False, True])
async def test_put_block(client: HolderClient, doubles: Doubles, as_parts: bool) -> None:
    holder = doubles["h2"]
    data = make_container(5)
    container = decode_container(data)
    body: object = data
    if as_parts:
        body = encode_parts(1, 0, TOKENS, [(v.k, v.v) for v in container.layers])
    outcome = await client.put_block(holder.uri, COMPAT, SCOPE, key_of(5), body)  # type: ignore[arg-type]
    assert outcome is StoreOutcome.STORED
    stored, headers = holder.stored[key_of(5)]
    assert stored == data
    assert headers["If-None-Match"] == "*"
    assert headers["Repr-Digest"] == format_repr_digest(hashlib.sha256(data).digest())
    assert headers["Content-Type"] == "application/kvsp-block"
    again = await client.put_block(holder.uri, COMPAT, SCOPE, key_of(5), data)
    assert again is StoreOutcome.ALREADY_PRESENT


async def test_put_block_large_offloads_the_digest(doubles: Doubles) -> None:
    holder = doubles["h3"]
    data = make_container(6, layers=2, tokens=4096)  # 2 layers x 2 x 64 KiB: above offload_min
    async with doubles.pki.session("client") as session:
        client = HolderClient(session, HolderOptions(offload_min=1024))
        assert await client.put_block(holder.uri, COMPAT, SCOPE, key_of(6), data) is StoreOutcome.STORED
    stored, headers = holder.stored[key_of(6)]
    assert stored == data and headers["Repr-Digest"] == format_repr_digest(hashlib.sha256(data).digest())


async def test_big_block_verifies_with_offloaded_repr_digest(doubles: Doubles) -> None:
    (record,) = publish(doubles, 3, "h1", make=lambda i: make_container(i, layers=8, tokens=2048))
    async with doubles.pki.session("client") as session:
        client = HolderClient(session, HolderOptions(offload_min=1024))
        block = await client.get_block(record.holder, COMPAT, SCOPE, key_of(3), expect=record)
    assert not isinstance(block, BlockMiss) and block.replica_verified
    assert block.size == record.size
