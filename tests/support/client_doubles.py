"""Test doubles for the block client: a holder and an Index Service as small aiohttp apps on real mTLS.

The holder serves real containers and misbehaves on purpose, per block key: wrong or missing
Repr-Digest, corrupted layer octets under a correct Repr-Digest, 404s, a connection closed mid-body,
a stalled body, one octet per write, or layer-by-layer delivery gated on the client having used the
previous layer.  The index answers lookups from a table and records withdrawals.  A few tests at the
end check the doubles themselves, so that a client test failing means the client is wrong.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from control.deploy.pki import DevPki
from kvsp.client.verify import format_repr_digest
from kvsp.container import (
    MEDIA_TYPE,
    Container,
    LayerRange,
    decode_container,
    encode_container,
    replica_digest,
)
from kvsp.encoding import canonical_json
from kvsp.problems import Problem, ProblemType
from kvsp.records import LeaseRenewal, LeaseRequest, LookupRequest, LookupResponse, ReplicaRecord, Residency
from kvsp.registry import Tier
from kvsp.service.tls import identities_of, server_context

COMPAT = bytes.fromhex("5ed5c2f238839655d7c4029e12b7f31caf9e7421f4edb4057feee6dab760ee0f")
SCOPE = bytes.fromhex("6d1c6481cd428737da312c089db3832a")
TOKENS = 4  # B
HEADS, DIM, ELEMENT = 2, 4, 2  # section = TOKENS * 16 octets
LAYERS = 4
ROLES = ["client", "is", "h1", "h2", "h3"]


def key_of(i: int) -> bytes:
    return hashlib.sha256(b"block %d" % i).digest()


def make_container(i: int, layers: int = LAYERS, tokens: int = TOKENS, first: int = 0) -> bytes:
    """A raw container whose every octet depends on the block and layer, so mix-ups show."""
    section = tokens * HEADS * DIM * ELEMENT
    sections = []
    for layer in range(first, first + layers):
        k = hashlib.shake_256(b"k%d.%d" % (i, layer)).digest(section)
        v = hashlib.shake_256(b"v%d.%d" % (i, layer)).digest(section)
        sections.append((k, v))
    return encode_container(1, first, tokens, sections)


def make_record(holder: str, key: bytes, container: bytes, *, tier: Tier = Tier.HOST,
                layer_digests: bool = True, read_mbit_per_s: float | None = None,
                residency: tuple[Residency, ...] | None = None) -> ReplicaRecord:
    decoded = decode_container(container)
    digests = decoded.layer_digests()
    return ReplicaRecord(
        block_key=key, compat_id=COMPAT, scope_id=SCOPE, holder=holder, codec=decoded.codec, size=len(container),
        digest=replica_digest(digests),
        residency=residency or (Residency(tier, (decoded.first_layer, decoded.last_layer), read_mbit_per_s),),
        ttl_ms=60_000, layer_digests=digests if layer_digests else ())


class Mode(enum.Enum):
    OK = "ok"
    WRONG_REPR = "wrong-repr"
    NO_REPR = "no-repr"
    CORRUPT_LAYER = "corrupt-layer"  # last layer's octets altered, Repr-Digest of the altered body
    NOT_FOUND = "not-found"
    LAYERS_UNAVAILABLE = "layers-unavailable"
    CLOSE_MID_BODY = "close-mid-body"
    STALL = "stall"
    TRICKLE = "trickle"  # one octet per write, drained
    GATED = "gated"  # layer by layer, each after the client signalled the previous one
    FORBIDDEN = "forbidden"
    IGNORE_RANGE = "ignore-range"  # answers every layers=a-b request with the whole block


def problem(kind: ProblemType, detail: str = "") -> web.Response:
    p = Problem.of(kind, detail or None)
    return web.Response(status=p.status, body=p.to_bytes(), content_type="application/problem+json")


async def serve(app: web.Application, pki: DevPki, name: str) -> web.AppRunner:
    """Serve ``app`` at the role's URI over mutual TLS 1.3; handlers are cancelled when a client leaves."""
    uri = pki.uri(name)
    port = int(uri.split(":")[2].split("/")[0])
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_context(pki.files(name)))
    await site.start()
    return runner


def _peer(request: web.Request) -> str | None:
    transport = request.transport
    ids = identities_of(transport.get_extra_info("peercert") if transport else None)
    return ids[0] if ids else None


