"""The contract with aioquic's internals (moqt/quic/aioquic_hooks.py), which pyproject.toml pins.

``HookedQuicConnection`` overrides private methods of ``QuicConnection`` and reads private state of
it, its TLS context and its stream senders. A new aioquic may rename or reshape any of these without
notice; these tests are what notices. They check each overridden method's signature against the one
our override expects, the signatures of the private helpers our ``_write_stream_frame`` calls, that
each private attribute we set already exists in a stock connection (else our write would be dead),
and that each hook still has its effect: a 4-octet STREAM Length, a CertificateRequest that brings
the client's chain, the peer's ``max_udp_payload_size`` honoured, the send-buffer size read.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aioquic.buffer import Buffer  # type: ignore[attr-defined]  # re-exported without __all__
from aioquic.quic import events as qe
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.logger import QuicLoggerTrace
from aioquic.quic.packet import QuicTransportParameters, pull_quic_transport_parameters, push_quic_transport_parameters
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.stream import QuicStreamSender

from kvsp.pki import RoleSpec, make_dev_pki
from moqt.quic import EndpointConfig, QuicSettings
from moqt.quic.aioquic_hooks import HookedQuicConnection, peer_certificate_chain, send_buffered

CLIENT_ADDRESS = ("127.0.0.1", 40000)
SERVER_ADDRESS = ("127.0.0.1", 4433)
DATA_SIZE = 65000

OVERRIDDEN = ("_initialize", "_parse_transport_parameters", "_write_stream_frame", "send_stream_data",
              "reset_stream", "stop_stream", "send_datagram_frame", "send_ping", "close")
"""Every ``QuicConnection`` method ``HookedQuicConnection`` overrides; the first three are private."""

CALLED: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "QuicStreamSender.get_frame": (QuicStreamSender.get_frame, ("self", "max_size", "max_offset")),
    "QuicStreamSender.on_data_delivery": (QuicStreamSender.on_data_delivery,
                                          ("self", "delivery", "start", "stop", "fin")),
    "QuicPacketBuilder.start_frame": (QuicPacketBuilder.start_frame,
                                      ("self", "frame_type", "capacity", "handler", "handler_args")),
    "QuicLoggerTrace.encode_stream_frame": (QuicLoggerTrace.encode_stream_frame, ("self", "frame", "stream_id")),
    "pull_quic_transport_parameters": (pull_quic_transport_parameters, ("buf",)),
}
"""What our ``_write_stream_frame`` and ``_parse_transport_parameters`` call, with the parameters they pass."""


def _shape(function: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """A signature without annotations (aioquic rewrites those between releases without other change)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_overridden_methods_are_the_ones_listed() -> None:
    ours = {name for name, value in vars(HookedQuicConnection).items()
            if callable(value) and hasattr(QuicConnection, name) and name != "__init__"}
    assert ours == set(OVERRIDDEN)


@pytest.mark.parametrize("name", OVERRIDDEN)
def test_each_override_has_the_signature_of_aioquic_method(name: str) -> None:
    stock = getattr(QuicConnection, name, None)
    assert stock is not None, f"aioquic's QuicConnection no longer has {name}: moqt/quic/aioquic_hooks.py hooks it"
    assert _shape(getattr(HookedQuicConnection, name)) == _shape(stock)


@pytest.mark.parametrize("name", sorted(CALLED))
def test_private_helpers_we_call_keep_their_parameters(name: str) -> None:
    function, parameters = CALLED[name]
    assert tuple(p for p, _, _ in _shape(function)) == parameters


def test_the_constructor_keywords_we_pass_exist() -> None:
    names = {p for p, _, _ in _shape(QuicConnection.__init__)}
    assert {"configuration", "original_destination_connection_id"} <= names


def test_properties_we_read_on_senders_and_builders_exist() -> None:
    for cls, name in ((QuicStreamSender, "next_offset"), (QuicPacketBuilder, "remaining_flight_space")):
        assert isinstance(inspect.getattr_static(cls, name), property), f"{cls.__name__}.{name}"


# -- the hooks at work, over two connections wired in memory ------------------------------------------
@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("pki")
    make_dev_pki(base, [RoleSpec("server", "moqt://127.0.0.1:4433/x"), RoleSpec("client", "https://c.test/")])
    return base


def _configuration(pki: Path, role: str, *, is_client: bool) -> QuicConfiguration:
    config = EndpointConfig.from_files(pki / f"{role}.pem", pki / f"{role}.key", pki / "ca.pem", QuicSettings())
    return config.quic_configuration(is_client=is_client, datagram_size=DATA_SIZE,
                                     server_name="127.0.0.1" if is_client else None)


