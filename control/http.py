"""The one place where HTTP meets the KVSP core: identity, media types, limits, Problem Details.

Handlers raise `ProblemError` / `ValidationError`; the middleware here turns every error into a
Problem Details response (RFC 9457) and every non-block response gets ``Cache-Control: no-store``.

``Expect: 100-continue`` (RFC 9110 section 10.1.1): aiohttp's default answers ``100 Continue`` before
any middleware or handler has run, so a client that may not store uploads its whole body only to be
refused.  Routes that take large bodies use `defer_continue`; the body readers here send the ``100``
when the handler starts reading, that is after it has authorized the request and checked its
preconditions, and a request refused before that is answered with ``Connection: close``.

Logs (kvsp/service/logs.py): a malformed request (`BAD_INPUT_STATUSES`) and a client that goes away
are a peer's fault, one rate-limited INFO line each; aiohttp's own records of such requests are
rewritten the same way (`PeerFaultsOfAiohttp`); any other error is ours, ERROR with the traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, TypeVar

from aiohttp import HttpVersion11, hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

from kvsp.encoding import canonical_json, parse_json
from kvsp.errors import KvspError
from kvsp.problems import PROBLEM_MEDIA_TYPE, Problem, ProblemError, ProblemType
from kvsp.service.logs import PEER_KEY, one_line, peer_fault
from kvsp.service.tls import identities_of

log = logging.getLogger("kvsp.http")

JSON_MEDIA_TYPE = "application/kvsp+json"
BLOCK_MEDIA_TYPE = "application/kvsp-block"
ACCEPTED_JSON_TYPES = frozenset({JSON_MEDIA_TYPE, "application/json"})
# Answers that say the request itself was malformed: logged as a peer's fault (one INFO line).  The
# protocol's ordinary refusals (403, 404, 409, 412, 429, ...) are not logged: the metrics count them.
BAD_INPUT_STATUSES = frozenset({400, 411, 413, 414, 415, 417, 431})
IDENTITY_KEY: web.RequestKey[str] = web.RequestKey("kvsp.identity", str)
# Tests that say so explicitly may run without TLS; the identity then comes from this header.
INSECURE_IDENTITY_HEADER = "X-Kvsp-Test-Identity"
ALLOW_INSECURE: web.AppKey[bool] = web.AppKey("kvsp.allow_insecure", bool)
# Set by `defer_continue` until the body is invited: the client waits for our 100 before sending it.
CONTINUE_DEFERRED: web.RequestKey[bool] = web.RequestKey("kvsp.continue_deferred", bool)
CONTINUE: bytes = b"HTTP/1.1 100 Continue\r\n\r\n"
# Fields of an aiohttp HTTPException that describe its text body, not the status: the Problem
# Details body replaces them.  Every other field (Allow on 405, Retry-After ...) is kept.
_BODY_FIELDS = frozenset(h.lower() for h in (hdrs.CONTENT_TYPE, hdrs.CONTENT_LENGTH, hdrs.CONTENT_ENCODING,
                                             hdrs.CONTENT_LANGUAGE, hdrs.TRANSFER_ENCODING))

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class JsonRecord(Protocol):
    def to_bytes(self) -> bytes: ...


R = TypeVar("R")


def problem_response(problem: Problem, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(status=problem.status, body=problem.to_bytes(), content_type=PROBLEM_MEDIA_TYPE,
                        headers={**(headers or {}), "Cache-Control": "no-store"})


def status_fields(exc: web.HTTPException) -> dict[str, str]:
    """The fields of an aiohttp HTTP error that belong to its status (``Allow``, a MUST on 405 by RFC
    9110 section 15.5.6), for the answer that replaces its body."""
    return {name: value for name, value in exc.headers.items() if name.lower() not in _BODY_FIELDS}


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


async def defer_continue(request: web.Request) -> web.StreamResponse | None:
    """An ``expect_handler`` for routes: no ``100 Continue`` yet; `invite_body` sends it (module docstring)."""
    if request.version != HttpVersion11:
        return None  # HTTP/1.0 has no interim responses: the client sends its body anyway
    expect = request.headers.get(hdrs.EXPECT, "")
    if expect.lower() != "100-continue":
        return problem_response(Problem.generic(417, "Expectation Failed", f"unknown expectation {expect[:64]!r}"))
    request[CONTINUE_DEFERRED] = True
    return None


async def invite_body(request: web.Request) -> None:
    """Send the ``100 Continue`` that `defer_continue` held back, once: the handler now wants the body."""
    if request.get(CONTINUE_DEFERRED, False):
        request[CONTINUE_DEFERRED] = False
        await request.writer.write(CONTINUE)
        request.writer.output_size = 0  # the interim response is not the answer: the answer is still to come


def close_if_uninvited(request: web.Request, response: web.StreamResponse) -> None:
    """A final answer to a request whose body was never invited says that the connection closes, so
    the client does not send the body after all (RFC 9110 section 10.1.1)."""
    if request.get(CONTINUE_DEFERRED, False) and not response.prepared:
        response.force_close()


async def read_limited(request: web.Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` octets before reading (or inviting) them."""
    if request.content_length is not None and request.content_length > limit:
        raise ProblemError(Problem.generic(413, "Content Too Large", f"body limit is {limit} octets"))
    await invite_body(request)
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
    response = await _answer(request, handler)
    close_if_uninvited(request, response)
    return response


