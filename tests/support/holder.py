"""Shared pieces of the holder tests: small descriptors, real containers, and an Index Service double.

(A module of helpers, named like a test module so that it sits with the holder tests; it has no tests.)
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from aiohttp import web

from control.deploy.pki import DevPki
from control.holder.store import BlockId, BlockMeta
from kvsp.container import Geometry, decode_container, encode_container, replica_digest
from kvsp.descriptor import CompatDescriptor
from kvsp.records import ReplicaRecord
from kvsp.registry import Codec
from kvsp.service.policy import Policy, Quotas, ScopeGrant
from kvsp.service.tls import identities_of, server_context

SCOPE = bytes(range(16))
OTHER_SCOPE = bytes(range(16, 32))


def descriptor(layers: int = 4, kv_heads: int = 2, head_dim: int = 8, block_tokens: int = 4,
               kv_dtype: str = "bf16", model: str = "test-model") -> CompatDescriptor:
    return CompatDescriptor(model=model, model_digest=hashlib.sha256(model.encode()).digest(),
                            tokenizer_digest=bytes(32), layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                            kv_dtype=kv_dtype, positional="rope", block_tokens=block_tokens)


def write_descriptor(d: CompatDescriptor, path: Path) -> Path:
    path.write_text(json.dumps(d.to_json()))
    return path


def geometry(d: CompatDescriptor) -> Geometry:
    return Geometry.for_dtype(d.kv_heads, d.head_dim, d.kv_dtype, d.layers)


def container(d: CompatDescriptor, seed: int, *, first: int = 0, count: int | None = None,
              tokens: int | None = None) -> bytes:
    """A real raw container of distinct random sections (layers ``first..first+count-1``)."""
    rng = random.Random(seed)
    tokens = d.block_tokens if tokens is None else tokens
    section = d.section_length(tokens)
    count = d.layers if count is None else count
    layers = [(rng.randbytes(section), rng.randbytes(section)) for _ in range(count)]
    return encode_container(Codec.RAW, first, tokens, layers)


def block_id(d: CompatDescriptor, key: int, scope: bytes = SCOPE) -> BlockId:
    return BlockId(d.compat_id, scope, hashlib.sha256(key.to_bytes(8, "big")).digest())


def meta_of(block: BlockId, body: bytes, d: CompatDescriptor) -> BlockMeta:
    c = decode_container(body, geometry=geometry(d))
    digests = c.layer_digests()
    return BlockMeta(block, c.header, digests, replica_digest(digests), hashlib.sha256(body).digest())


def policy(quotas: Quotas | None = None) -> Policy:
    """client: read+store SCOPE; other: nothing; holder: may publish for itself (identity == holder)."""
    return Policy(scopes={SCOPE: ScopeGrant(read=frozenset({"*"}), store=frozenset({"*"})),
                          OTHER_SCOPE: ScopeGrant()}, quotas=quotas or Quotas())


def restricted_policy(pki: DevPki, quotas: Quotas | None = None) -> Policy:
    client = pki.uri("client")
    return Policy(scopes={SCOPE: ScopeGrant(read=frozenset({client}), store=frozenset({client})),
                          OTHER_SCOPE: ScopeGrant(read=frozenset({pki.uri("other")}))},
                  quotas=quotas or Quotas())


# -- Index Service double --------------------------------------------------------------------------


@dataclass
class IndexCall:
    method: str
    holder_id: str
    block_key: str
    identity: str
    record: ReplicaRecord | None
    observed: object = None  # whatever the ``on_delete`` probe saw when the DELETE arrived


@dataclass
class IndexDouble:
    """Records PUT/DELETE replicas/{holder-id}/{key}; ``on_delete`` probes the holder at DELETE time."""

    calls: list[IndexCall] = field(default_factory=list)
    on_delete: Callable[[str], object] | None = None
    fail: bool = False
    cap_ttl_ms: int | None = None  # like a real IS, answer with the TTL capped

    def puts(self) -> list[IndexCall]:
        return [c for c in self.calls if c.method == "PUT"]

    def deletes(self) -> list[IndexCall]:
        return [c for c in self.calls if c.method == "DELETE"]

    async def handle(self, request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        ids = identities_of(peer)
        key = request.match_info["key"]
        if self.fail:
            return web.Response(status=503)
        if request.method == "PUT":
            record = ReplicaRecord.from_bytes(await request.read())
            self.calls.append(IndexCall("PUT", request.match_info["holder"], key, ids[0], record))
            if self.cap_ttl_ms is not None:
                record = replace(record, ttl_ms=min(record.ttl_ms, self.cap_ttl_ms))
            return web.Response(status=200, body=record.to_bytes(), content_type="application/kvsp+json")
        observed = self.on_delete(key) if self.on_delete else None
        self.calls.append(IndexCall("DELETE", request.match_info["holder"], key, ids[0], None, observed))
        return web.Response(status=204)


@asynccontextmanager
async def index_double(pki: DevPki, name: str = "is") -> AsyncIterator[IndexDouble]:
    double = IndexDouble()
    uri = pki.uri(name)
    port = int(uri.split(":")[2].split("/")[0])
    path = "/" + uri.split("/", 3)[3]
    app = web.Application()
    app.router.add_put(path + "replicas/{holder}/{key}", double.handle)
    app.router.add_delete(path + "replicas/{holder}/{key}", double.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_context(pki.files(name)))
    await site.start()
    try:
        yield double
    finally:
        await runner.cleanup()