@dataclass
class FakeHolder:
    """A holder with blocks and a misbehaviour per key; counts what it was asked."""

    pki: DevPki
    name: str
    blocks: dict[bytes, bytes] = field(default_factory=dict)
    modes: dict[bytes, Mode] = field(default_factory=dict)
    mode: Mode = Mode.OK  # for keys without an entry in modes
    delay_s: float = 0.0  # before answering a GET (makes overlap observable)
    lease_status: int = 201
    gates: dict[int, asyncio.Event] = field(default_factory=dict)  # GATED: layer -> "client used it"
    gets: list[tuple[bytes, str]] = field(default_factory=list)  # (key, query string)
    peers: list[str | None] = field(default_factory=list)
    leases: dict[str, tuple[bytes, ...]] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)
    stored: dict[bytes, tuple[bytes, dict[str, str]]] = field(default_factory=dict)
    in_flight: int = 0
    max_in_flight: int = 0
    gate_timeouts: int = 0
    sent_before_gate: list[int] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None

    @property
    def uri(self) -> str:
        return self.pki.uri(self.name)

    def add(self, i: int, *, mode: Mode | None = None, container: bytes | None = None,
            **record_args: object) -> ReplicaRecord:
        data = container if container is not None else make_container(i)
        self.blocks[key_of(i)] = data
        if mode is not None:
            self.modes[key_of(i)] = mode
        return make_record(self.uri, key_of(i), data, **record_args)  # type: ignore[arg-type]

    def app(self) -> web.Application:
        app = web.Application()
        base = "/" + self.name + "/"
        app.router.add_get(base + "blocks/{compat}/{scope}/{key}", self.get_block)
        app.router.add_put(base + "blocks/{compat}/{scope}/{key}", self.put_block)
        app.router.add_post(base + "leases", self.post_lease)
        app.router.add_put(base + "leases/{id}", self.put_lease)
        app.router.add_delete(base + "leases/{id}", self.delete_lease)
        return app

    async def start(self) -> FakeHolder:
        self._runner = await serve(self.app(), self.pki, self.name)
        return self

    async def stop(self) -> None:
        self._stop.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- leases ----------------------------------------------------------------------------------------
    async def post_lease(self, request: web.Request) -> web.Response:
        body = LeaseRequest.from_bytes(await request.read())
        if self.lease_status == 429:
            return problem(ProblemType.LEASE_QUOTA)
        if self.lease_status == 403:
            return problem(ProblemType.SCOPE_DENIED)
        if any(k not in self.blocks for k in body.block_keys):
            return problem(ProblemType.NOT_FOUND, "no such block")
        lease_id = f"L{len(self.leases) + 1}"
        self.leases[lease_id] = body.block_keys
        out = {"lease": lease_id, "block_keys": [k.hex() for k in body.block_keys], "ttl_ms": min(body.ttl_ms, 5000)}
        return web.Response(status=201, body=canonical_json(out), content_type="application/kvsp+json")

    async def put_lease(self, request: web.Request) -> web.Response:
        lease_id = request.match_info["id"]
        body = LeaseRenewal.from_bytes(await request.read())
        if lease_id not in self.leases:
            return problem(ProblemType.NOT_FOUND)
        out = {"lease": lease_id, "block_keys": [k.hex() for k in self.leases[lease_id]], "ttl_ms": body.ttl_ms}
        return web.Response(body=canonical_json(out), content_type="application/kvsp+json")

    async def delete_lease(self, request: web.Request) -> web.Response:
        lease_id = request.match_info["id"]
        if lease_id not in self.leases:
            return problem(ProblemType.NOT_FOUND)
        self.released.append(lease_id)
        return web.Response(status=204)

    # -- blocks ----------------------------------------------------------------------------------------
    async def put_block(self, request: web.Request) -> web.Response:
        key = bytes.fromhex(request.match_info["key"])
        data = await request.read()
        if key in self.stored or key in self.blocks:
            return web.Response(status=412)
        self.stored[key] = (data, dict(request.headers))
        return web.Response(status=201)

    async def get_block(self, request: web.Request) -> web.StreamResponse:
        key = bytes.fromhex(request.match_info["key"])
        self.gets.append((key, request.query_string))
        self.peers.append(_peer(request))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            return await self._answer(request, key, self.modes.get(key, self.mode))
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request, key: bytes, mode: Mode) -> web.StreamResponse:
        if mode is Mode.FORBIDDEN:
            return problem(ProblemType.SCOPE_DENIED)
        if mode is Mode.NOT_FOUND or key not in self.blocks:
            return problem(ProblemType.NOT_FOUND)
        if mode is Mode.LAYERS_UNAVAILABLE:
            return problem(ProblemType.LAYERS_UNAVAILABLE)
        stored = self.blocks[key]
        if mode is Mode.CORRUPT_LAYER:  # the stored copy rotted: its last layer's last octet
            stored = stored[:-1] + bytes([stored[-1] ^ 0xFF])
        container = decode_container(stored)
        data = self._body(container, None if mode is Mode.IGNORE_RANGE else request.query.get("layers"))
        if data is None:
            return problem(ProblemType.LAYERS_UNAVAILABLE)
        digest = hashlib.sha256(data).digest()  # of what is sent, so only the layer digests can tell
        if mode is Mode.WRONG_REPR:
            digest = hashlib.sha256(b"something else").digest()
        resp = web.StreamResponse(headers={"Cache-Control": "private, immutable"})
        resp.content_type = MEDIA_TYPE
        resp.content_length = len(data)
        if mode is not Mode.NO_REPR:
            resp.headers["Repr-Digest"] = format_repr_digest(digest)
        await resp.prepare(request)
        await self._send(request, resp, data, mode)
        return resp

    @staticmethod
    def _body(container: Container, layers: str | None) -> bytes | None:
        if layers is None:
            return container.slice_bytes(container.first_layer, container.last_layer)
        wanted = LayerRange.parse(layers)
        if wanted.first < container.first_layer or wanted.last > container.last_layer:
            return None
        return container.slice_bytes(wanted.first, wanted.last)

    async def _send(self, request: web.Request, resp: web.StreamResponse, data: bytes, mode: Mode) -> None:
        if mode is Mode.CLOSE_MID_BODY:
            await resp.write(data[: len(data) // 2])
            assert request.transport is not None
            request.transport.close()  # the holder process dies mid-GET
            raise asyncio.CancelledError
        if mode is Mode.STALL:
            await resp.write(data[: len(data) // 2])
            await asyncio.wait_for(self._stop.wait(), 30)
            return
        if mode is Mode.TRICKLE:
            for i in range(len(data)):
                await resp.write(data[i : i + 1])  # awaits the transport's drain
            await resp.write_eof()
            return
        if mode is Mode.GATED:
            await self._send_gated(resp, data)
            return
        await resp.write(data)
        await resp.write_eof()

    async def _send_gated(self, resp: web.StreamResponse, data: bytes) -> None:
        """Octet by octet; after each layer's last octet, wait until the client says it has that layer."""
        container = decode_container(data)
        end = container.header_length
        ends = {}
        for view in container.layers:
            end += view.nbytes
            ends[end] = view.layer
        for i in range(len(data)):
            await resp.write(data[i : i + 1])  # awaits the transport's drain
            layer = ends.get(i + 1)
            if layer is not None and layer != container.last_layer:
                self.sent_before_gate.append(i + 1)
                try:
                    await asyncio.wait_for(self.gates.setdefault(layer, asyncio.Event()).wait(), 5)
                except TimeoutError:
                    self.gate_timeouts += 1
        await resp.write_eof()


@dataclass
class FakeIndex:
    """An Index Service that answers lookups from ``replicas`` and records withdrawals."""

    pki: DevPki
    name: str = "is"
    replicas: dict[bytes, list[ReplicaRecord]] = field(default_factory=dict)
    withdraw_status: int = 204
    withdrawals: list[tuple[str, bytes, str | None]] = field(default_factory=list)  # holder-id, key, producer
    lookups: list[LookupRequest] = field(default_factory=list)
    fail_lookup: bool = False
    _runner: web.AppRunner | None = None

    @property
    def uri(self) -> str:
        return self.pki.uri(self.name)

    def publish(self, record: ReplicaRecord) -> None:
        self.replicas.setdefault(record.block_key, []).append(record)

    def app(self) -> web.Application:
        app = web.Application()
        base = "/" + self.name + "/"
        app.router.add_post(base + "lookup", self.lookup)
        app.router.add_delete(base + "replicas/{holder}/{key}", self.withdraw)
        return app

    async def start(self) -> FakeIndex:
        self._runner = await serve(self.app(), self.pki, self.name)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def lookup(self, request: web.Request) -> web.Response:
        if self.fail_lookup:
            return problem(ProblemType.SCOPE_DENIED)
        body = LookupRequest.from_bytes(await request.read())
        self.lookups.append(body)
        groups = []
        for key in body.block_keys:
            group = self.replicas.get(key)
            if not group:
                break
            groups.append(tuple(group))
        return web.Response(body=LookupResponse(tuple(groups)).to_bytes(), content_type="application/kvsp+json")

    async def withdraw(self, request: web.Request) -> web.Response:
        self.withdrawals.append((request.match_info["holder"], bytes.fromhex(request.match_info["key"]),
                                 request.query.get("producer")))
        if self.withdraw_status == 403:
            return problem(ProblemType.SCOPE_DENIED, "not authorized for this holder")
        return web.Response(status=self.withdraw_status)


# -- fixtures shared by the client tests ------------------------------------------------------------------


@pytest.fixture(scope="session", name="client_pki")
def client_pki_fixture(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    directory: Path = tmp_path_factory.mktemp("client-pki")
    return DevPki.make(directory, ROLES)


@dataclass
class Doubles:
    pki: DevPki
    index: FakeIndex
    holders: dict[str, FakeHolder]

    def __getitem__(self, name: str) -> FakeHolder:
        return self.holders[name]


@pytest.fixture(name="doubles")
async def doubles_fixture(client_pki: DevPki) -> AsyncIterator[Doubles]:
    index = await FakeIndex(client_pki).start()
    holders = {name: await FakeHolder(client_pki, name).start() for name in ("h1", "h2", "h3")}
    try:
        yield Doubles(client_pki, index, holders)
    finally:
        for holder in holders.values():
            await holder.stop()
        await index.stop()


def publish(doubles: Doubles, i: int, *holders: str, modes: dict[str, Mode] | None = None,
            make: Callable[[int], bytes] = make_container, **record_args: object) -> list[ReplicaRecord]:
    """Store block i at each named holder (with a mode per holder) and publish the records, in order."""
    records = []
    for name in holders:
        mode = (modes or {}).get(name)
        record = doubles[name].add(i, mode=mode, container=make(i), **record_args)
        doubles.index.publish(record)
        records.append(record)
    return records
