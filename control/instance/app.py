"""The inference instance role over HTTPS (spec sections 6.3, 6.5, 6.8, 6.9 and the kvsp extension).

Routes, relative to the role's base URI (docs/instance.md has the bodies):

    PUT   state                              StateChange -> 200 StateChange           PC only
    POST  prefetch                           PrefetchDirective -> 202 + Location      PC only
    GET   prefetch/{directive}               -> PrefetchStatus                        PC only
    POST  sessions/{session}/start           StartSession -> 202           (ext.)     PC only
    POST  sessions/{session}/resume          SessionCheckpoint -> 202                 PC only
    GET   sessions/{session}/tokens?from=N   -> NDJSON TokenEvents         (ext.)     readers of the scope
    POST  reshard                            ReshardPlan | Commit | Abort -> 200      PC only
    GET   shards/{map}?tokens=a-b[&version=v] -> container of the range    (ext.)     [instance] peers
    PUT   shards/{map}?tokens=a-b&version=v   container -> 201             (ext.)     the PC, [instance] peers

Handlers only translate: authorize, parse, call the role's parts (whose decisions live in
`control.instance.core`), and write the answer.  Errors are raised as `ProblemError` and become
Problem Details in `control.http`, in one place.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Final

from aiohttp import hdrs, web

from control.holder.app import format_repr_digest
from control.http import BLOCK_MEDIA_TYPE, defer_continue, identity, json_response, read_json, read_limited
from control.instance.metrics import InstanceMetrics
from control.instance.output import TokenLog
from control.instance.role import InstanceRole
from control.instance.sessions import spec_for_resume, spec_for_start
from control.instance.settings import InstanceSettings
from kvsp.errors import ValidationError
from kvsp.numbers import parse_decimal, parse_decimal_range
from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.reader import ObjectReader
from kvsp.records import PrefetchDirective, StateChange, parse_reshard_message
from kvsp.records.base import MAX_SAFE_INT, read_uuid
from kvsp.records.generation import ResumeRequest, StartSession, TokenEvent
from kvsp.records.shard import MAX_MAP_ID
from kvsp.service.app import CLOCK, CONFIG
from kvsp.service.config import RoleConfig
from kvsp.service.metrics import metrics_of

INSTANCE: web.AppKey[InstanceRole] = web.AppKey("kvsp.instance", InstanceRole)
NDJSON: Final = "application/x-ndjson"
STREAM_BATCH: Final = 256  # token lines per write
MAX_READERS: Final = 16  # token streams per session at once


def setup(app: web.Application, config: RoleConfig) -> None:
    """Add the instance's routes, state and background work to ``app`` (see `control.serve`)."""
    settings = InstanceSettings.from_config(config)
    app[INSTANCE] = InstanceRole(config, settings, InstanceMetrics.register(metrics_of(app)), app[CLOCK])
    base = config.server.base_path
    app.router.add_put(base + "state", put_state)
    app.router.add_post(base + "prefetch", post_prefetch)
    app.router.add_get(base + "prefetch/{directive}", get_prefetch)
    app.router.add_post(base + "sessions/{session}/start", post_start)
    app.router.add_post(base + "sessions/{session}/resume", post_resume)
    app.router.add_get(base + "sessions/{session}/tokens", get_tokens)
    app.router.add_post(base + "reshard", post_reshard)
    app.router.add_get(base + "shards/{map}", get_shard)
    app.router.add_put(base + "shards/{map}", put_shard, expect_handler=defer_continue)
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_stop_work)


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    role = app[INSTANCE]
    await role.start(app)
    try:
        yield
    finally:
        await role.close()


async def _stop_work(app: web.Application) -> None:
    """Shutdown runs before every cleanup context: sessions stop before this process's holder closes."""
    await app[INSTANCE].stop_work()


# -- helpers ---------------------------------------------------------------------------------------


def _require_pc(request: web.Request) -> str:
    """Directives, state changes, sessions and reshard plans come only from the PC (section 9)."""
    who = identity(request)
    if not request.app[CONFIG].policy.is_pc(who):
        raise ProblemError(Problem.generic(403, "Forbidden", f"{who} is not the placement controller"))
    return who