async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    who = _peer_identity(request)
    if who is None:
        # The TLS handshake verified the certificate against the deployment CA; it names no role.  A 401
        # needs a WWW-Authenticate challenge (RFC 9110 section 15.5.2), and mutual TLS has none to offer.
        return problem_response(Problem.generic(403, "Forbidden",
                                                "the client certificate has no URI SubjectAltName (role identity)"))
    request[IDENTITY_KEY] = who
    try:
        return await handler(request)
    except Exception as exc:
        if request.writer.output_size > 0:
            # The status line is out: a second answer would be written into the body.  Re-raised,
            # aiohttp logs it (a client gone: one INFO line) and closes the connection, which tells the
            # client the body is cut.
            raise
        return _problem_of(request, exc)


def _problem_of(request: web.Request, exc: Exception) -> web.StreamResponse:
    match exc:
        case ProblemError():
            response = problem_response(exc.problem)
        case KvspError():  # ValidationError and the other input errors of the core
            response = problem_response(Problem.generic(400, "Bad Request", str(exc)))
        case web.HTTPException() if exc.status >= 400:
            response = problem_response(Problem.generic(exc.status, exc.reason), status_fields(exc))
        case web.HTTPException():
            raise exc
        case _:
            log_failure(request, exc, log)
            return problem_response(Problem.generic(500, "Internal Server Error"))
    if response.status in BAD_INPUT_STATUSES:
        peer_fault(log, f"http.{response.status}", "%s %s from %s: %d %s", request.method, one_line(request.path),
                   request.get(IDENTITY_KEY, "?"), response.status, one_line(exc))
    return response


# -- logs (kvsp/service/logs.py) ----------------------------------------------------------------------
def client_gone(request: web.Request, exc: BaseException) -> bool:
    """Whether ``exc`` is this request's client going away (a reset, a closed socket), as opposed to a
    connection of ours to another role failing, which is our side's trouble."""
    if not isinstance(exc, ConnectionError):
        return False
    transport = request.transport
    return transport is None or transport.is_closing()


def log_failure(request: web.Request, exc: BaseException, logger: logging.Logger) -> None:
    """Log an error that no typed answer covers: one INFO line when the client went away, else ours:
    ERROR with the traceback."""
    if client_gone(request, exc):
        peer_fault(logger, "http.client-gone", "client went away during %s %s (%s)", request.method,
                   one_line(request.path), type(exc).__name__)
    else:
        logger.error("unhandled error in %s %s", request.method, request.path, exc_info=exc)


class PeerFaultsOfAiohttp(logging.Filter):
    """On aiohttp's server logger: a request that is not HTTP, or a client gone while aiohttp wrote the
    answer, becomes one INFO line of a peer's fault instead of an ERROR with a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info and record.levelno > logging.INFO else None
        if isinstance(exc, HttpProcessingError) and exc.code < 500:
            key = "http.malformed"
        elif isinstance(exc, ConnectionError):
            key = "http.client-gone"
        else:
            return True
        record.msg = f"{record.getMessage()}: {type(exc).__name__}: {one_line(exc)}"
        record.args, record.exc_info, record.exc_text = None, None, None
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        setattr(record, PEER_KEY, key)
        return True


def _install_aiohttp_filter() -> None:
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, PeerFaultsOfAiohttp) for f in server_log.filters):
        server_log.addFilter(PeerFaultsOfAiohttp())


async def _no_store(request: web.Request, response: web.StreamResponse) -> None:
    # Spec section 5: every response other than block data carries no-store.
    if response.content_type != BLOCK_MEDIA_TYPE:
        response.headers["Cache-Control"] = "no-store"


def make_app(*, json_limit: int, allow_insecure: bool = False) -> web.Application:
    _install_aiohttp_filter()  # process-wide, once: every role's listener is made here
    app = web.Application(middlewares=[kvsp_middleware], client_max_size=json_limit)
    app[ALLOW_INSECURE] = allow_insecure
    app.on_response_prepare.append(_no_store)
    return app


def not_found(what: str) -> ProblemError:
    return ProblemError.of(ProblemType.NOT_FOUND, what)
