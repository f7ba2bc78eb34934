"""Relays as ``kvsp serve relay`` processes with ``[moqt] quic = "picoquic"`` (issue 19 item 1): a rack relay
whose both legs are picoquic, its spine on picoquic, the publisher and the subscriber on aioquic.

The relays run in the picoquic venv (Python >= 3.12); the test process (any Python) is the publisher (it
keeps a session to the spine, as a holder with ``moqt_relay`` does) and the subscriber. Every MOQT peer of
a picoquic relay authenticates with the token ``kvsp certs --moqt-tokens`` issued for its identity, the
rack relay too, towards the spine; the control plane stays HTTPS with mutual TLS. A FETCH through the rack
misses there and at the spine, reaches the publisher over its aioquic session to the picoquic spine, and
arrives byte-exact; the second is a cache hit at the rack. A subscriber without a token is refused.

A holder role on picoquic (``kvsp serve holder`` in the venv, its IS in the test process) serves a stored
block on its own picoquic listener and publishes through the picoquic rack relay (its relay link by
token; the relay's FETCH to it authorized as from the relay it dialled): the block client (aioquic, by
token) fetches it both ways, verified layer by layer, identical to what was stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from control.deploy.configs import HolderSection, MoqtSection, PolicyFile, RelaySection, RoleFile, ScopeEntry, Tls
from control.deploy.environment import child_env
from control.deploy.pki import DevPki
from control.deploy.ports import free_udp_port, port_of
from control.deploy.processes import output_tail, stop_all, wait_listening
from kvsp.client.holder import BlockMiss, HolderClient
from kvsp.client.moqt import MoqtBlockClient
from kvsp.pki import RoleSpec, make_dev_moqt_tokens
from kvsp.service.policy import Policy
from moqt.api import Publisher, SetupRefused, Subscriber, UpstreamLink, allow_authenticated
from moqt.quic import EndpointConfig
from moqt.wire import Location
from tests.support.pico_venv import pico_python
from tests.support.relay import REPO, TRACK, CountingSource, block_namespace, holder_prefix, layers
from tests.support.servers import role_config, running
from tests.test_moqt_kvsp import COMPAT, DESCRIPTOR, GEOMETRY, SCOPE, container, key
from tests.test_relay_holder import lookup_moqt

pytestmark = pytest.mark.process

RELAYS = ("spine", "rack")
NAMES = [*RELAYS, "pub", "sub", "is", "h1", "client"]
LAYERS, LAYER_OCTETS = 16, 64 << 10


class Roles:
    def __init__(self, pki: DevPki, tmp: Path, moqt: dict[str, str]) -> None:
        self.pki, self.tmp, self.moqt = pki, tmp, moqt
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.python = Path()

    def start(self, name: str, python: Path, role: str = "relay") -> None:
        self.procs[name] = subprocess.Popen(
            [str(python), "-m", "control.cli", "serve", role, "--config", str(self.tmp / f"{name}.toml")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO, env=child_env())

    async def stats(self, name: str) -> dict[str, float]:
        ssl = self.pki.client_ssl("sub")
        async with (aiohttp.ClientSession() as http,
                    http.get(self.pki.uri(name) + "relay/stats", ssl=ssl) as resp):
            resp.raise_for_status()
            body: dict[str, float] = json.loads(await resp.text())
            return body

    async def wait_ready(self, name: str, *, upstreams: int = 0) -> None:
        async with asyncio.timeout(30):
            while True:
                proc = self.procs[name]
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited: {output_tail(proc)}")
                with contextlib.suppress(OSError, aiohttp.ClientError):
                    if (await self.stats(name))["upstreams"] >= upstreams:
                        return
                await asyncio.sleep(0.1)

    def token(self, name: str) -> bytes:
        return (self.pki.dir / f"{name}.moqt-token").read_bytes()

    def client(self, name: str) -> EndpointConfig:
        files = self.pki.files(name)
        return EndpointConfig.from_files(files.cert, files.key, files.ca)


def write_configs(pki: DevPki, tmp: Path) -> dict[str, str]:
    PolicyFile(scopes=[ScopeEntry(SCOPE.hex(), lookup=[pki.uri("client")], read=[pki.uri("sub"), pki.uri("client")],
                                  store=[pki.uri("pub"), pki.uri("h1"), pki.uri("client")])]).write(tmp / "policy.toml")
    moqt = {name: f"moqt://127.0.0.1:{free_udp_port('0.0.0.0')}/relay" for name in RELAYS}
    for name in RELAYS:
        relay = RelaySection(listen=f"127.0.0.1:{port_of(moqt[name])}", uri=moqt[name],
                             upstream=[] if name == "spine" else [moqt["spine"]],
                             peers=[pki.uri(p) for p in RELAYS if p != name],
                             token_keys=[str(pki.dir / "moqt-issuer.pub.pem")], drain_s=0.5)
        backend = MoqtSection(quic="picoquic", token=str(pki.dir / f"{name}.moqt-token"))
        RoleFile(["relay"], pki.uri(name), Tls.of(name, pki.dir), "policy.toml", sections=[relay, backend]).write(
            tmp / f"{name}.toml")
    return moqt


def write_holder(pki: DevPki, tmp: Path, relay: str) -> str:
    """h1's role file: picoquic, token keys, its token, publishing through ``relay``; its moqt:// URI."""
    (tmp / "model.json").write_text(json.dumps(DESCRIPTOR.to_json()))
    port = free_udp_port("0.0.0.0")
    uri = f"moqt://127.0.0.1:{port}/holder"
    holder = HolderSection(index=pki.uri("is"), descriptors=["model.json"], host_capacity_octets=1 << 24,
                           moqt_listen=f"127.0.0.1:{port}", moqt_uri=uri, moqt_relay=relay,
                           moqt_token_keys=[str(pki.dir / "moqt-issuer.pub.pem")])
    backend = MoqtSection(quic="picoquic", token=str(pki.dir / "h1.moqt-token"))
    RoleFile(["holder"], pki.uri("h1"), Tls.of("h1", pki.dir), "policy.toml", sections=[holder, backend]).write(
        tmp / "h1.toml")
    return uri


