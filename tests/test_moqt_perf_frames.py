"""Large STREAM frames (moqt/quic/aioquic_hooks.py ``HookedQuicConnection``): 64 KiB packets that stock aioquic reads.

Two connections are wired back to back in memory (no sockets, a fake clock), so every datagram can be
inspected: handshake datagrams stay within ``HANDSHAKE_DATAGRAM_SIZE`` (aioquic writes long-header
lengths in 14 bits), data packets grow to the configured size once the handshake is over, the peer's
``max_udp_payload_size`` still caps them, and a stock ``QuicConnection`` receives every octet intact
(its frame parser reads the 4-octet Length varints we write).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aioquic.quic import events as qe
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from kvsp.pki import RoleSpec, make_dev_pki
from moqt.quic import EndpointConfig, QuicSettings
from moqt.quic.aioquic_hooks import HANDSHAKE_DATAGRAM_SIZE, HookedQuicConnection

CLIENT_ADDRESS = ("127.0.0.1", 40000)
SERVER_ADDRESS = ("127.0.0.1", 4433)
DATA_SIZE = 65000
STOCK_LIMIT = 0x3FFF  # the longest STREAM frame aioquic itself can write (2-octet Length)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("pki")
    make_dev_pki(base, [RoleSpec("server", "moqt://127.0.0.1:4433/x"), RoleSpec("client", "https://c.test/")])
    return base


def _configuration(pki: Path, role: str, *, is_client: bool, size: int = DATA_SIZE) -> QuicConfiguration:
    config = EndpointConfig.from_files(pki / f"{role}.pem", pki / f"{role}.key", pki / "ca.pem", QuicSettings())
    return config.quic_configuration(is_client=is_client, datagram_size=size,
                                     server_name="127.0.0.1" if is_client else None)


@dataclass
class Side:
    quic: QuicConnection
    address: tuple[str, int]
    sizes: list[tuple[bool, int]] = field(default_factory=list)  # (handshake complete?, datagram size)
    received: dict[int, bytearray] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    complete: bool = False

    def events(self) -> Iterator[qe.QuicEvent]:
        while (event := self.quic.next_event()) is not None:
            yield event


def _hooked(configuration: QuicConfiguration, ack_delay_s: float | None = None,
            original_destination_connection_id: bytes | None = None) -> HookedQuicConnection:
    quic = HookedQuicConnection(configuration=configuration, ack_delay_s=ack_delay_s,
                                original_destination_connection_id=original_destination_connection_id)
    quic.on_write = lambda: None
    return quic


class Wire:
    """Moves datagrams between two connections until neither has anything to send."""

    def __init__(self, client: Side, server: Side) -> None:
        self.client, self.server, self.now = client, server, 1.0

    def run(self, rounds: int = 2000) -> None:
        for _ in range(rounds):
            moved = self._move(self.client, self.server) + self._move(self.server, self.client)
            if not moved:
                timer = min((t for t in (self.client.quic.get_timer(), self.server.quic.get_timer()) if t),
                            default=None)
                if timer is None or timer > self.now + 0.05:
                    return
                self.now = max(self.now, timer)
                for side in (self.client, self.server):
                    if (at := side.quic.get_timer()) is not None and at <= self.now:
                        side.quic.handle_timer(self.now)
            self.now += 0.0001

    def _move(self, source: Side, target: Side) -> int:
        datagrams = source.quic.datagrams_to_send(now=self.now)
        for data, _ in datagrams:
            source.sizes.append((source.complete, len(data)))
            target.quic.receive_datagram(data, source.address, now=self.now)
            self._drain(target)
        self._drain(source)
        return len(datagrams)

    @staticmethod
    def _drain(side: Side) -> None:
        for event in side.events():
            if isinstance(event, qe.HandshakeCompleted):
                side.complete = True
                if isinstance(side.quic, HookedQuicConnection):
                    side.quic.handshake_done()  # what moqt/quic/connection.py does at this event
            elif isinstance(event, qe.StreamDataReceived):
                side.received.setdefault(event.stream_id, bytearray()).extend(event.data)
                if event.end_stream:
                    side.finished.add(event.stream_id)


def _pair(pki: Path, *, stock_server: bool = False, client_size: int = DATA_SIZE,
          server_ack_delay_s: float | None = None) -> Wire:
    client = _hooked(_configuration(pki, "client", is_client=True, size=client_size))
    client.connect(SERVER_ADDRESS, now=1.0)
    # a stock server keeps aioquic's own limit: with larger packets it would corrupt its frame lengths
    server_configuration = _configuration(pki, "server", is_client=False,
                                          size=HANDSHAKE_DATAGRAM_SIZE if stock_server else DATA_SIZE)
    cid = client.original_destination_connection_id
    server = (QuicConnection(configuration=server_configuration, original_destination_connection_id=cid)
              if stock_server
              else _hooked(server_configuration, server_ack_delay_s, original_destination_connection_id=cid))
    wire = Wire(Side(client, CLIENT_ADDRESS), Side(server, SERVER_ADDRESS))
    wire.run()
    assert wire.client.complete and wire.server.complete
    return wire


def _payload(size: int) -> bytes:
    return b"".join(hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(size // 32))


def test_handshake_stays_small_then_data_packets_fill_the_configured_size(pki: Path) -> None:
    wire = _pair(pki)
    data = _payload(2 << 20)
    wire.client.quic.send_stream_data(0, data, end_stream=True)
    wire.run()
    assert 0 in wire.server.finished and bytes(wire.server.received[0]) == data
    handshake = [size for complete, size in wire.client.sizes + wire.server.sizes if not complete]
    after = [size for complete, size in wire.client.sizes if complete]
    assert handshake and max(handshake) <= HANDSHAKE_DATAGRAM_SIZE
    assert STOCK_LIMIT < max(after) <= DATA_SIZE
    assert sum(1 for size in after if size > STOCK_LIMIT) >= len(data) // DATA_SIZE - 1  # nearly all full-size


def test_stock_aioquic_reads_our_large_stream_frames(pki: Path) -> None:
    wire = _pair(pki, stock_server=True)
    streams = {sid: _payload(n) for sid, n in ((0, 300_000), (4, 70_000), (8, 1 << 20))}
    for sid, data in streams.items():  # several streams interleave in the same large packets
        wire.client.quic.send_stream_data(sid, data, end_stream=True)
    wire.run()
    assert wire.server.finished == set(streams)
    assert {sid: bytes(got) for sid, got in wire.server.received.items()} == streams
    assert max(size for complete, size in wire.client.sizes if complete) > STOCK_LIMIT


def test_configured_size_below_the_handshake_size_is_kept(pki: Path) -> None:
    wire = _pair(pki, client_size=1452)
    wire.client.quic.send_stream_data(0, _payload(100_000), end_stream=True)
    wire.run()
    assert max(size for _, size in wire.client.sizes) <= 1452


def test_peer_max_udp_payload_size_caps_the_data_size(pki: Path) -> None:
    quic = _hooked(_configuration(pki, "client", is_client=True))
    quic._peer_payload_limit = 9000  # what _parse_transport_parameters records from the peer
    quic.handshake_done()
    assert quic._max_datagram_size == 9000
    quic.handshake_done()  # only once: later calls change nothing
    assert quic._max_datagram_size == 9000


@pytest.mark.parametrize("bad", [-0.001, 0.025])
def test_ack_delay_setting_is_bounded_by_the_announced_max_ack_delay(bad: float) -> None:
    with pytest.raises(ValueError):
        QuicSettings(ack_delay_s=bad)


def test_ack_delay_reaches_aioquic_and_data_still_flows(pki: Path) -> None:
    wire = _pair(pki, server_ack_delay_s=0.02)
    assert wire.server.quic._ack_delay == 0.02 and wire.client.quic._ack_delay == 0.001  # aioquic's own
    data = _payload(1 << 20)
    wire.client.quic.send_stream_data(0, data, end_stream=True)
    wire.run()
    assert bytes(wire.server.received[0]) == data
