"""Relays as ``kvsp serve relay`` processes on loopback: a chain rack B -> spine -> rack A -> publisher.

Counts come from each relay's ``GET {base}relay/stats`` (mutual TLS), so "the second FETCH is a cache
hit with no upstream request" is checked at every hop. Also: a subscriber frozen with SIGSTOP is ended
with TOO_FAR_BEHIND while the others complete; a publisher killed with SIGKILL mid-track ends the
subscription downstream with PUBLISH_DONE; a relay restarted is found again by its publisher and peers,
and rack relays reconnect to a restarted spine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from control.deploy.configs import PolicyFile, RelaySection, RoleFile, ScopeEntry, Tls
from control.deploy.environment import child_env
from control.deploy.pki import DevPki
from control.deploy.ports import free_udp_port, port_of
from moqt.api import Publisher, SubscriptionEnded, TransferError, UpstreamLink, allow_authenticated
from moqt.kinds import PublishDoneStatus
from moqt.profiles import PROFILES
from tests.support.relay import (
    NAMES,
    REPO,
    SCOPE,
    TRACK,
    CountingSource,
    block_namespace,
    endpoint_config,
    fetch_all,
    holder_prefix,
    layers,
    subscriber,
)

RELAYS = ("spine", "relay-a", "relay-b")


@dataclass
class Chain:
    pki: DevPki
    tmp: Path
    moqt: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str) -> None:
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "control.cli", "serve", "relay", "--config", str(self.tmp / f"{name}.toml")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.tmp, env=child_env())

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(sig)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    async def get(self, name: str, path: str) -> str:
        ssl = self.pki.client_ssl("sub")
        async with aiohttp.ClientSession() as http, http.get(self.pki.uri(name) + path, ssl=ssl) as resp:
            resp.raise_for_status()
            return await resp.text()

    async def stats(self, name: str) -> dict[str, float]:
        body: dict[str, float] = json.loads(await self.get(name, "relay/stats"))
        return body

    async def wait_ready(self, name: str, *, upstreams: int = 0, timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while True:
                proc = self.procs[name]
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited: {proc.stderr.read().decode() if proc.stderr else ''}")
                with contextlib.suppress(OSError, aiohttp.ClientError):
                    if (await self.stats(name))["upstreams"] >= upstreams:
                        return
                await asyncio.sleep(0.1)


def write_configs(pki: DevPki, tmp: Path) -> dict[str, str]:
    scope = ScopeEntry(SCOPE.hex(), read=[pki.uri("sub")], store=[pki.uri("pub")])
    PolicyFile(scopes=[scope]).write(tmp / "policy.toml")
    moqt = {name: f"moqt://127.0.0.1:{free_udp_port()}/relay" for name in RELAYS}
    for name in RELAYS:
        relay = RelaySection(listen=f"127.0.0.1:{port_of(moqt[name])}", uri=moqt[name],
                             upstream=[] if name == "spine" else [moqt["spine"]],
                             peers=[pki.uri(p) for p in RELAYS if p != name], subscriber_buffer_octets=1 << 20,
                             idle_timeout_s=2.0, drain_s=0.5)
        RoleFile(["relay"], pki.uri(name), Tls.of(name, pki.dir), "policy.toml", sections=[relay]).write(
            tmp / f"{name}.toml")
    return moqt


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[Chain]:
    pki = DevPki.make(tmp_path / "pki", NAMES)
    moqt = write_configs(pki, tmp_path)
    chain = Chain(pki, tmp_path, moqt)
    try:
        for name in RELAYS:
            chain.start(name)
        yield chain
    finally:
        for name in list(chain.procs):
            chain.stop(name, signal.SIGKILL)


@contextlib.asynccontextmanager
async def ready(chain: Chain) -> AsyncIterator[None]:
    await chain.wait_ready("spine")
    await asyncio.gather(chain.wait_ready("relay-a", upstreams=1), chain.wait_ready("relay-b", upstreams=1))
    yield


async def publisher_link(chain: Chain, source: CountingSource | None = None) -> tuple[Publisher, UpstreamLink]:
    publisher = Publisher(source, authorize=allow_authenticated)
    await publisher.publish_namespace(holder_prefix(chain.pki.uri("pub")))  # announced on every session
    link = UpstreamLink(publisher, chain.moqt["relay-a"], endpoint_config(chain.pki, "pub"), base_s=0.05, cap_s=0.5)
    link.start()
    await link.wait_connected(20)
    return publisher, link


async def wait_namespaces(chain: Chain, name: str, count: int) -> None:
    async with asyncio.timeout(20):
        while (await chain.stats(name))["namespaces"] != count:
            await asyncio.sleep(0.05)


async def test_chain_cache_hit_and_relay_restart(chain: Chain) -> None:
    source = CountingSource()
    for block in (1, 2, 3):
        source.put(block_namespace(chain.pki.uri("pub"), block), TRACK, layers(16, 16 << 10, seed=block))
    async with ready(chain):
        publisher, link = await publisher_link(chain, source)
        try:
            await wait_namespaces(chain, "spine", 1)
            async with subscriber(chain.pki, chain.moqt["relay-b"]) as sub:
                first = await fetch_all(sub, block_namespace(chain.pki.uri("pub"), 1), 16)
                second = await fetch_all(sub, block_namespace(chain.pki.uri("pub"), 1), 16)
            assert [bytes(o.payload) for o in first] == [bytes(o.payload) for o in second]
            assert bytes(first[3].payload) == bytes([4]) * (16 << 10)
            b, spine, a = [await chain.stats(n) for n in ("relay-b", "spine", "relay-a")]
            assert (b["upstream_fetches"], b["cache_hits"], b["cache_misses"]) == (1, 1, 1)
            assert spine["upstream_fetches"] == 1 and a["upstream_fetches"] == 1
            assert source.lookups == 1
            metrics = await chain.get("relay-b", "metrics")
            assert "kvsp_relay_cache_hits_total 1.0" in metrics and "kvsp_relay_upstream_fetches_total 1.0" in metrics
            health = json.loads(await chain.get("relay-b", "health"))
            assert health["relay"]["upstreams"] == 1 and health["relay"]["draining"] is False

            chain.stop("relay-a")  # GOAWAY, drained, gone: the publisher reconnects with backoff
            chain.start("relay-a")
            await chain.wait_ready("relay-a", upstreams=1)
            async with asyncio.timeout(20):
                while link.connects < 2:
                    await asyncio.sleep(0.05)
            await wait_namespaces(chain, "spine", 1)
            async with subscriber(chain.pki, chain.moqt["relay-b"]) as sub:
                again = await fetch_all(sub, block_namespace(chain.pki.uri("pub"), 2), 16)
            assert [o.object_id for o in again] == list(range(16)) and source.lookups == 2

            chain.stop("spine")  # upstream loss: both rack relays reconnect and announce again
            chain.start("spine")
            await chain.wait_ready("spine")
            await asyncio.gather(chain.wait_ready("relay-a", upstreams=1), chain.wait_ready("relay-b", upstreams=1))
            await wait_namespaces(chain, "spine", 1)
            async with subscriber(chain.pki, chain.moqt["relay-b"]) as sub:
                third = await fetch_all(sub, block_namespace(chain.pki.uri("pub"), 3), 16)
            assert len(third) == 16 and source.lookups == 3
        finally:
            await link.close()
            await publisher.close()


async def test_slow_subscriber_is_ended_others_complete(chain: Chain) -> None:
    async with ready(chain):
        publisher, link = await publisher_link(chain)
        namespace = block_namespace(chain.pki.uri("pub"), 3)
        track = publisher.track(namespace, TRACK)
        track.publish(0, 0, bytes(1000))
        uri = chain.moqt["relay-a"]
        slow = subprocess.Popen(
            [sys.executable, "-m", "tests.support.relay", "subscribe", "--pki", str(chain.pki.dir),
             "--uris", json.dumps(chain.pki.uris), "--uri", uri, "--block", "3"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO, env=child_env())
        try:
            assert slow.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(slow.stdout.readline), 30)
            assert line.strip() == b"first"
            slow.send_signal(signal.SIGSTOP)
            async with subscriber(chain.pki, uri) as s1, subscriber(chain.pki, uri) as s2, \
                    subscriber(chain.pki, uri) as s3:
                seen = [0, 0, 0]

                async def collect(index: int, sub: object) -> int:
                    async with sub.subscribe(namespace, TRACK, end_group=0) as objects:  # type: ignore[attr-defined]
                        async for _ in objects:
                            seen[index] += 1
                    return seen[index]

                tasks = [asyncio.create_task(collect(i, s)) for i, s in enumerate((s1, s2, s3))]
                async with asyncio.timeout(20):
                    while (await chain.stats("relay-a"))["subscribers"] < 4:
                        await asyncio.sleep(0.05)
                published = 1
                async with asyncio.timeout(60):
                    for _ in range(12):  # 6 MiB in rounds of 512 KiB, each taken by the live subscribers
                        for _ in range(8):
                            track.publish(0, published, bytes(64 << 10))
                            published += 1
                        while min(seen) < published:
                            await asyncio.sleep(0.005)
                track.end_group()
                track.close()
                counts = await asyncio.wait_for(asyncio.gather(*tasks), 60)
            assert counts == [97, 97, 97]
            stats = await chain.stats("relay-a")
            assert stats["too_far_behind"] == 1 and stats["upstream_subscribes"] == 1
            slow.send_signal(signal.SIGCONT)
            out, _ = await asyncio.wait_for(asyncio.to_thread(slow.communicate), 60)
            result = json.loads(out.decode().strip().splitlines()[-1])
            # the newest draft, which the loopback sessions negotiate (draft-18 renumbered TOO_FAR_BEHIND)
            too_far_behind = PROFILES[0].publish_done.code(PublishDoneStatus.TOO_FAR_BEHIND)
            assert result["publish_done"] == [too_far_behind] and result["received"] < 97
            assert result["error"] is not None  # the stream reset before PUBLISH_DONE, or PUBLISH_DONE itself
        finally:
            slow.send_signal(signal.SIGCONT)
            slow.kill()
            slow.wait()
            await link.close()
            await publisher.close()


async def test_publisher_killed_mid_track(chain: Chain) -> None:
    async with ready(chain):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.relay", "publish", "--pki", str(chain.pki.dir),
             "--uris", json.dumps(chain.pki.uris), "--uri", chain.moqt["relay-a"], "--block", "4"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO, env=child_env())
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
            assert line.strip() == b"published"
            await wait_namespaces(chain, "spine", 1)
            namespace = block_namespace(chain.pki.uri("pub"), 4)
            async with subscriber(chain.pki, chain.moqt["relay-b"]) as sub:
                got = []
                with pytest.raises((SubscriptionEnded, TransferError)) as caught:
                    async with sub.subscribe(namespace, TRACK, end_group=0, timeout_s=30) as objects:
                        async for obj in objects:
                            got.append(obj.object_id)
                            proc.kill()  # SIGKILL: no goodbye; relay A notices by its idle timeout
            assert got == [0]
            if isinstance(caught.value, SubscriptionEnded):
                assert caught.value.status is PublishDoneStatus.INTERNAL_ERROR
            await wait_namespaces(chain, "spine", 0)  # withdrawn upstream with the publisher
        finally:
            proc.kill()
            proc.wait()
