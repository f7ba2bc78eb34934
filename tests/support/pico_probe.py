"""Run by the picoquic venv's Python 3.12 (tests/test_moqt_picoquic.py): what aiopquic does, as JSON on stdout.

``python pico_probe.py PKI_DIR PORT``: an aiopquic server (``server.pem``) on ``PORT`` and two clients,
one trusting ``ca.pem`` and one trusting certifi's roots. Records the facts docs/moqt-picoquic.md relies
on (ALPN choice, ``send_stream_data`` types and backpressure, datagrams, close codes, certificate check)
so a new aiopquic release that changes one of them fails the test instead of the back-end.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from aiopquic.asyncio import connect, serve  # type: ignore[import-not-found]
from aiopquic.asyncio.protocol import QuicConnectionProtocol  # type: ignore[import-not-found]
from aiopquic.quic import events as pe  # type: ignore[import-not-found]
from aiopquic.quic.configuration import QuicConfiguration  # type: ignore[import-not-found]

MIB = 1 << 20
T = 5.0
facts: dict[str, Any] = {"server_octets": 0, "server_closes": [], "client_closes": [], "alpn": {}}


class Probe(QuicConnectionProtocol):  # type: ignore[misc]
    def quic_event_received(self, event: object) -> None:
        side = "client" if self._quic.configuration.is_client else "server"
        if isinstance(event, pe.HandshakeCompleted):
            facts["alpn"][side] = event.alpn_protocol
        elif isinstance(event, pe.ConnectionTerminated):
            facts[f"{side}_closes"].append(event.error_code)
        elif isinstance(event, pe.DatagramFrameReceived) and side == "server":
            facts["server_datagram"] = len(event.data)
        elif isinstance(event, pe.StreamDataReceived) and side == "server":
            facts["server_octets"] += len(event.data)
            if event.end_stream:
                self._quic.close(error_code=0x2, reason_phrase="not sent by picoquic")


def _type_error(quic: Any, sid: int, data: object) -> bool:
    try:
        quic.send_stream_data(sid, data, False)
    except TypeError:
        return True
    return False


async def _writes(quic: Any) -> None:
    sid = quic.get_next_available_stream_id()
    facts["memoryview_refused"] = _type_error(quic, sid, memoryview(b"x"))
    facts["bytearray_refused"] = _type_error(quic, sid, bytearray(b"x"))
    try:
        quic.send_stream_data(sid, b"y" * (5 * MIB), False)
    except ValueError:
        facts["over_ring_cap"] = "ValueError"
    sent = 0
    drained = quic.get_tx_data_drain_event(sid)
    while True:
        drained.clear()
        try:
            quic.send_stream_data(sid, b"z" * MIB, False)
            sent += MIB
        except BufferError:
            break
    facts["accepted_before_buffer_error"] = sent
    await asyncio.wait_for(drained.wait(), T)
    quic.send_stream_data(sid, b"end", True)
    facts["client_sent"] = sent + 3
    facts["datagram_accepted"] = quic.send_datagram_frame(b"d" * 100)
    facts["max_datagram_payload"] = quic.max_datagram_payload()


async def main(pki: Path, port: int) -> None:
    server_cfg = QuicConfiguration(is_client=False, alpn_protocols=["moqt-18", "moqt-16", "moq-00"],
                                   certificate_file=str(pki / "server.pem"), private_key_file=str(pki / "server.key"),
                                   congestion_control_algorithm="cubic")
    server = await serve("127.0.0.1", port, configuration=server_cfg, create_protocol=Probe)
    try:
        cfg = QuicConfiguration(is_client=True, alpn_protocols=["moqt-16", "moq-00"], cafile=str(pki / "ca.pem"),
                                server_name="127.0.0.1", congestion_control_algorithm="cubic")
        async with connect("127.0.0.1", port, configuration=cfg, create_protocol=Probe) as client:
            await _writes(client._quic)
            await asyncio.wait_for(client._closed.wait(), T)
        untrusted = QuicConfiguration(is_client=True, alpn_protocols=["moqt-16"], server_name="127.0.0.1")
        try:
            async with connect("127.0.0.1", port, configuration=untrusted, create_protocol=Probe):
                facts["untrusted_server"] = "accepted"
        except ConnectionError as exc:
            facts["untrusted_server"] = f"refused: {exc}"
        await asyncio.sleep(0.2)  # the server's own close event
    finally:
        server.close()


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(Path(sys.argv[1]), int(sys.argv[2])), 20.0))
    print(json.dumps(facts))
