"""Two ``kvsp serve is`` processes on one Redis Cluster (3 masters): any IS answers for the shared index.

Published through one IS, looked up through the other; then one IS is SIGKILLed in the middle of a
workload of publishes and lookups, and nothing is lost: every record acknowledged before, during or
after the kill is visible through the survivor, and the clients (given both IS base URIs) carried on
without an error reaching them.  Real processes, real TLS, real redis-server; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from control.deploy.configs import IndexSection, PolicyFile, RedisTable, RoleFile, ScopeEntry, Tls
from control.deploy.pki import DevPki
from control.deploy.processes import kill, serve, stop_all, wait_listening
from control.deploy.redis import RedisCluster, start_cluster
from kvsp.client.index import IndexClient
from kvsp.records import LookupRequest, ReplicaRecord
from tests.test_index_backend import COMPAT, SCOPE, R, fresh_prefix, key, require_redis


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    require_redis()
    cluster = start_cluster(tmp_path_factory.mktemp("cluster"), 3)
    try:
        yield cluster
    finally:
        cluster.stop(kill=True)


@dataclass
class Deployment:
    pki: DevPki
    procs: dict[str, subprocess.Popen[bytes]]

    def record(self, i: int) -> ReplicaRecord:
        return ReplicaRecord.from_json({**R(i).record().to_json(), "holder": self.pki.uri("h1")})

    @property
    def uris(self) -> list[str]:
        return [self.pki.uri("is1"), self.pki.uri("is2")]


@pytest.fixture
async def deployment(tmp_path: Path, redis_cluster: RedisCluster) -> AsyncIterator[Deployment]:
    pki = DevPki.make(tmp_path, ["is1", "is2", "h1", "pc"])
    PolicyFile(scopes=[ScopeEntry(SCOPE.hex(), lookup=[pki.uri("pc")], store=[pki.uri("h1")])]).write(
        tmp_path / "policy.toml")
    section = IndexSection(sweep_interval_s=0.5, backend="redis",
                           redis=RedisTable(url=redis_cluster.url, cluster=True, timeout_ms=5000,
                                            key_prefix=fresh_prefix()))
    for name in ("is1", "is2"):
        RoleFile(["is"], pki.uri(name), Tls.of(name), "policy.toml", sections=[section]).write(
            tmp_path / f"{name}.toml")
    procs = {name: serve("is", tmp_path / f"{name}.toml") for name in ("is1", "is2")}
    try:
        for name, proc in procs.items():
            await wait_listening(name, pki.port(name), proc, timeout=60)
        yield Deployment(pki, procs)
    finally:
        stop_all(procs.values())


async def test_publish_through_one_is_look_up_through_the_other(deployment: Deployment) -> None:
    d = deployment
    async with d.pki.session("h1") as h1_session, d.pki.session("pc") as pc_session:
        h1 = IndexClient(h1_session, d.pki.uri("is1"))
        for i in range(64):
            stored = await h1.publish(d.record(i))
            assert stored == d.record(i)
        pc = IndexClient(pc_session, d.pki.uri("is2"))
        response = await pc.lookup(LookupRequest(SCOPE, COMPAT, tuple(key(i) for i in range(65))))
        assert response.matched == 64 and all(g == (d.record(i),) for i, g in enumerate(response.replicas))
        assert await IndexClient(h1_session, d.pki.uri("is2")).withdraw(d.pki.uri("h1"), key(10))
        response = await IndexClient(pc_session, d.pki.uri("is1")).lookup(
            LookupRequest(SCOPE, COMPAT, tuple(key(i) for i in range(64))))
        assert response.matched == 10  # withdrawn through is2, gone at is1: the prefix ends at key 10


async def test_sigkill_of_one_is_mid_workload_loses_nothing(deployment: Deployment) -> None:
    d = deployment
    total = 240
    acknowledged: list[int] = []
    lookups: list[int] = []
    async with d.pki.session("h1") as h1_session, d.pki.session("pc") as pc_session:
        h1 = IndexClient(h1_session, d.uris)  # both: is1 first
        pc = IndexClient(pc_session, d.uris)

        async def publisher() -> None:
            for i in range(total):
                await h1.publish(d.record(i))  # any error here fails the test: failover must hide the kill
                acknowledged.append(i)

        async def looker() -> None:
            while len(acknowledged) < total:
                done = len(acknowledged)
                if not done:
                    await asyncio.sleep(0.01)
                    continue
                response = await pc.lookup(LookupRequest(SCOPE, COMPAT, tuple(key(i) for i in range(done))))
                assert response.matched >= done  # never fewer than acknowledged before the lookup began
                lookups.append(response.matched)
                await asyncio.sleep(0.01)

        async def killer() -> None:
            deadline = time.monotonic() + 60
            while len(acknowledged) < total // 3:
                assert time.monotonic() < deadline, "the workload made no progress"
                await asyncio.sleep(0.01)
            kill(d.procs["is1"])  # SIGKILL: no shutdown, connections cut mid-request

        await asyncio.wait_for(asyncio.gather(publisher(), looker(), killer()), 120)
        assert d.procs["is1"].poll() is not None and d.procs["is2"].poll() is None
        assert h1.base_uri == pc.base_uri == d.pki.uri("is2")  # both followed the survivor
        assert lookups and acknowledged == list(range(total))
        survivor = IndexClient(pc_session, d.pki.uri("is2"))
        response = await survivor.lookup(LookupRequest(SCOPE, COMPAT, tuple(key(i) for i in range(total))))
        assert response.matched == total
