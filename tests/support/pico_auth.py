"""Run by the picoquic venv (tests/test_moqt_picoquic.py): token-only authentication on a picoquic server.

``python pico_auth.py PKI_DIR PORT``: a picoquic Publisher with ``auth_timeout_s`` 1 s. A client that
completes the handshake and never sets up is closed UNAUTHORIZED by the deadline (an application close);
one that goes quiet after setup ends at the idle timeout (a transport close); over a per-address cap of
two connections the third is closed at once; a Subscriber with no
token is refused at setup; one that trusts another CA fails its handshake; one with a valid token is
served, then sent GOAWAY with a timeout it ignores, so the server session's timer closes it
GOAWAY_TIMEOUT. Prints JSON of what each saw.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from aioquic.quic import events as qe
from cryptography.hazmat.primitives.asymmetric import ec

from kvsp.pki import RoleSpec, make_dev_pki
from moqt.api import MemoryTrackSource, MoqtObject, Publisher, SetupRefused, Subscriber, allow_authenticated
from moqt.kinds import SessionError
from moqt.quic import ConnectionClosedError, EndpointConfig, QuicSettings
from moqt.quic.pico import PicoConnection, pico_connect
from moqt.tls import PeerTrust
from moqt.wire import Location

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the checkout's tests package
from tests.support.pico_api import NS, token_for

AUTH_TIMEOUT_S = 1.0
GOAWAY_TIMEOUT_S = 0.5
IDLE_TIMEOUT_S = 1.0


class Silent:
    """A session that never sends CLIENT_SETUP: the peer the auth deadline is for."""

    def handle_event(self, event: qe.QuicEvent) -> Sequence[object]:
        return []


async def idle_out(uri: str, config: EndpointConfig, token: bytes) -> dict[str, object]:
    """A served subscriber that goes quiet (no keepalive, a 1 s idle timeout): picoquic ends the connection,
    which must read as a transport close, not as the server's application close."""
    quiet = replace(config, settings=replace(config.settings, idle_timeout_s=IDLE_TIMEOUT_S, keepalive=False))
    sub = await Subscriber.connect(uri, quiet, token=token)
    start = time.monotonic()
    await asyncio.wait_for(sub.endpoint.link.wait_closed(), IDLE_TIMEOUT_S * 4)
    event = sub.endpoint.link.close_event  # type: ignore[attr-defined]  # PicoConnection's, not Link's
    return {"after_s": round(time.monotonic() - start, 2), "application": event.frame_type is None}


async def capped(config: EndpointConfig, client: EndpointConfig, token: bytes) -> dict[str, object]:
    """A picoquic publisher with max_connections_per_client 2: the third connection from 127.0.0.1 is
    closed at once and counted, the first two are served."""
    settings = replace(config.settings, max_connections_per_client=2)
    publisher = Publisher(MemoryTrackSource(), authorize=allow_authenticated)
    port = await publisher.listen("127.0.0.1", 0, replace(config, settings=settings))
    uri = f"moqt://127.0.0.1:{port}/kvsp"
    subs, outcomes = [], []
    try:
        for _ in range(3):
            try:
                subs.append(await Subscriber.connect(uri, client, token=token, setup_timeout_s=3.0))
                outcomes.append("served")
            except (ConnectionClosedError, SetupRefused, TimeoutError) as exc:
                outcomes.append(type(exc).__name__)
        server = publisher.server
        return {"outcomes": outcomes, "refused": None if server is None else server.refused}
    finally:
        for sub in subs:
            await sub.close()
        await asyncio.wait_for(publisher.close(), 5.0)


async def main(pki: Path, port: int) -> dict[str, object]:
    issuer = ec.generate_private_key(ec.SECP256R1())
    settings = QuicSettings(auth_timeout_s=AUTH_TIMEOUT_S, quic="picoquic")
    server_cfg = EndpointConfig.from_files(pki / "server.pem", pki / "server.key", pki / "ca.pem", settings,
                                           token_keys=[issuer.public_key()])
    client_cfg = EndpointConfig(PeerTrust.load(pki / "ca.pem"), settings=settings)
    source = MemoryTrackSource()
    source.put(NS, b"t", [MoqtObject(0, 0, memoryview(b"x" * 1000))])
    publisher = Publisher(source, authorize=allow_authenticated)
    await publisher.listen("127.0.0.1", port, server_cfg)
    uri = f"moqt://127.0.0.1:{port}/kvsp"
    seen: dict[str, object] = {}
    try:
        start = time.monotonic()
        silent: PicoConnection[object] = await pico_connect(uri, client_cfg, lambda conn: Silent())
        await asyncio.wait_for(silent.wait_closed(), AUTH_TIMEOUT_S + 2.0)
        assert silent.close_event is not None
        seen["silent"] = {"closed_after_s": round(time.monotonic() - start, 2), "code": silent.close_event.error_code,
                          "unauthorized": silent.profile.session_errors.code(SessionError.UNAUTHORIZED),
                          "application": silent.close_event.frame_type is None}
        seen["idle"] = await idle_out(uri, client_cfg, token_for(issuer))
        seen["capped"] = await capped(server_cfg, client_cfg, token_for(issuer))
        try:
            await Subscriber.connect(uri, client_cfg)
            seen["tokenless"] = "served"
        except SetupRefused as exc:
            seen["tokenless"] = str(exc.error)
        with tempfile.TemporaryDirectory() as other:  # a client trusting another CA: picotls refuses the server
            make_dev_pki(Path(other), [RoleSpec("server", "https://127.0.0.1:1/server/")])
            try:
                await Subscriber.connect(uri, EndpointConfig(PeerTrust.load(Path(other) / "ca.pem"), settings=settings),
                                        token=token_for(issuer))
                seen["untrusted"] = "connected"
            except ConnectionClosedError as exc:
                seen["untrusted"] = {"application": exc.application}
        sub = await Subscriber.connect(uri, client_cfg, token=token_for(issuer))
        async with sub.fetch(NS, b"t", Location(0, 0), Location(0, 1)) as objects:
            seen["token"] = [len(obj.payload) async for obj in objects]
        seen["identity"] = [e.link.peer_identity for e in publisher.endpoints]
        served = next(e for e in publisher.endpoints if e.link.peer_identity is not None)
        start = time.monotonic()  # GOAWAY with a 0.5 s timeout the subscriber ignores: the session timer fires
        served.session.goaway(now=asyncio.get_running_loop().time(), timeout=GOAWAY_TIMEOUT_S)
        served.link.transmit_soon()
        await asyncio.wait_for(sub.endpoint.link.wait_closed(), GOAWAY_TIMEOUT_S + 2.0)
        lost = sub.endpoint.closed_error
        seen["goaway"] = {"received": sub.endpoint.session.goaway_received,
                          "after_s": round(time.monotonic() - start, 2),
                          "closed_with": None if lost is None else str(lost.error)}
    finally:
        await asyncio.wait_for(publisher.close(), 5.0)
    return seen


if __name__ == "__main__":
    print(json.dumps(asyncio.run(asyncio.wait_for(main(Path(sys.argv[1]), int(sys.argv[2])), 20.0))))
