"""Pieces of the instance's MOQT and layer-wise tests: a deployment whose holders also serve MOQT, an
engine wrapper that can hold a prefill before a layer and reports each computed layer, and slow sources
(HTTPS and MOQT) that send a block's first layer, then wait until the test lets the rest go.

(A module of helpers named like a test module so that it sits with the instance tests; it has no tests.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from control.deploy.pki import DevPki
from control.deploy.ports import free_udp_port
from control.holder.app import HOLDER
from control.instance.app import INSTANCE
from control.instance.role import InstanceRole
from kvsp.client.http import KvspSession
from kvsp.client.index import IndexClient
from kvsp.client.verify import REPR_DIGEST_FIELD, format_repr_digest
from kvsp.container import MEDIA_TYPE, decode_container
from kvsp.descriptor import CompatDescriptor
from kvsp.engine import BlockKv, Bytes, Engine, EngineGeometry, LayerKv, OnLayer, Step, WaitLayer
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.moqt_binding import BLOCK_GROUP, layer_object
from kvsp.problems import Problem, ProblemType
from kvsp.records import LookupRequest, ReplicaRecord, Sampler
from kvsp.service.tls import server_context
from moqt.api import MoqtObject, Publisher
from moqt.quic import EndpointConfig
from moqt.wire import Location, Namespace
from tests.support.instance import (
    COMPAT,
    SCOPE,
    PcDouble,
    instance_section,
    pc_double,
    policy,
    replica_record,
    write_files,
)
from tests.support.servers import role_config, running

T = 20.0  # seconds: the bound on every wait of these tests


# -- the deployment -----------------------------------------------------------------------------------
@dataclass
class MoqtWorld:
    """The IS, holder h1 (HTTPS and MOQT), instance ii1 (with its own holder, MOQT too), a PC double."""

    pki: DevPki
    pc: PcDouble
    apps: dict[str, web.Application]
    http: dict[str, aiohttp.ClientSession]
    session: KvspSession  # the front end's client
    moqt_uris: dict[str, str]

    def role(self, name: str = "ii1") -> InstanceRole:
        return self.apps[name][INSTANCE]

    def url(self, name: str, path: str) -> str:
        return self.pki.uri(name) + path

    async def lookup(self, keys: Sequence[bytes]) -> list[list[ReplicaRecord]]:
        response = await IndexClient(self.session, self.pki.uri("is")).lookup(
            LookupRequest(SCOPE, COMPAT, tuple(keys)))
        return [list(group) for group in response.replicas]

    async def wait_records(self, keys: Sequence[bytes], holders: set[str]) -> list[list[ReplicaRecord]]:
        """Until every key has a record of each of ``holders`` at the IS; the groups."""
        async with asyncio.timeout(T):
            while True:
                groups = await self.lookup(keys)
                if len(groups) == len(keys) and all(holders <= {r.holder for r in g} for g in groups):
                    return groups
                await asyncio.sleep(0.05)

    async def metric(self, name: str, line: str) -> float:
        async with self.http["pc"].get(self.url(name, "metrics")) as resp:
            body = await resp.text()
        for text in body.splitlines():
            if text.startswith(line + " "):
                return float(text.split()[-1])
        return 0.0

    async def start(self, session: str, body: dict[str, object], instance: str = "ii1") -> None:
        data = json.dumps(body).encode()
        async with self.http["pc"].post(self.url(instance, f"sessions/{session}/start"), data=data,
                                        headers={"Content-Type": "application/kvsp+json"}) as resp:
            assert resp.status == 202, await resp.text()

    async def tokens(self, session: str, instance: str = "ii1") -> list[int]:
        """The session's output tokens, read to the end line."""
        out: list[int] = []
        async with asyncio.timeout(T), self.http["fe"].get(self.url(instance, f"sessions/{session}/tokens")) as resp:
            assert resp.status == 200, await resp.text()
            while line := await resp.content.readline():
                event = json.loads(line)
                if event.get("end"):
                    return out
                out.append(event["token"])
        raise AssertionError(f"the stream of {session} ended without an end line")


