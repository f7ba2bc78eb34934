"""Per-fetch costs (docs/moqt-performance.md, second round): how the publisher flushes a FETCH, the
congestion-window cap, and the block buffer that is no longer zeroed.

* ``Publisher._send_range`` flushes the first object synchronously once a second one exists (not
  before: a one-object fetch's FETCH_OK, object and FIN leave in one transmit), and never yields to
  the event loop for it.
* ``capped_congestion_control`` keeps aioquic's window (and so the bytes in flight) within the cap
  through slow start, and still shrinks it on loss; ``HookedQuicConnection(max_flight_bytes=...)``
  installs it, and a real transfer never has more in flight than the cap.
* ``BlockAssembly`` fills an uninitialised buffer: a block assembled in place or from copied objects
  is octet for octet the block that was sent.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from aioquic.quic.congestion.cubic import CubicCongestionControl
from aioquic.quic.congestion.reno import RenoCongestionControl
from aioquic.quic.packet_builder import QuicSentPacket

from kvsp.container import LayerRange
from kvsp.moqt_binding import BLOCK_GROUP, BlockAssembly, LayerCheck
from kvsp.pki import RoleSpec, make_dev_pki
from kvsp.registry import Codec
from moqt.api import MoqtObject, Publisher
from moqt.api.endpoint import Endpoint
from moqt.kinds import StreamReset
from moqt.profiles import DRAFT_14, Profile
from moqt.quic import EndpointConfig, QuicSettings
from moqt.quic.aioquic_hooks import HookedQuicConnection, capped_congestion_control

MIB = 1 << 20


# -- the publisher's flushes -----------------------------------------------------------------------
@dataclass
class Recorder:
    """A fake session and link that log, in order, what the publisher asks of them."""

    log: list[str] = field(default_factory=list)
    flushable: bool = True
    profile: Profile = DRAFT_14

    def send_fetch_object(self, stream: int, group: int, subgroup: int, object_id: int, payload: memoryview,
                          extensions: tuple[object, ...] = (), status: object = None) -> None:
        self.log.append(f"object {object_id}")

    def finish_stream(self, stream: int) -> None:
        self.log.append("fin")

    def reset_stream(self, stream: int, code: StreamReset | int) -> None:
        self.log.append(f"reset {code}")

    async def drain(self, stream: int) -> None:
        return None

    def transmit_soon(self) -> None:
        pass  # scheduled sends happen at the end of the loop turn: not a flush

    def transmit_now(self) -> None:
        self.log.append("flush")


class NoFlushLink:
    """A link without ``transmit_now`` (an in-memory transport): the publisher falls back to scheduling."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    async def drain(self, stream: int) -> None:
        return None

    def transmit_soon(self) -> None:
        self.recorder.log.append("soon")


async def _objects(count: int, *, fail_after: int | None = None) -> AsyncIterator[MoqtObject]:
    for n in range(count):
        if fail_after is not None and n == fail_after:
            raise OSError("tier read failed")
        yield MoqtObject(BLOCK_GROUP, n, memoryview(bytes([n]) * 10))


def _endpoint(recorder: Recorder, link: object | None = None) -> Endpoint:
    return cast(Endpoint, type("FakeEndpoint", (), {"session": recorder, "link": link or recorder})())


def _send(recorder: Recorder, objects: AsyncIterator[MoqtObject], link: object | None = None) -> None:
    send_range: Any = Publisher._send_range
    asyncio.run(send_range(_endpoint(recorder, link), 3, objects))


def test_first_object_is_flushed_before_the_rest_are_queued() -> None:
    recorder = Recorder()
    _send(recorder, _objects(4))
    assert recorder.log == ["object 0", "flush", "object 1", "object 2", "object 3", "fin"]


def test_a_single_object_leaves_with_its_fin() -> None:
    recorder = Recorder()
    _send(recorder, _objects(1))
    assert recorder.log == ["object 0", "fin"]  # one transmit at the end of the turn: OK, object, FIN


def test_an_empty_range_only_ends_the_stream() -> None:
    recorder = Recorder()
    _send(recorder, _objects(0))
    assert recorder.log == ["fin"]


def test_a_link_without_transmit_now_gets_transmit_soon() -> None:
    recorder = Recorder()
    _send(recorder, _objects(2), NoFlushLink(recorder))
    assert recorder.log == ["object 0", "soon", "soon", "object 1", "soon", "fin"]


def test_a_failing_source_resets_the_stream_after_what_was_sent() -> None:
    recorder = Recorder()
    _send(recorder, _objects(3, fail_after=2))
    assert recorder.log == ["object 0", "flush", "object 1", f"reset {StreamReset.INTERNAL_ERROR}"]


def test_sending_a_range_takes_no_extra_event_loop_turn() -> None:
    """The old code slept once after the first object; now nothing yields while the source does not."""
    recorder = Recorder()
    turns = 0

    async def main() -> None:
        nonlocal turns
        done = False

        async def count() -> None:
            nonlocal turns
            while not done:
                turns += 1
                await asyncio.sleep(0)

        counter = asyncio.create_task(count())
        await asyncio.sleep(0)
        turns = 0
        send_range: Any = Publisher._send_range
        await send_range(_endpoint(recorder), 3, _objects(8))
        done = True
        await counter

    asyncio.run(main())
    assert recorder.log[-1] == "fin" and turns == 0


# -- the congestion-window cap ---------------------------------------------------------------------
def _packet(size: int, now: float) -> QuicSentPacket:
    return cast(QuicSentPacket, type("Sent", (), {"sent_bytes": size, "sent_time": now, "in_flight": True,
                                                  "packet_number": 0})())


