"""One table of Index Service semantics, run against both back-ends: memory and Redis (decision D7).

Each case is a list of steps (publish, look up, get, withdraw, let time pass, count, statuses) with
the answer each step must give; `run` plays a case against a back-end.  The memory back-end reads a
`FakeClock`, so "time passes" advances it; Redis decides expiry by its own clock, so there the same
step sleeps for real: TTLs in the table are short (1 s) with margins of 0.3 s or more either side,
and every wait is bounded by the step itself.  The Redis server is a real ``redis-server`` that this
module starts (skipped when none is installed, failed with ``KVSP_REQUIRE_REDIS=1``); each test has
its own key prefix, so tests share the server without seeing each other's keys.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import pytest

from control.backend import RedisConfig, connect
from control.deploy.redis import RedisServer, RedisUnavailable, redis_binaries, start_redis
from control.index.backend import IndexBackend, MemoryBackend
from control.index.status import StatusBoard
from control.index.store import ReplicaIndex
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import InstanceStatus, Link, ReplicaRecord, Residency
from kvsp.registry import InstanceState, Tier
from tests.support.servers import FakeClock

SCOPE = bytes.fromhex("6d1c6481cd428737da312c089db3832a")
OTHER_SCOPE = bytes(16)
COMPAT = bytes.fromhex("5ed5c2f238839655d7c4029e12b7f31caf9e7421f4edb4057feee6dab760ee0f")
OTHER_COMPAT = bytes(32)
HOLDERS = {name: f"https://{name}.example/kvsp/" for name in ("h1", "h2", "h3")}
RELAY = "moqt://127.0.0.1:4443/r1"  # a relay: many producers' records share its holder-id
TTL_MAX = 60_000
SHORT = 1_000  # ms: the TTL of the expiry cases
II = "https://ii7.example/kvsp/"


# -- a real redis-server for the module ----------------------------------------------------------------
def require_redis() -> None:
    """Skip without redis-server (fail when KVSP_REQUIRE_REDIS=1), as tests/test_deploy_redis.py does."""
    try:
        redis_binaries()
    except RedisUnavailable as exc:
        if os.environ.get("KVSP_REQUIRE_REDIS") == "1":
            pytest.fail(f"KVSP_REQUIRE_REDIS=1 and {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    require_redis()
    server = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop(kill=True)


_prefixes = itertools.count()


def fresh_prefix() -> str:
    """A key prefix no other test of this process uses."""
    return f"kvsp-test{os.getpid()}-{next(_prefixes)}:"


# -- the two back-ends ---------------------------------------------------------------------------------
@dataclass
class Harness:
    kind: str
    backend: IndexBackend
    advance: Callable[[float], Awaitable[None]]
    ttl_ms_max: int = TTL_MAX


Make = Callable[..., Awaitable[Harness]]


@pytest.fixture(params=["memory", "redis"])
async def make(request: pytest.FixtureRequest) -> AsyncIterator[Make]:
    """``await make(capacity=..., ttl_ms_max=...)``: a fresh, empty back-end of the parameter's kind."""
    made: list[IndexBackend] = []
    server: RedisServer | None = request.getfixturevalue("redis_server") if request.param == "redis" else None

    async def factory(*, capacity: int | None = None, ttl_ms_max: int = TTL_MAX) -> Harness:
        backend: IndexBackend
        if server is None:
            clock = FakeClock()

            async def advance_fake(seconds: float) -> None:
                clock.advance(seconds)

            backend = MemoryBackend(ReplicaIndex(ttl_ms_max=ttl_ms_max, capacity=capacity), StatusBoard(), clock)
            made.append(backend)
            return Harness("memory", backend, advance_fake, ttl_ms_max)
        from control.index.redis_store import RedisIndex  # noqa: PLC0415 - only where redis-py is needed

        config = RedisConfig(url=server.url, key_prefix=fresh_prefix(), timeout_ms=5000)
        backend = RedisIndex(connect(config), config, ttl_ms_max=ttl_ms_max, capacity=capacity)
        made.append(backend)
        return Harness("redis", backend, asyncio.sleep, ttl_ms_max)

    yield factory
    for backend in made:
        await backend.close()


# -- records and steps ---------------------------------------------------------------------------------
def key(i: int) -> bytes:
    return hashlib.sha256(b"key" + i.to_bytes(8, "big")).digest()


