"""The Index Service on real Redis: round trips per lookup, partitioning over a cluster, shared statuses,
clients that fail over between IS URIs, and Redis outages (down, hung, back) answered within a bound.

Redis servers are real ``redis-server`` processes started here (skipped without one; failed with
``KVSP_REQUIRE_REDIS=1``).  IS roles run in this process over mutual TLS on loopback; the two-process
tests with ``kvsp serve`` are in tests/test_index_redis_processes.py.  Round trips are counted on the
server (``INFO commandstats``: one EVALSHA per script call) and, for a cluster, per node on the client
(redis-py's per-node pipeline calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from redis.exceptions import ResponseError

from control.backend import RedisConfig, connect
from control.deploy.pki import DevPki
from control.deploy.redis import RedisCluster, RedisServer, redis_binaries, start_cluster, start_redis
from control.index.app import INDEX_BACKEND, STATUS_BOARD
from control.index.backend import MemoryBackend
from control.index.redis_store import RedisIndex
from control.index.status import StatusBoard
from control.index.store import ReplicaIndex
from control.serve import build_app
from kvsp.client.http import KvspSession
from kvsp.client.index import IndexClient
from kvsp.identifiers import role_id
from kvsp.problems import ProblemError
from kvsp.records import InstanceStatus, Link, LookupRequest, ReplicaRecord
from kvsp.registry import InstanceState
from kvsp.service.policy import Policy, ScopeGrant
from tests.support.servers import role_config, running
from tests.test_index_backend import COMPAT, SCOPE, R, fresh_prefix, key, require_redis

TIMEOUT_MS = 1000  # the bound under test; generous, so that a loaded machine does not trip it
KEYS = 64
ROLES = ["isa", "isb", "isc", "isd", "h1", "pc", "ii7"]


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    require_redis()
    server = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop(kill=True)


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    require_redis()
    cluster = start_cluster(tmp_path_factory.mktemp("cluster"), 3)
    try:
        yield cluster
    finally:
        cluster.stop(kill=True)


def redis_cli(port: int, *args: str) -> str:
    cli = redis_binaries()[1]
    return subprocess.run([cli, "-p", str(port), *args], capture_output=True, text=True, timeout=10,
                          check=True).stdout


def evalsha_calls(port: int) -> int:
    """EVALSHA calls the server on ``port`` has answered (each is one script call, one command sent)."""
    for line in redis_cli(port, "INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_evalsha:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def records(n: int, holder: str = "h1") -> list[ReplicaRecord]:
    return [R(i, holder).record() for i in range(n)]


# -- round trips and partitioning ---------------------------------------------------------------------------
async def test_standalone_lookup_is_one_script_call_whatever_the_prompt(redis_server: RedisServer) -> None:
    config = RedisConfig(url=redis_server.url, key_prefix=fresh_prefix(), timeout_ms=5000)
    ix = RedisIndex(connect(config), config, ttl_ms_max=600_000)
    memory = MemoryBackend(ReplicaIndex(ttl_ms_max=600_000), StatusBoard(), time.monotonic)
    try:
        for record in records(KEYS):
            await ix.put(record, role_id(record.holder))
            await memory.put(record, role_id(record.holder))
        await ix.lookup(SCOPE, COMPAT, [key(0)])  # the first use of a script loads it (NOSCRIPT, then EVALSHA)
        for keys in ([key(i) for i in range(KEYS)], [key(1000), *(key(i) for i in range(KEYS - 1))]):
            before = evalsha_calls(redis_server.port)
            found = await ix.lookup(SCOPE, COMPAT, keys)
            assert evalsha_calls(redis_server.port) - before == 1
            # The same answer as the embedded index, to the octet (the text is spliced into the response).
            assert found.replicas_text() == (await memory.lookup(SCOPE, COMPAT, keys)).replicas_text()
        assert found.matched == 0
    finally:
        await ix.close()


async def test_cluster_spreads_block_keys_and_looks_up_in_one_round_trip_per_node(
        redis_cluster: RedisCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    config = RedisConfig(url=redis_cluster.url, cluster=True, key_prefix=fresh_prefix(), timeout_ms=5000)
    ix = RedisIndex(connect(config), config, ttl_ms_max=600_000)
    try:
        for record in records(3 * KEYS):
            await ix.put(record, role_id(record.holder))
        sizes = [int(redis_cli(n.port, "DBSIZE")) for n in redis_cluster.nodes]
        # Two keys per Block Key (index hash, record), spread by slot: every node holds a fair share.
        assert sum(sizes) >= 2 * 3 * KEYS and min(sizes) >= 0.15 * sum(sizes), sizes

        prompt = [key(i) for i in range(KEYS)]
        await ix.lookup(SCOPE, COMPAT, prompt)  # loads the script on every node
        before = [evalsha_calls(n.port) for n in redis_cluster.nodes]
        found = await ix.lookup(SCOPE, COMPAT, prompt)
        calls = [evalsha_calls(n.port) - b for n, b in zip(redis_cluster.nodes, before, strict=True)]
        assert found.matched == KEYS and [len(g) for g in found.groups()] == [1] * KEYS
        assert calls == [1, 1, 1]  # one script call per node, whatever the prompt's length
        # The prefix is still cut at the first missing key, whichever node holds the keys after it.
        for missing in (0, 1, 17, KEYS - 1):
            keys = [*prompt[:missing], key(5000), *prompt[missing:]]
            assert (await ix.lookup(SCOPE, COMPAT, keys)).matched == missing

        # A node that refuses (as during a slot migration) sends the lookup key by key, in one pipeline.
        async def refused(*args: object) -> object:
            raise ResponseError("MOVED 1234 127.0.0.1:1")

        monkeypatch.setattr(ix, "_eval_at", refused)
        await ix.lookup(SCOPE, COMPAT, prompt)  # loads the per-key script
        before = [evalsha_calls(n.port) for n in redis_cluster.nodes]
        again = await ix.lookup(SCOPE, COMPAT, prompt)
        assert again.replicas_text() == found.replicas_text()
        assert sum(evalsha_calls(n.port) - b for n, b in zip(redis_cluster.nodes, before, strict=True)) == KEYS
    finally:
        await ix.close()


# -- IS roles in this process ----------------------------------------------------------------------------------
def policy(pki: DevPki) -> Policy:
    return Policy(pc=pki.uri("pc"),
                  scopes={SCOPE: ScopeGrant(lookup=frozenset({pki.uri("pc")}), store=frozenset({pki.uri("h1")}))},
                  instances=frozenset({pki.uri("ii7")}))


def is_section(url: str, prefix: str, *, cluster: bool = False) -> dict[str, object]:
    return {"backend": "redis", "sweep_interval_s": 0.1,
            "redis": {"url": url, "cluster": cluster, "timeout_ms": TIMEOUT_MS, "key_prefix": prefix}}


@dataclass
class World:
    pki: DevPki
    stack: contextlib.AsyncExitStack
    sessions: dict[str, KvspSession]

    def session(self, name: str) -> KvspSession:
        if name not in self.sessions:
            self.sessions[name] = self.pki.session(name)
        return self.sessions[name]

    async def serve(self, name: str, section: dict[str, object], roles: tuple[str, ...] = ("is",)) -> web.Application:
        config = role_config(self.pki, name, roles, policy(self.pki), {"is": section})
        app = build_app(config, roles=("is",))
        return await self.stack.enter_async_context(running(config, app=app))

    def holder_record(self, i: int) -> ReplicaRecord:
        return ReplicaRecord.from_json({**R(i).record().to_json(), "holder": self.pki.uri("h1")})


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with contextlib.AsyncExitStack() as stack:
        w = World(DevPki.make(tmp_path / "pki", ROLES), stack, {})
        try:
            yield w
        finally:
            for s in w.sessions.values():
                await s.close()


async def get_json(session: KvspSession, url: str) -> dict[str, Any]:
    async with session.http.get(url) as resp:
        assert resp.status == 200
        doc: dict[str, Any] = json.loads(await resp.read())
        return doc


async def metrics(session: KvspSession, base: str) -> str:
    async with session.http.get(base + "metrics") as resp:
        return await resp.text()


async def test_redis_down_then_back_lookups_miss_writes_503_within_the_bound(
        world: World, tmp_path: Path) -> None:
    server = start_redis(tmp_path / "outage")
    try:
        await world.serve("isa", is_section(server.url, fresh_prefix()))
        base = world.pki.uri("isa")
        h1, pc = IndexClient(world.session("h1"), base), IndexClient(world.session("pc"), base)
        prompt = LookupRequest(SCOPE, COMPAT, tuple(key(i) for i in range(4)))
        for i in range(4):
            await h1.publish(world.holder_record(i))
        assert (await pc.lookup(prompt)).matched == 4

        server.stop(kill=True)
        for _ in range(5):  # three in a row pay the timeout; then the back-end cools down and they fail fast
            start = time.monotonic()
            with pytest.raises(ProblemError) as exc:  # 503: a miss for the caller, a failover for a client
                await pc.lookup(prompt)
            assert exc.value.problem.status == 503 and time.monotonic() - start < TIMEOUT_MS / 1000 + 2.0
        start = time.monotonic()
        with pytest.raises(ProblemError) as exc:
            await h1.publish(world.holder_record(9))
        assert exc.value.problem.status == 503 and time.monotonic() - start < TIMEOUT_MS / 1000 + 2.0
        health = await get_json(world.session("pc"), base + "health")
        assert health["status"] == "ok" and health["is"]["backend"] == "redis" and health["is"]["state"] == "down"
        text = await metrics(world.session("pc"), base)
        assert 'kvsp_is_backend_errors_total{operation="lookup"}' in text
        assert 'kvsp_is_backend_errors_total{operation="publish"}' in text

        server = server.restart()  # no AOF: an empty Redis that knows none of the scripts
        deadline = time.monotonic() + 10
        while True:
            try:
                await h1.publish(world.holder_record(0))
                break
            except ProblemError:
                assert time.monotonic() < deadline, "the IS did not use Redis again after it came back"
                await asyncio.sleep(0.1)
        assert (await pc.lookup(prompt)).matched == 1
        health = await get_json(world.session("pc"), base + "health")
        assert health["is"]["state"] == "up"
    finally:
        server.stop(kill=True)


async def test_a_hung_redis_costs_one_timeout_not_a_hang(world: World, tmp_path: Path) -> None:
    import signal  # noqa: PLC0415

    server = start_redis(tmp_path / "hung")
    try:
        await world.serve("isa", is_section(server.url, fresh_prefix()))
        base = world.pki.uri("isa")
        h1, pc = IndexClient(world.session("h1"), base), IndexClient(world.session("pc"), base)
        await h1.publish(world.holder_record(0))
        prompt = LookupRequest(SCOPE, COMPAT, (key(0),))
        server.signal(signal.SIGSTOP)  # accepts connections (the kernel does), answers nothing
        start = time.monotonic()
        with pytest.raises(ProblemError) as exc:
            await pc.lookup(prompt)
        assert exc.value.problem.status == 503 and time.monotonic() - start < TIMEOUT_MS / 1000 + 2.0
        server.signal(signal.SIGCONT)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(ProblemError):
                if (await pc.lookup(prompt)).matched == 1:
                    break
            assert time.monotonic() < deadline, "the IS did not use Redis again after it resumed"
            await asyncio.sleep(0.1)
    finally:
        server.stop(kill=True)


def ii7_status(pki: DevPki, epoch: int = 3) -> InstanceStatus:
    return InstanceStatus(instance=pki.uri("ii7"), epoch=epoch, state=InstanceState.ACTIVE, running=1, queued=0,
                          batch_size=8, kv_utilization=0.5, prefill_tokens_per_s=40_000.0, decode_tokens_per_s=3000.0,
                          links=(Link(pki.uri("h1"), 200_000.0, 12),), ttl_ms=30_000)


async def test_statuses_and_records_are_shared_by_every_is(world: World, redis_server: RedisServer) -> None:
    prefix = fresh_prefix()
    await world.serve("isa", is_section(redis_server.url, prefix))
    await world.serve("isb", is_section(redis_server.url, prefix))
    # isc runs with a PC in its process: the PC feeds the local board, which the IS mirrors to Redis.
    isc = await world.serve("isc", is_section(redis_server.url, prefix), roles=("is", "pc"))
    a, b = world.pki.uri("isa"), world.pki.uri("isb")
    await IndexClient(world.session("h1"), a).publish(world.holder_record(0))
    status = ii7_status(world.pki)
    url = f"{a}instances/{role_id(world.pki.uri('ii7'))}/status"
    _, answer = await world.session("ii7").request_json("PUT", url, status)
    assert answer == {"state": "active"}
    request = LookupRequest(SCOPE, COMPAT, (key(0),), (world.pki.uri("ii7"),))
    response = await IndexClient(world.session("pc"), b).lookup(request)
    assert response.matched == 1 and [t.instance for t in response.targets] == [world.pki.uri("ii7")]
    # The lower epoch is refused at the other IS too: the epoch rule is checked in Redis.
    url_b = f"{b}instances/{role_id(world.pki.uri('ii7'))}/status"
    with pytest.raises(ProblemError) as exc:
        await world.session("ii7").request_json("PUT", url_b, ii7_status(world.pki, epoch=2))
    assert exc.value.problem.status == 409

    isc[STATUS_BOARD].put(ii7_status(world.pki, epoch=4), time.monotonic())  # as the PC in isc would
    backend = world_backend(isc)
    deadline = time.monotonic() + 5
    while (await backend.statuses([world.pki.uri("ii7")])).get(world.pki.uri("ii7"), status).epoch != 4:
        assert time.monotonic() < deadline, "the PC's status never reached Redis"
        await asyncio.sleep(0.05)


def world_backend(app: web.Application) -> RedisIndex:
    backend = app[INDEX_BACKEND]
    assert isinstance(backend, RedisIndex)
    return backend


async def test_client_fails_over_between_is_uris(world: World, redis_server: RedisServer, tmp_path: Path) -> None:
    prefix = fresh_prefix()
    dead_redis = start_redis(tmp_path / "dead")
    dead_redis.stop(kill=True)  # its port refuses: isd answers every write with 503
    await world.serve("isd", is_section(dead_redis.url, prefix))
    await world.serve("isb", is_section(redis_server.url, prefix))
    config = role_config(world.pki, "isa", ("is",), policy(world.pki), {"is": is_section(redis_server.url, prefix)})
    a_stack = contextlib.AsyncExitStack()
    await a_stack.enter_async_context(running(config))
    try:
        nobody = "https://127.0.0.1:1/nobody/"  # nothing listens: a transport error
        uris = [nobody, world.pki.uri("isd"), world.pki.uri("isa"), world.pki.uri("isb")]
        h1 = IndexClient(world.session("h1"), uris)
        stored = await h1.publish(world.holder_record(0))  # nobody: refused; isd: 503; isa: stored
        assert stored.block_key == key(0) and h1.base_uri == world.pki.uri("isa")
        pc = IndexClient(world.session("pc"), uris)
        assert (await pc.lookup(LookupRequest(SCOPE, COMPAT, (key(0),)))).matched == 1  # past isd's 503
        assert pc.base_uri == world.pki.uri("isa")
    finally:
        await a_stack.aclose()  # isa goes away
    assert (await h1.withdraw(world.pki.uri("h1"), key(0))) is True  # at isb: the record was shared
    assert h1.base_uri == world.pki.uri("isb")
    with pytest.raises(ProblemError) as exc:  # a 4xx is the request's fault: no failover, no retry
        await IndexClient(world.session("pc"), [world.pki.uri("isb")]).publish(world.holder_record(1))
    assert exc.value.problem.status == 403
    assert IndexClient(world.session("pc"), world.pki.uri("isb")).base_uris == (world.pki.uri("isb"),)


async def test_a_password_protected_redis_is_used_with_the_password_file_only(world: World, tmp_path: Path) -> None:
    """``password_file`` (the password never sits in the TOML): the IS authenticates and serves; without the
    file the same Redis refuses it, and the IS answers 503 rather than crash."""
    server = start_redis(tmp_path / "auth", password="s3cret-pass")
    try:
        (world.pki.dir / "redis.pass").write_text("s3cret-pass\n")
        prefix = fresh_prefix()
        good = {**is_section(server.url, prefix)}
        good["redis"] = {**good["redis"], "password_file": "redis.pass"}  # type: ignore[dict-item]
        await world.serve("isa", good)
        await world.serve("isb", is_section(server.url, prefix))  # no password
        a, b = world.pki.uri("isa"), world.pki.uri("isb")
        await IndexClient(world.session("h1"), a).publish(world.holder_record(0))
        found = await IndexClient(world.session("pc"), a).lookup(LookupRequest(SCOPE, COMPAT, (key(0),)))
        assert found.matched == 1
        with pytest.raises(ProblemError) as refused:
            await IndexClient(world.session("pc"), b).lookup(LookupRequest(SCOPE, COMPAT, (key(0),)))
        assert refused.value.problem.status == 503
        assert redis_cli_auth(server.port, "s3cret-pass", "DBSIZE") != "0"  # the record is in that Redis
    finally:
        server.stop(kill=True)


def redis_cli_auth(port: int, password: str, *args: str) -> str:
    cli = redis_binaries()[1]
    return subprocess.run([cli, "-a", password, "--no-auth-warning", "-p", str(port), *args], capture_output=True,
                          text=True, timeout=10, check=True).stdout.strip()