@pytest.fixture
def roles(tmp_path: Path) -> Iterator[Roles]:
    python = pico_python()
    pki = DevPki.make(tmp_path / "pki", NAMES)
    make_dev_moqt_tokens(pki.dir, [RoleSpec(n, pki.uri(n)) for n in NAMES])
    running = Roles(pki, tmp_path, write_configs(pki, tmp_path))
    running.python = python
    try:
        for name in RELAYS:
            running.start(name, python)
        yield running
    finally:
        stop_all(running.procs.values())


@contextlib.asynccontextmanager
async def publishing(roles: Roles, source: CountingSource) -> AsyncIterator[UpstreamLink]:
    publisher = Publisher(source, authorize=allow_authenticated)
    await publisher.publish_namespace(holder_prefix(roles.pki.uri("pub")))
    link = UpstreamLink(publisher, roles.moqt["spine"], roles.client("pub"), token=roles.token("pub"),
                        base_s=0.05, cap_s=0.5)
    link.start()
    try:
        await link.wait_connected(20)
        yield link
    finally:
        await link.close()
        await publisher.close()


async def test_relays_on_picoquic_serve_a_block_through_both_legs(roles: Roles) -> None:
    source = CountingSource()
    namespace = block_namespace(roles.pki.uri("pub"), 1)
    source.put(namespace, TRACK, layers(LAYERS, LAYER_OCTETS, seed=7))
    await roles.wait_ready("spine")
    await roles.wait_ready("rack", upstreams=1)  # the rack's picoquic session to the spine, by its token
    async with publishing(roles, source):
        async with asyncio.timeout(20):
            while (await roles.stats("spine"))["namespaces"] != 1:
                await asyncio.sleep(0.05)
        sub = await Subscriber.connect(roles.moqt["rack"], roles.client("sub"), token=roles.token("sub"),
                                       timeout_s=20)
        try:
            got = []
            for _ in range(2):
                async with sub.fetch(namespace, TRACK, Location(0, 0), Location(0, LAYERS)) as objects:
                    got.append([bytes(o.payload) async for o in objects])
        finally:
            await sub.close()
    expected = [bytes(o.payload) for o in layers(LAYERS, LAYER_OCTETS, seed=7)]
    assert got == [expected, expected]
    rack, spine = await roles.stats("rack"), await roles.stats("spine")
    assert (rack["upstream_fetches"], rack["cache_misses"], rack["cache_hits"]) == (1, 1, 1)
    assert spine["upstream_fetches"] == 1 and source.lookups == 1


async def test_a_picoquic_relay_refuses_a_subscriber_without_a_token(roles: Roles) -> None:
    await roles.wait_ready("spine")
    with pytest.raises(SetupRefused):
        await Subscriber.connect(roles.moqt["spine"], roles.client("sub"), timeout_s=5)  # its certificate: unseen


async def test_a_picoquic_holder_serves_directly_and_through_its_picoquic_relay(roles: Roles) -> None:
    pki = roles.pki
    holder_uri = write_holder(pki, roles.tmp, roles.moqt["rack"])
    policy = Policy.load(roles.tmp / "policy.toml")
    files = pki.files("client")
    block_client = MoqtBlockClient(EndpointConfig.from_files(files.cert, files.key, files.ca),
                                   token=roles.token("client"))
    session = pki.session("client")
    try:
        async with running(role_config(pki, "is", ("is",), policy)):
            await roles.wait_ready("rack", upstreams=1)
            roles.start("h1", roles.python, "holder")
            await wait_listening("h1", pki.port("h1"), roles.procs["h1"], timeout=30)
            await HolderClient(session).put_block(pki.uri("h1"), COMPAT, SCOPE, key(0), container(0))
            via_relay = await lookup_moqt(pki, session, 0)
            assert via_relay.holder == roles.moqt["rack"]  # the holder publishes through its relay
            direct = dataclasses.replace(via_relay, holder=holder_uri)
            for record in (via_relay, direct, via_relay):
                block = await asyncio.wait_for(block_client.fetch_block(record, geometry=GEOMETRY), 30)
                assert not isinstance(block, BlockMiss) and block.replica_verified, record.holder
                assert bytes(block.container.header.encode()) + bytes(block.container.data) == container(0)
            rack = await roles.stats("rack")
            assert (rack["upstream_fetches"], rack["cache_hits"]) == (1, 1)  # the relay fetched from h1 once
    finally:
        await block_client.close()
        await session.close()
