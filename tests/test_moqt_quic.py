"""The QUIC adapter (moqt/quic/) over loopback UDP with a dev PKI made at test time.

Sessions here are tiny stand-ins for the MOQT session: objects with ``handle_event(quic_event)`` that
write into the QuicConnection themselves, exactly the contract the real session follows. The loopback
tests run over each QUIC back-end present (``quic_backend``, tests/support/backends.py); those that
check aioquic's own behaviour (client certificates and TLS alerts, its write path, datagram sizes and
stats) are marked ``aioquic_only`` with the reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aioquic.quic import events as qe
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from cryptography.hazmat.primitives.asymmetric import ec

from kvsp.pki import RoleSpec, make_dev_pki
from moqt.auth import AuthError, issue_token
from moqt.events import SessionEstablished, SetupRequested
from moqt.kinds import SessionError
from moqt.params import AuthToken, SetupParameters
from moqt.profiles import DRAFT_14, PROFILES
from moqt.quic import (
    LOOPBACK_DATAGRAM_SIZE,
    MAX_DATAGRAM_SIZE,
    ConnectionClosedError,
    EndpointConfig,
    MoqtConnection,
    MoqtServer,
    MoqtUri,
    QuicSettings,
    connect,
    serve,
)
from moqt.quic.aioquic_hooks import HookedQuicConnection
from moqt.quic.backend import listen
from moqt.quic.pico import PicoConnection, PicoServer, pico_connect, pico_serve
from moqt.session import MoqtSession
from moqt.tls import PeerCertificateError
from tests.support import backends
from tests.support.backends import aioquic_only

SERVER_URI = "moqt://127.0.0.1:4433/relay"
CLIENT_URI = "https://client.test/kvsp/"
T = 20.0  # upper bound for any single await in these tests

UNAUTHORIZED = DRAFT_14.session_errors.code(SessionError.UNAUTHORIZED)  # as seen on the wire
INTERNAL_ERROR = DRAFT_14.session_errors.code(SessionError.INTERNAL_ERROR)
CERTIFICATE_REQUIRED, UNKNOWN_CA = 0x100 + 116, 0x100 + 48  # QUIC crypto errors of TLS alerts (RFC 9001 4.8)


@dataclass
class Pki:
    dir: Path
    other: Path  # a second, unrelated CA with its own "client" and "server"

    def config(self, name: str | None, *, ca: Path | None = None, settings: QuicSettings | None = None,
               token_keys: Sequence[ec.EllipticCurvePublicKey] = (), require_certificate: bool = False
               ) -> EndpointConfig:
        """``name``'s endpoint on the test's back-end (a picoquic server trusts the test issuer's tokens
        unless ``token_keys`` are given: it has no other way to authenticate anyone)."""
        base = ca or self.dir
        cert, key = (base / f"{name}.pem", base / f"{name}.key") if name else (None, None)
        quic = dataclasses.replace(settings or FAST, quic=backends.CURRENT)
        return EndpointConfig.from_files(cert, key, base / "ca.pem", quic,
                                         token_keys=token_keys or backends.token_keys(),
                                         require_certificate=require_certificate)


FAST = QuicSettings(auth_timeout_s=0.5, handshake_timeout_s=5.0, idle_timeout_s=10.0)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    base = tmp_path_factory.mktemp("pki")
    make_dev_pki(base / "a", [RoleSpec("server", SERVER_URI), RoleSpec("client", CLIENT_URI),
                              RoleSpec("elsewhere", "moqt://relay.other.test:4433/"),
                              RoleSpec("c2", "https://c2.test/")])
    make_dev_pki(base / "b", [RoleSpec("server", SERVER_URI), RoleSpec("client", CLIENT_URI)])
    return Pki(base / "a", base / "b")


# -- test sessions --------------------------------------------------------------------------------
Ev = tuple[int, bytes, bool]
Conn = MoqtConnection[Ev] | PicoConnection[Ev]
"""A connection of either back-end; aioquic-only tests narrow it (`aioquic_conn`)."""


def aioquic_conn(conn: Conn) -> MoqtConnection[Ev]:
    assert isinstance(conn, MoqtConnection), "an aioquic-only test ran on picoquic"
    return conn


@dataclass
class Recorder:
    """Records every QUIC event; returns stream data as (stream_id, data, end) events."""

    conn: Conn
    seen: list[qe.QuicEvent] = field(default_factory=list)

    def handle_event(self, event: qe.QuicEvent) -> Sequence[tuple[int, bytes, bool]]:
        self.seen.append(event)
        if isinstance(event, qe.StreamDataReceived):
            return [(event.stream_id, event.data, event.end_stream)]
        return []


class Echo(Recorder):
    """Writes every received stream byte back on the same stream (FIN too)."""

    def handle_event(self, event: qe.QuicEvent) -> Sequence[tuple[int, bytes, bool]]:
        out = super().handle_event(event)
        if isinstance(event, qe.StreamDataReceived):
            self.conn.quic.send_stream_data(event.stream_id, event.data, event.end_stream)
        return out


class TokenOnFirstStream(Recorder):
    """Stands in for CLIENT_SETUP's AUTHORIZATION_TOKEN: the first stream's content is the token.

    Like the real session, a bad token closes with the error's session code.
    """

    def handle_event(self, event: qe.QuicEvent) -> Sequence[tuple[int, bytes, bool]]:
        out = super().handle_event(event)
        if isinstance(event, qe.StreamDataReceived) and event.end_stream:
            token = b"".join(e.data for e in self.seen if isinstance(e, qe.StreamDataReceived))
            try:
                self.conn.authenticate_with_token(token)
            except AuthError as exc:
                self.conn.close(exc.error, str(exc))
        return out


class Ticking(Recorder):
    """A session with its own deadline (like MoqtSession's GOAWAY timeout)."""

    deadline: float | None = None

    def handle_event(self, event: qe.QuicEvent) -> Sequence[tuple[int, bytes, bool]]:
        if isinstance(event, qe.HandshakeCompleted):
            self.deadline = asyncio.get_running_loop().time() + 0.05
        return super().handle_event(event)

    def get_timer(self) -> float | None:
        return self.deadline

    def handle_timer(self, now: float) -> Sequence[tuple[int, bytes, bool]]:
        self.deadline = None
        return [(-1, b"tick", False)]


Factory = Callable[[Conn], Recorder]


@dataclass
class Served:
    server: MoqtServer[Ev] | PicoServer[Ev]
    sessions: list[Recorder]

    @property
    def uri(self) -> str:
        return f"moqt://127.0.0.1:{self.server.port}/relay?x=1"


async def _serve(config: EndpointConfig, cls: type[Recorder] = Recorder) -> Served:
    """A server on ``config``'s back-end whose connections each get a ``cls`` session."""
    sessions: list[Recorder] = []

    def factory(conn: Conn) -> Recorder:
        sessions.append(cls(conn))
        return sessions[-1]

    if config.settings.quic == backends.PICOQUIC:
        return Served(await pico_serve("127.0.0.1", 0, config, factory), sessions)
    return Served(await serve("127.0.0.1", 0, config, factory), sessions)


async def _connect(uri: str, config: EndpointConfig, factory: Callable[[Any], Any]) -> Conn:
    """``connect`` on ``config``'s back-end (``moqt.quic.connect`` or ``pico_connect``)."""
    if config.settings.quic == backends.PICOQUIC:
        return await pico_connect(uri, config, factory)
    return await connect(uri, config, factory)


def _send(conn: Conn, data: bytes) -> None:
    """``data`` and FIN on a new stream, on either back-end (``MoqtConnection.write`` is aioquic's only)."""
    conn.quic.send_stream_data(conn.quic.get_next_available_stream_id(), data, end_stream=True)
    conn.transmit_soon()


@pytest.fixture
async def served(pki: Pki, quic_backend: str) -> AsyncIterator[Served]:
    s = await _serve(pki.config("server"), Echo)
    yield s
    s.server.close()
    await asyncio.wait_for(s.server.wait_closed(), T)


def recorder(conn: Conn) -> Recorder:
    return Recorder(conn)


async def _closed_code(conn: Conn) -> int:
    await asyncio.wait_for(conn.wait_closed(), T)
    assert conn.close_event is not None
    return conn.close_event.error_code


# -- URIs and settings ------------------------------------------------------------------------------
@pytest.mark.parametrize(("uri", "host", "port", "path", "fragment"), [
    ("moqt://relay.example:4433/kvsp", "relay.example", 4433, "/kvsp", ""),
    ("moqt://relay.example/", "relay.example", 443, "/", ""),
    ("moqt://relay.example", "relay.example", 443, "", ""),
    ("moqt://[::1]:9000/a/b?c=d&e", "::1", 9000, "/a/b?c=d&e", ""),
    ("moqt://h/app?x=1#track-v2:a/b#c", "h", 443, "/app?x=1", "track-v2:a/b#c"),  # draft-18 fragments
])
def test_uri_parsing(uri: str, host: str, port: int, path: str, fragment: str) -> None:
    parsed = MoqtUri.parse(uri)
    assert (parsed.host, parsed.port, parsed.path, parsed.fragment) == (host, port, path, fragment)
    assert MoqtUri.parse(str(parsed)) == parsed


@pytest.mark.parametrize("uri", ["https://h/", "moqt:///path", "moqt://h:99999/", "moqt://u@h/", "moqt://h/#f",
                                 "moqt://h/#Type:v", "moqt://h/#:v", "moqt://h:x/"])
def test_bad_uris(uri: str) -> None:
    with pytest.raises(ValueError):
        MoqtUri.parse(uri)


def test_datagram_size_is_clamped_to_the_largest_udp_payload(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        s = QuicSettings(max_datagram_size=70000, loopback_datagram_size=65000)
    assert s.max_datagram_size == MAX_DATAGRAM_SIZE == 65507
    assert s.loopback_datagram_size == 65000
    assert "largest UDP payload" in caplog.text
    with pytest.raises(ValueError):
        QuicSettings(max_datagram_size=1000)
    assert s.datagram_size_for(("127.0.0.1", 1)) == 65000
    assert s.datagram_size_for(("::ffff:127.0.0.1", 1, 0, 0)) == 65000
    assert QuicSettings().datagram_size_for(("10.1.2.3", 1)) == 1452
    assert QuicSettings().datagram_size_for(("::1", 1, 0, 0)) == LOOPBACK_DATAGRAM_SIZE == 65488


def test_quic_configuration_carries_settings(pki: Pki) -> None:
    config = pki.config("client", settings=QuicSettings(max_data=1 << 22, congestion_control="reno"))
    qc = config.quic_configuration(is_client=True, datagram_size=9000, server_name="127.0.0.1")
    assert qc.alpn_protocols == ["moqt-18", "moqt-16", "moq-00"]  # every draft, newest first
    assert (qc.max_datagram_size, qc.max_data, qc.congestion_control_algorithm) == (9000, 1 << 22, "reno")
    assert qc.certificate is not None and qc.private_key is not None
    assert qc.verify_mode == ssl.CERT_NONE  # aioquic's check can't parse our URI SANs; moqt/tls.py verifies


# -- authentication ---------------------------------------------------------------------------------
CLIENT_CERTIFICATES = aioquic_only("client certificates: a picoquic server never requests one")


@CLIENT_CERTIFICATES
async def test_mutual_authentication_both_sides_see_identity(pki: Pki, served: Served) -> None:
    conn = await connect(served.uri, pki.config("client"), recorder)
    async with conn:
        assert conn.peer_identity == SERVER_URI and conn.authenticated_by == "certificate"
        assert conn.uri is not None and conn.uri.path == "/relay?x=1"
        (session,) = served.sessions
        assert session.conn.peer_identity == CLIENT_URI
        assert session.conn.authenticated_by == "certificate"
        assert aioquic_conn(session.conn).peer_certificate is not None
        assert any(isinstance(e, qe.HandshakeCompleted) for e in session.seen)
        assert isinstance(session.seen[0], qe.ProtocolNegotiated)  # queued before the session existed
        assert conn.quic.tls.alpn_negotiated == PROFILES[0].alpn == conn.profile.alpn  # the newest draft
    assert conn.close_event is not None and conn.close_event.error_code == 0


async def test_client_without_certificate_is_closed_at_auth_deadline(pki: Pki, served: Served) -> None:
    conn = await _connect(served.uri, pki.config(None), recorder)
    (session,) = served.sessions
    assert session.conn.peer_identity is None and session.conn.authenticated_by is None
    start = time.monotonic()
    assert await _closed_code(conn) == UNAUTHORIZED
    assert 0.3 < time.monotonic() - start < 5
    if not backends.picoquic():  # picoquic sends the close's code only, never its reason
        assert conn.close_event is not None and "token" in conn.close_event.reason_phrase


@aioquic_only("require_certificate: pico_serve refuses it (no client certificates), and the refusal is a TLS "
              "alert picoquic cannot send")
async def test_required_certificate_closes_at_once_without_a_session(pki: Pki, quic_backend: str) -> None:
    s = await _serve(pki.config("server", require_certificate=True))
    try:
        conn = await connect(f"moqt://127.0.0.1:{s.server.port}/", pki.config(None), recorder)
        assert await _closed_code(conn) == CERTIFICATE_REQUIRED  # the TLS alert as a crypto error
        assert s.sessions == []
    finally:
        s.server.close()


async def test_token_authenticates_a_client_without_certificate(pki: Pki, quic_backend: str) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    s = await _serve(pki.config("server", token_keys=[key.public_key()]), TokenOnFirstStream)
    token = issue_token(key, "https://tokenholder.test/", [bytes(16)], expires_at=int(time.time()) + 60,
                        now=int(time.time()))
    try:
        conn = await _connect(f"moqt://127.0.0.1:{s.server.port}/", pki.config(None), recorder)
        _send(conn, token)
        while not s.sessions and not conn.closed:  # picoquic's server may see the handshake end later
            await asyncio.sleep(0.01)
        (session,) = s.sessions
        while session.conn.authenticated_by is None and not conn.closed:
            await asyncio.sleep(0.01)
        await asyncio.sleep(FAST.auth_timeout_s + 0.1)  # past the auth deadline: still open
        assert not conn.closed
        assert session.conn.peer_identity == "https://tokenholder.test/"
        assert session.conn.authenticated_by == "token"
        assert session.conn.token_claims is not None and session.conn.token_claims.allows_scope(bytes(16))
        await conn.__aexit__(None, None, None)
    finally:
        s.server.close()


async def test_bad_token_leaves_client_unauthenticated(pki: Pki, quic_backend: str) -> None:
    trusted, rogue = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    s = await _serve(pki.config("server", token_keys=[trusted.public_key()]), TokenOnFirstStream)
    token = issue_token(rogue, "https://x.test/", expires_at=int(time.time()) + 60, now=int(time.time()))
    try:
        conn = await _connect(f"moqt://127.0.0.1:{s.server.port}/", pki.config(None), recorder)
        _send(conn, token)
        assert await _closed_code(conn) == UNAUTHORIZED  # BadSignatureError.error
        assert s.sessions[0].conn.peer_identity is None
    finally:
        s.server.close()


@CLIENT_CERTIFICATES
async def test_client_certificate_from_another_ca_is_rejected(pki: Pki, quic_backend: str) -> None:
    s = await _serve(pki.config("server"))
    try:
        rogue = EndpointConfig.from_files(pki.other / "client.pem", pki.other / "client.key", pki.dir / "ca.pem",
                                          FAST)
        conn = await connect(f"moqt://127.0.0.1:{s.server.port}/", rogue, recorder)
        assert await _closed_code(conn) == UNKNOWN_CA  # the TLS alert as a crypto error
        assert s.sessions == []  # no session ever saw the unverified peer
    finally:
        s.server.close()


async def test_server_certificate_from_another_ca_is_rejected(pki: Pki, quic_backend: str) -> None:
    s = await _serve(pki.config("server", ca=pki.other))
    try:  # aioquic: our check after the handshake; picoquic: picotls's, in it (a transport close)
        with pytest.raises((ConnectionClosedError, PeerCertificateError)):
            await _connect(f"moqt://127.0.0.1:{s.server.port}/", pki.config("client"), recorder)
        assert s.sessions == []
    finally:
        s.server.close()


async def test_server_name_mismatch_is_rejected(pki: Pki, quic_backend: str) -> None:
    s = await _serve(pki.config("elsewhere"))  # certificate for relay.other.test, reached as 127.0.0.1
    try:
        with pytest.raises((ConnectionClosedError, PeerCertificateError)):
            await _connect(f"moqt://127.0.0.1:{s.server.port}/", pki.config("client"), recorder)
    finally:
        s.server.close()


@aioquic_only("expected_identity: a picoquic client reads no server certificate, so pico_connect refuses it")
async def test_unexpected_server_identity_is_rejected_by_our_check(pki: Pki, served: Served) -> None:
    with pytest.raises(PeerCertificateError, match="expected"):
        await connect(served.uri, pki.config("client"), recorder, expected_identity="moqt://someone.else/")
    # The server never keeps the connection: it ends (UNAUTHORIZED from the client) within the bound.
    deadline = time.monotonic() + T
    while served.server.connections and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not served.server.connections


# -- data path ----------------------------------------------------------------------------------------
@aioquic_only("MoqtConnection.write and aioquic's unacknowledged-octets bound (picoquic's drain: "
              "tests/test_moqt_picoquic.py)")
async def test_echo_8_mib_over_one_stream_with_backpressure(pki: Pki, served: Served) -> None:
    settings = QuicSettings(send_high_water=256 << 10)
    conn = await connect(served.uri, pki.config("client", settings=settings), recorder)
    payload = os.urandom(8 << 20)
    peak = 0
    original = conn.quic.send_stream_data

    def watched(stream_id: int, data: bytes, end_stream: bool = False) -> None:
        nonlocal peak
        original(stream_id, data, end_stream)
        peak = max(peak, conn.send_buffered(stream_id))

    conn.quic.send_stream_data = watched  # type: ignore[method-assign]
    stream_id = conn.quic.get_next_available_stream_id()

    async def receive() -> bytes:
        chunks = []
        async for sid, data, end in conn.events():
            assert sid == stream_id
            chunks.append(data)
            if end:
                break
        return b"".join(chunks)

    async with conn:
        start = time.monotonic()
        reader = asyncio.ensure_future(receive())
        await asyncio.wait_for(conn.write(stream_id, payload, end_stream=True), T)
        echoed = await asyncio.wait_for(reader, T)
        assert echoed == payload
        assert 0 < peak <= settings.send_high_water
        assert time.monotonic() - start < T


@aioquic_only("recv_batch and transmit stats: aioquic's Python send loop (picoquic sends from its own thread)")
async def test_transmit_is_coalesced_per_receive_batch(pki: Pki, quic_backend: str) -> None:
    s = await _serve(pki.config("server"))
    try:
        conn = await connect(f"moqt://127.0.0.1:{s.server.port}/", pki.config("client"), recorder)
        async with conn:
            await asyncio.wait_for(conn.write(0, bytes(8 << 20), end_stream=True), T)
            receiver = aioquic_conn(s.sessions[0].conn)
            while receiver.stats.octets_received < 8 << 20:
                await asyncio.sleep(0.01)
            stats = receiver.stats
            # aioquic.asyncio builds packets after every datagram (transmits == datagrams received).
            assert stats.transmits < stats.datagrams_received / 2, stats
    finally:
        s.server.close()


@aioquic_only("transmit_now and datagram stats: aioquic's Python send loop (picoquic sends from its own thread)")
async def test_transmit_now_sends_before_the_loop_turn_ends(pki: Pki, served: Served) -> None:
    conn = await connect(served.uri, pki.config("client"), recorder)
    async with conn:
        sent = conn.stats.datagrams_sent
        conn.quic.send_stream_data(0, b"x" * 1000)  # schedules a transmit for the end of this turn
        assert conn.stats.datagrams_sent == sent
        conn.transmit_now()
        assert conn.stats.datagrams_sent > sent  # already on the socket, without yielding
        transmits, received = conn.stats.transmits, conn.stats.datagrams_received
        await asyncio.sleep(0)
        # The scheduled transmit was cancelled: nothing left. A datagram read in that loop turn (the
        # handshake's last ACKs: Python 3.12's loop reads the socket there) may be answered by a transmit.
        assert conn.stats.transmits - transmits <= conn.stats.datagrams_received - received


@aioquic_only("datagram sizes: not applied on picoquic (it runs path MTU discovery)")
async def test_large_datagrams_on_loopback(pki: Pki, served: Served) -> None:
    settings = QuicSettings(loopback_datagram_size=65000)
    conn = await connect(served.uri, pki.config("client", settings=settings), recorder)
    async with conn:
        await asyncio.wait_for(conn.write(0, bytes(1 << 20), end_stream=True), T)
        async for _, _, end in conn.events():
            if end:
                break
        # beyond the 16383 octets a STREAM frame could carry with aioquic's own 2-octet Length field
        assert 0x3FFF < conn.stats.largest_datagram_sent <= 65000


async def test_session_exception_closes_with_internal_error(pki: Pki, quic_backend: str) -> None:
    class Broken(Recorder):
        def handle_event(self, event: qe.QuicEvent) -> Sequence[tuple[int, bytes, bool]]:
            if isinstance(event, qe.StreamDataReceived):
                raise RuntimeError("bug")
            return []

    s = await _serve(pki.config("server"), Broken)
    try:
        conn = await _connect(f"moqt://127.0.0.1:{s.server.port}/", pki.config("client"), recorder)
        _send(conn, b"x")
        assert await _closed_code(conn) == INTERNAL_ERROR
        with pytest.raises(ConnectionClosedError):  # what writers wait on fails once closed
            await conn.drain(0)
    finally:
        s.server.close()


async def test_session_timer_is_armed_and_fired(pki: Pki, served: Served) -> None:
    conn = await _connect(served.uri, pki.config("client"), Ticking)
    async with conn:
        assert await asyncio.wait_for(conn.next_event(), T) == (-1, b"tick", False)


async def test_server_close_ends_its_connections(pki: Pki, quic_backend: str) -> None:
    s = await _serve(pki.config("server"))
    conn = await _connect(f"moqt://127.0.0.1:{s.server.port}/", pki.config("client"), recorder)
    s.server.close()
    assert await _closed_code(conn) == 0
    await asyncio.wait_for(s.server.wait_closed(), T)
    with pytest.raises(ConnectionClosedError):
        await conn.next_event()


@aioquic_only("aioquic's pacer on uvloop's 1 ms timers (picoquic paces in C on its own thread)")
def test_runs_on_uvloop(pki: Pki, quic_backend: str) -> None:
    """uvloop's 1 ms timers must not stall or spin the pacer: a 4 MiB echo completes promptly."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> None:
        s = await _serve(pki.config("server"), Echo)
        conn = await connect(f"moqt://127.0.0.1:{s.server.port}/", pki.config("client"), recorder)
        async with conn:
            await conn.write(0, bytes(4 << 20), end_stream=True)
            got = 0
            async for _, data, end in conn.events():
                got += len(data)
                if end:
                    break
            assert got == 4 << 20
        s.server.close()
        await s.server.wait_closed()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(asyncio.wait_for(main(), T))


def test_quic_connection_subclass_hooks_writes() -> None:
    calls: list[int] = []
    quic = HookedQuicConnection(configuration=QuicConfiguration(is_client=True))
    quic.on_write = lambda: calls.append(1)
    assert isinstance(quic, QuicConnection)
    quic.send_ping(1)
    assert calls == [1]
    assert not quic.closing
    quic.close(0x2, reason_phrase="bye")
    assert quic.closing and calls == [1, 1]


# -- with the real MOQT session ---------------------------------------------------------------------
@pytest.mark.parametrize("trusted", [True, False])
async def test_moqt_session_setup_with_authorization_token(pki: Pki, trusted: bool, quic_backend: str) -> None:
    """CLIENT_SETUP carries the token; the server checks it on SetupRequested, as D3 intends."""
    issuer = ec.generate_private_key(ec.SECP256R1())
    signer = issuer if trusted else ec.generate_private_key(ec.SECP256R1())
    token = issue_token(signer, "https://c.test/", [bytes(16)], expires_at=int(time.time()) + 60, now=int(time.time()))

    def on_setup(conn: MoqtConnection[object] | PicoConnection[object], event: object) -> None:
        if isinstance(event, SetupRequested):
            session = conn.session
            try:
                conn.authenticate_with_token(event.authorization[0].value)
            except AuthError as exc:
                session.reject_setup(exc.error, str(exc))  # type: ignore[union-attr]
                return
            session.accept_setup()  # type: ignore[union-attr]

    server = await listen("127.0.0.1", 0, pki.config("server", token_keys=[issuer.public_key()]),
                          lambda c: MoqtSession(c.quic, auto_accept=False), on_event=on_setup)
    params = SetupParameters(authorization_tokens=(AuthToken.use_value(0, token),))
    try:
        conn = await _connect(f"moqt://127.0.0.1:{server.port}/relay", pki.config(None),
                              lambda c: MoqtSession(c.quic, path="/relay", setup_parameters=params))
        if trusted:
            assert isinstance(await asyncio.wait_for(conn.next_event(), T), SessionEstablished)
            assert isinstance(server, MoqtServer | PicoServer)
            (accepted,) = server.connections
            assert (accepted.peer_identity, accepted.authenticated_by) == ("https://c.test/", "token")
            await conn.__aexit__(None, None, None)
        else:
            assert await _closed_code(conn) == UNAUTHORIZED
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), T)
