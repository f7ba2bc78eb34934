"""The Placement Controller role over HTTPS with mutual TLS (``kvsp serve pc``).

Routes, relative to the role's base URI (docs/pc-instance-protocol.md, docs/pc.md):

- ``PUT instances/{instance-id}/status`` (section 6.3): that instance only, and only an identity the
  policy lists in ``instances``; 200 ``{"state": ...}``;
- ``PUT sessions/{session}/checkpoint`` (section 6.8): the instance the PC assigned the session to, at
  the current epoch, with ``read`` on the session's scope; 200 Ack;
- ``POST requests`` (extension): GenerateRequest -> 200 SessionInfo; identities with ``lookup`` on the scope;
- ``GET sessions/{session}`` (extension): SessionInfo; identities with ``lookup`` on the session's scope;
- ``POST maps/{map}`` (extension): a new Shard Map version -> 202 while the reshard runs (201 for a
  new map); the PC itself or a configured operator only, and every member must be a listed instance
  (the PC sends each member a plan);
- ``GET maps/{map}`` (extension): the authoritative map, the version in progress, the last outcome.

Handlers only authorize, parse and answer; `PlacementController` feeds the sans-I/O cores and carries
out their actions.  Errors are raised as `ProblemError`/`ValidationError` and become Problem Details
in ``control.http``'s middleware, in one place.

**Active/standby** (``[pc] backend = "redis"``, docs/scale.md).  Every route above is a role request:
only the leader answers it.  A PC that does not lead answers with Problem Details, ``about:blank``:

- **421 Misdirected Request** when it is a standby that knows the leader: the member ``"leader"`` names
  the leader's base URI, and the client sends the same request there (it was not acted on here);
- **503 Service Unavailable** with ``Retry-After: 1`` and ``"leader": null`` when no leader is known
  (an election is under way, the store is unreachable) or this PC holds the lease but is still loading
  its state.  The member tells it from the leader's own 503s (no instance to place a request on).

421 says exactly "this server is not the one to answer this request" (RFC 9110 section 15.5.20), so a
client never mistakes a standby for a failed request; ``GET {base}health`` says ``"role"`` and
``"leader"`` on every PC.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from control.http import identity, json_response, not_found, read_json
from control.index.app import status_board_of
from control.pc.client import InstanceClient
from control.pc.leader import NotLeader
from control.pc.metrics import PcCollector, PcMetrics
from control.pc.service import PlacementController
from control.pc.settings import PcSettings
from control.pc.store import PcStore
from kvsp.client.http import ClientOptions, KvspSession
from kvsp.client.index import IndexClient
from kvsp.errors import ValidationError
from kvsp.identifiers import check_role_id, role_id
from kvsp.numbers import parse_decimal
from kvsp.problems import PROBLEM_MEDIA_TYPE, Problem, ProblemError, ProblemType
from kvsp.records import InstanceStatus, SessionCheckpoint, ShardMap
from kvsp.records.base import MAX_SAFE_INT
from kvsp.records.generation import GenerateRequest
from kvsp.records.shard import MAX_MAP_ID
from kvsp.service.app import CLOCK, CONFIG, HEALTH
from kvsp.service.config import RoleConfig
from kvsp.service.metrics import metrics_of
from kvsp.service.tls import client_context

log = logging.getLogger("kvsp.pc")

PC: web.AppKey[PlacementController] = web.AppKey("kvsp.pc", PlacementController)
_MAP_STATUS = {"registered": 201, "unchanged": 200, "started": 202}
LEADER_MEMBER = "leader"  # the Problem Details extension member of a 421: the leader's base URI
RETRY_AFTER_S = 1
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def not_leader_response(exc: NotLeader) -> web.Response:
    """421 naming the leader, or 503 when there is none to name (see the module docstring)."""
    if exc.leader is not None:
        problem = Problem.generic(421, "Misdirected Request", exc.detail)
        body = {**problem.to_json(), LEADER_MEMBER: exc.leader}
        headers: dict[str, str] = {}
    else:
        problem = Problem.generic(503, "Service Unavailable", exc.detail)
        body = {**problem.to_json(), LEADER_MEMBER: None}  # the member says "not the leader", unlike other 503s
        headers = {"Retry-After": str(RETRY_AFTER_S)}
    return web.Response(status=problem.status, body=json.dumps(body, separators=(",", ":")).encode(),
                        content_type=PROBLEM_MEDIA_TYPE, headers=headers)


def leader_only(handler: Handler) -> Handler:
    """A role request: answered by the leader only, before anything of the request is read."""
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            request.app[PC].require_leader()
            return await handler(request)
        except NotLeader as exc:
            return not_leader_response(exc)
    return wrapped


def _forbidden(detail: str) -> ProblemError:
    return ProblemError(Problem.generic(403, "Forbidden", detail))


def _body_limit(request: web.Request) -> int:
    return request.app[CONFIG].policy.quotas.body_limit_octets


# -- spec resources -------------------------------------------------------------------------------
async def put_status(request: web.Request) -> web.Response:
    """PUT instances/{instance-id}/status (section 6.3): only that instance reports its status."""
    pc, who = request.app[PC], identity(request)
    instance_id = check_role_id(request.match_info["instance_id"], "instance-id")
    status = await read_json(request, InstanceStatus.from_json, _body_limit(request))
    if role_id(status.instance) != instance_id:
        raise ValidationError("instance-id", "must be the instance-id of the record's instance")
    if who != status.instance or not pc.is_instance(who):
        pc.metrics.denials.labels("status").inc()
        raise _forbidden(f"{who} may not report the status of {status.instance}")
    answer = await pc.report_status(status, pc.clock())
    return json_response(answer)


async def put_checkpoint(request: web.Request) -> web.Response:
    """PUT sessions/{session}/checkpoint (section 6.8): the session's current owner, current epoch."""
    pc, who = request.app[PC], identity(request)
    checkpoint = await read_json(request, SessionCheckpoint.from_json, _body_limit(request))
    if checkpoint.session != request.match_info["session"]:
        raise ValidationError("session", "must equal the session of the path")
    return json_response(await pc.checkpoint(who, checkpoint, pc.clock()))