def _session_id(request: web.Request) -> str:
    """The {session} path segment, checked like the records' session members (canonical UUID)."""
    return read_uuid(ObjectReader({"session": request.match_info["session"]}, "path"), "session")


def _body_limit(request: web.Request) -> int:
    return request.app[CONFIG].policy.quotas.body_limit_octets


def _same_session(path: str, body: str) -> None:
    if path != body:
        raise ValidationError("session", f"the body names session {body}, the path {path}")


def _token_range(request: web.Request) -> tuple[int, int]:
    return parse_decimal_range(request.query.get("tokens", ""), "tokens", maximum=MAX_SAFE_INT)


def _version(text: str) -> int:
    return parse_decimal(text, "version", maximum=MAX_SAFE_INT)


# -- lifecycle (section 6.3) -----------------------------------------------------------------------


async def put_state(request: web.Request) -> web.Response:
    _require_pc(request)
    change = await read_json(request, StateChange.from_json, _body_limit(request))
    instance = request.app[INSTANCE].instance
    instance.report_soon(instance.lifecycle.on_state_change(change, instance.clock()))
    return json_response(StateChange(instance.lifecycle.state))


# -- prefetch (section 6.5) ------------------------------------------------------------------------


async def post_prefetch(request: web.Request) -> web.Response:
    who = _require_pc(request)
    role = request.app[INSTANCE]
    role.instance.lifecycle.require_active("prefetch directive")
    quotas = request.app[CONFIG].policy.quotas
    directive = await read_json(request, lambda v: PrefetchDirective.from_json(v, max_keys=quotas.keys_per_lookup),
                                quotas.body_limit_octets)
    role.prefetch.accept(who, directive)
    location = role.config.server.base_uri + "prefetch/" + directive.directive
    return json_response(role.tracker.status(directive.directive), status=202, headers={hdrs.LOCATION: location})


async def get_prefetch(request: web.Request) -> web.Response:
    _require_pc(request)
    return json_response(request.app[INSTANCE].tracker.status(request.match_info["directive"]))


# -- sessions (section 6.8 and the kvsp extension) -------------------------------------------------


def _accepted(request: web.Request, session: str, epoch: int, offset: int) -> web.Response:
    location = request.app[INSTANCE].config.server.base_uri + f"sessions/{session}/tokens?from={offset}"
    return json_response({"session": session, "epoch": epoch, "output_offset": offset, "state": "running"},
                         status=202, headers={hdrs.LOCATION: location})


async def post_start(request: web.Request) -> web.Response:
    _require_pc(request)
    session = _session_id(request)
    body = await read_json(request, StartSession.from_json, _body_limit(request))
    _same_session(session, body.session)
    role = request.app[INSTANCE]
    instance = role.instance
    instance.check_compat(body.compat_id)
    if body.max_tokens > role.settings.limits.max_tokens_limit:
        raise ValidationError("max_tokens", f"must be at most {role.settings.limits.max_tokens_limit}")
    spec = spec_for_start(body, instance.scope_key(body.scope_id), role.settings.descriptor.block_tokens)
    await instance.admit(spec)
    return _accepted(request, session, body.epoch, 0)


async def post_resume(request: web.Request) -> web.Response:
    _require_pc(request)
    session = _session_id(request)
    body = await read_json(request, ResumeRequest.from_json, _body_limit(request))
    checkpoint = body.checkpoint
    _same_session(session, checkpoint.session)
    role = request.app[INSTANCE]
    instance = role.instance
    instance.check_compat(checkpoint.compat_id)
    limits = role.settings.limits
    spec = spec_for_resume(body, instance.scope_key(checkpoint.scope_id), role.settings.descriptor.block_tokens,
                           limits.default_resume_max_tokens)
    if spec.max_tokens > limits.max_tokens_limit:
        raise ValidationError("max_tokens", f"must be at most {limits.max_tokens_limit}")
    await instance.admit(spec)
    return _accepted(request, session, checkpoint.epoch, checkpoint.output_offset)