@asynccontextmanager
async def moqt_world(pki: DevPki, tmp: Path, *, descriptor: CompatDescriptor | None = None,
                     **instance: object) -> AsyncIterator[MoqtWorld]:
    """``instance``: overrides of ii1's ``[instance]`` table (``links`` may name ``"h1-moqt"``);
    ``descriptor``: the model served (default: the test engine's)."""
    model, key = write_files(tmp)
    if descriptor is not None:
        Path(model).write_text(json.dumps(descriptor.to_json()))
    pol = policy(pki)
    ports = {name: free_udp_port() for name in ("h1", "ii1")}
    moqt = {name: f"moqt://127.0.0.1:{port}/{name}" for name, port in ports.items()}

    def holder(name: str) -> dict[str, object]:
        return {"index": pki.uri("is"), "descriptors": [model], "replica_ttl_ms": 60_000,
                "moqt_listen": f"127.0.0.1:{ports[name]}", "moqt_uri": moqt[name]}

    links = [{**link, "holder": moqt["h1"] if link["holder"] == "h1-moqt" else link["holder"]}
             for link in instance.pop("links", [])]  # type: ignore[attr-defined]
    instance.setdefault("layerwise", True)  # these worlds test the layer-wise path; "auto" skips it for small tails
    section = instance_section(pki, model, key, **instance, **({"links": links} if links else {}))
    configs = {
        "is": role_config(pki, "is", ("is",), pol, {"is": {"descriptors": [model]}}, tmp),
        "h1": role_config(pki, "h1", ("holder",), pol, {"holder": holder("h1")}, tmp),
        "ii1": role_config(pki, "ii1", ("instance", "holder"), pol,
                           {"holder": holder("ii1"), "instance": section}, tmp),
    }
    async with AsyncExitStack() as stack:
        double = await stack.enter_async_context(pc_double(pki))
        apps = {name: await stack.enter_async_context(running(cfg)) for name, cfg in configs.items()}
        http = {}
        for who in ("pc", "fe"):
            connector = aiohttp.TCPConnector(ssl=pki.client_ssl(who))
            http[who] = await stack.enter_async_context(aiohttp.ClientSession(connector=connector))
        session = await stack.enter_async_context(pki.session("fe"))
        assert HOLDER in apps["h1"]
        yield MoqtWorld(pki, double, apps, http, session, moqt)


# -- an engine the test can hold between layers ----------------------------------------------------------
@dataclass
class LayerLog:
    """What the wrapped engines did, for the event loop: computed layers, and holds before layers."""

    loop: asyncio.AbstractEventLoop
    layers: int
    holds: dict[int, threading.Event] = field(default_factory=dict)  # before wait_layer(l): wait for the event
    computed: list[asyncio.Event] = field(default_factory=list)
    waiting: list[asyncio.Event] = field(default_factory=list)  # the engine reached layer l
    layerwise_calls: list[int] = field(default_factory=list)  # prefix_blocks of each prefill_layerwise

    def __post_init__(self) -> None:
        self.computed = [asyncio.Event() for _ in range(self.layers)]
        self.waiting = [asyncio.Event() for _ in range(self.layers)]

    def hold(self, *layers: int) -> None:
        for layer in layers:
            self.holds[layer] = threading.Event()

    def release(self, layer: int) -> None:
        self.holds[layer].set()


class GatedEngine:
    """Delegates to ``inner``; in ``prefill_layerwise`` it reports layers and honours the log's holds."""

    def __init__(self, inner: Engine, log: LayerLog) -> None:
        self.inner = inner
        self.log = log

    @property
    def geometry(self) -> EngineGeometry:
        return self.inner.geometry

    @property
    def context_length(self) -> int:
        return self.inner.context_length

    def prefill(self, tokens: Sequence[int], loaded_prefix_kv: Sequence[BlockKv] = ()) -> Step:
        return self.inner.prefill(tokens, loaded_prefix_kv)

    def prefill_layerwise(self, tokens: Sequence[int], prefix_blocks: int, wait_layer: WaitLayer,
                          on_layer: OnLayer | None = None) -> Step:
        log = self.log
        log.loop.call_soon_threadsafe(log.layerwise_calls.append, prefix_blocks)

        def wait(layer: int) -> None:
            log.loop.call_soon_threadsafe(log.waiting[layer].set)
            hold = log.holds.get(layer)
            if hold is not None and not hold.wait(T):
                raise AssertionError(f"layer {layer} was never released")
            wait_layer(layer)

        def done(layer: int) -> None:
            if on_layer is not None:
                on_layer(layer)
            log.loop.call_soon_threadsafe(log.computed[layer].set)

        step: Step = self.inner.prefill_layerwise(tokens, prefix_blocks, wait, done)  # type: ignore[attr-defined]
        return step

    def decode_step(self) -> Step:
        return self.inner.decode_step()

    def export_kv(self, block: int, layers: tuple[int, int]) -> list[LayerKv]:
        return self.inner.export_kv(block, layers)

    def import_kv(self, block: int, layer: int, k: Bytes, v: Bytes) -> None:
        self.inner.import_kv(block, layer, k, v)

    def sampler_state(self) -> Sampler:
        return self.inner.sampler_state()

    def restore_sampler(self, state: Sampler) -> None:
        self.inner.restore_sampler(state)


def gate_engines(world: MoqtWorld, layers: int, name: str = "ii1") -> LayerLog:
    """Wrap every engine the instance makes from now on."""
    log = LayerLog(asyncio.get_running_loop(), layers)
    instance = world.role(name).instance
    inner: Callable[[Sampler], Engine] = instance.engines
    instance.engines = lambda sampler: GatedEngine(inner(sampler), log)
    return log