@dataclass(frozen=True, slots=True)
class R:
    """A record of the table: block ``i`` at ``holder`` (a name of HOLDERS, or "relay" with a producer)."""

    i: int
    holder: str = "h1"
    ttl_ms: int = TTL_MAX
    scope: bytes = SCOPE
    compat: bytes = COMPAT
    producer: str | None = None  # through the relay: the producer's name (a moqt record, section 4.4)

    @property
    def holder_uri(self) -> str:
        return RELAY if self.holder == "relay" else HOLDERS[self.holder]

    @property
    def holder_id(self) -> str:
        return role_id(self.holder_uri)

    def record(self) -> ReplicaRecord:
        k = key(self.i)
        namespace = None
        if self.producer is not None:
            namespace = TrackNamespace(self.compat, self.scope, role_id(HOLDERS[self.producer]), k)
        return ReplicaRecord(block_key=k, compat_id=self.compat, scope_id=self.scope, holder=self.holder_uri, codec=1,
                             size=2 << 20, digest=hashlib.sha256(k).digest(),
                             residency=(Residency(Tier.HOST, (0, 31)),), ttl_ms=self.ttl_ms, moqt_namespace=namespace)


def label(record: ReplicaRecord) -> str:
    """How the table names a record: its holder's name, "relay/PRODUCER" for one through the relay."""
    if record.holder == RELAY:
        producer = next(n for n, u in HOLDERS.items() if role_id(u) == record.producer_id)
        return f"relay/{producer}"
    return next(n for n, u in HOLDERS.items() if u == record.holder)


@dataclass(frozen=True, slots=True)
class Put:
    rec: R
    created: bool | None = None  # None: not checked
    ttl_ms: int | None = None  # the TTL as stored (capped)
    full: bool = False  # expect 507


@dataclass(frozen=True, slots=True)
class Lookup:
    keys: Sequence[int]
    expect: Sequence[frozenset[str]]  # per matched key, the labels of its replicas
    scope: bytes = SCOPE
    compat: bytes = COMPAT


@dataclass(frozen=True, slots=True)
class Get:
    holder: str
    i: int
    expect: R | None
    producer: str | None = None


@dataclass(frozen=True, slots=True)
class Records:
    holder: str
    i: int
    expect: frozenset[str]


@dataclass(frozen=True, slots=True)
class Withdraw:
    holder: str
    i: int
    producers: Sequence[str]  # names of HOLDERS whose records may go
    expect: int


@dataclass(frozen=True, slots=True)
class Delete:
    holder: str
    i: int
    expect: bool
    producer: str | None = None


@dataclass(frozen=True, slots=True)
class Advance:
    seconds: float


@dataclass(frozen=True, slots=True)
class Maintain:
    """The background step (sweeps; with Redis, the count)."""


@dataclass(frozen=True, slots=True)
class Count:
    expect: int


def status(epoch: int, *, ttl_ms: int = 30_000, state: InstanceState = InstanceState.ACTIVE) -> InstanceStatus:
    return InstanceStatus(instance=II, epoch=epoch, state=state, running=1, queued=0, batch_size=8,
                          kv_utilization=0.5, prefill_tokens_per_s=40_000.0, decode_tokens_per_s=3000.0,
                          links=(Link(HOLDERS["h1"], 200_000.0, 12),), ttl_ms=ttl_ms)


@dataclass(frozen=True, slots=True)
class PutStatus:
    status: InstanceStatus
    stale: bool = False  # expect kvsp-stale-epoch


@dataclass(frozen=True, slots=True)
class Statuses:
    expect: InstanceStatus | None


Step = Put | Lookup | Get | Records | Withdraw | Delete | Advance | Maintain | Count | PutStatus | Statuses


def holder_id(name: str) -> str:
    return role_id(RELAY if name == "relay" else HOLDERS[name])


def producer_id(name: str | None) -> str | None:
    return None if name is None else role_id(HOLDERS[name])