async def get_tokens(request: web.Request) -> web.StreamResponse:
    session = _session_id(request)
    run = request.app[INSTANCE].instance.run_of(session)
    who = identity(request)
    if not request.app[CONFIG].policy.may_read(who, run.spec.base.scope_id):
        raise ProblemError.of(ProblemType.SCOPE_DENIED, f"{who} may not read scope {run.spec.base.scope_id.hex()}")
    # Everything is checked before prepare(): after the status line a refusal can only cut the stream.
    start = parse_decimal(request.query.get("from", "0"), "from", maximum=MAX_SAFE_INT)
    log = run.log
    if log.readers >= MAX_READERS:
        raise ProblemError(Problem.generic(429, "Too Many Requests", f"at most {MAX_READERS} streams per session"))
    response = web.StreamResponse()
    response.content_type = NDJSON
    await response.prepare(request)
    log.readers += 1
    try:
        await _follow(response, log, start)
    except ConnectionError:
        return response  # the reader went away
    finally:
        log.readers -= 1
    return response


async def _follow(response: web.StreamResponse, log: TokenLog, index: int) -> None:
    """Write released tokens from ``index`` as they come; the end line when the session finished."""
    while True:
        if index < len(log.tokens):
            chunk = log.tokens[index : index + STREAM_BATCH]
            await response.write(b"".join(TokenEvent(index + i, log.epoch, t).to_line()
                                          for i, t in enumerate(chunk)))
            index += len(chunk)
            continue
        if log.closed:
            if log.end is not None:
                await response.write(log.end.to_line())
            break
        await log.wait(index)
    await response.write_eof()


# -- resharding (section 6.9) ----------------------------------------------------------------------


async def post_reshard(request: web.Request) -> web.Response:
    _require_pc(request)
    message = await read_json(request, parse_reshard_message, _body_limit(request))
    return json_response(await request.app[INSTANCE].shards.handle(message))


async def put_shard(request: web.Request) -> web.Response:
    """Register KV of a token range as held in a version of a map (a prefill worker or the PC placing
    a member's range); the write side of GET shards/{map}."""
    role = request.app[INSTANCE]
    who = identity(request)
    if not (role.settings.may_read_shards(who) or request.app[CONFIG].policy.is_pc(who)):
        raise ProblemError(Problem.generic(403, "Forbidden", f"{who} is not a peer of this instance"))
    if request.content_type != BLOCK_MEDIA_TYPE:
        raise ProblemError(Problem.generic(415, "Unsupported Media Type", f"use {BLOCK_MEDIA_TYPE}"))
    tokens = _token_range(request)
    version = _version(request.query.get("version", ""))
    map_id = request.match_info["map"]
    if not 0 < len(map_id) <= MAX_MAP_ID:
        raise ValidationError("map", f"must be 1..{MAX_MAP_ID} characters")
    body = await read_limited(request, role.shards.max_range_octets(tokens))
    await role.shards.put_range(map_id, version, tokens, body)
    return json_response({"map": map_id, "version": version, "tokens": list(tokens)}, status=201)


async def get_shard(request: web.Request) -> web.StreamResponse:
    """KV of a token range of a map in the authoritative version, for a peer carrying out a plan."""
    role = request.app[INSTANCE]
    who = identity(request)
    if not role.settings.may_read_shards(who):
        raise ProblemError(Problem.generic(403, "Forbidden", f"{who} is not a peer of this instance"))
    tokens = _token_range(request)
    version = None if "version" not in request.query else _version(request.query["version"])
    count, views = role.shards.read(request.match_info["map"], tokens, version)

    def encode() -> tuple[list[bytes | memoryview], bytes]:
        parts = role.shards.layout.to_container(count, views)
        digest = hashlib.sha256()
        for part in parts:
            digest.update(part)
        return parts, digest.digest()

    parts, digest = await asyncio.to_thread(encode)
    response = web.StreamResponse(headers={"Repr-Digest": format_repr_digest(digest),
                                           hdrs.CACHE_CONTROL: "private, no-store"})
    response.content_type = BLOCK_MEDIA_TYPE
    response.content_length = sum(len(memoryview(p)) for p in parts)
    await response.prepare(request)
    for part in parts:
        await response.write(part)
    await response.write_eof()
    return response
