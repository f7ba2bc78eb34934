"""A MOQT peer's fault is one INFO line: CLIENT_SETUP with the control stream's FIN in the same frame,
sent to the holder's real MOQT server (moqt.api.Publisher), closes the session for the protocol
violation before the server's answer to the setup; that answer's LocalError is the peer's doing, not a
bug of ours with a traceback (moqt/quic/connection.py)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from benchmarks.bench_log_noise import Probe
from kvsp.service.config import RoleConfig
from kvsp.service.logs import PEER_KEY
from moqt.kinds import SessionError
from moqt.profiles import DRAFT_14
from tests.support.servers import running

pytestmark = pytest.mark.loopback


@pytest.fixture
async def probe(tmp_path: Path) -> AsyncIterator[Probe]:
    probe = Probe(tmp_path)
    async with running(RoleConfig.load(probe.write_config())):
        yield probe


async def test_client_setup_with_fin_is_one_info_line(probe: Probe, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    for i in range(3):
        conn = await probe.moqt_setup_fin(i)
        assert conn.close_event is not None
        assert conn.close_event.error_code == DRAFT_14.session_errors.code(SessionError.PROTOCOL_VIOLATION)
    moqt = [r for r in caplog.records if r.name.startswith("moqt")]
    assert len(moqt) == 3, caplog.text
    for r in moqt:
        assert r.levelno == logging.INFO and r.exc_info is None and getattr(r, PEER_KEY) == "moqt.closed-early"
        assert "the session closed before its events were answered" in r.getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