async def play(step: Step, h: Harness) -> None:
    b = h.backend
    match step:
        case Put(rec, created, ttl_ms, full):
            if full:
                with pytest.raises(ProblemError) as exc:
                    await b.put(rec.record(), rec.holder_id)
                assert exc.value.problem.status == 507
                return
            stored = await b.put(rec.record(), rec.holder_id)
            if created is not None:
                assert stored.created == created
            assert stored.ttl_ms == (ttl_ms if ttl_ms is not None else min(rec.ttl_ms, h.ttl_ms_max))
        case Lookup(keys, expect, scope, compat):
            matches = await b.lookup(scope, compat, [key(i) for i in keys])
            assert matches.matched == len(expect)
            assert [frozenset(label(r) for r in g) for g in matches.groups()] == list(expect)
            # the JSON text and the records agree (Redis answers with text, memory with records)
            assert matches.replicas_text() == ",".join(
                "[" + ",".join(r.to_bytes().decode() for r in g) + "]" for g in matches.groups())
        case Get(holder, i, expect, producer):
            got = await b.get(holder_id(holder), key(i), producer_id(producer))
            want = None if expect is None else expect.record()
            if want is not None and want.ttl_ms > h.ttl_ms_max:
                want = replace(want, ttl_ms=h.ttl_ms_max)
            assert got == want
        case Records(holder, i, expect):
            assert frozenset(label(r) for r in await b.records(holder_id(holder), key(i))) == expect
        case Withdraw(holder, i, producers, expect):
            allowed = frozenset(role_id(HOLDERS[p]) for p in producers)
            assert await b.withdraw(holder_id(holder), key(i), allowed) == expect
        case Delete(holder, i, expect, producer):
            assert await b.delete(holder_id(holder), key(i), producer_id(producer)) == expect
        case Advance(seconds):
            await h.advance(seconds)
        case Maintain():
            await b.maintain()
        case Count(expect):
            assert await b.count() == expect
        case PutStatus(st, stale):
            if stale:
                with pytest.raises(ProblemError) as exc:
                    await b.put_status(st)
                assert exc.value.problem.kind is ProblemType.STALE_EPOCH
            else:
                assert await b.put_status(st) == st
        case Statuses(expect):
            assert (await b.statuses([II, "https://nobody.example/"])).get(II) == expect


def one(*labels: str) -> frozenset[str]:
    return frozenset(labels)


@dataclass(frozen=True, slots=True)
class Case:
    steps: Sequence[Step]
    capacity: int | None = None
    ttl_ms_max: int = TTL_MAX
    real_seconds: float = field(default=0.0)  # how long the case sleeps with Redis (for the reader)