def _hooked(configuration: QuicConfiguration, **kwargs: Any) -> HookedQuicConnection:
    quic = HookedQuicConnection(configuration=configuration, **kwargs)
    quic.on_write = lambda: None
    return quic


def _pump(client: QuicConnection, server: QuicConnection, now: float = 1.0) -> None:
    """Move datagrams both ways until neither side has anything to send (no timers needed here)."""
    for _ in range(200):
        moved = 0
        for source, target, address in ((client, server, CLIENT_ADDRESS), (server, client, SERVER_ADDRESS)):
            for data, _ in source.datagrams_to_send(now=now):
                moved += 1
                target.receive_datagram(data, address, now=now)
            while (event := source.next_event()) is not None:
                if isinstance(event, qe.HandshakeCompleted) and isinstance(source, HookedQuicConnection):
                    source.handshake_done()
        if not moved:
            return
        now += 0.001


def _pair(pki: Path, **server_kwargs: Any) -> tuple[HookedQuicConnection, HookedQuicConnection]:
    client = _hooked(_configuration(pki, "client", is_client=True))
    client.connect(SERVER_ADDRESS, now=1.0)
    server = _hooked(_configuration(pki, "server", is_client=False),
                     original_destination_connection_id=client.original_destination_connection_id, **server_kwargs)
    server.request_client_certificate = True
    _pump(client, server)
    return client, server


def test_private_attributes_we_set_exist_in_a_stock_connection(pki: Path) -> None:
    stock = QuicConnection(configuration=_configuration(pki, "client", is_client=True))
    for name in ("_ack_delay", "_max_datagram_size", "_configuration", "_streams", "_quic_logger"):
        assert hasattr(stock, name), name
    assert hasattr(stock._loss, "_cc")


def test_write_stream_frame_writes_a_4_octet_length(pki: Path) -> None:
    client, server = _pair(pki)
    frames: list[bytes] = []
    write = client._write_stream_frame

    def spy(*, builder: QuicPacketBuilder, **kwargs: Any) -> int:  # aioquic passes keywords: names matter
        buf = builder._buffer  # start_frame writes the frame into the builder's one buffer
        start = buf.tell()
        written = write(builder=builder, **kwargs)
        if written:
            frames.append(buf.data_slice(start, buf.tell()))
        return written

    client._write_stream_frame = spy  # type: ignore[method-assign, assignment]
    payload = bytes(range(256)) * 200  # 51200 octets: more than aioquic's 2-octet Length can say
    client.send_stream_data(0, payload, end_stream=True)
    _pump(client, server)
    assert frames
    for frame in frames:
        buf = Buffer(data=frame)
        frame_type = buf.pull_uint_var()
        assert frame_type & 0x02, "STREAM frame without a Length field"
        buf.pull_uint_var()  # stream ID
        if frame_type & 0x04:
            buf.pull_uint_var()  # offset
        assert frame[buf.tell()] >> 6 == 0b10, "Length is not a 4-octet varint"
        assert buf.pull_uint_var() == len(frame) - buf.tell()
    assert max(len(frame) for frame in frames) > 0x3FFF


def test_a_client_certificate_is_requested_and_its_chain_readable(pki: Path) -> None:
    client, server = _pair(pki)
    assert server.tls._request_client_certificate is True
    chain = peer_certificate_chain(server)
    ours = _configuration(pki, "client", is_client=True).certificate
    assert chain and ours is not None and chain[0].public_key() == ours.public_key()
    assert peer_certificate_chain(client)  # and the server's, on the client


def test_send_buffered_reads_the_unacknowledged_octets(pki: Path) -> None:
    client, server = _pair(pki)
    client.send_stream_data(0, b"x" * 1000)
    assert send_buffered(client, 0) == 1000
    _pump(client, server)
    assert send_buffered(client, 0) == 0  # acknowledged
    assert send_buffered(client, 404) == 0  # unknown stream


def test_the_peer_max_udp_payload_size_is_honoured(pki: Path) -> None:
    client = _hooked(_configuration(pki, "client", is_client=True))
    buf = Buffer(capacity=256)
    push_quic_transport_parameters(buf, QuicTransportParameters(max_udp_payload_size=1400))
    client._parse_transport_parameters(buf.data, from_session_ticket=True)
    client.handshake_done()
    assert client._max_datagram_size == 1400


def test_ack_delay_and_flight_cap_reach_aioquic_state(pki: Path) -> None:
    quic = _hooked(_configuration(pki, "client", is_client=True), ack_delay_s=0.005, max_flight_bytes=1 << 20)
    assert quic._ack_delay == 0.005
    assert type(quic._loss._cc).__name__.startswith("Capped")
