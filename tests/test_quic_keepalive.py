"""Keepalive and liveness of QUIC connections (moqt/quic/liveness.py), over loopback UDP in this process.

A peer that vanishes (SIGKILL, SIGSTOP, a pulled cable) is played by `Blackhole`: a UDP forwarder
between client and server that can stop forwarding in both directions, so that each end sees the
other go silent without a close, as on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from aioquic.quic import events as qe

from kvsp.pki import RoleSpec, make_dev_pki
from moqt.quic import EndpointConfig, MoqtConnection, QuicSettings, connect, serve
from moqt.quic.aioquic_hooks import ack_eliciting_in_flight, negotiated_idle_timeout
from moqt.quic.liveness import Liveness, Verdict

pytestmark = pytest.mark.loopback

T = 20.0  # upper bound for any single await


class Quiet:
    """A session that consumes every event and produces none."""

    def __init__(self, conn: MoqtConnection[Any]) -> None:
        self.conn = conn

    def handle_event(self, event: qe.QuicEvent) -> Sequence[Any]:
        return []


class _Side(asyncio.DatagramProtocol):
    def __init__(self, deliver: Callable[[bytes, tuple[str, int]], None]) -> None:
        self.deliver = deliver
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)  # the selector's is no subclass of it

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.deliver(data, addr)


class Blackhole:
    """Forwards UDP between one client and ``target`` until `cut`; then drops everything, both ways."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.open = True
        self.client: tuple[str, int] | None = None
        self._front = _Side(self._from_client)
        self._back = _Side(self._from_server)

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: self._front, local_addr=("127.0.0.1", 0))
        await loop.create_datagram_endpoint(lambda: self._back, remote_addr=self.target)
        assert self._front.transport is not None
        return int(self._front.transport.get_extra_info("sockname")[1])

    def _from_client(self, data: bytes, addr: tuple[str, int]) -> None:
        self.client = addr
        if self.open and self._back.transport is not None:
            self._back.transport.sendto(data)

    def _from_server(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.open and self.client is not None and self._front.transport is not None:
            self._front.transport.sendto(data, self.client)

    def cut(self) -> None:
        self.open = False

    def close(self) -> None:
        for side in (self._front, self._back):
            if side.transport is not None:
                side.transport.close()


@pytest.fixture(scope="module")
def pki_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("pki")
    make_dev_pki(base, [RoleSpec("server", "moqt://127.0.0.1:4433/r"), RoleSpec("client", "https://c.test/")])
    return base


def config(pki_dir: Path, name: str, **quic: Any) -> EndpointConfig:
    return EndpointConfig.from_files(pki_dir / f"{name}.pem", pki_dir / f"{name}.key", pki_dir / "ca.pem",
                                     QuicSettings(**quic))


@pytest.fixture
async def server_port(pki_dir: Path, request: pytest.FixtureRequest) -> AsyncIterator[int]:
    options: dict[str, Any] = getattr(request, "param", {})
    server = await serve("127.0.0.1", 0, config(pki_dir, "server", **options), Quiet)
    yield server.port
    server.close()
    await asyncio.wait_for(server.wait_closed(), T)


# -- the rules, without I/O ---------------------------------------------------------------------------------
def test_keepalive_pings_only_when_nothing_was_received_for_the_interval() -> None:
    live = Liveness(1.0, None, last_received=100.0)
    assert live.next_check == 101.0
    live.received(100.6)  # traffic moves the deadline, without re-planning until the check
    assert live.check(101.0, in_flight=False) is None and live.next_check == 101.6
    assert live.check(101.6, in_flight=False) is Verdict.PING and live.next_check == 102.6
    assert live.check(102.6, in_flight=False) is Verdict.PING  # still silent: ping again, one interval on
    assert not live.watching  # no liveness bound: sends are not watched


def test_liveness_gives_up_a_peer_that_owes_an_ack_for_the_timeout() -> None:
    live = Liveness(None, 2.0, last_received=0.0)
    assert live.next_check is None and live.watching
    live.sent(10.0)
    assert live.next_check == 12.0 and not live.watching
    live.sent(11.0)  # already awaiting: the first send since the peer was last heard counts
    assert live.check(11.9, in_flight=True) is None
    assert live.check(12.0, in_flight=True) is Verdict.DEAD and live.next_check is None


def test_an_answer_or_nothing_owed_clears_the_liveness_deadline() -> None:
    live = Liveness(None, 2.0, last_received=0.0)
    live.sent(1.0)
    live.received(1.5)
    assert live.watching and live.check(3.0, in_flight=True) is None and live.next_check is None
    live.sent(4.0)
    assert live.check(6.0, in_flight=False) is None and live.watching  # only ACKs had been sent
    with pytest.raises(ValueError, match="positive"):
        Liveness(0.0, None, last_received=0.0)


# -- over loopback ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("server_port", [{"idle_timeout_s": 1.0}], indirect=True)
async def test_an_idle_session_is_kept_alive_by_pings_past_the_idle_timeout(pki_dir: Path, server_port: int) -> None:
    uri = f"moqt://127.0.0.1:{server_port}/r"
    kept = await connect(uri, config(pki_dir, "client"), Quiet)
    silent = await connect(uri, config(pki_dir, "client", keepalive=False), Quiet)
    try:
        assert negotiated_idle_timeout(kept.quic) == pytest.approx(1.0, abs=0.2)  # the server's, the smaller
        await asyncio.wait_for(silent.wait_closed(), T)  # without pings: closed at the idle timeout
        assert silent.close_event is not None and "Idle" in silent.close_event.reason_phrase
        await asyncio.sleep(2.5)  # well past the idle timeout again
        assert not kept.closed and kept.stats.keepalive_pings >= 2
    finally:
        kept.close()
        await asyncio.wait_for(kept.wait_closed(), T)


@contextlib.asynccontextmanager
async def behind_blackhole(pki_dir: Path,
                           idle_timeout_s: float) -> AsyncIterator[tuple[Blackhole, MoqtConnection[Any]]]:
    """A client connection (liveness bound 0.5 s) to a server reached through a `Blackhole`."""
    server = await serve("127.0.0.1", 0, config(pki_dir, "server", idle_timeout_s=idle_timeout_s), Quiet)
    hole = Blackhole(("127.0.0.1", server.port))
    try:
        port = await hole.start()
        client = config(pki_dir, "client", idle_timeout_s=idle_timeout_s, liveness_timeout_s=0.5)
        yield hole, await connect(f"moqt://127.0.0.1:{port}/r", client, Quiet)
    finally:
        hole.close()
        server.close()


async def test_a_request_to_a_vanished_peer_fails_within_the_liveness_bound(pki_dir: Path) -> None:
    async with behind_blackhole(pki_dir, 60.0) as (hole, conn):
        stream = conn.quic.get_next_available_stream_id()
        await conn.write(stream, b"before")
        await asyncio.sleep(0.2)
        assert not ack_eliciting_in_flight(conn.quic)  # answered: nothing owed
        hole.cut()
        start = time.monotonic()
        await conn.write(stream, b"x" * 1000)
        await asyncio.wait_for(conn.wait_closed(), T)
        assert time.monotonic() - start < 10  # the idle timeout (60 s) would take far longer
        assert conn.close_event is not None and "unresponsive" in conn.close_event.reason_phrase


async def test_a_silent_vanished_peer_is_noticed_by_the_keepalive_probe(pki_dir: Path) -> None:
    async with behind_blackhole(pki_dir, 3.0) as (hole, conn):
        hole.cut()  # nothing in flight: only the next PING (after 1 s) finds out
        await asyncio.wait_for(conn.wait_closed(), T)
        assert conn.close_event is not None and "unresponsive" in conn.close_event.reason_phrase
        assert conn.stats.keepalive_pings >= 1