CASES: dict[str, Case] = {
    "longest prefix": Case([*(Put(R(i), created=True) for i in range(4)),
                            Lookup(range(5), [one("h1")] * 4)]),
    "stops at the first key without a replica": Case([
        *(Put(R(i)) for i in (0, 1, 3, 4)),
        Lookup(range(5), [one("h1")] * 2),
        Lookup([2, 3], []),
    ]),
    "first key missing matches nothing": Case([Put(R(1)), Lookup([0, 1], [])]),
    "compat_id isolation": Case([
        Put(R(0)), Put(R(1, compat=OTHER_COMPAT)),
        Lookup([0], [], compat=OTHER_COMPAT),
        Lookup([0, 1], [one("h1")]),  # key 1 exists, under another compat_id: the prefix ends there
    ]),
    "scope isolation": Case([
        Put(R(0, scope=OTHER_SCOPE)),
        Lookup([0], []),
        Lookup([0], [one("h1")], scope=OTHER_SCOPE),
    ]),
    "only replicas of the request's scope count": Case([
        Put(R(0, "h1")), Put(R(0, "h2", scope=OTHER_SCOPE)),
        Lookup([0], [one("h1")]),
    ]),
    "several holders per key": Case([
        *(Put(R(0, h), created=True) for h in ("h1", "h2", "h3")),
        Lookup([0], [one("h1", "h2", "h3")]),
        Delete("h2", 0, True),
        Lookup([0], [one("h1", "h3")]),
        Count(2),
    ]),
    "publish creates, the same PUT refreshes": Case([
        Put(R(0), created=True), Put(R(0), created=False), Count(1),
        Get("h1", 0, R(0)), Records("h1", 0, one("h1")),
    ]),
    "ttl capped and stored capped": Case([
        Put(R(0, ttl_ms=600_000), ttl_ms=TTL_MAX), Get("h1", 0, R(0, ttl_ms=TTL_MAX)),
        Put(R(1, ttl_ms=5_000), ttl_ms=5_000),
    ]),
    "a refresh may move the record to another scope": Case([
        Put(R(0)), Put(R(0, scope=OTHER_SCOPE), created=False),
        Lookup([0], []), Lookup([0], [one("h1")], scope=OTHER_SCOPE), Count(1),
    ]),
    "expiry": Case([
        Put(R(0, ttl_ms=SHORT)), Put(R(1)),
        Advance(SHORT / 1000 + 0.4),
        Lookup([0, 1], []), Lookup([1], [one("h1")]), Get("h1", 0, None),
        Put(R(0, ttl_ms=SHORT), created=True),  # expired: this PUT creates it anew
    ], real_seconds=1.4),
    "refresh extends expiry": Case([
        Put(R(0, ttl_ms=SHORT)), Advance(0.6),
        Put(R(0, ttl_ms=SHORT), created=False), Advance(0.6),  # 1.2 s after the first PUT, 0.6 s after the refresh
        Lookup([0], [one("h1")]),
        Advance(0.7),
        Lookup([0], []),
    ], real_seconds=1.9),
    "producers at one holder are separate records": Case([
        Put(R(0, "relay", producer="h1"), created=True),
        Put(R(0, "relay", producer="h2"), created=True),
        Put(R(0, "relay", producer="h2", ttl_ms=5000), created=False),
        Records("relay", 0, one("relay/h1", "relay/h2")),
        Lookup([0], [one("relay/h1", "relay/h2")]),
        Get("relay", 0, R(0, "relay", producer="h1"), producer="h1"),
        Delete("relay", 0, False),  # no record of the relay itself as producer
        Delete("relay", 0, True, producer="h2"),
        Records("relay", 0, one("relay/h1")),
        Count(1),
    ]),
    "withdraw removes only the producers allowed": Case([
        Put(R(0, "relay", producer="h1")), Put(R(0, "relay", producer="h2")),
        Put(R(0, "h1")),  # h1's own https record: another holder-id
        Withdraw("relay", 0, ["h1"], 1),
        Records("relay", 0, one("relay/h2")),
        Get("h1", 0, R(0, "h1")),
        Withdraw("relay", 0, ["h1", "h3"], 0),
        Count(2),
    ]),
    "an expired record is withdrawn but not counted": Case([
        Put(R(0, "relay", producer="h2", ttl_ms=SHORT)),
        Advance(SHORT / 1000 + 0.4),
        Withdraw("relay", 0, ["h2"], 0),
        Records("relay", 0, one()),
    ], real_seconds=1.4),
    "withdrawing nothing": Case([Withdraw("h1", 0, ["h1"], 0), Delete("h1", 0, False), Withdraw("h1", 0, [], 0)]),
    "capacity refuses new records, not refreshes": Case([
        Put(R(0)), Put(R(1)), Put(R(2), full=True),
        Put(R(0), created=False),
        Delete("h1", 1, True), Put(R(2), created=True), Count(2),
    ], capacity=2),
    "capacity comes back when records expire": Case([
        Put(R(0, ttl_ms=SHORT), ttl_ms=SHORT), Put(R(1), full=True),
        Advance(SHORT / 1000 + 0.4), Maintain(),
        Put(R(1), created=True),
    ], capacity=1, ttl_ms_max=3200, real_seconds=1.4),
    "statuses: the epoch rule": Case([
        Statuses(None),
        PutStatus(status(7)), Statuses(status(7)),
        PutStatus(status(6, state=InstanceState.DRAINING), stale=True), Statuses(status(7)),
        PutStatus(status(7, state=InstanceState.DRAINING)),  # equal epoch: the same run reporting again
        Statuses(status(7, state=InstanceState.DRAINING)),
        PutStatus(status(8)), Statuses(status(8)),
    ]),
    "statuses expire, their epoch is remembered": Case([
        PutStatus(status(7, ttl_ms=SHORT)),
        Advance(SHORT / 1000 + 0.4), Maintain(),
        Statuses(None),
        PutStatus(status(6), stale=True),
        PutStatus(status(7)), Statuses(status(7)),
    ], real_seconds=1.4),
}


@pytest.mark.parametrize("name", list(CASES))
async def test_index_semantics(make: Make, name: str) -> None:
    case = CASES[name]
    h = await make(capacity=case.capacity, ttl_ms_max=case.ttl_ms_max)
    for n, step in enumerate(case.steps):
        try:
            await asyncio.wait_for(play(step, h), 30)
        except AssertionError as exc:
            raise AssertionError(f"{h.kind}, step {n}: {step}: {exc}") from exc


async def test_lookup_of_no_keys_and_statuses_of_none(make: Make) -> None:
    h = await make()
    assert (await h.backend.lookup(SCOPE, COMPAT, [])).matched == 0
    assert await h.backend.statuses([]) == {}
    assert h.backend.facts()["state"] == "up" and h.backend.facts()["backend"] == h.kind
