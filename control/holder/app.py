"""The holder role over HTTPS (spec sections 6.6 and 6.7): block GET/PUT and leases.

Routes, relative to the role's base URI:

    GET, HEAD  blocks/{compat}/{scope}/{block_key}[?layers=a-b][&codec=n]
    PUT        blocks/{compat}/{scope}/{block_key}          (If-None-Match: * required)
    POST       leases
    PUT        leases/{id}
    DELETE     leases/{id}

Handlers only translate: they parse the request, ask the policy, call `Holder`, and write the answer.
Errors are raised as `ProblemError` and become Problem Details in `control.http` (one place).

``codec=n``: this holder does not transcode, so it serves the stored codec whatever ``n`` asks for
(the spec makes transcoding a MAY); the container's Codec field tells the client what it got, and
because that is the replica's codec the client can verify the layer digests against the record.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator
from typing import Final

from aiohttp import hdrs, web

from control.holder import moqt
from control.holder.disk import DiskTier
from control.holder.files import load_or_create_key
from control.holder.metrics import HolderMetrics
from control.holder.service import Holder, StoreFullError
from control.holder.settings import HolderSettings
from control.holder.store import BlockExistsError, BlockId, BlockMeta
from control.holder.tiers import StorageCorruptError, StorageMissingError, TierError
from control.holder.tierset import memory_tiers
from control.http import (
    BLOCK_MEDIA_TYPE,
    defer_continue,
    identity,
    json_response,
    not_found,
    read_json,
    read_limited,
)
from kvsp.client.http import KvspSession
from kvsp.client.index import IndexClient
from kvsp.container import Geometry, LayerRange, decode_container, replica_digest
from kvsp.descriptor import CompatDescriptor
from kvsp.encoding import parse_hex
from kvsp.errors import ContainerError, ValidationError
from kvsp.numbers import parse_decimal
from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.records import LeaseRenewal, LeaseRequest
from kvsp.records.lease import check_lease_id
from kvsp.service.app import CLOCK, CONFIG, HEALTH
from kvsp.service.config import RoleConfig
from kvsp.service.metrics import metrics_of
from kvsp.service.tls import client_context

log = logging.getLogger("kvsp.holder.http")

HOLDER: web.AppKey[Holder] = web.AppKey("kvsp.holder", Holder)
REPR_DIGEST: Final = "Repr-Digest"
ACCEPTED_BLOCK_TYPES: Final = frozenset({BLOCK_MEDIA_TYPE, "application/octet-stream"})
SHUTDOWN_WITHDRAW_S: Final = 5.0
LISTEN_PROBE_S: Final = 0.02  # first retry of the listener probe (doubling to 1 s)
_LOOPBACK: Final = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # wildcard binds: probe locally


def setup(app: web.Application, config: RoleConfig) -> None:
    """Add the holder's routes, state and background work to ``app`` (see `control.serve`)."""
    settings = HolderSettings.from_config(config)
    metrics = HolderMetrics.register(metrics_of(app))
    device, host = memory_tiers(settings)  # device only with CUDA; host as tensors with torch_tiers
    disk = None
    if settings.storage_dir is not None and settings.encryption_key_file is not None:
        disk = DiskTier(settings.storage_dir, load_or_create_key(settings.encryption_key_file))
    app[HOLDER] = Holder(settings, base_uri=config.server.base_uri, quotas=config.policy.quotas,
                         clock=app[CLOCK], metrics=metrics, host=host, disk=disk, device=device)
    quota = app[HOLDER].quota
    log.info("lease quota: %d octets per client (%s; %d pinnable in all tiers)", quota.lease_octets_per_client,
             quota.lease_quota_source, quota.pinnable_octets)
    for warning in quota.warnings:
        log.warning("%s", warning)
    app[HEALTH]["holder"] = lambda app: app[HOLDER].quota.facts()
    base = config.server.base_path
    block = base + "blocks/{compat}/{scope}/{block_key}"
    app.router.add_get(block, get_block)
    app.router.add_put(block, put_block, expect_handler=defer_continue)  # authorize, then 100 Continue
    app.router.add_post(base + "leases", post_lease)
    app.router.add_put(base + "leases/{lease_id}", put_lease)
    app.router.add_delete(base + "leases/{lease_id}", delete_lease)
    app.cleanup_ctx.append(_lifecycle)
    moqt.setup(app, config, app[HOLDER])  # [holder] moqt_listen: blocks over MOQT too (decision D3)


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    """Startup: prepare and measure local storage, connect to the IS, adopt the metadata of what local
    storage holds from an earlier process, start maintenance and, in the background, the check of the
    adopted files' contents (``verify_stored``) and, once the listeners serve, their publication.
    Shutdown: stop that work and withdraw every published record (spec 6.1, clean shutdown)."""
    holder, config = app[HOLDER], app[CONFIG]
    if holder.disk is not None:
        await asyncio.to_thread(holder.disk.prepare)
        await asyncio.to_thread(holder.disk.calibrate)
    await asyncio.to_thread(holder.tiers.calibrate)  # the torch tiers' copy rates (D5: measured)
    session: KvspSession | None = None
    if holder.settings.index is not None:
        session = KvspSession(client_context(config.tls) if config.tls is not None else None)
        holder.publisher.index = IndexClient(session, holder.settings.index)
    await holder.adopt()  # metadata only: the listener comes up without reading every stored file
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[None] | asyncio.Task[int]] = [
        loop.create_task(holder.run()), loop.create_task(_publish_when_listening(holder, config))]
    if holder.settings.verify_stored:
        tasks.append(loop.create_task(holder.verify_adopted()))
    else:
        holder.verification_done.set()
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await holder.publisher.withdraw_all(SHUTDOWN_WITHDRAW_S)
        if session is not None:
            await session.close()


