"""What a served role logs when its clients misbehave, and when it fails itself (control/http.py).

A real holder (HTTPS and MOQT, in this process) gets the bad requests of benchmarks/bench_log_noise.py
from raw TLS clients: each is at most one INFO line, without a traceback, tagged as a peer's fault for
the rate limit; a failure of ours is still an ERROR with its traceback, and so is a connection of ours
that fails while the client is still there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web

from benchmarks.bench_log_noise import Probe
from control.serve import build_app
from kvsp.service.config import RoleConfig
from kvsp.service.logs import PEER_KEY
from tests.support.servers import running

pytestmark = pytest.mark.loopback
T = 20.0  # bound on any one wait


async def _boom(request: web.Request) -> web.Response:
    raise RuntimeError("a bug of ours")


async def _upstream_reset(request: web.Request) -> web.Response:
    raise ConnectionResetError("a role we called reset the connection")  # our client is still connected


@pytest.fixture
async def probe(tmp_path: Path) -> AsyncIterator[Probe]:
    probe = Probe(tmp_path)
    config = RoleConfig.load(probe.write_config())
    app = build_app(config)
    app.router.add_get(config.server.base_path + "boom", _boom)
    app.router.add_get(config.server.base_path + "upstream", _upstream_reset)
    async with running(config, app=app):
        await probe.store_block()
        yield probe


def peer_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if hasattr(r, PEER_KEY)]


async def until(check: Callable[[], bool]) -> None:
    """The server logs after the client has gone: wait for it, boundedly."""
    for _ in range(int(T / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the expected records never came")


async def test_bad_input_and_disconnects_are_one_info_line_each(probe: Probe, caplog: pytest.LogCaptureFixture
                                                                ) -> None:
    caplog.set_level(logging.INFO)
    sends = (probe.bad_json, probe.bad_type, probe.bad_key, probe.oversize, probe.unknown_route, probe.cut_body,
             probe.cut_response, probe.bad_http, probe.no_cert, probe.plain_tcp)
    for i, send in enumerate(sends):
        await send(i)
    expected = {"http.400", "http.415", "http.413", "http.client-gone", "http.malformed"}
    await until(lambda: expected <= {getattr(r, PEER_KEY) for r in peer_records(caplog)})
    await asyncio.sleep(0.2)  # anything else the server had to say
    peers = peer_records(caplog)
    assert all(r.levelno == logging.INFO and r.exc_info is None and r.exc_text is None for r in peers)
    assert all("\n" not in r.getMessage() for r in peers)
    assert len([r for r in peers if getattr(r, PEER_KEY) == "http.400"]) == 2  # bad JSON, bad key
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    (gone,) = [r for r in peers if getattr(r, PEER_KEY) == "http.client-gone"]
    assert gone.name == "kvsp.http" and gone.getMessage().startswith("client went away during PUT ")
    (malformed,) = [r for r in peers if getattr(r, PEER_KEY) == "http.malformed"]
    assert malformed.name == "aiohttp.server" and "BadHttpMessage" in malformed.getMessage()
    (bad_json,) = [r for r in peers if "malformed JSON" in r.getMessage()]
    assert f"from {probe.pki.uri('client')}: 400" in bad_json.getMessage()  # who sent it


async def test_our_own_faults_are_errors_with_their_traceback(probe: Probe, caplog: pytest.LogCaptureFixture
                                                              ) -> None:
    caplog.set_level(logging.INFO)
    for route in ("boom", "upstream"):
        status, _ = await probe.request(f"GET {probe.path(route)} HTTP/1.1", {})
        assert status == 500
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [type(r.exc_info[1]) for r in errors if r.exc_info] == [RuntimeError, ConnectionResetError]
    assert [r.getMessage() for r in errors] == [f"unhandled error in GET {probe.path('boom')}",
                                                f"unhandled error in GET {probe.path('upstream')}"]
    assert not peer_records(caplog)
