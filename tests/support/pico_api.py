"""Run by the picoquic venv (tests/test_moqt_picoquic.py): moqt.api's Publisher and Subscriber over picoquic.

``python pico_api.py PKI_DIR PORT``: a Publisher serves a multi-MiB track; Subscribers fetch it, each
authenticated by a D3 token, over three pairings of back-ends, each chosen by ``QuicSettings.quic`` alone
(picoquic to picoquic, an aioquic subscriber on the picoquic server, a picoquic subscriber on an aioquic
server). Prints JSON per pairing:
whether the octets matched, the draft, how often the picoquic publisher's ``drain`` waited, MiB/s.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec

from moqt.api import MemoryTrackSource, MoqtObject, Publisher, Subscriber, allow_authenticated
from moqt.auth import issue_token
from moqt.quic import EndpointConfig, QuicSettings
from moqt.tls import PeerTrust
from moqt.wire import Location, Namespace

NS: Namespace = (b"kvsp-test", b"pico")
OBJECTS, OBJECT_SIZE = 4, 2 << 20  # 8 MiB: beyond aiopquic's 4 MiB stream ring; objects beyond send_high_water
SUBJECT = "https://sub.test/"
async def fetch_all(sub: Subscriber, expected: bytes, publisher: Publisher) -> dict[str, object]:
    start = time.perf_counter()
    got = bytearray()
    async with sub.fetch(NS, b"t", Location(0, 0), Location(0, OBJECTS)) as objects:
        async for obj in objects:
            got += obj.payload
    elapsed = time.perf_counter() - start
    result = {"match": bytes(got) == expected, "octets": len(got), "draft": sub.endpoint.session.profile.draft,
              "client_saw": [sub.peer_identity, sub.endpoint.link.authenticated_by],
              "mib_s": round(len(got) / (1 << 20) / elapsed, 1),
              "server_saw": [(e.link.peer_identity, e.link.authenticated_by) for e in publisher.endpoints],
              "drain_waits": [getattr(e.link, "drain_waits", None) for e in publisher.endpoints]}
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

    pico_server_cfg, pico_client_cfg = (replace(c, settings=replace(settings, quic="picoquic"))
                                        for c in (server_cfg, client_cfg))
    for server_name, scfg in (("pico", pico_server_cfg), ("aioquic", server_cfg)):
        publisher = Publisher(source, authorize=allow_authenticated)
        port = await publisher.listen("127.0.0.1", port if server_name == "pico" else 0, scfg)
        uri = f"moqt://127.0.0.1:{port}/kvsp"
        try:
            for client_name, ccfg in (("pico", pico_client_cfg), ("aioquic", client_cfg)):
                if server_name == client_name == "aioquic":
                    continue
                sub = await Subscriber.connect(uri, ccfg, token=token)
                results[f"{client_name}-on-{server_name}"] = await fetch_all(sub, data, publisher)
        finally:
            await asyncio.wait_for(publisher.close(), 5.0)
    return results


if __name__ == "__main__":
    print(json.dumps(asyncio.run(asyncio.wait_for(main(Path(sys.argv[1]), int(sys.argv[2])), 30.0))))
