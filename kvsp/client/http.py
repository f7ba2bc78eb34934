"""A mutual-TLS HTTPS session shared by every KVSP client (connection reuse, bounded concurrency).

Errors are mapped once here: a Problem Details answer becomes `ProblemError`; transport failures
become `TransportError` (also an `OSError`, so callers may treat them like any I/O failure).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import TypeVar

import aiohttp

from kvsp.encoding import canonical_json, parse_json
from kvsp.errors import KvspError, ValidationError
from kvsp.problems import Problem, ProblemError

JSON_MEDIA_TYPE = "application/kvsp+json"
DEFAULT_MAX_RESPONSE = 64 << 20

T = TypeVar("T")


class TransportError(KvspError, OSError):
    """The peer could not be reached, or the exchange broke off."""


@dataclass(frozen=True, slots=True)
class ClientOptions:
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 30.0
    max_connections: int = 64
    max_connections_per_host: int = 16
    max_json_response: int = DEFAULT_MAX_RESPONSE


class KvspSession:
    """One aiohttp ClientSession with the role's certificate, reused for every request."""

    def __init__(self, ssl_context: ssl.SSLContext | None, options: ClientOptions | None = None,
                 *, headers: dict[str, str] | None = None) -> None:
        self.options = options or ClientOptions()
        # ssl_context None is only for tests that say so explicitly (plain HTTP on loopback).
        connector = aiohttp.TCPConnector(ssl=ssl_context if ssl_context is not None else False,
                                         limit=self.options.max_connections,
                                         limit_per_host=self.options.max_connections_per_host)
        timeout = aiohttp.ClientTimeout(total=self.options.request_timeout_s,
                                        sock_connect=self.options.connect_timeout_s)
        self.http = aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers,
                                          auto_decompress=False)

    async def close(self) -> None:
        await self.http.close()

    async def __aenter__(self) -> KvspSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request_json(self, method: str, url: str, body: object | None = None,
                           *, ok: tuple[int, ...] = (200, 201, 202, 204),
                           timeout_s: float | None = None) -> tuple[int, object | None]:
        """Send a JSON body (a record with ``to_bytes`` or a dict) and return (status, parsed JSON).

        ``timeout_s`` bounds the whole exchange, TLS handshake included (default: the session's).
        """
        data: bytes | None
        if body is None:
            data = None
        elif isinstance(body, dict):
            data = canonical_json(body)
        else:
            data = body.to_bytes()  # type: ignore[attr-defined]
        headers = {"Content-Type": JSON_MEDIA_TYPE} if data is not None else {}
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s is not None else None
            async with self.http.request(method, url, data=data, headers=headers, timeout=timeout) as resp:
                raw = await read_capped(resp, self.options.max_json_response)
                status = resp.status
                ctype = resp.content_type
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransportError(f"{method} {url}: {exc!r}") from exc
        if status not in ok:
            raise problem_from(status, ctype, raw)
        return status, (parse_json(raw) if raw else None)


async def read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    if resp.content_length is not None and resp.content_length > limit:
        raise TransportError(f"response of {resp.content_length} octets exceeds the limit of {limit}")
    chunks: list[bytes] = []
    total = 0
    async for chunk in resp.content.iter_any():
        total += len(chunk)
        if total > limit:
            raise TransportError(f"response exceeds the limit of {limit} octets")
        chunks.append(chunk)
    return b"".join(chunks)


def problem_from(status: int, content_type: str, body: bytes) -> ProblemError:
    """A `ProblemError` for a non-success answer; statuses we do not know are handled by class."""
    if content_type == "application/problem+json":
        try:
            return ProblemError(Problem.from_bytes(body))
        except ValidationError:
            pass
    return ProblemError(Problem.generic(status, f"HTTP {status}", body[:200].decode("utf-8", "replace")))