async def _publish_when_listening(holder: Holder, config: RoleConfig) -> None:
    """Publish the adopted blocks once the HTTPS listener accepts connections.

    aiohttp runs every cleanup context's startup (the MOQT listener's included, set up after this
    one) before it opens the HTTPS site, so a listening HTTPS port means both serve.  The site is
    not visible from here: the port is probed with plain TCP connects (closed before any TLS).
    """
    port = config.server.port
    if port != 0:  # an ephemeral listener is not reachable at the base URI anyway: nothing to wait for
        host = _LOOPBACK.get(config.server.host, config.server.host)
        delay = LISTEN_PROBE_S
        while True:
            try:
                _, writer = await asyncio.open_connection(host, port)
            except OSError:
                await asyncio.sleep(delay)
                delay = min(2 * delay, 1.0)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            break
    published = holder.publish_adopted()
    log.info("listening: published the records of %d adopted blocks", published)


# -- helpers ---------------------------------------------------------------------------------------


def _block_id(request: web.Request) -> BlockId:
    m = request.match_info
    return BlockId(parse_hex(m["compat"], 32, "compat"), parse_hex(m["scope"], 16, "scope"),
                   parse_hex(m["block_key"], 32, "block_key"))


def _authorize(request: web.Request, block: BlockId, action: str) -> str:
    who = identity(request)
    policy = request.app[CONFIG].policy
    allowed = policy.may_read(who, block.scope_id) if action == "read" else policy.may_store(who, block.scope_id)
    if not allowed:
        raise ProblemError.of(ProblemType.SCOPE_DENIED, f"{who} may not {action} blocks of scope "
                                                        f"{block.scope_id.hex()}")
    return who


def format_repr_digest(digest: bytes) -> str:
    """``Repr-Digest`` (RFC 9530): a Structured Field Dictionary with one sha-256 byte sequence."""
    return f"sha-256=:{base64.b64encode(digest).decode('ascii')}:"