# -- extension resources ----------------------------------------------------------------------------
async def post_request(request: web.Request) -> web.Response:
    """POST requests: place a generation request and start its session (200 SessionInfo)."""
    pc, who = request.app[PC], identity(request)
    body = await read_json(request, GenerateRequest.from_json, _body_limit(request))
    if not pc.policy.may_lookup(who, body.scope_id):
        pc.metrics.denials.labels("request").inc()
        raise ProblemError.of(ProblemType.SCOPE_DENIED, f"{who} may not use scope {body.scope_id.hex()}")
    return json_response(await pc.place(body))


async def get_session(request: web.Request) -> web.Response:
    """GET sessions/{session}: current owner and epoch, for a front end that lost its stream."""
    pc, who = request.app[PC], identity(request)
    session = request.match_info["session"]
    scope = pc.scope_of(session)
    if scope is None:
        raise not_found(f"no session {session}")
    if not (pc.policy.may_lookup(who, scope) or pc.is_admin(who)):
        pc.metrics.denials.labels("session").inc()
        raise ProblemError.of(ProblemType.SCOPE_DENIED, f"{who} may not see sessions of scope {scope.hex()}")
    return json_response(pc.info(session))


def _admin(request: web.Request) -> PlacementController:
    pc, who = request.app[PC], identity(request)
    if not pc.is_admin(who):
        pc.metrics.denials.labels("map").inc()
        raise _forbidden(f"{who} may not manage shard maps")
    return pc


def _map_id(request: web.Request) -> str:
    map_id = request.match_info["map"]
    if not map_id or len(map_id) > MAX_MAP_ID:
        raise ValidationError("map", f"must be 1..{MAX_MAP_ID} characters")
    return map_id


