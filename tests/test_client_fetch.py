"""BlockFetcher against a fake IS and misbehaving holders over real mutual TLS (spec sections 6-8)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from control.deploy.ports import free_port
from kvsp.client.fetch import BlockFetcher, ClientStats, FetchOptions, Outcome
from kvsp.client.holder import HolderClient, HolderOptions
from kvsp.container import LayerRange
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.records import Link
from kvsp.registry import Tier
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
    make_record,
    publish,
)

FAST = HolderOptions(read_timeout_s=0.4, block_timeout_s=5.0)


@pytest.fixture
async def make_fetcher(doubles: Doubles) -> AsyncIterator[object]:
    session = doubles.pki.session("client")

    def make(**options: object) -> BlockFetcher:
        holder_options = options.pop("holder_options", FAST)
        return BlockFetcher(session, doubles.index.uri, holder=HolderClient(session, holder_options),  # type: ignore[arg-type]
                            options=FetchOptions(**options))  # type: ignore[arg-type]

    try:
        yield make
    finally:
        await session.close()


def keys(n: int) -> list[bytes]:
    return [key_of(i) for i in range(n)]


def outcomes(result: object) -> list[tuple[int, str, Outcome]]:
    return [(a.block, a.holder, a.outcome) for a in result.attempts]  # type: ignore[attr-defined]


async def test_happy_path(doubles: Doubles, make_fetcher: object) -> None:
    for i in range(3):
        publish(doubles, i, "h1")
    fetcher: BlockFetcher = make_fetcher()  # type: ignore[operator]
    result = await fetcher.fetch(SCOPE, COMPAT, keys(3), block_tokens=TOKENS)
    assert result.loaded_blocks == 3 and result.matched == 3 and result.requested == 3
    assert result.recompute_from_token == 3 * TOKENS
    for i, block in enumerate(result.blocks):
        assert block.index == i and block.block_key == key_of(i)
        assert block.replica.holder == doubles["h1"].uri
        assert bytes(block.container.data) == make_container(i)[block.container.header_length :]
        assert [v.layer for v in block.layers] == list(range(LAYERS))
        assert block.block.replica_verified
    holder = doubles["h1"]
    # one lease for the three blocks of h1 (section 6.6 leases a list of keys), released afterwards
    assert list(holder.leases.values()) == [tuple(keys(3))] and holder.released == list(holder.leases)
    stats = fetcher.stats
    assert (stats.fetched_blocks, stats.fetched_tokens, stats.recomputed_tokens) == (3, 3 * TOKENS, 0)
    assert stats.hit_ratio == 1.0 and stats.digest_failures == 0


async def test_block_tokens_from_the_containers(doubles: Doubles, make_fetcher: object) -> None:
    publish(doubles, 0, "h1")
    result = await make_fetcher().fetch(SCOPE, COMPAT, keys(2))  # type: ignore[operator]
    assert result.loaded_blocks == 1 and result.matched == 1 and result.block_tokens == TOKENS
    assert result.recompute_from_token == TOKENS


FAILURES = [
    (Mode.WRONG_REPR, Outcome.DIGEST_MISMATCH),
    (Mode.CORRUPT_LAYER, Outcome.DIGEST_MISMATCH),
    (Mode.NO_REPR, Outcome.BAD_RESPONSE),
    (Mode.IGNORE_RANGE, Outcome.BAD_RESPONSE),
    (Mode.NOT_FOUND, Outcome.MISS),
    (Mode.LAYERS_UNAVAILABLE, Outcome.MISS),
    (Mode.CLOSE_MID_BODY, Outcome.TRANSPORT),
    (Mode.STALL, Outcome.TRANSPORT),
    (Mode.FORBIDDEN, Outcome.REJECTED),
]


@pytest.mark.parametrize(("mode", "outcome"), FAILURES)
async def test_falls_back_to_the_next_replica(doubles: Doubles, make_fetcher: object, mode: Mode,
                                              outcome: Outcome) -> None:
    publish(doubles, 0, "h1", "h2", modes={"h1": mode})
    fetcher: BlockFetcher = make_fetcher()  # type: ignore[operator]
    layers = (1, 2) if mode is Mode.IGNORE_RANGE else None
    start = time.monotonic()
    result = await fetcher.fetch(SCOPE, COMPAT, keys(1), block_tokens=TOKENS, layers=layers)
    assert time.monotonic() - start < 3
    assert result.loaded_blocks == 1
    assert result.blocks[0].replica.holder == doubles["h2"].uri
    assert outcomes(result) == [(0, doubles["h1"].uri, outcome), (0, doubles["h2"].uri, Outcome.LOADED)]
    # only the bad replica's own producer: at a relay's URI other producers' records share the path
    h1 = role_id(doubles["h1"].uri)
    withdrawn = [(h1, key_of(0), h1)] if outcome is Outcome.DIGEST_MISMATCH else []
    assert doubles.index.withdrawals == withdrawn
    stats = fetcher.stats
    assert stats.digest_failures == (outcome is Outcome.DIGEST_MISMATCH)
    assert stats.misses == (outcome is Outcome.MISS)
    assert stats.withdrawals == len(withdrawn)


async def test_forbidden_withdrawal_is_fine(doubles: Doubles, make_fetcher: object) -> None:
    doubles.index.withdraw_status = 403
    publish(doubles, 0, "h1", "h2", modes={"h1": Mode.CORRUPT_LAYER})
    fetcher: BlockFetcher = make_fetcher()  # type: ignore[operator]
    result = await fetcher.fetch(SCOPE, COMPAT, keys(1))
    assert result.loaded_blocks == 1 and len(doubles.index.withdrawals) == 1
    assert fetcher.stats.withdrawals_denied == 1 and fetcher.stats.withdrawals == 0


async def test_no_withdrawal_when_disabled(doubles: Doubles, make_fetcher: object) -> None:
    publish(doubles, 0, "h1", "h2", modes={"h1": Mode.WRONG_REPR})
    result = await make_fetcher(withdraw_on_mismatch=False).fetch(SCOPE, COMPAT, keys(1))  # type: ignore[operator]
    assert result.loaded_blocks == 1 and doubles.index.withdrawals == []


async def test_prefix_semantics(doubles: Doubles, make_fetcher: object) -> None:
    """Block 1 fails on every replica: blocks 2 and 3 are not used, even though they arrived fine."""
    publish(doubles, 0, "h1", "h2")
    publish(doubles, 1, "h1", "h2", modes={"h1": Mode.CORRUPT_LAYER, "h2": Mode.NOT_FOUND})
    publish(doubles, 2, "h1", "h2")
    publish(doubles, 3, "h1", "h2")
    fetcher: BlockFetcher = make_fetcher()  # type: ignore[operator]
    result = await fetcher.fetch(SCOPE, COMPAT, keys(4), block_tokens=TOKENS)
    assert result.matched == 4 and result.loaded_blocks == 1
    assert result.recompute_from_token == TOKENS
    assert [b.index for b in result.blocks] == [0]
    assert fetcher.stats.recomputed_tokens == 3 * TOKENS and fetcher.stats.fetched_tokens == TOKENS


async def test_failure_cancels_later_blocks(doubles: Doubles, make_fetcher: object) -> None:
    """With block 0 lost, blocks still waiting for the semaphore never start."""
    publish(doubles, 0, "h1", modes={"h1": Mode.NOT_FOUND})
    for i in range(1, 10):
        publish(doubles, i, "h1")
    doubles["h1"].delay_s = 0.05
    result = await make_fetcher(concurrency=2).fetch(SCOPE, COMPAT, keys(10))  # type: ignore[operator]
    assert result.loaded_blocks == 0 and result.recompute_from_token == 0
    assert len(doubles["h1"].gets) <= 3


async def test_layer_range_fetch_verifies_only_those_layers(doubles: Doubles, make_fetcher: object) -> None:
    """The last layer is corrupted at h1; a fetch of layers 0-1 neither sees nor minds it."""
    (record,) = publish(doubles, 0, "h1", modes={"h1": Mode.CORRUPT_LAYER})
    result = await make_fetcher().fetch(SCOPE, COMPAT, keys(1), layers=(0, 1))  # type: ignore[operator]
    assert result.loaded_blocks == 1
    block = result.blocks[0].block
    assert [v.layer for v in block.layers] == [0, 1]
    assert block.layer_digests == record.layer_digests[:2] and not block.replica_verified
    assert doubles["h1"].gets[-1][1] == "layers=0-1"
    full = await make_fetcher().fetch(SCOPE, COMPAT, keys(1))  # type: ignore[operator]
    assert full.loaded_blocks == 0 and outcomes(full)[0][2] is Outcome.DIGEST_MISMATCH


async def test_concurrency_bound(doubles: Doubles, make_fetcher: object) -> None:
    for i in range(9):
        publish(doubles, i, "h1")
    doubles["h1"].delay_s = 0.2  # longer than a TLS handshake under load, so the overlap is certain
    result = await make_fetcher(concurrency=3, lease_ms=None).fetch(SCOPE, COMPAT, keys(9))  # type: ignore[operator]
    assert result.loaded_blocks == 9
    assert doubles["h1"].max_in_flight == 3  # bounded, and actually parallel


async def test_replicas_tried_in_cost_order(doubles: Doubles, make_fetcher: object) -> None:
    """h2 (host memory, near) first; h3 (1 ms away) before h1, whose storage reads at 1 Mbit/s:
    ~600 octets take 4.8 ms from there (section 6.4 cost: rtt + 8 * octets / rate)."""
    slow = {"tier": Tier.LOCAL_STORAGE, "read_mbit_per_s": 1.0}
    h1 = doubles["h1"].add(0, **slow)  # type: ignore[arg-type]
    h2 = doubles["h2"].add(0, mode=Mode.NOT_FOUND)
    h3 = doubles["h3"].add(0)
    for record in (h1, h3, h2):
        doubles.index.publish(record)
    links = (Link(doubles["h3"].uri, 100_000.0, 1_000), Link(doubles["h2"].uri, 100_000.0, 10),
             Link(doubles["h1"].uri, 100_000.0, 10))
    result = await make_fetcher(links=links).fetch(SCOPE, COMPAT, keys(1))  # type: ignore[operator]
    assert [a[1] for a in outcomes(result)] == [doubles["h2"].uri, doubles["h3"].uri]
    assert result.blocks[0].replica.holder == doubles["h3"].uri


async def test_failed_holder_goes_last_for_later_blocks(doubles: Doubles, make_fetcher: object) -> None:
    """A holder that dropped one GET is tried after the others for the rest of the fetch."""
    for i in range(4):
        publish(doubles, i, "h1", "h2", modes={"h1": Mode.CLOSE_MID_BODY})
    result = await make_fetcher(concurrency=1).fetch(SCOPE, COMPAT, keys(4))  # type: ignore[operator]
    assert result.loaded_blocks == 4
    assert [a[1:] for a in outcomes(result)][:2] == [(doubles["h1"].uri, Outcome.TRANSPORT),
                                                     (doubles["h2"].uri, Outcome.LOADED)]
    assert len(doubles["h1"].gets) == 1


async def test_dead_holder_and_moqt_replicas(doubles: Doubles, make_fetcher: object) -> None:
    """Nobody listens at the first holder; the second is MOQT-only (not this client's): the third serves."""
    data = make_container(0)
    dead = make_record(f"https://127.0.0.1:{free_port()}/dead/", key_of(0), data)
    relay = "moqt://127.0.0.1:4443/relay"
    moqt = replace(make_record(relay, key_of(0), data),
                   moqt_namespace=TrackNamespace(COMPAT, SCOPE, role_id(relay), key_of(0)))
    doubles.index.publish(dead)
    doubles.index.publish(moqt)
    publish(doubles, 0, "h2")
    fetcher: BlockFetcher = make_fetcher()  # type: ignore[operator]
    result = await fetcher.fetch(SCOPE, COMPAT, keys(1))
    assert result.loaded_blocks == 1 and result.blocks[0].replica.holder == doubles["h2"].uri
    assert [a[1] for a in outcomes(result)] == [dead.holder, doubles["h2"].uri]
    assert fetcher.stats.transport_failures == 1


async def test_a_refused_batch_lease_falls_back_to_one_lease_per_block(doubles: Doubles,
                                                                         make_fetcher: object) -> None:
    """The IS lists three blocks at h1, but h1 lost block 1: the one lease for all three is a 404, so each
    block is leased alone; block 0 loads, block 1 is a miss and ends the prefix."""
    for i in range(3):
        publish(doubles, i, "h1")
    holder = doubles["h1"]
    del holder.blocks[key_of(1)]
    result = await make_fetcher().fetch(SCOPE, COMPAT, keys(3), block_tokens=TOKENS)  # type: ignore[operator]
    assert result.loaded_blocks == 1
    leased = list(holder.leases.values())  # the batch was refused (no lease id): one lease per block after it
    assert (key_of(0),) in leased and all(len(k) == 1 for k in leased)  # block 2 may be leased before 1 fails
    block0 = next(i for i, k in holder.leases.items() if k == (key_of(0),))
    assert block0 in holder.released  # (block 2's, when its grant raced the cancellation, lapses by its TTL)
    assert (1, holder.uri, Outcome.MISS) in outcomes(result)


async def test_blocks_at_two_holders_get_one_lease_each(doubles: Doubles, make_fetcher: object) -> None:
    for i in range(4):
        publish(doubles, i, "h1" if i % 2 == 0 else "h2")
    result = await make_fetcher().fetch(SCOPE, COMPAT, keys(4), block_tokens=TOKENS)  # type: ignore[operator]
    assert result.loaded_blocks == 4
    assert list(doubles["h1"].leases.values()) == [(key_of(0), key_of(2))]
    assert list(doubles["h2"].leases.values()) == [(key_of(1), key_of(3))]
    assert all(d.released == list(d.leases) for d in (doubles["h1"], doubles["h2"]))


async def test_lease_quota(doubles: Doubles, make_fetcher: object) -> None:
    publish(doubles, 0, "h1", "h2")
    doubles["h1"].lease_status = 429
    fetcher: BlockFetcher = make_fetcher()  # type: ignore[operator]
    result = await fetcher.fetch(SCOPE, COMPAT, keys(1))
    assert result.blocks[0].replica.holder == doubles["h1"].uri  # fetched unleased
    assert fetcher.stats.lease_rejections == 1
    strict: BlockFetcher = make_fetcher(require_lease=True)  # type: ignore[operator]
    result = await strict.fetch(SCOPE, COMPAT, keys(1))
    assert result.blocks[0].replica.holder == doubles["h2"].uri
    assert outcomes(result)[0][2] is Outcome.LEASE_REJECTED and strict.stats.lease_rejections == 1


async def test_lease_refused_moves_on(doubles: Doubles, make_fetcher: object) -> None:
    publish(doubles, 0, "h1", "h2")
    doubles["h1"].lease_status = 403
    result = await make_fetcher().fetch(SCOPE, COMPAT, keys(1))  # type: ignore[operator]
    assert outcomes(result)[0][2] is Outcome.REJECTED
    assert result.blocks[0].replica.holder == doubles["h2"].uri
    assert doubles["h1"].gets == []


async def test_lookup_failure_means_recompute(doubles: Doubles, make_fetcher: object) -> None:
    doubles.index.fail_lookup = True
    fetcher: BlockFetcher = make_fetcher()  # type: ignore[operator]
    result = await fetcher.fetch(SCOPE, COMPAT, keys(2), block_tokens=TOKENS)
    assert result.loaded_blocks == 0 and result.lookup_error
    assert fetcher.stats.lookup_failures == 1 and fetcher.stats.recomputed_tokens == 2 * TOKENS


async def test_nothing_matched_and_no_keys(doubles: Doubles, make_fetcher: object) -> None:
    fetcher: BlockFetcher = make_fetcher()  # type: ignore[operator]
    result = await fetcher.fetch(SCOPE, COMPAT, keys(3), block_tokens=TOKENS)
    assert (result.matched, result.loaded_blocks, result.recompute_from_token) == (0, 0, 0)
    assert fetcher.stats.hit_ratio == 0.0
    empty = await fetcher.fetch(SCOPE, COMPAT, [])
    assert empty.requested == 0 and doubles.index.lookups and len(doubles.index.lookups) == 1


async def test_deadline_returns_the_prefix_so_far(doubles: Doubles, make_fetcher: object) -> None:
    publish(doubles, 0, "h1")
    publish(doubles, 1, "h1", modes={"h1": Mode.STALL})
    opts = HolderOptions(read_timeout_s=30, block_timeout_s=30)
    start = time.monotonic()
    result = await make_fetcher(deadline_s=0.5, holder_options=opts).fetch(SCOPE, COMPAT, keys(2))  # type: ignore[operator]
    assert time.monotonic() - start < 3
    assert result.deadline_expired and result.loaded_blocks == 1


async def test_cancelling_a_fetch_leaves_nothing_running(doubles: Doubles, make_fetcher: object) -> None:
    publish(doubles, 0, "h1", modes={"h1": Mode.STALL})
    opts = HolderOptions(read_timeout_s=30, block_timeout_s=30)
    task = asyncio.create_task(make_fetcher(holder_options=opts).fetch(SCOPE, COMPAT, keys(1)))  # type: ignore[operator]
    await asyncio.sleep(0.3)
    before = len(asyncio.all_tasks())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.05)
    assert len(asyncio.all_tasks()) < before


def test_stats_as_dict() -> None:
    stats = ClientStats(lookup_keys=4, matched_keys=3, digest_failures=1)
    assert stats.hit_ratio == 0.75
    assert stats.as_dict()["digest_failures"] == 1
    with pytest.raises(ValueError):
        FetchOptions(concurrency=0)
    assert LayerRange(0, 1).count == 2