def parse_repr_digest(value: str | None) -> bytes | None:
    """The sha-256 member of a ``Repr-Digest`` field, None when absent (other algorithms are ignored)."""
    if value is None:
        return None
    found: bytes | None = None
    for member in value.split(","):
        name, eq, rest = member.strip().partition("=")
        item = rest.split(";", 1)[0].strip()
        if not eq or len(item) < 2 or item[0] != ":" or item[-1] != ":":
            raise ValidationError(REPR_DIGEST, "must be a dictionary of algorithm=:base64:")
        if name != "sha-256":
            continue
        try:
            digest = base64.b64decode(item[1:-1], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValidationError(REPR_DIGEST, "sha-256 must be standard base64") from exc
        if len(digest) != 32:
            raise ValidationError(REPR_DIGEST, "sha-256 must be 32 octets")
        found = digest
    return found


def _parse_codec(value: str) -> int:
    return parse_decimal(value, "codec", minimum=1, maximum=0xFFFF)


def _decode_block(block: BlockId, descriptor: CompatDescriptor, body: bytes) -> BlockMeta:
    """Decode with the descriptor's geometry, insist on a whole block, and compute every digest.

    Runs in a worker thread: hashing a block is the costly part and hashlib releases the GIL.
    """
    geometry = Geometry.for_dtype(descriptor.kv_heads, descriptor.head_dim, descriptor.kv_dtype, descriptor.layers)
    container = decode_container(body, geometry=geometry)
    if container.first_layer != 0 or container.layer_count != descriptor.layers:
        raise ContainerError(f"layers {container.layer_range} given; this holder stores whole blocks "
                             f"(layers 0-{descriptor.layers - 1})")
    if container.token_count != descriptor.block_tokens:
        raise ContainerError(f"token count {container.token_count}, a block has {descriptor.block_tokens}")
    digests = container.layer_digests()
    return BlockMeta(block, container.header, digests, replica_digest(digests), hashlib.sha256(body).digest())


def _exists(block: BlockId) -> ProblemError:
    return ProblemError(Problem.generic(412, "Precondition Failed", f"a replica of {block} is already held"))


# -- blocks ----------------------------------------------------------------------------------------


async def get_block(request: web.Request) -> web.StreamResponse:
    holder = request.app[HOLDER]
    block = _block_id(request)
    _authorize(request, block, "read")
    if "codec" in request.query:
        _parse_codec(request.query["codec"])  # validated; the stored codec is served (module docstring)
    now = holder.clock()
    entry = holder.store.get(block, now)
    if entry is None:
        raise not_found(f"block {block} is not held")
    text = request.query.get("layers")
    layers = entry.meta.layers if text is None else LayerRange.parse(text)
    if layers.last > entry.meta.layers.last:
        raise ProblemError.of(ProblemType.LAYERS_UNAVAILABLE, f"layers {layers} requested, "
                                                              f"{entry.meta.layers} held")
    try:
        rep = await holder.representation(entry, layers)
    except StorageMissingError as exc:
        raise not_found(f"block {block} is not held") from exc
    except StorageCorruptError as exc:
        log.error("%s; withdrawing and dropping it", exc)
        await holder.lose(block)
        raise not_found(f"block {block} failed its integrity check at rest and was discarded") from exc
    response = web.StreamResponse(headers={
        REPR_DIGEST: format_repr_digest(rep.repr_digest),
        hdrs.CACHE_CONTROL: f"private, immutable, max-age={holder.max_age_s(entry, now)}",
    })
    response.content_type = BLOCK_MEDIA_TYPE
    response.content_length = rep.length
    await response.prepare(request)
    if request.method != hdrs.METH_HEAD:
        for part in rep.parts:
            await response.write(part)
        holder.metrics.blocks_served.labels("full" if layers == entry.meta.layers else "range").inc()
        holder.metrics.bytes_served.labels("https").inc(rep.length)
    await response.write_eof()
    return response


async def put_block(request: web.Request) -> web.Response:
    holder = request.app[HOLDER]
    block = _block_id(request)
    _authorize(request, block, "store")
    if request.headers.get(hdrs.IF_NONE_MATCH, "").strip() != "*":
        raise ProblemError(Problem.generic(428, "Precondition Required", "storing a block needs If-None-Match: *"))
    descriptor = holder.settings.descriptors.get(block.compat_id)
    if descriptor is None:
        holder.metrics.store_rejections.labels("incompatible").inc()
        raise ProblemError.of(ProblemType.INCOMPATIBLE, f"this holder stores no blocks of compat "
                                                        f"{block.compat_id.hex()}")
    if holder.store.get(block, holder.clock(), touch=False) is not None:
        holder.metrics.store_rejections.labels("exists").inc()
        raise _exists(block)
    if request.headers.get(hdrs.CONTENT_TYPE) is not None and request.content_type not in ACCEPTED_BLOCK_TYPES:
        raise ProblemError(Problem.generic(415, "Unsupported Media Type", f"use {BLOCK_MEDIA_TYPE}"))
    expected = parse_repr_digest(request.headers.get(REPR_DIGEST))
    body = await read_limited(request, request.app[CONFIG].policy.quotas.block_body_limit_octets)
    try:
        meta = await asyncio.to_thread(_decode_block, block, descriptor, body)
    except ContainerError:
        holder.metrics.store_rejections.labels("malformed").inc()
        raise
    if expected is not None and expected != meta.repr_digest:
        holder.metrics.digest_failures.labels("put").inc()
        holder.metrics.store_rejections.labels("digest").inc()
        raise ProblemError.of(ProblemType.DIGEST_MISMATCH, "the body does not match its Repr-Digest")
    try:
        await holder.put(meta, memoryview(body))
    except BlockExistsError as exc:
        holder.metrics.store_rejections.labels("exists").inc()
        raise _exists(block) from exc
    except StoreFullError as exc:
        holder.metrics.store_rejections.labels("full").inc()
        raise ProblemError(Problem.generic(507, "Insufficient Storage", str(exc))) from exc
    except TierError as exc:
        raise ProblemError(Problem.generic(503, "Service Unavailable", str(exc))) from exc
    record = holder.record_of(block)
    if record is None:  # stored and already gone (an immediate fault): nothing to describe
        return web.Response(status=201)
    return json_response(record, status=201, headers={hdrs.LOCATION: request.path})


# -- leases ----------------------------------------------------------------------------------------


async def post_lease(request: web.Request) -> web.Response:
    holder = request.app[HOLDER]
    who = identity(request)
    policy = request.app[CONFIG].policy
    quotas = policy.quotas
    body = await read_json(request, lambda v: LeaseRequest.from_json(v, max_keys=quotas.keys_per_lookup),
                           quotas.body_limit_octets)
    state = holder.grant(who, body, lambda scope: policy.may_read(who, scope))
    location = holder.base_uri + "leases/" + state.lease_id
    return json_response(state.to_record(), status=201, headers={hdrs.LOCATION: location})


async def put_lease(request: web.Request) -> web.Response:
    holder = request.app[HOLDER]
    who = identity(request)
    lease_id = check_lease_id(request.match_info["lease_id"], "lease id")
    renewal = await read_json(request, LeaseRenewal.from_json, request.app[CONFIG].policy.quotas.body_limit_octets)
    return json_response(holder.renew(who, lease_id, renewal).to_record())


async def delete_lease(request: web.Request) -> web.Response:
    holder = request.app[HOLDER]
    holder.release(identity(request), check_lease_id(request.match_info["lease_id"], "lease id"))
    return web.Response(status=204)
