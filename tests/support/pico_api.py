"""Run by the picoquic venv (tests/test_moqt_picoquic.py): moqt.api's Publisher and Subscriber over picoquic.

``python pico_api.py PKI_DIR PORT``: a Publisher serves a multi-MiB track; Subscribers fetch it, each
authenticated by a D3 token, over three pairings of back-ends (picoquic to picoquic, an aioquic
subscriber on the picoquic server, a picoquic subscriber on an aioquic server). Prints JSON per pairing:
whether the octets matched, the draft, how often the picoquic publisher's ``drain`` waited, MiB/s.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from moqt.api import MemoryTrackSource, MoqtObject, Publisher, Subscriber, allow_authenticated, subscriber_session
from moqt.api.publisher import TOKEN_TYPE
from moqt.auth import issue_token
from moqt.events import MoqtEvent
from moqt.params import AuthToken
from moqt.quic import EndpointConfig, QuicSettings
from moqt.quic.pico import PicoConnection, PicoServer, pico_connect, pico_serve
from moqt.session import MoqtSession
from moqt.tls import PeerTrust
from moqt.wire import Location, Namespace

NS: Namespace = (b"kvsp-test", b"pico")
OBJECTS, OBJECT_SIZE = 4, 2 << 20  # 8 MiB: beyond aiopquic's 4 MiB stream ring; objects beyond send_high_water
SUBJECT = "https://sub.test/"
SERVED: list[PicoConnection[MoqtEvent]] = []  # the picoquic publisher's connections, for drain_waits


async def pico_publisher(publisher: Publisher, port: int, config: EndpointConfig) -> PicoServer[MoqtEvent]:
    """``Publisher.listen`` over picoquic, through the Publisher's public ``attach``."""
    endpoints: dict[int, Any] = {}

    def factory(conn: PicoConnection[MoqtEvent]) -> MoqtSession:
        session = MoqtSession(conn.quic, role="server", auto_accept=False)
        endpoints[id(conn)] = publisher.attach(conn, session)
        SERVED.append(conn)
        return session

    def on_event(conn: PicoConnection[MoqtEvent], event: MoqtEvent) -> None:
        endpoints[id(conn)].handle(event)

    return await pico_serve("127.0.0.1", port, config, factory, on_event=on_event)


async def pico_subscriber(uri: str, config: EndpointConfig, token: bytes | None) -> Subscriber:
    """``Subscriber.connect`` over picoquic, through ``Subscriber.attach``."""
    tokens = (AuthToken.use_value(TOKEN_TYPE, token),) if token is not None else ()
    subs: list[Subscriber] = []

    def factory(conn: PicoConnection[MoqtEvent]) -> MoqtSession:
        session = subscriber_session(conn.quic, path="/kvsp", tokens=tokens)
        subs.append(Subscriber.attach(conn, session))
        return session

    def on_event(conn: PicoConnection[MoqtEvent], event: MoqtEvent) -> None:
        subs[0].endpoint.handle(event)

    await pico_connect(uri, config, factory, on_event=on_event)
    await asyncio.wait_for(subs[0].wait_established(), 5.0)
    return subs[0]


async def fetch_all(sub: Subscriber, expected: bytes, publisher: Publisher) -> dict[str, object]:
    start = time.perf_counter()
    got = bytearray()
    async with sub.fetch(NS, b"t", Location(0, 0), Location(0, OBJECTS)) as objects:
        async for obj in objects:
            got += obj.payload
    elapsed = time.perf_counter() - start
    result = {"match": bytes(got) == expected, "octets": len(got), "draft": sub.endpoint.session.profile.draft,
              "mib_s": round(len(got) / (1 << 20) / elapsed, 1),
              "server_saw": [(e.link.peer_identity, e.link.authenticated_by) for e in publisher.endpoints]}
    await sub.close()
    return result


def token_for(issuer: ec.EllipticCurvePrivateKey) -> bytes:
    now = int(time.time())
    return issue_token(issuer, SUBJECT, namespaces=[NS[:1]], expires_at=now + 60, now=now)


async def main(pki: Path, port: int) -> dict[str, object]:
    issuer = ec.generate_private_key(ec.SECP256R1())
    settings = QuicSettings(send_high_water=1 << 20)  # drain() waits before every object, on any machine
    server_cfg = EndpointConfig.from_files(pki / "server.pem", pki / "server.key", pki / "ca.pem", settings,
                                           token_keys=[issuer.public_key()])
    client_cfg = EndpointConfig(PeerTrust.load(pki / "ca.pem"), settings=settings)
    data = os.urandom(OBJECTS * OBJECT_SIZE)
    source = MemoryTrackSource()
    view = memoryview(data)
    source.put(NS, b"t", [MoqtObject(0, i, view[i * OBJECT_SIZE : (i + 1) * OBJECT_SIZE]) for i in range(OBJECTS)])
    token = token_for(issuer)
    results: dict[str, object] = {}

    publisher = Publisher(source, authorize=allow_authenticated)
    server = await pico_publisher(publisher, port, server_cfg)
    uri = f"moqt://127.0.0.1:{port}/kvsp"
    try:
        results["pico-pico"] = await fetch_all(await pico_subscriber(uri, client_cfg, token), data, publisher)
        results["aioquic-on-pico"] = await fetch_all(await Subscriber.connect(uri, client_cfg, token=token), data,
                                                     publisher)
        results["drain_waits"] = [c.drain_waits for c in SERVED]
    finally:
        await publisher.close()
        server.close()
        await asyncio.wait_for(server.wait_closed(), 5.0)

    aioquic_publisher = Publisher(source, authorize=allow_authenticated)
    aio_port = await aioquic_publisher.listen("127.0.0.1", 0, server_cfg)
    try:
        results["pico-on-aioquic"] = await fetch_all(
            await pico_subscriber(f"moqt://127.0.0.1:{aio_port}/kvsp", client_cfg, token), data, aioquic_publisher)
    finally:
        await aioquic_publisher.close()
    return results


if __name__ == "__main__":
    print(json.dumps(asyncio.run(asyncio.wait_for(main(Path(sys.argv[1]), int(sys.argv[2])), 30.0))))
