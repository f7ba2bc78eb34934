"""The one place where HTTP meets the KVSP core: identity, media types, limits, Problem Details.

Handlers raise `ProblemError` / `ValidationError`; the middleware here turns every error into a
Problem Details response (RFC 9457) and every non-block response gets ``Cache-Control: no-store``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from aiohttp import web

from control.tls import identities_of
from kvsp.encoding import canonical_json, parse_json
from kvsp.errors import KvspError, ValidationError
from kvsp.problems import PROBLEM_MEDIA_TYPE, Problem, ProblemError, ProblemType

log = logging.getLogger("kvsp.http")

JSON_MEDIA_TYPE = "application/kvsp+json"
BLOCK_MEDIA_TYPE = "application/kvsp-block"
ACCEPTED_JSON_TYPES = frozenset({JSON_MEDIA_TYPE, "application/json"})
IDENTITY_KEY: web.RequestKey[str] = web.RequestKey("kvsp.identity", str)
# Tests that say so explicitly may run without TLS; the identity then comes from this header.
INSECURE_IDENTITY_HEADER = "X-Kvsp-Test-Identity"
ALLOW_INSECURE: web.AppKey[bool] = web.AppKey("kvsp.allow_insecure", bool)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class JsonRecord(Protocol):
    def to_bytes(self) -> bytes: ...


R = TypeVar("R")


def problem_response(problem: Problem) -> web.Response:
    return web.Response(status=problem.status, body=problem.to_bytes(), content_type=PROBLEM_MEDIA_TYPE,
                        headers={"Cache-Control": "no-store"})


def json_response(body: JsonRecord | dict[str, object], status: int = 200,
                  headers: dict[str, str] | None = None) -> web.Response:
    data = canonical_json(body) if isinstance(body, dict) else body.to_bytes()
    return web.Response(status=status, body=data, content_type=JSON_MEDIA_TYPE, headers=headers)


def identity(request: web.Request) -> str:
    """The authenticated client identity (URI SAN of its certificate)."""
    value = request.get(IDENTITY_KEY)
    if not isinstance(value, str):  # pragma: no cover - the middleware always sets it
        raise ProblemError(Problem.generic(401, "Unauthenticated"))
    return value


async def read_limited(request: web.Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` octets before reading them."""
    if request.content_length is not None and request.content_length > limit:
        raise ProblemError(Problem.generic(413, "Content Too Large", f"body limit is {limit} octets"))
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.content.iter_any():
        total += len(chunk)
        if total > limit:
            raise ProblemError(Problem.generic(413, "Content Too Large", f"body limit is {limit} octets"))
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: web.Request, parse: Callable[[object], R], limit: int) -> R:
    """Read, size-check and parse a JSON body into a record type with ``parse``."""
    if request.content_type not in ACCEPTED_JSON_TYPES:
        raise ProblemError(Problem.generic(415, "Unsupported Media Type", f"use {JSON_MEDIA_TYPE}"))
    return parse(parse_json(await read_limited(request, limit)))


def _peer_identity(request: web.Request) -> str | None:
    transport = request.transport
    peercert = transport.get_extra_info("peercert") if transport is not None else None
    ids = identities_of(peercert)
    if ids:
        return ids[0]
    if request.app.get(ALLOW_INSECURE, False) and transport is not None \
            and transport.get_extra_info("sslcontext") is None:
        return request.headers.get(INSECURE_IDENTITY_HEADER)
    return None


@web.middleware
async def kvsp_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    who = _peer_identity(request)
    if who is None:
        return problem_response(Problem.generic(401, "Unauthenticated",
                                                "a client certificate with a URI SubjectAltName is required"))
    request[IDENTITY_KEY] = who
    try:
        return await handler(request)
    except ProblemError as exc:
        return problem_response(exc.problem)
    except ValidationError as exc:
        return problem_response(Problem.generic(400, "Bad Request", str(exc)))
    except KvspError as exc:
        return problem_response(Problem.generic(400, "Bad Request", str(exc)))
    except web.HTTPException as exc:
        if exc.status >= 400:
            return problem_response(Problem.generic(exc.status, exc.reason))
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return problem_response(Problem.generic(500, "Internal Server Error"))


async def _no_store(request: web.Request, response: web.StreamResponse) -> None:
    # Spec section 5: every response other than block data carries no-store.
    if response.content_type != BLOCK_MEDIA_TYPE:
        response.headers["Cache-Control"] = "no-store"


def make_app(*, json_limit: int, allow_insecure: bool = False) -> web.Application:
    app = web.Application(middlewares=[kvsp_middleware], client_max_size=json_limit)
    app[ALLOW_INSECURE] = allow_insecure
    app.on_response_prepare.append(_no_store)
    return app


def not_found(what: str) -> ProblemError:
    return ProblemError.of(ProblemType.NOT_FOUND, what)
