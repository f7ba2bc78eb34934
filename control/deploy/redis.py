"""Local Redis servers for tests, benchmarks and ``kvsp up --backend redis`` (decision D7).

Real ``redis-server`` processes (Debian's 7.0 here) on loopback ports chosen like every other listener
(`control.deploy.ports`): one standalone server, or a cluster of N masters made with
``redis-cli --cluster create``.  Nothing here talks the Redis protocol beyond the PING that says a
server is up; the roles use redis-py.  Every wait is bounded; `RedisServer.stop` always reaps.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from control.deploy.ports import LOOPBACK, free_port

START_TIMEOUT_S = 20.0


class RedisUnavailable(RuntimeError):
    """No ``redis-server`` (or ``redis-cli``) on this machine; the message says how to get one."""


def redis_binaries() -> tuple[str, str]:
    """Paths of ``redis-server`` and ``redis-cli``, or `RedisUnavailable`."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        raise RedisUnavailable("redis-server and redis-cli are not on PATH (Debian: apt-get install redis-server)")
    return server, cli


def ping(port: int, password: str | None = None, timeout: float = 1.0) -> bool:
    """Whether a Redis server on loopback ``port`` answers PING (after AUTH when it has a password)."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout) as s:
            if password is not None:
                s.sendall(_command("AUTH", password))
                if not s.recv(64).startswith(b"+OK"):
                    return False
            s.sendall(_command("PING"))
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _command(*parts: str) -> bytes:
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        data = part.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


@dataclass(slots=True)
class RedisServer:
    """One ``redis-server`` process: its port, data folder and (optional) password."""

    port: int
    directory: Path
    proc: subprocess.Popen[bytes]
    password: str | None = None
    cluster_port: int | None = None
    log: Path = field(default_factory=Path)
    args: tuple[str, ...] = ()  # the options it was started with (`restart` uses them again)

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    def stop(self, *, kill: bool = False, grace_s: float = 10.0) -> None:
        """SIGTERM (Redis writes its AOF and exits) or SIGKILL; always waits for the process."""
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(grace_s)

    def restart(self) -> RedisServer:
        """The same server (port, folder, options) started again after `stop`: what a restart with AOF keeps."""
        self.stop()
        return _launch(self.directory, self.port, self.password, self.cluster_port, self.args)

    def log_tail(self, limit: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-limit:] if self.log.is_file() else ""


def start_redis(directory: Path, *, port: int | None = None, appendonly: bool = False,
                password: str | None = None, cluster: bool = False, extra: Sequence[str] = ()) -> RedisServer:
    """Start ``redis-server`` in ``directory`` (made if absent) and wait until it answers PING.

    ``appendonly`` turns on the AOF (``appendfsync always``: an acknowledged write survives a crash);
    without it the server keeps nothing on disk (no RDB snapshots either), so a restart starts empty.
    """
    directory.mkdir(parents=True, exist_ok=True)
    args = ["--appendonly", "yes" if appendonly else "no", "--save", ""]
    if appendonly:
        args += ["--appendfsync", "always"]
    cluster_port = None
    if cluster:
        # the bus port defaults to port + 10000, which may fall in the ephemeral range: choose it too
        cluster_port = free_port()
        args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port",
                 str(cluster_port), "--cluster-node-timeout", "2000"]
    return _launch(directory, port or free_port(), password, cluster_port, (*args, *extra))


def _launch(directory: Path, port: int, password: str | None, cluster_port: int | None,
            args: Sequence[str]) -> RedisServer:
    server_bin, _ = redis_binaries()
    log = directory / "redis.log"
    argv = [server_bin, "--port", str(port), "--bind", LOOPBACK, "--dir", str(directory), "--daemonize", "no",
            "--logfile", str(log), *args]
    if password is not None:
        argv += ["--requirepass", password]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=directory)
    server = RedisServer(port, directory, proc, password, cluster_port, log, tuple(args))
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ping(port, password):
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop(kill=True)
            raise RedisUnavailable(f"redis-server on port {port} did not start; log tail:\n{server.log_tail()}")
        time.sleep(0.05)
    return server


@dataclass(slots=True)
class RedisCluster:
    """N master nodes joined with ``redis-cli --cluster create`` (no replicas)."""

    nodes: list[RedisServer]
    password: str | None = None

    @property
    def url(self) -> str:
        """A URL of one node: redis-py's cluster client discovers the others from it."""
        return f"redis://{self.nodes[0].address}/0"

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def stop(self, *, kill: bool = False) -> None:
        for node in self.nodes:
            node.stop(kill=kill)


def start_cluster(directory: Path, masters: int = 3, *, appendonly: bool = False,
                  password: str | None = None) -> RedisCluster:
    """Start ``masters`` cluster-enabled servers, assign every slot, and wait for ``cluster_state:ok``."""
    _, cli = redis_binaries()
    nodes: list[RedisServer] = []
    try:
        for i in range(masters):
            nodes.append(start_redis(directory / f"node{i}", appendonly=appendonly, password=password, cluster=True))
        auth = ["-a", password, "--no-auth-warning"] if password is not None else []
        made = subprocess.run([cli, *auth, "--cluster", "create", *(n.address for n in nodes), "--cluster-replicas",
                               "0", "--cluster-yes"], capture_output=True, text=True, timeout=60, check=False)
        if made.returncode != 0:
            raise RedisUnavailable(f"redis-cli --cluster create failed: {made.stdout[-2000:]}{made.stderr[-2000:]}")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(_cluster_ok(cli, n, auth) for n in nodes):
            if time.monotonic() > deadline:
                raise RedisUnavailable("the Redis cluster did not reach cluster_state:ok")
            time.sleep(0.1)
    except BaseException:
        for node in nodes:
            node.stop(kill=True)
        raise
    return RedisCluster(nodes, password)


def _cluster_ok(cli: str, node: RedisServer, auth: list[str]) -> bool:
    info = subprocess.run([cli, *auth, "-p", str(node.port), "cluster", "info"], capture_output=True, text=True,
                          timeout=10, check=False)
    return "cluster_state:ok" in info.stdout
