"""The front end's public listener: bodies are read by the JSON reader of every role (deep nesting and
lone surrogates are 400, not 500), a 405 names the allowed methods, a 401 carries its challenge, and
``Expect: 100-continue`` is answered only after the API key is checked (RFC 9110 sections 10.1.1,
15.5.2, 15.5.6)."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import pytest

from control.frontend.openai import ApiError, Limits, parse_completion
from control.frontend.tokenizer import ByteTokenizer
from tests.test_frontend_http import API_KEY, REFERENCE, Setup, complete, setup  # noqa: F401 - setup: fixture

LIMITS = Limits("kvsp-test", 256, 64)
JSON = {"Content-Type": "application/json"}
DEEP = 100_000  # about 300 KB of nesting in the unit tests; the HTTP fixture's body limit is 4096


def _lone_surrogate_bodies() -> list[bytes]:
    return [b'{"model": "kvsp-test", "prompt": "\\ud800"}',  # a JSON escape of a lone surrogate
            b'{"model": "kvsp-test", "prompt": "a\\udfffb"}',
            b'{"model": "kvsp-test", "prompt": ["\\udbff"]}',  # the one-prompt batch form
            b'{"model": "kvsp-test", "prompt": "x"}'.replace(b'"x"', b'"\xed\xa0\x80"')]  # UTF-8 of U+D800


@pytest.mark.parametrize("body", _lone_surrogate_bodies(), ids=["escape", "escape-in-text", "batch", "utf-8"])
def test_a_prompt_with_a_lone_surrogate_is_400_naming_the_prompt(body: bytes) -> None:
    with pytest.raises(ApiError) as info:
        parse_completion(body, LIMITS, ByteTokenizer())
    assert info.value.status == 400 and info.value.param == "prompt"


@pytest.mark.parametrize("body", [b"[" * DEEP + b"]" * DEEP, b'{"a":' * DEEP + b"1" + b"}" * DEEP,
                                  b'{"model": "kvsp-test", "prompt": ' + b"[" * DEEP + b"]" * DEEP + b"}"],
                         ids=["arrays", "objects", "prompt"])
def test_nesting_too_deep_to_parse_is_400(body: bytes) -> None:
    with pytest.raises(ApiError) as info:
        parse_completion(body, LIMITS, ByteTokenizer())
    assert info.value.status == 400 and "JSON" in info.value.detail


async def _post(s: Setup, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    async with s.http.post(s.url + "/v1/completions", data=body, headers=JSON | (headers or {})) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def test_bad_bodies_are_400_problem_details_and_never_reach_the_pc(setup: Setup) -> None:  # noqa: F811
    for body in [*_lone_surrogate_bodies(), b"[" * 2000 + b"]" * 2000]:  # valid JSON, too deep to parse
        status, headers, raw = await _post(setup, body)
        assert status == 400, (body[:40], status, raw[:200])
        assert headers["Content-Type"] == "application/problem+json"
        assert json.loads(raw)["error"]["type"] == "invalid_request_error"
    assert setup.double.requests == []
    ok, raw = await complete(setup, {"model": "kvsp-test", "prompt": "x", "max_tokens": 10, "temperature": 0})
    assert ok == 200 and json.loads(raw)["kvsp"]["tokens"] == REFERENCE


async def test_a_405_names_the_allowed_methods(setup: Setup) -> None:  # noqa: F811
    for method, path, allowed in (("GET", "/v1/completions", {"POST"}), ("PUT", "/v1/models", {"GET", "HEAD"}),
                                  ("DELETE", "/health", {"GET", "HEAD"})):
        async with setup.http.request(method, setup.url + path) as resp:
            assert resp.status == 405 and resp.content_type == "application/problem+json"
            assert {m.strip() for m in resp.headers["Allow"].split(",")} == allowed, path


async def test_a_401_carries_a_bearer_challenge(setup: Setup) -> None:  # noqa: F811
    status, headers, _ = await _post(setup, json.dumps({"model": "kvsp-test", "prompt": "x"}).encode(),
                                     {"Authorization": "Bearer sk-wrong"})
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer ")
    assert "sk-wrong" not in headers["WWW-Authenticate"]


async def _expect_post(s: Setup, body: bytes, key: str) -> tuple[int, str, int | None]:
    """POST with Expect: 100-continue over a raw socket: the first status, its fields, and the final
    status when the first was 100 (the body is sent only then)."""
    url = urlsplit(s.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nAuthorization: Bearer {key}\r\nExpect: 100-continue\r\n\r\n"
                     .encode())
        await writer.drain()
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode("latin-1")
        first = int(head.split()[1])
        if first != 100:
            return first, head.lower(), None
        writer.write(body)
        await writer.drain()
        final = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode("latin-1")
        return first, head.lower(), int(final.split()[1])
    finally:
        writer.close()


async def test_the_body_is_invited_only_after_the_api_key_is_checked(setup: Setup) -> None:  # noqa: F811
    body = json.dumps({"model": "kvsp-test", "prompt": "x", "max_tokens": 10, "temperature": 0}).encode()
    first, head, _ = await _expect_post(setup, body, "sk-wrong")
    assert first == 401 and "connection: close" in head and "www-authenticate: bearer" in head
    first, _, final = await _expect_post(setup, body, API_KEY)
    assert (first, final) == (100, 200)