# -- slow sources: the first layer, then the rest once the test says so -------------------------------------
@dataclass
class SlowBlocks:
    """Blocks served layer 0 first; the rest after ``go`` is set (or the connection breaks: ``broken``)."""

    containers: dict[bytes, bytes]  # block key -> container
    go: asyncio.Event = field(default_factory=asyncio.Event)
    broken: set[bytes] = field(default_factory=set)  # keys whose transfer stops after layer 0
    served: list[bytes] = field(default_factory=list)
    first_layer_sent: asyncio.Event = field(default_factory=asyncio.Event)
    compat_id: bytes = COMPAT

    def record(self, key: bytes, holder: str) -> ReplicaRecord:
        """The record a holder publishes for the block."""
        return dataclasses.replace(replica_record(key, holder, self.containers[key]), compat_id=self.compat_id)


@asynccontextmanager
async def slow_https_holder(pki: DevPki, blocks: SlowBlocks, name: str = "slow") -> AsyncIterator[str]:
    """An HTTPS holder (identity ``name``) that publishes its blocks and serves them slowly."""

    async def lease(request: web.Request) -> web.Response:  # no leases here: the fetcher goes on unleased
        problem = Problem.of(ProblemType.LEASE_QUOTA, "no leases")
        return web.Response(status=429, body=problem.to_bytes(), content_type="application/problem+json")

    async def get(request: web.Request) -> web.StreamResponse:
        key = bytes.fromhex(request.match_info["key"])
        data = blocks.containers[key]
        blocks.served.append(key)
        c = decode_container(data)
        first = c.header.header_length + sum(c.header.lengths[0])
        resp = web.StreamResponse(headers={REPR_DIGEST_FIELD: format_repr_digest(hashlib.sha256(data).digest())})
        resp.content_type = MEDIA_TYPE
        resp.content_length = len(data)
        await resp.prepare(request)
        await resp.write(data[:first])
        blocks.first_layer_sent.set()
        await asyncio.wait_for(blocks.go.wait(), T)
        if key in blocks.broken:
            assert request.transport is not None
            request.transport.close()  # the transfer breaks after layer 0
            return resp
        await resp.write(data[first:])
        await resp.write_eof()
        return resp

    uri = pki.uri(name)
    port = int(uri.split(":")[2].split("/")[0])
    path = "/" + uri.split("/", 3)[3]
    app = web.Application()
    app.router.add_post(path + "leases", lease)
    app.router.add_get(path + "blocks/{compat}/{scope}/{key}", get)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_context(pki.files(name)))
    await site.start()
    try:
        async with pki.session(name) as session:
            index = IndexClient(session, pki.uri("is"))
            for key in blocks.containers:
                await index.publish(blocks.record(key, uri))
        yield uri
    finally:
        await runner.cleanup()


class SlowTrack:
    """A stored block as a MOQT track: object 0, then the rest once the test says so."""

    def __init__(self, key: bytes, blocks: SlowBlocks) -> None:
        self.key = key
        self.blocks = blocks
        self.container = decode_container(blocks.containers[key])

    @property
    def largest(self) -> Location:
        return Location(BLOCK_GROUP, self.container.layer_count - 1)

    @property
    def complete(self) -> bool:
        return True

    async def read(self, start: Location, end: Location) -> AsyncIterator[MoqtObject]:
        self.blocks.served.append(self.key)
        for view in self.container.layers:
            if view.layer == 1:
                self.blocks.first_layer_sent.set()
                await asyncio.wait_for(self.blocks.go.wait(), T)
                if self.key in self.blocks.broken:
                    raise ConnectionError("the publisher stops after layer 0")
            yield layer_object(view.layer, view.payload, view.k_length, self.container.codec)


class SlowSource:
    def __init__(self, blocks: SlowBlocks, holder_id: str) -> None:
        self.blocks = blocks
        self.holder_id = holder_id

    async def lookup(self, namespace: Namespace, name: bytes) -> SlowTrack | None:
        fields = TrackNamespace.from_fields(namespace)
        if fields.holder_id != self.holder_id or fields.block_key not in self.blocks.containers:
            return None
        return SlowTrack(fields.block_key, self.blocks)


@asynccontextmanager
async def slow_moqt_holder(pki: DevPki, blocks: SlowBlocks, name: str = "slow") -> AsyncIterator[str]:
    """A MOQT publisher (certificate of ``name``) that publishes its blocks' moqt records and serves them slowly."""
    holder_id = role_id(pki.uri(name))
    publisher = Publisher(SlowSource(blocks, holder_id), authorize=lambda who, namespace, action: True)
    d = pki.dir
    port = await publisher.listen("127.0.0.1", 0, EndpointConfig.from_files(d / f"{name}.pem", d / f"{name}.key",
                                                                           d / "ca.pem"))
    uri = f"moqt://127.0.0.1:{port}/"
    try:
        async with pki.session(name) as session:
            index = IndexClient(session, pki.uri("is"))
            for key in blocks.containers:
                namespace = TrackNamespace(blocks.compat_id, SCOPE, holder_id, key)
                await index.publish(dataclasses.replace(blocks.record(key, uri), moqt_namespace=namespace))
        yield uri
    finally:
        await publisher.close()