@pytest.mark.parametrize("base", [CubicCongestionControl, RenoCongestionControl])
def test_the_window_grows_to_the_cap_and_no_further(base: type[CubicCongestionControl]) -> None:
    cap, size = 2 * MIB, 65000
    cc = capped_congestion_control(base, cap)(max_datagram_size=size)
    assert isinstance(cc, base) and cc.congestion_window == 10 * size
    for n in range(200):  # slow start without loss: aioquic alone would reach 13 MB
        cc.on_packet_sent(packet=_packet(size, n * 0.001))
        cc.on_packet_acked(packet=_packet(size, n * 0.001), now=n * 0.001 + 0.001)
    assert cc.congestion_window == cap
    cc.on_packets_lost(packets=[_packet(size, 0.5)], now=0.6)
    assert cc.congestion_window < cap  # a loss still shrinks it


def test_the_capped_class_is_made_once_per_base_and_cap() -> None:
    assert capped_congestion_control(CubicCongestionControl, MIB) is capped_congestion_control(
        CubicCongestionControl, MIB)
    assert capped_congestion_control(CubicCongestionControl, MIB) is not capped_congestion_control(
        CubicCongestionControl, 2 * MIB)


def test_settings_validate_the_cap() -> None:
    assert QuicSettings().max_flight_bytes is None
    assert QuicSettings(max_flight_bytes=4 * MIB).max_flight_bytes == 4 * MIB
    with pytest.raises(ValueError, match="max_flight_bytes"):
        QuicSettings(max_flight_bytes=65488)


def test_a_transfer_never_has_more_in_flight_than_the_cap(pki_paths: tuple[Any, Any]) -> None:
    server_config, client_config = pki_paths
    cap = 512 * 1024
    server_address, client_address = ("127.0.0.1", 4433), ("127.0.0.1", 40000)
    now = 1.0
    client = HookedQuicConnection(configuration=client_config)
    client.connect(server_address, now=now)
    server = HookedQuicConnection(configuration=server_config, max_flight_bytes=cap,
                                  original_destination_connection_id=client.original_destination_connection_id)
    for quic in (client, server):
        quic.on_write = lambda: None
    payload = hashlib.sha256(b"seed").digest() * (8 * MIB // 32)
    received = bytearray()
    sent_data = False
    peak = 0
    for _ in range(5000):
        moved = 0
        for data, _ in client.datagrams_to_send(now=now):
            server.receive_datagram(data, client_address, now=now)
            moved += 1
        for data, _ in server.datagrams_to_send(now=now):
            client.receive_datagram(data, server_address, now=now)
            moved += 1
        peak = max(peak, server._loss.bytes_in_flight)
        while (event := server.next_event()) is not None:
            if type(event).__name__ == "HandshakeCompleted":
                server.handshake_done()
        while (event := client.next_event()) is not None:
            name = type(event).__name__
            if name == "HandshakeCompleted":
                client.handshake_done()
                stream = client.get_next_available_stream_id(is_unidirectional=True)
                client.send_stream_data(stream, b"go", end_stream=True)
            elif name == "StreamDataReceived":
                received += cast(Any, event).data
        if not sent_data and server._handshake_complete:
            server.send_stream_data(server.get_next_available_stream_id(is_unidirectional=True), payload,
                                    end_stream=True)
            sent_data = True
        if len(received) == len(payload):
            break
        if not moved:
            timers = [t for t in (client.get_timer(), server.get_timer()) if t is not None]
            now = max(now + 0.001, min(timers, default=now + 0.001))
            client.handle_timer(now=now)
            server.handle_timer(now=now)
    assert bytes(received) == payload
    assert server._loss.congestion_window <= cap
    assert 0 < peak <= cap


@pytest.fixture(scope="module")
def pki_paths(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    base = tmp_path_factory.mktemp("pki")
    make_dev_pki(base, [RoleSpec("server", "moqt://127.0.0.1:4433/x"), RoleSpec("client", "https://c.test/")])
    configs = []
    for role, is_client in (("server", False), ("client", True)):
        config = EndpointConfig.from_files(base / f"{role}.pem", base / f"{role}.key", base / "ca.pem")
        configs.append(config.quic_configuration(is_client=is_client, datagram_size=65000,
                                                 server_name="127.0.0.1" if is_client else None))
    return configs[0], configs[1]


# -- the block buffer ------------------------------------------------------------------------------
def _layers(count: int, size: int) -> list[bytes]:
    return [hashlib.sha256(b"layer %d" % n).digest() * (size // 32) for n in range(count)]


def test_a_block_assembled_in_place_is_the_block_sent() -> None:
    layers = _layers(4, 4096)
    digests = tuple(hashlib.sha256(layer).digest() for layer in layers)
    check = LayerCheck(Codec.RAW, LayerRange(0, 3), digests, token_count=1)
    assembly = BlockAssembly(check, capacity=4 * 4096)
    for n, layer in enumerate(layers):
        slot = assembly.allocate(BLOCK_GROUP, n, len(layer))
        assert slot is not None
        slot[:] = layer  # as the receiver does: the object lands in its slot
        assembly.accept(MoqtObject(BLOCK_GROUP, n, slot))
    block = assembly.finish()
    assert [bytes(view.payload) for view in block.container.layers] == layers


def test_copied_objects_fill_the_uninitialised_buffer_exactly() -> None:
    layers = _layers(3, 2048)
    digests = tuple(hashlib.sha256(layer).digest() for layer in layers)
    assembly = BlockAssembly(LayerCheck(Codec.RAW, LayerRange(0, 2), digests, token_count=1), capacity=8 * 2048)
    for n, layer in enumerate(layers):
        assembly.accept(MoqtObject(BLOCK_GROUP, n, memoryview(layer)))
    block = assembly.finish()
    assert bytes(block.container.data) == b"".join(layers)  # only what was written, never the spare capacity
