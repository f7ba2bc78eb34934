"""Run by the picoquic venv (tests/test_moqt_picoquic.py): the shim through a full TX *event* ring.

``python pico_ring.py PKI_DIR PORT``: a client with a 16-entry TX event ring writes 1000 octets on each
of 2000 unidirectional streams (more, until one had to queue) in one loop turn through `PicoQuic`;
aiopquic refuses writes with "TX event ring full" (not the stream's ring), which its per-stream drain
event never reports. Prints
JSON: how many streams had to queue, and the octets written and received.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from aiopquic.asyncio import connect, serve  # type: ignore[import-not-found]
from aiopquic.asyncio.protocol import QuicConnectionProtocol  # type: ignore[import-not-found]
from aiopquic.quic.configuration import QuicConfiguration  # type: ignore[import-not-found]

from moqt.quic.pico.shim import PicoQuic

STREAMS, MAX_STREAMS, SIZE = 2000, 20000, 1000
received = [0]


class Counting(QuicConnectionProtocol):  # type: ignore[misc]
    def quic_event_received(self, event: object) -> None:
        if type(event).__name__ == "StreamDataReceived":
            received[0] += len(event.data)  # type: ignore[attr-defined]


async def main(pki: Path, port: int) -> dict[str, int]:
    server_cfg = QuicConfiguration(is_client=False, alpn_protocols=["kvsp-test"],
                                   certificate_file=str(pki / "server.pem"), private_key_file=str(pki / "server.key"))
    server = await serve("127.0.0.1", port, configuration=server_cfg, create_protocol=Counting)
    queued = written = 0
    try:
        cfg = QuicConfiguration(is_client=True, alpn_protocols=["kvsp-test"], cafile=str(pki / "ca.pem"),
                                server_name="127.0.0.1", event_ring_capacity=16)
        async with connect("127.0.0.1", port, configuration=cfg) as client:
            shim = PicoQuic(client._quic)
            written = 0
            while written < MAX_STREAMS and (written < STREAMS or not shim._queued):  # until the ring has filled
                shim.send_stream_data(shim.get_next_available_stream_id(True), b"y" * SIZE, True)
                written += 1
            queued = len(shim._queued)
            for _ in range(200):
                if received[0] >= written * SIZE:
                    break
                await asyncio.sleep(0.025)
    finally:
        server.close()
    return {"queued": queued, "written": written * SIZE, "received": received[0]}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(asyncio.wait_for(main(Path(sys.argv[1]), int(sys.argv[2])), 15.0))))
