"""Integers in the instance's queries (``from``, ``tokens``, ``version``) are ASCII decimals or 400
Problem Details, and the token stream checks its request before it sends the first byte of its
answer.  Real instances on loopback with mutual TLS (`tests.support.instance.world`)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from control.deploy.pki import DevPki
from kvsp.engine import top_p_sampler
from kvsp.problems import PROBLEM_MEDIA_TYPE
from tests.support.instance import NAMES, World, start_body, tokens_of, world
from tests.test_http_hygiene_roles import BAD_INTEGERS

MAP = "m7"
BLOCK = {"Content-Type": "application/kvsp-block"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return DevPki.make(tmp_path_factory.mktemp("pki"), NAMES)


async def _ask(http: aiohttp.ClientSession, method: str, url: str, body: bytes | None = None,
               headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    """The status, media type and whole body (reading to the end: a cut stream raises here)."""
    async with http.request(method, URL(url, encoded=True), data=body, headers=headers) as resp:
        return resp.status, resp.content_type, await resp.read()


def _is_problem(status: int, media: str, body: bytes, member: str) -> None:
    assert status == 400 and media == PROBLEM_MEDIA_TYPE, (status, media, body[:200])
    doc = json.loads(body)
    assert doc["status"] == 400 and member in doc["detail"]


async def test_a_bad_from_on_a_live_session_is_400_before_the_stream_starts(pki: DevPki, tmp_path: Path) -> None:
    async with world(pki, tmp_path) as w:
        w.pc.release.clear()  # acks held: the session stays live and releases nothing yet
        s = str(uuid.uuid4())
        sampler = top_p_sampler(0.9, 7)
        assert (await w.call("pc", "POST", w.url("ii1", f"sessions/{s}/start"), start_body(s, sampler, max_tokens=4))
                )[0] == 202
        await w.wait_for(lambda: w.pc.checkpoints, "a checkpoint")
        for text in [*BAD_INTEGERS, "9007199254740992"]:  # and one past the largest token index
            status, media, body = await _ask(w.http["fe"], "GET", w.url("ii1", f"sessions/{s}/tokens?from={text}"))
            _is_problem(status, media, body, "from")
        assert not w.role("ii1").instance.run_of(s).log.closed
        assert w.role("ii1").instance.run_of(s).log.readers == 0
        w.pc.release.set()
        lines = await asyncio.wait_for(w.stream("ii1", s, 0), 20)
        assert len(tokens_of(lines)) == 4


async def _peer(w: World, name: str = "ii1") -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=w.pki.client_ssl(name)))


async def test_shard_ranges_and_versions_are_ascii_decimals_or_400(pki: DevPki, tmp_path: Path) -> None:
    async with world(pki, tmp_path) as w:
        layout = w.role("ii2").shards.layout
        w.role("ii2").shards.put(MAP, 4, (0, 8), bytes(8 * layout.bytes_per_token))
        async with await _peer(w) as peer:
            base = w.url("ii2", f"shards/{MAP}")
            for text in BAD_INTEGERS:
                cases = [(f"?tokens={text}-3", "tokens"), (f"?tokens=1-{text}", "tokens"),
                         (f"?tokens=0-4&version={text}", "version")]
                for query, member in cases:
                    _is_problem(*await _ask(peer, "GET", base + query), member)
                    _is_problem(*await _ask(peer, "PUT", base + query, b"", BLOCK), member)
            assert (await _ask(peer, "GET", base + "?tokens=0-4&version=4"))[0] == 200
            assert (await _ask(peer, "GET", base + "?tokens=00-04&version=0004"))[0] == 200
