"""The front end role (``kvsp serve frontend``): the OpenAI-shaped public API and its health route.

Public listener (``[frontend] listen``; for clients without KVSP identities):

- ``POST /v1/completions``: a completion; ``stream: true`` answers with server-sent events, one
  ``text_completion`` chunk per token labelled ``kvsp: {index, epoch, token}``, then ``data: [DONE]``;
- ``GET /v1/models``, ``GET /health``.

Mutual-TLS listener (``server.base_uri``, like every role): ``GET {base}health`` and ``{base}metrics``.

Each request goes to the PC (``POST requests``) with the tenant's Scope ID; the tokens come from the
owner instance and are followed across failovers by `SessionFollower`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace

from aiohttp import web
from prometheus_client import Counter

from control.frontend.admission import Admission
from control.frontend.follower import FollowError, SessionFollower
from control.frontend.metrics import FrontendMetrics
from control.frontend.openai import (
    MEDIA_PROBLEM,
    ApiError,
    CompletionRequest,
    Limits,
    chunk,
    finish_reason,
    parse_completion,
    sse,
    usage,
)
from control.frontend.settings import FrontendSettings
from control.frontend.tokenizer import TextStream, Tokenizer, load_tokenizer
from control.http import close_if_uninvited, defer_continue, log_failure, read_limited, status_fields
from control.listener.site import GuardedSite
from control.pc.endpoints import PcEndpoints
from kvsp.client.http import ClientOptions, KvspSession
from kvsp.problems import ProblemError
from kvsp.records import Sampler
from kvsp.records.generation import GenerateRequest, TokenEvent
from kvsp.service.app import HEALTH
from kvsp.service.config import RoleConfig
from kvsp.service.metrics import metrics_of
from kvsp.service.tls import client_context

log = logging.getLogger("kvsp.frontend")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
JSON_TYPES = frozenset({"application/json", "application/kvsp+json"})
CLIENT_CLOSED = 499  # the status label of streams the client closed (nginx's convention)


@dataclass
class Frontend:
    settings: FrontendSettings
    tokenizer: Tokenizer
    http: KvspSession
    metrics: FrontendMetrics
    refusals: Counter  # label: limit (`admission.LIMITS`): the 429s of a full cap
    started: float = field(default_factory=time.time)
    pcs: PcEndpoints = field(init=False)  # shared by every request: it remembers which PC leads
    admission: Admission = field(init=False)

    def __post_init__(self) -> None:
        self.pcs = PcEndpoints(self.settings.pc)
        self.admission = Admission(self.settings.caps)

    @property
    def in_flight(self) -> int:
        return self.admission.in_flight

    @property
    def limits(self) -> Limits:
        s = self.settings
        return Limits(s.model, s.max_prompt_tokens, s.max_tokens_limit)

    def follower(self) -> SessionFollower:
        s = self.settings
        return SessionFollower(self.http, self.pcs, stall_s=s.stall_ms / 1000,
                               stranded_retry_s=s.stranded_retry_ms / 1000)

    def generate_request(self, tenant: str, req: CompletionRequest) -> GenerateRequest:
        sampler = Sampler(req.method, req.params, req.seed, 0, False)
        return GenerateRequest(None, self.settings.tenants[tenant], self.settings.descriptor.compat_id, req.prompt,
                               req.max_tokens, sampler)


FRONTEND: web.AppKey[Frontend] = web.AppKey("kvsp.frontend", Frontend)


# A 401 carries the challenge (RFC 9110 section 15.5.2); the API keys are Bearer tokens (RFC 6750).
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="kvsp"'}
_INVALID = {"WWW-Authenticate": 'Bearer realm="kvsp", error="invalid_token"'}
_RETRY = {"Retry-After": "1"}  # a cap is full: slots free as streams end (RFC 9110 section 10.2.3)


def _tenant(fe: Frontend, request: web.Request) -> str:
    auth = request.headers.get("Authorization")
    if auth is None:
        if fe.settings.anonymous_tenant is None:
            raise ApiError(401, "Unauthorized", "an API key is required (Authorization: Bearer KEY)",
                           kind="authentication_error", code="invalid_api_key", fields=_CHALLENGE)
        return fe.settings.anonymous_tenant
    scheme, _, key = auth.partition(" ")
    tenant = fe.settings.tenant_of_key(key.strip().encode()) if scheme.lower() == "bearer" else None
    if tenant is None:  # the presented key is never echoed
        raise ApiError(401, "Unauthorized", "the API key is not valid", kind="authentication_error",
                       code="invalid_api_key", fields=_INVALID)
    return tenant


async def _body(request: web.Request, limit: int) -> bytes:
    """The body, read as every role reads one (`read_limited`: the limit, then ``100 Continue``)."""
    if request.content_type not in JSON_TYPES:
        raise ApiError(415, "Unsupported Media Type", "send the request as application/json")
    try:
        return await read_limited(request, limit)
    except ProblemError as exc:
        raise ApiError(exc.problem.status, exc.problem.title, exc.problem.detail or exc.problem.title) from exc


async def completions(request: web.Request) -> web.StreamResponse:
    fe = request.app[FRONTEND]
    tenant = _tenant(fe, request)
    req = parse_completion(await _body(request, fe.settings.body_limit_octets), fe.limits, fe.tokenizer)
    client = request.remote or "?"
    refusal = fe.admission.acquire(tenant, client)
    if refusal is not None:
        fe.refusals.labels(refusal.limit).inc()
        raise ApiError(429, "Too Many Requests", refusal.detail, kind="rate_limit_error", fields=_RETRY)
    fe.metrics.in_flight.set(fe.in_flight)
    try:
        async with asyncio.timeout(fe.settings.request_timeout_ms / 1000):
            return await _run(fe, request, tenant, req)
    except TimeoutError as exc:
        raise ApiError(504, "Gateway Timeout", "the completion did not finish in time", kind="server_error") from exc
    finally:
        fe.admission.release(tenant, client)
        fe.metrics.in_flight.set(fe.in_flight)


async def _run(fe: Frontend, request: web.Request, tenant: str, req: CompletionRequest) -> web.StreamResponse:
    follower = fe.follower()
    try:
        info = await follower.start(fe.generate_request(tenant, req))
    except FollowError as exc:
        raise ApiError(exc.status, "Service Unavailable" if exc.status == 503 else "Bad Gateway", exc.detail,
                       kind="server_error") from exc
    created = int(time.time())
    tokens: AsyncGenerator[TokenEvent, None] = follower.tokens()
    text = TextStream(fe.tokenizer)
    if not req.stream:
        out: list[TokenEvent] = []
        try:
            async for token in tokens:
                out.append(token)
        except FollowError as exc:
            raise ApiError(exc.status, "Bad Gateway", exc.detail, kind="server_error") from exc
        fe.metrics.tokens.inc(len(out))
        _account(fe, follower, 200)
        pieces = "".join(text.push(t.token) for t in out) + text.flush()
        end = follower.stats.end
        body = chunk(info.session, fe.settings.model, created, pieces,
                     finish=finish_reason(end.reason) if end else "length",
                     kvsp={**_summary(follower), "tokens": [t.token for t in out]},
                     usage=usage(len(req.prompt), len(out)))
        return web.json_response(body)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    await resp.prepare(request)
    count, owner = 0, None
    try:
        async for token in tokens:
            count += 1
            fe.metrics.tokens.inc()
            label: dict[str, object] = {"index": token.index, "epoch": token.epoch, "token": token.token}
            if (follower.stats.instance, token.epoch) != owner:  # the first token and after each move
                owner = (follower.stats.instance, token.epoch)
                label |= {"session": follower.stats.session, "instance": follower.stats.instance}
            await resp.write(sse(chunk(info.session, fe.settings.model, created, text.push(token.token), kvsp=label)))
        end = follower.stats.end
        last = chunk(info.session, fe.settings.model, created, text.flush(),
                     finish=finish_reason(end.reason) if end else "length", kvsp=_summary(follower),
                     usage=usage(len(req.prompt), count) if req.include_usage else None)
        await resp.write(sse(last) + sse("[DONE]"))
        _account(fe, follower, 200)
    except FollowError as exc:  # headers are sent: the error travels as an event, and the stream ends
        _account(fe, follower, exc.status)
        with contextlib.suppress(ConnectionResetError):
            await resp.write(sse(ApiError(exc.status, "Bad Gateway", exc.detail, kind="server_error").to_json()))
    except ConnectionResetError:  # the client went away: stop following (the session runs to its end)
        _account(fe, follower, CLIENT_CLOSED)
    finally:
        await tokens.aclose()
    return resp


def _summary(follower: SessionFollower) -> dict[str, object]:
    s = follower.stats
    return {"session": s.session, "instance": s.instance, "epoch": s.epoch, "moves": s.moves,
            "submissions": s.submissions, "discarded": s.duplicates,
            "resume_ms": [round(g * 1000, 3) for g in s.resume_gaps_s]}


def _account(fe: Frontend, follower: SessionFollower, status: int) -> None:
    s = follower.stats
    fe.metrics.requests.labels(str(status)).inc()
    fe.metrics.moves.inc(s.moves)
    fe.metrics.resumes.inc(len(s.resume_gaps_s))
    fe.metrics.resume_seconds.inc(sum(s.resume_gaps_s))
    fe.metrics.duplicates.inc(s.duplicates)
    fe.metrics.resubmissions.inc(max(0, s.submissions - 1))


async def models(request: web.Request) -> web.Response:
    fe = request.app[FRONTEND]
    entry = {"id": fe.settings.model, "object": "model", "created": int(fe.started), "owned_by": "kvsp",
             "kvsp": {"compat_id": fe.settings.descriptor.compat_id_hex}}
    return web.json_response({"object": "list", "data": [entry]})


async def health(request: web.Request) -> web.Response:
    fe = request.app[FRONTEND]
    return web.json_response({"status": "ok", "role": "frontend", "in_flight": fe.in_flight,
                              "model": fe.settings.model})


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    fe = request.app[FRONTEND]
    try:
        response = await handler(request)
    except Exception as exc:
        if request.writer.output_size > 0:
            raise  # the status line is out: aiohttp closes the connection (see control.http)
        error = _api_error(request, exc)
        fe.metrics.requests.labels(str(error.status)).inc()
        response = web.Response(status=error.status, body=error.to_bytes(), content_type=MEDIA_PROBLEM,
                                headers={**error.fields, "Cache-Control": "no-store"})
    close_if_uninvited(request, response)
    return response


def _api_error(request: web.Request, exc: Exception) -> ApiError:
    match exc:
        case ApiError():
            return exc
        case web.HTTPException() if exc.status >= 400:
            return ApiError(exc.status, exc.reason, f"{request.method} {request.path}: {exc.reason}",
                            fields=status_fields(exc))
        case web.HTTPException():
            raise exc
    log_failure(request, exc, log)  # a client gone: one INFO line; else ours, with the traceback
    return ApiError(500, "Internal Server Error", "the front end failed", kind="server_error")


def public_app(fe: Frontend) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=fe.settings.body_limit_octets)
    app[FRONTEND] = fe
    app.router.add_post("/v1/completions", completions, expect_handler=defer_continue)  # key first, then 100
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


def _public_ssl(settings: FrontendSettings) -> ssl.SSLContext | None:
    if settings.public_tls is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(settings.public_tls.cert, settings.public_tls.key)
    return ctx


def setup(app: web.Application, config: RoleConfig) -> None:
    settings = FrontendSettings.from_config(config)
    if config.tls is None:
        raise ApiError(500, "Configuration", "the front end needs [tls]: it calls the PC and instances over mTLS")
    tls = config.tls
    tokenizer = load_tokenizer(settings.tokenizer)
    metrics = FrontendMetrics.register(metrics_of(app))
    refusals = metrics_of(app).counter("kvsp_frontend_refused_total", "Completions refused with 429 by a full cap",
                                       ("limit",))
    public_limits = replace(config.server.limits, max_connections_per_client=settings.max_connections_per_client)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        http = KvspSession(client_context(tls), ClientOptions(request_timeout_s=30.0, max_connections=1024,
                                                              max_connections_per_host=512))
        fe = Frontend(settings, tokenizer, http, metrics, refusals)
        app[FRONTEND] = fe
        runner = web.AppRunner(public_app(fe), access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        try:
            await GuardedSite(runner, settings.host, settings.port, limits=public_limits, metrics=metrics_of(app),
                              name="public", ssl_context=_public_ssl(settings)).start()
            log.info("completions API at %s://%s:%d/v1/completions", "https" if settings.public_tls else "http",
                     settings.host, settings.port)
            yield
        finally:
            await runner.cleanup()
            with contextlib.suppress(Exception):
                await http.close()

    app.cleanup_ctx.append(lifecycle)
    app[HEALTH]["frontend"] = lambda app: {"in_flight": app[FRONTEND].in_flight if FRONTEND in app else 0}
