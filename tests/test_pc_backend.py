"""The PC's stores, one suite for both back-ends (decision D7): `MemoryStore` and `RedisStore` on a real
redis-server started here.

1. The fenced epoch rules, as one table of cases (setup writes, then the write under test and its
   outcome, then the session as a new leader would load it): section 6.8 (reject a lower epoch, only
   the owner at the current epoch, keep the highest output_offset), section 6.3 (the highest instance
   epoch seen), section 6.9 (never a lower map version), and the fence: a write with a fence that is
   not the current lease is refused whatever it carries.
2. The lease: acquire (one holder at a time, a higher fencing token on every grant), renew, expiry,
   release, and the acquire retried after its answer was lost.

The memory cases are unit tests; the Redis cases start one redis-server for the module, the cluster
cases a 3-master Redis Cluster (the PC's keys share one hash tag, so every script runs on one node),
skipped when there is no redis-server unless KVSP_REQUIRE_REDIS=1; each test has its own key prefix.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from control.backend import RedisConfig
from control.deploy.redis import RedisCluster, RedisServer, RedisUnavailable, start_cluster, start_redis
from control.pc.core.durable import (
    DirectiveRecord,
    InstanceRecord,
    MapRecord,
    Refusal,
    SessionRecord,
    WriteRefused,
)
from control.pc.store import Fence, MemoryStore, PcStore, make_holder
from kvsp.records import InstanceStatus, PrefetchBlock, PrefetchDirective, Sampler, SessionCheckpoint, Shard, ShardMap
from kvsp.registry import InstanceState
from tests.support.servers import FakeClock

S1 = str(uuid.UUID(int=1))
S2 = str(uuid.UUID(int=2))
A, B = "https://ii1.example/", "https://ii2.example/"
PC1, PC2 = make_holder("n1", "https://pc1.example/"), make_holder("n2", "https://pc2.example/")
SCOPE, COMPAT = bytes(range(16)), bytes(range(32))
SAMPLER = Sampler("top-p", (("p", 0.9), ("temperature", 1.0)), 7, 0, False)
TTL_MS = 10_000


def checkpoint(epoch: int, offset: int, session: str = S1) -> SessionCheckpoint:
    return SessionCheckpoint(session, epoch, COMPAT, SCOPE, (bytes(32),), (5, 6), tuple(range(10, 10 + offset)),
                             offset, replace(SAMPLER, step=offset))


def session(epoch: int = 1, owner: str | None = A, offset: int | None = 0, **kw: object) -> SessionRecord:
    cp = None if offset is None else checkpoint(epoch, offset)
    return SessionRecord(S1, epoch, owner, cp, SCOPE, COMPAT, max_tokens=64, prompt=(1, 2, 3, 4, 5, 6),
                         **kw)  # type: ignore[arg-type]


def status(epoch: int, instance: str = A) -> InstanceStatus:
    return InstanceStatus(instance, epoch, InstanceState.ACTIVE, 0, 0, 8, 0.0, 1000.0, 100.0, (), 3000)


def shard_map(version: int) -> ShardMap:
    return ShardMap("m1", version, (Shard((0, 64), A), Shard((64, 128), B)))


# -- the two back-ends --------------------------------------------------------------------------------
@dataclass
class Backend:
    store: PcStore
    expire: Callable[[], Awaitable[None]]  # make the current lease expire now (the clock, or Redis PX)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    try:
        server = start_redis(Path(tmp_path_factory.mktemp("redis")))
    except RedisUnavailable as exc:
        if os.environ.get("KVSP_REQUIRE_REDIS") == "1":
            pytest.fail(f"KVSP_REQUIRE_REDIS=1 and {exc}")
        pytest.skip(str(exc))
    yield server
    server.stop(kill=True)


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    try:
        cluster = start_cluster(Path(tmp_path_factory.mktemp("cluster")), 3)
    except RedisUnavailable as exc:
        if os.environ.get("KVSP_REQUIRE_REDIS") == "1":
            pytest.fail(f"KVSP_REQUIRE_REDIS=1 and {exc}")
        pytest.skip(str(exc))
    yield cluster
    cluster.stop(kill=True)


@pytest.fixture(params=[pytest.param("memory", marks=pytest.mark.unit),
                        pytest.param("redis", marks=pytest.mark.process),
                        pytest.param("cluster", marks=pytest.mark.process)])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        clock = FakeClock()
        memory = MemoryStore(clock)

        async def advance() -> None:
            clock.advance(TTL_MS / 1000 + 1)
        yield Backend(memory, advance)
        return
    from control.pc.store.redis import RedisStore  # noqa: PLC0415 - only where a server runs

    prefix = f"t{uuid.uuid4().hex[:8]}:"
    if request.param == "cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        store = RedisStore(RedisConfig(cluster.url, cluster=True, timeout_ms=2000, key_prefix=prefix))
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        store = RedisStore(RedisConfig(server.url, timeout_ms=2000, key_prefix=prefix))

    async def expire() -> None:
        await store.redis.pexpire(store.keys["lease"], 1)
        await asyncio.sleep(0.01)
    try:
        yield Backend(store, expire)
    finally:
        await store.close()


async def lead(b: Backend, holder: str = PC1) -> Fence:
    view = await b.store.acquire(holder, TTL_MS)
    assert view.fence is not None, view
    return view.fence


# -- 1. the rules, one table ----------------------------------------------------------------------------
Op = Callable[[PcStore, Fence], Awaitable[object]]


def open_(record: SessionRecord) -> Op:
    return lambda s, f: s.open_session(f, record)


def cp(epoch: int, offset: int, sender: str = A, sid: str = S1) -> Op:
    return lambda s, f: s.record_checkpoint(f, sender, checkpoint(epoch, offset, sid))


def save(record: SessionRecord) -> Op:
    return lambda s, f: s.save_session(f, record)


def inst(epoch: int) -> Op:
    return lambda s, f: s.save_instance(f, InstanceRecord(status(epoch), InstanceState.ACTIVE))


def smap(version: int) -> Op:
    return lambda s, f: s.save_map(f, MapRecord(shard_map(version)))


@dataclass(frozen=True)
class Case:
    name: str
    setup: tuple[Op, ...]
    write: Op
    outcome: str  # "ok", "ok:N" (the recorded output_offset), or a Refusal value
    after: tuple[int, str | None, int] | None = None  # S1 as loaded: (epoch, owner, output_offset)


OPENED = (open_(session()),)
AT_8 = (*OPENED, cp(1, 8))
MOVED = (*AT_8, save(session(epoch=2, owner=B, offset=8)))
CLOSED = (*AT_8, save(session(offset=8, closed=True, owner=None)))

CASES = [
    Case("open a new session", (), open_(session()), "ok", (1, A, 0)),
    Case("open it twice", OPENED, open_(session()), "exists", (1, A, 0)),
    Case("checkpoint by the owner at the epoch", OPENED, cp(1, 4), "ok:4", (1, A, 4)),
    Case("a higher output_offset replaces", AT_8, cp(1, 12), "ok:12", (1, A, 12)),
    Case("a late, lower one is kept out and acked with the recorded offset", AT_8, cp(1, 4), "ok:8", (1, A, 8)),
    Case("the same one again (a retried PUT)", AT_8, cp(1, 8), "ok:8", (1, A, 8)),
    Case("a lower epoch after a move is stale", MOVED, cp(1, 12), "stale", (2, B, 8)),
    Case("the new owner at the new epoch", MOVED, cp(2, 12, B), "ok:12", (2, B, 12)),
    Case("the old owner at the new epoch", MOVED, cp(2, 12, A), "forbidden", (2, B, 8)),
    Case("an epoch never issued", OPENED, cp(2, 4), "unissued", (1, A, 0)),
    Case("another instance at the epoch", OPENED, cp(1, 4, B), "forbidden", (1, A, 0)),
    Case("an unknown session", OPENED, cp(1, 4, sid=S2), "not-found", (1, A, 0)),
    Case("a closed session", CLOSED, cp(1, 12), "closed", (1, None, 8)),
    Case("a move to a lower epoch is stale", MOVED, save(session(epoch=1, owner=A, offset=8)), "stale", (2, B, 8)),
    Case("a move keeps the higher recorded offset", AT_8, save(session(epoch=2, owner=B, offset=0)), "ok",
         (2, B, 8)),
    Case("a move at the same epoch (stranding) keeps it too", AT_8,
         save(session(epoch=1, owner=None, offset=4, stranded="no-instance")), "ok", (1, None, 8)),
    Case("a move to a higher epoch with more output", AT_8, save(session(epoch=3, owner=B, offset=12)), "ok",
         (3, B, 12)),
    Case("an instance record at a higher epoch", (inst(5),), inst(6), "ok"),
    Case("an instance record at the same epoch (a state change)", (inst(5),), inst(5), "ok"),
    Case("an instance record at a lower epoch", (inst(5),), inst(4), "stale"),
    Case("a map at a higher version", (smap(4),), smap(5), "ok"),
    Case("a map at a lower version", (smap(4),), smap(3), "stale"),
]


async def outcome_of(write: Op, store: PcStore, fence: Fence) -> str:
    try:
        result = await write(store, fence)
    except WriteRefused as exc:
        return exc.reason.value
    return "ok" if result is None else f"ok:{result}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
async def test_rule(backend: Backend, case: Case) -> None:
    fence = await lead(backend)
    for step in case.setup:
        await step(backend.store, fence)
    assert await outcome_of(case.write, backend.store, fence) == case.outcome
    if case.after is not None:
        [loaded] = [s for s in (await backend.store.load()).sessions if s.session == S1]
        assert (loaded.epoch, loaded.owner, loaded.output_offset) == case.after
        if loaded.checkpoint is not None:
            assert loaded.checkpoint.epoch == loaded.epoch  # the recorded checkpoint is at the session's epoch
            assert loaded.checkpoint == checkpoint(loaded.epoch, loaded.output_offset)


WRITES: list[tuple[str, Op]] = [
    ("open", open_(replace(session(), session=S2))), ("checkpoint", cp(1, 12)),
    ("session", save(session(epoch=2, owner=B, offset=8))), ("drop", lambda s, f: s.drop_sessions(f, [S1])),
    ("instance", inst(9)), ("map", smap(9)),
    ("directive", lambda s, f: s.save_directive(f, DirectiveRecord(A, PrefetchDirective(
        str(uuid.UUID(int=9)), SCOPE, COMPAT, (PrefetchBlock(bytes(32), (B,)),), 50, 2000, S1)))),
]


@pytest.mark.parametrize(("kind", "write"), WRITES, ids=[w[0] for w in WRITES])
async def test_a_deposed_leader_cannot_write_anything(backend: Backend, kind: str, write: Op) -> None:
    """The fence: the old leader's lease expired and another PC took it; the old one still believes it
    leads.  Every write it makes is refused, and the state is what the new leader wrote."""
    old = await lead(backend)
    for step in AT_8:
        await step(backend.store, old)
    await backend.expire()
    new = await lead(backend, PC2)
    assert new.token > old.token
    assert await outcome_of(write, backend.store, old) == Refusal.FENCED.value
    forged = Fence(new.token, old.holder)  # the new token with the old holder is no fence either
    assert await outcome_of(write, backend.store, forged) == Refusal.FENCED.value
    [loaded] = (await backend.store.load()).sessions
    assert (loaded.epoch, loaded.owner, loaded.output_offset) == (1, A, 8)
    assert await outcome_of(write, backend.store, new) in ("ok", "ok:12")


async def test_a_lapsed_lease_fences_even_without_a_successor(backend: Backend) -> None:
    fence = await lead(backend)
    await backend.expire()
    assert await outcome_of(cp(1, 4), backend.store, fence) == Refusal.FENCED.value
    assert not await backend.store.renew(fence, TTL_MS)


async def test_a_snapshot_carries_every_record(backend: Backend) -> None:
    fence = await lead(backend)
    await backend.store.open_session(fence, session(moving=True))
    await backend.store.record_checkpoint(fence, A, checkpoint(1, 4))
    await backend.store.save_instance(fence, InstanceRecord(status(3), InstanceState.DRAINING))
    await backend.store.save_map(fence, MapRecord(shard_map(2), shard_map(3), (1, "committed")))
    directive = DirectiveRecord(A, PrefetchDirective(str(uuid.UUID(int=7)), SCOPE, COMPAT,
                                                     (PrefetchBlock(bytes(32), (B,)),), 50, 2000, S1))
    await backend.store.save_directive(fence, directive)
    snap = await backend.store.load()
    assert snap.sessions == (replace(session(moving=True), checkpoint=checkpoint(1, 4), prompt=None),)
    assert snap.instances == (InstanceRecord(status(3), InstanceState.DRAINING),)
    assert snap.maps == (MapRecord(shard_map(2), shard_map(3), (1, "committed")),)
    assert snap.directives == (directive,)
    await backend.store.drop_sessions(fence, [S1])
    assert (await backend.store.load()).sessions == ()


# -- 2. the lease -----------------------------------------------------------------------------------------
async def test_one_holder_at_a_time_and_a_higher_token_per_grant(backend: Backend) -> None:
    first = await lead(backend)
    assert first.leader == "https://pc1.example/"
    other = await backend.store.acquire(PC2, TTL_MS)
    assert other.fence is None and other.leader == "https://pc1.example/"
    assert await backend.store.leader() == "https://pc1.example/"
    assert await backend.store.renew(first, TTL_MS)
    await backend.store.release(first)
    assert await backend.store.leader() is None
    second = await lead(backend, PC2)
    assert second.token == first.token + 1 and second.leader == "https://pc2.example/"
    assert not await backend.store.renew(first, TTL_MS)  # the released grant stays released
    await backend.store.release(first)  # and cannot release its successor's lease
    assert await backend.store.leader() == "https://pc2.example/"


async def test_an_expired_lease_goes_to_the_next_holder(backend: Backend) -> None:
    first = await lead(backend)
    await backend.expire()
    assert await backend.store.leader() is None
    assert not await backend.store.renew(first, TTL_MS)
    second = await lead(backend, PC2)
    assert second.token > first.token


async def test_a_retried_acquire_finds_its_own_grant(backend: Backend) -> None:
    """An acquire whose answer was lost is retried: the holder recognises the grant it already has."""
    first = await lead(backend)
    again = await backend.store.acquire(PC1, TTL_MS)
    assert again.fence == first


async def test_renewal_keeps_the_lease_past_its_first_ttl() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    fence = (await store.acquire(PC1, 1000)).fence
    assert fence is not None
    for _ in range(5):
        clock.advance(0.6)
        assert await store.renew(fence, 1000)
    clock.advance(1.01)
    assert not await store.renew(fence, 1000)
