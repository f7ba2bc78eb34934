"""UDP GSO in the QUIC adapter (moqt/quic/udp.py, ``UdpEndpoint.send`` in moqt/quic/endpoint.py), with its fallback."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from aioquic.quic import events as qe

import moqt.quic.udp as udp_module
from kvsp.pki import RoleSpec, make_dev_pki
from moqt.quic import EndpointConfig, MoqtConnection, QuicSettings, connect, serve
from moqt.quic.udp import GSO_MAX_OCTETS, GSO_MAX_SEGMENTS, GSO_UNSUPPORTED, gso_batches, send_gso

real_send_gso = send_gso

A, B = ("127.0.0.1", 1000), ("127.0.0.1", 2000)
T = 20.0


def _sizes(datagrams: list[tuple[bytes, tuple[str, int]]]) -> list[tuple[list[int], int, tuple[str, int]]]:
    return [([len(b) for b in buffers], segment, to) for buffers, segment, to in gso_batches(datagrams)]


def test_runs_of_equal_sizes_to_one_address_with_a_shorter_last() -> None:
    datagrams = [(bytes(1452), A)] * 3 + [(bytes(100), A), (bytes(1452), A), (bytes(1452), B), (bytes(9), B)]
    assert _sizes(datagrams) == [([1452, 1452, 1452, 100], 1452, A), ([1452], 1452, A), ([1452, 9], 1452, B)]


def test_a_larger_datagram_starts_a_new_run() -> None:
    assert _sizes([(bytes(100), A), (bytes(200), A), (bytes(200), A)]) == [([100], 100, A), ([200, 200], 200, A)]


def test_runs_respect_segment_count_and_octet_limits() -> None:
    runs = _sizes([(bytes(10), A)] * (GSO_MAX_SEGMENTS + 1))
    assert [len(sizes) for sizes, _, _ in runs] == [GSO_MAX_SEGMENTS, 1]
    runs = _sizes([(bytes(9000), A)] * 10)
    assert all(sum(sizes) <= GSO_MAX_OCTETS for sizes, _, _ in runs)
    assert [len(sizes) for sizes, _, _ in runs] == [7, 3]
    assert _sizes([]) == []


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    sender, receiver = (socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2))
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(5)
    yield sender, receiver
    sender.close()
    receiver.close()


def test_one_gso_send_arrives_as_separate_datagrams(pair: tuple[socket.socket, socket.socket]) -> None:
    sender, receiver = pair
    buffers = [bytes([i]) * 1452 for i in range(3)] + [b"tail"]
    try:
        send_gso(sender, buffers, 1452, receiver.getsockname())
    except OSError as exc:
        if exc.errno in GSO_UNSUPPORTED:
            pytest.skip(f"this kernel has no UDP GSO ({exc})")  # a real capability is absent
        raise
    assert [receiver.recv(65536) for _ in buffers] == buffers


# -- through the adapter ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("pki")
    make_dev_pki(base, [RoleSpec("server", "moqt://127.0.0.1:4433/x"), RoleSpec("client", "https://c.test/")])
    return base


class Sink:
    """Counts stream octets and answers the FIN with ``ok`` + FIN."""

    def __init__(self, conn: MoqtConnection[int]) -> None:
        self.conn, self.octets = conn, 0

    def handle_event(self, event: qe.QuicEvent) -> list[int]:
        if isinstance(event, qe.StreamDataReceived):
            self.octets += len(event.data)
            if event.end_stream:
                if not self.conn.is_client:
                    self.conn.quic.send_stream_data(event.stream_id, b"ok", end_stream=True)
                return [self.octets]
        return []


async def _transfer(pki: Path, size: int) -> int:
    settings = QuicSettings(loopback_datagram_size=1452, gso=True)  # small datagrams: many per transmit
    server_config = EndpointConfig.from_files(pki / "server.pem", pki / "server.key", pki / "ca.pem", settings)
    server = await serve("127.0.0.1", 0, server_config, Sink)
    try:
        client_config = EndpointConfig.from_files(pki / "client.pem", pki / "client.key", pki / "ca.pem", settings)
        conn = await connect(f"moqt://127.0.0.1:{server.port}/x", client_config, Sink)
        async with conn:
            await asyncio.wait_for(conn.write(0, bytes(size), end_stream=True), T)
            received: int = await asyncio.wait_for(conn.next_event(), T)  # the server's "ok"
            assert received == 2
            return conn.stats.datagrams_sent
    finally:
        server.close()
        await server.wait_closed()


async def test_transfer_with_gso_uses_batched_sends(pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    batches: list[int] = []

    def counting(sock: socket.socket, buffers: list[bytes], segment: int, address: tuple[str, int]) -> None:
        real_send_gso(sock, buffers, segment, address)
        batches.append(len(buffers))

    monkeypatch.setattr(udp_module, "send_gso", counting)
    sent = await _transfer(pki, 1 << 20)
    assert batches and max(batches) > 1
    assert sum(batches) <= sent


async def test_kernel_refusal_turns_gso_off_and_every_datagram_still_leaves(
        pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refusals: list[int] = []

    def refusing(sock: socket.socket, buffers: list[bytes], segment: int, address: tuple[str, int]) -> None:
        refusals.append(len(buffers))
        raise OSError(errno.EIO, "no checksum offload")

    monkeypatch.setattr(udp_module, "send_gso", refusing)
    await _transfer(pki, 1 << 20)  # completes: the refused batch and all later datagrams went by sendto
    assert 1 <= len(refusals) <= 2  # at most once per endpoint (the server may never batch), then off
