"""Run by the picoquic venv (tests/test_moqt_picoquic.py): an unchanged ``MoqtSession`` pair over aiopquic.

``python pico_session.py PKI_DIR PORT``: a server and a client, each session written through
`moqt.quic.pico.shim.PicoQuic` and fed aiopquic's events as aioquic's; prints JSON of what each side saw.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from aiopquic.asyncio import connect, serve  # type: ignore[import-not-found]
from aiopquic.asyncio.protocol import QuicConnectionProtocol  # type: ignore[import-not-found]
from aiopquic.quic.configuration import QuicConfiguration  # type: ignore[import-not-found]

from moqt.events import SessionEstablished, SessionTerminated
from moqt.quic.pico.shim import PicoQuic, to_aioquic
from moqt.session import MoqtSession

seen: dict[str, list[str]] = {"client": [], "server": []}


class Side(QuicConnectionProtocol):  # type: ignore[misc]
    def __init__(self, quic: Any, stream_handler: object = None) -> None:
        super().__init__(quic, stream_handler=stream_handler)
        self.shim = PicoQuic(quic)
        self.session: MoqtSession | None = None
        self.side = "client" if quic.configuration.is_client else "server"

    def quic_event_received(self, event: object) -> None:
        converted = to_aioquic(event, self.shim)
        if converted is None:
            return
        if self.session is None and type(event).__name__ == "HandshakeCompleted":
            self.session = MoqtSession(self.shim, role=self.side, path="/kvsp")  # type: ignore[arg-type]
        if self.session is not None:
            for item in self.session.handle_event(converted):
                seen[self.side].append(type(item).__name__)
                if isinstance(item, SessionEstablished):
                    seen[self.side].append(f"draft-{self.session.profile.draft}")
                    if self.side == "client":  # established: it has the SERVER_SETUP
                        self.shim.close(0)
                elif isinstance(item, SessionTerminated):
                    seen[self.side].append(f"code={item.error_code}")


async def main(pki: Path, port: int) -> None:
    server_cfg = QuicConfiguration(is_client=False, alpn_protocols=["moqt-16", "moq-00"],
                                   certificate_file=str(pki / "server.pem"), private_key_file=str(pki / "server.key"),
                                   congestion_control_algorithm="cubic")
    server = await serve("127.0.0.1", port, configuration=server_cfg, create_protocol=Side)
    try:
        cfg = QuicConfiguration(is_client=True, alpn_protocols=["moqt-16", "moq-00"], cafile=str(pki / "ca.pem"),
                                server_name="127.0.0.1", congestion_control_algorithm="cubic")
        async with connect("127.0.0.1", port, configuration=cfg, create_protocol=Side) as client:
            await asyncio.wait_for(client._closed.wait(), 5.0)
        await asyncio.sleep(0.1)
    finally:
        server.close()


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(Path(sys.argv[1]), int(sys.argv[2])), 15.0))
    print(json.dumps(seen))