async def post_map(request: web.Request) -> web.Response:
    """POST maps/{map}: make ``body`` the next version of the map (section 6.9, two-phase)."""
    pc = _admin(request)
    map_id = _map_id(request)
    new = await read_json(request, ShardMap.from_json, _body_limit(request))
    if new.map != map_id:
        raise ValidationError("map", "must equal the map of the path")
    for i, shard in enumerate(new.shards):  # plans and the shard traffic they start go to members only
        if not pc.is_instance(shard.instance):
            raise ValidationError(f"shards[{i}].instance", "must be an instance the policy lists")
    deadline_ms = pc.settings.reshard_deadline_ms
    if "deadline_ms" in request.query:
        deadline_ms = parse_decimal(request.query["deadline_ms"], "deadline_ms", minimum=1, maximum=MAX_SAFE_INT)
    status = _MAP_STATUS[await pc.reshard(new, deadline_ms, pc.clock())]
    return json_response(_map_state(pc, map_id), status=status, headers={"Location": f"maps/{map_id}"})


async def get_map(request: web.Request) -> web.Response:
    """GET maps/{map}: the authoritative version, the one in progress and the last outcome."""
    pc = _admin(request)
    map_id = _map_id(request)
    if pc.reshards.authoritative(map_id) is None:
        raise not_found(f"no shard map {map_id}")
    return json_response(_map_state(pc, map_id))


def _map_state(pc: PlacementController, map_id: str) -> dict[str, object]:
    current = pc.reshards.authoritative(map_id)
    last = pc.map_outcomes.get(map_id)
    return {"map": None if current is None else current.to_json(), "in_progress": pc.reshards.in_progress(map_id),
            "last": None if last is None else {"version": last.version, "outcome": last.outcome}}


# -- lifecycle ------------------------------------------------------------------------------------
async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    """Startup: the outbound session (the PC's certificate) and the maintenance loop.
    Shutdown: cancel every delivery and the loop, then close the session."""
    pc, config = app[PC], app[CONFIG]
    timeout = pc.settings.call_timeout_s
    options = ClientOptions(connect_timeout_s=min(timeout, 5.0), request_timeout_s=timeout)
    session = KvspSession(client_context(config.tls) if config.tls is not None else None, options)
    pc.client = InstanceClient(session, timeout_s=timeout)
    if pc.settings.index is not None:
        pc.index = IndexClient(session, pc.settings.index)
    loop = asyncio.get_running_loop()
    await pc.start()
    loops = [loop.create_task(pc.run(), name="kvsp-pc-maintenance")]
    if not pc.embedded:
        loops.append(loop.create_task(pc.run_lease(), name="kvsp-pc-lease"))
    try:
        yield
    finally:
        for task in loops:
            task.cancel()
        for task in loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await pc.tasks.close()
        await pc.release()
        await pc.store.close()
        await session.close()


def setup(app: web.Application, config: RoleConfig) -> None:
    """Add the PC's routes, state, metrics and background work to ``app`` (see ``control.serve``)."""
    settings = PcSettings.from_config(config)
    metrics = PcMetrics.register(metrics_of(app))
    board = status_board_of(app) if "is" in config.roles else None  # feeds the IS's lookup estimates
    clock = app[CLOCK]
    pc = PlacementController(settings, config.policy, base_uri=config.server.base_uri, clock=clock,
                             metrics=metrics, board=board, store=_store(settings))
    app[PC] = pc
    if not pc.policy.instances:
        log.warning("the policy lists no instances: every instance status and checkpoint will be refused")
    metrics_of(app).registry.register(PcCollector(pc))
    app[HEALTH]["pc"] = lambda app: {"role": app[PC].role.value, "leader": app[PC].leader}
    base = config.server.base_path
    app.router.add_put(base + "instances/{instance_id}/status", leader_only(put_status))
    app.router.add_put(base + "sessions/{session}/checkpoint", leader_only(put_checkpoint))
    app.router.add_get(base + "sessions/{session}", leader_only(get_session))
    app.router.add_post(base + "requests", leader_only(post_request))
    app.router.add_post(base + "maps/{map}", leader_only(post_map))
    app.router.add_get(base + "maps/{map}", leader_only(get_map))
    app.cleanup_ctx.append(_lifecycle)


def _store(settings: PcSettings) -> PcStore | None:
    """The configured store; None is the embedded one (the PC makes its own `MemoryStore`)."""
    if settings.backend.kind == "memory" or settings.backend.redis is None:
        return None
    from control.pc.store.redis import RedisStore  # noqa: PLC0415 - redis-py only for PCs that use it

    return RedisStore(settings.backend.redis)
