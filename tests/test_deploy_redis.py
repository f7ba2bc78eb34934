"""control.deploy.redis starts real redis-server processes: standalone (with and without AOF) and a cluster."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from control.deploy.redis import RedisUnavailable, ping, redis_binaries, start_cluster, start_redis


@pytest.fixture(scope="module")
def cli() -> str:
    try:
        return redis_binaries()[1]
    except RedisUnavailable as exc:
        if os.environ.get("KVSP_REQUIRE_REDIS") == "1":
            pytest.fail(f"KVSP_REQUIRE_REDIS=1 and {exc}")
        pytest.skip(str(exc))


def redis(cli: str, port: int, *args: str, password: str | None = None) -> str:
    auth = ["-a", password, "--no-auth-warning"] if password else []
    return subprocess.run([cli, *auth, "-p", str(port), *args], capture_output=True, text=True, timeout=10,
                          check=True).stdout.strip()


def test_aof_keeps_writes_across_a_restart_and_none_without(cli: str, tmp_path: Path) -> None:
    durable = start_redis(tmp_path / "aof", appendonly=True, password="s3cret")
    plain = start_redis(tmp_path / "plain")
    try:
        assert not ping(durable.port) and ping(durable.port, "s3cret")  # the password is required
        redis(cli, durable.port, "SET", "k", "v", password="s3cret")
        redis(cli, plain.port, "SET", "k", "v")
        durable.stop(kill=True)  # a crash: appendfsync always has the write on disk already
        plain.stop(kill=True)
        durable, plain = durable.restart(), plain.restart()
        assert redis(cli, durable.port, "GET", "k", password="s3cret") == "v"
        assert redis(cli, plain.port, "GET", "k") == ""
    finally:
        durable.stop(kill=True)
        plain.stop(kill=True)
    assert not durable.alive() and not plain.alive()


def test_a_cluster_of_three_masters_serves_every_slot(cli: str, tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path / "cluster", 3)
    try:
        assert len(cluster.nodes) == 3
        info = redis(cli, cluster.nodes[0].port, "cluster", "info")
        assert "cluster_slots_assigned:16384" in info and "cluster_known_nodes:3" in info
        owners = {redis(cli, n.port, "cluster", "countkeysinslot", "0") for n in cluster.nodes}
        assert owners == {"0"}
    finally:
        cluster.stop(kill=True)
    assert not any(n.alive() for n in cluster.nodes)
