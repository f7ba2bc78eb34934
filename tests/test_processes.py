"""Real role processes on loopback: ``kvsp serve`` for the IS and two holders, mutual TLS throughout.

A block stored at both holders is fetched after one holder was killed with SIGKILL, and after one was
frozen with SIGSTOP: the client falls back to the other holder, and nothing hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from control.deploy.configs import HolderSection, PolicyFile, RoleFile, ScopeEntry, Tls
from control.deploy.environment import child_env
from control.deploy.pki import DevPki
from control.deploy.processes import kill, serve, serve_argv
from kvsp.client.fetch import BlockFetcher, FetchOptions, Outcome
from kvsp.client.holder import HolderClient, HolderOptions, StoreOutcome
from kvsp.client.http import KvspSession
from kvsp.container import encode_container
from kvsp.descriptor import CompatDescriptor
from kvsp.records import Link, LookupRequest
from kvsp.registry import Codec

SCOPE = bytes(range(16))
DESCRIPTOR = CompatDescriptor(model="proc-model", model_digest=hashlib.sha256(b"proc").digest(),
                              tokenizer_digest=bytes(32), layers=8, kv_heads=2, head_dim=16, kv_dtype="fp16",
                              positional="rope", block_tokens=16)
BLOCK_KEY = hashlib.sha256(b"process test block").digest()
def block_bytes() -> bytes:
    geometry = DESCRIPTOR.geometry()
    section = geometry.section_length(DESCRIPTOR.block_tokens)
    layers = [(bytes([i]) * section, bytes([i + 64]) * section) for i in range(DESCRIPTOR.layers)]
    return encode_container(Codec.RAW, 0, DESCRIPTOR.block_tokens, layers, geometry=geometry)


@dataclass
class Cluster:
    pki: DevPki
    procs: dict[str, subprocess.Popen[bytes]]


def _write_configs(pki: DevPki, tmp: Path) -> None:
    (tmp / "descriptor.json").write_bytes(DESCRIPTOR.canonical())
    PolicyFile(scopes=[ScopeEntry.open_to(SCOPE, [pki.uri("client"), pki.uri("h1"), pki.uri("h2")])]).write(
        tmp / "policy.toml")
    RoleFile(["is"], pki.uri("is"), Tls.of("is"), "policy.toml").write(tmp / "is.toml")
    holder = HolderSection(index=pki.uri("is"), descriptors=["descriptor.json"])
    for name in ("h1", "h2"):
        RoleFile(["holder"], pki.uri(name), Tls.of(name), "policy.toml", sections=[holder]).write(tmp / f"{name}.toml")


def _wait_listening(pki: DevPki, name: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    port = pki.port(name)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''!r}")
        with contextlib.suppress(OSError):
            import socket  # noqa: PLC0415

            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        time.sleep(0.1)
    raise AssertionError(f"{name} did not start listening")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    pki = DevPki.make(tmp_path, ["is", "h1", "h2", "client"])
    _write_configs(pki, tmp_path)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in ("is", "h1", "h2"):
            procs[name] = serve("is" if name == "is" else "holder", tmp_path / f"{name}.toml")
        for name, proc in procs.items():
            _wait_listening(pki, name, proc)
        yield Cluster(pki, procs)
    finally:
        for proc in procs.values():
            kill(proc)


@contextlib.asynccontextmanager
async def client_session(pki: DevPki) -> AsyncIterator[KvspSession]:
    session = KvspSession(pki.client_ssl("client"))
    try:
        yield session
    finally:
        await session.close()


async def _store_everywhere_and_lookup(cluster: Cluster, session: KvspSession) -> object:
    holder = HolderClient(session)
    body = block_bytes()
    for name in ("h1", "h2"):
        outcome = await holder.put_block(cluster.pki.uri(name), DESCRIPTOR.compat_id, SCOPE, BLOCK_KEY, body)
        assert outcome is StoreOutcome.STORED
    fetcher = BlockFetcher(session, cluster.pki.uri("is"))
    request = LookupRequest(SCOPE, DESCRIPTOR.compat_id, (BLOCK_KEY,))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # holders publish asynchronously after the PUT
        response = await fetcher.index.lookup(request)
        if response.matched and len(response.replicas[0]) == 2:
            return response
        await asyncio.sleep(0.1)
    raise AssertionError("both replicas were not published")


def _prefer_h1(pki: DevPki, read_timeout_s: float = 30.0) -> tuple[FetchOptions, HolderOptions]:
    links = (Link(pki.uri("h1"), 1_000_000.0, 1), Link(pki.uri("h2"), 100.0, 10_000))
    return (FetchOptions(links=links, geometry=DESCRIPTOR.geometry()),
            HolderOptions(read_timeout_s=read_timeout_s, block_timeout_s=read_timeout_s,
                          control_timeout_s=read_timeout_s))


@pytest.mark.parametrize("fault", ["sigkill", "sigstop"])
async def test_fetch_falls_back_when_a_holder_dies_or_hangs(cluster: Cluster, fault: str) -> None:
    async with client_session(cluster.pki) as session:
        response = await _store_everywhere_and_lookup(cluster, session)
        h1 = cluster.procs["h1"]
        os.kill(h1.pid, signal.SIGKILL if fault == "sigkill" else signal.SIGSTOP)
        fetch_options, holder_options = _prefer_h1(cluster.pki, read_timeout_s=2.0)  # bounded stall
        fetcher = BlockFetcher(session, cluster.pki.uri("is"), options=fetch_options,
                               holder=HolderClient(session, holder_options))
        started = time.monotonic()
        result = await asyncio.wait_for(
            fetcher.load(SCOPE, DESCRIPTOR.compat_id, response.replicas, block_tokens=16),  # type: ignore[attr-defined]
            timeout=60)
        assert time.monotonic() - started < 15  # lease and GET to the frozen holder each time out in 2 s
    assert result.loaded_blocks == 1 and result.recompute_from_token == 16
    assert result.blocks[0].replica.holder == cluster.pki.uri("h2")
    body = block_bytes()
    assert bytes(result.blocks[0].container.data) == body[len(body) - len(result.blocks[0].container.data):]
    failed = [a for a in result.attempts if a.holder == cluster.pki.uri("h1")]
    assert failed and all(a.outcome is Outcome.TRANSPORT for a in failed)


async def test_processes_reject_clients_without_certificates(cluster: Cluster) -> None:
    port = int(cluster.pki.uri("is").split(":")[2].split("/")[0])
    ctx = ssl.create_default_context(cafile=str(cluster.pki.dir / "ca.pem"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    writer.write(b"POST /is/lookup HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        await writer.drain()
    data = b""
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        data = await asyncio.wait_for(reader.read(), timeout=10)
    assert b"HTTP/1.1 200" not in data  # TLS 1.3 rejects the missing certificate after the handshake
    writer.close()


def test_serve_without_tls_is_one_line_error(tmp_path: Path) -> None:
    config = RoleFile(["is"], "https://127.0.0.1:1/").write(tmp_path / "c.toml")
    result = subprocess.run(serve_argv("is", config),
                            capture_output=True, text=True, timeout=60, check=False, env=child_env())
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "tls" in result.stderr
