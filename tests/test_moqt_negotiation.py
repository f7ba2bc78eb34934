"""Draft negotiation over loopback QUIC (docs/moqt-drafts.md): one port serves every draft we speak, the
client offers newest first, the agreed ALPN picks the session's profile on both ends.

Real MOQT sessions on both sides: the setup exchange itself proves both ends speak the chosen draft
(draft-14's CLIENT_SETUP carries versions, later drafts' do not; a mismatch would close the session).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kvsp.pki import RoleSpec, make_dev_pki
from moqt.events import MoqtEvent, SessionEstablished
from moqt.profiles import DRAFT_14, PROFILES
from moqt.profiles.negotiation import alpns, profile_for_alpn, profiles_for
from moqt.quic import ConnectionClosedError, EndpointConfig, MoqtConnection, MoqtServer, QuicSettings, connect, serve
from moqt.session import MoqtSession

pytestmark = pytest.mark.loopback

SERVER_URI = "moqt://127.0.0.1:4433/relay"
T = 20.0
DRAFTS = [p.draft for p in PROFILES]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("pki")
    make_dev_pki(base, [RoleSpec("server", SERVER_URI), RoleSpec("client", "https://client.test/")])
    return base


def config(pki: Path, name: str, drafts: tuple[int, ...] | None = None) -> EndpointConfig:
    return EndpointConfig.from_files(pki / f"{name}.pem", pki / f"{name}.key", pki / "ca.pem",
                                     QuicSettings(drafts=drafts, idle_timeout_s=10.0))


async def _server(pki: Path, drafts: tuple[int, ...] | None = None) -> MoqtServer[object]:
    return await serve("127.0.0.1", 0, config(pki, "server", drafts), lambda c: MoqtSession(c.quic, path="/relay"))


@pytest.fixture
async def server(pki: Path) -> AsyncIterator[MoqtServer[object]]:
    s = await _server(pki)
    yield s
    s.close()
    await asyncio.wait_for(s.wait_closed(), T)


async def _session(pki: Path, server: MoqtServer[object], drafts: tuple[int, ...] | None
                   ) -> tuple[MoqtConnection[MoqtEvent], SessionEstablished]:
    conn = await connect(f"moqt://127.0.0.1:{server.port}/relay", config(pki, "client", drafts),
                         lambda c: MoqtSession(c.quic, path="/relay"))
    event = await asyncio.wait_for(conn.next_event(), T)
    assert isinstance(event, SessionEstablished), event
    return conn, event


def _accepted(server: MoqtServer[object]) -> MoqtConnection[object]:
    (accepted,) = server.connections
    return accepted


async def test_a_client_offering_every_draft_gets_the_newest(pki: Path, server: MoqtServer[object]) -> None:
    conn, established = await _session(pki, server, None)
    async with conn:
        newest = PROFILES[0]
        assert conn.profile is newest and _accepted(server).profile is newest
        session = conn.session
        assert isinstance(session, MoqtSession) and session.profile is newest
        assert established.version == newest.version
        peer = _accepted(server).session
        assert isinstance(peer, MoqtSession) and peer.profile is newest


@pytest.mark.parametrize("draft", DRAFTS)
async def test_a_client_pinned_to_one_draft_speaks_it_on_the_shared_port(pki: Path, server: MoqtServer[object],
                                                                         draft: int) -> None:
    conn, established = await _session(pki, server, (draft,))
    async with conn:
        assert conn.profile.draft == draft == _accepted(server).profile.draft
        assert conn.quic.tls.alpn_negotiated == profiles_for((draft,))[0].alpn
        assert established.version == conn.profile.version


@pytest.mark.parametrize("draft", DRAFTS)
async def test_a_server_pinned_to_one_draft_is_met_there_by_a_client_offering_all(pki: Path, draft: int) -> None:
    server = await _server(pki, (draft,))
    try:
        conn, _ = await _session(pki, server, None)
        async with conn:
            assert conn.profile.draft == draft == _accepted(server).profile.draft
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), T)


async def test_no_draft_in_common_fails_the_handshake_with_a_clear_error(pki: Path) -> None:
    """The server's TLS refuses the ClientHello (no_application_protocol), so the client's connect fails."""
    if len(DRAFTS) < 2:
        pytest.skip("needs two drafts")
    server = await _server(pki, (DRAFTS[0],))
    try:
        with pytest.raises((ConnectionClosedError, ConnectionError, TimeoutError)) as caught:
            conn = await asyncio.wait_for(connect(f"moqt://127.0.0.1:{server.port}/relay",
                                                  config(pki, "client", (DRAFTS[-1],)),
                                                  lambda c: MoqtSession(c.quic, path="/relay")), T)
            await conn.__aexit__(None, None, None)
        assert not isinstance(caught.value, TimeoutError), "refused at once, not timed out"
        assert all(c.session is None for c in server.connections)  # no session on a refused connection
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), T)


def test_drafts_setting_is_checked_and_ordered_newest_first() -> None:
    assert QuicSettings(drafts=tuple(reversed(DRAFTS))).drafts == tuple(DRAFTS)
    assert QuicSettings().profiles == PROFILES
    with pytest.raises(ValueError, match=r"draft.*99.*not spoken"):
        QuicSettings(drafts=(99,))
    with pytest.raises(ValueError, match="at least one"):
        QuicSettings(drafts=())


def test_alpn_lookup() -> None:
    assert alpns(PROFILES) == [p.alpn for p in PROFILES]
    assert profile_for_alpn("moq-00") is DRAFT_14
    assert profile_for_alpn("h3") is None and profile_for_alpn(None) is None
    assert profile_for_alpn(DRAFT_14.alpn, profiles_for((DRAFTS[0],))) is (None if DRAFTS[0] != 14 else DRAFT_14)


async def test_the_server_counts_sessions_by_draft(pki: Path, server: MoqtServer[object]) -> None:
    assert server.drafts == tuple(DRAFTS) and server.sessions_by_draft == {}
    for draft in DRAFTS:
        conn, _ = await _session(pki, server, (draft,))
        await conn.__aexit__(None, None, None)
    assert server.sessions_by_draft == {d: 1 for d in DRAFTS}
