"""kvsp's side of the interop suite on the picoquic back-end: ``moqt.api`` with ``QuicSettings(quic="picoquic")``.

aiopquic needs Python >= 3.12 while the test process may be 3.11, so tests/test_interop_picoquic.py runs
this module as a subprocess of the picoquic venv (``.venv-pico``: this tree and aiopquic 0.6.1), speaking
the ``@interop`` JSON-line protocol of interop/harness.py (``PeerProcess``). Only the public API is used
(``Publisher.listen``, ``Publisher.connect_relay``, ``Subscriber.connect``), so the back-end is chosen by
the settings alone, as a role's ``[moqt] quic = "picoquic"`` would choose it.

* ``serve``: a Publisher listening on picoquic. Clients authenticate by D3 token only (a picoquic server
  never sees a client certificate); each accepted or refused setup is reported (``session``: the token's
  subject, how it was authenticated, the draft of the session and of the ALPN), and so is each request.
* ``subscribe``: a Subscriber dialling over picoquic; FETCHes the ``--stored`` blocks, then SUBSCRIBEs to the
  ``--live`` ones, and reports every object (hex) and the draft agreed (``result``), then exits.
* ``announce``: a Publisher dialling a relay over picoquic and publishing its blocks' namespaces there;
  ``ready`` once the relay answered, then it serves the relay's requests until SIGTERM.

Blocks are interop/content.py's: the stored ones are in a ``MemoryTrackSource`` from the start, a live one is
produced (layer l every ``--interval`` s, then end of group and PUBLISH_DONE) from its first SUBSCRIBE on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from interop.content import BlockSpec
from kvsp.moqt_binding import kvsp_token_rule
from moqt.api import (
    Endpoint,
    LiveTrack,
    MemoryTrackSource,
    MoqtApiError,
    MoqtObject,
    Publisher,
    Subscriber,
    allow_authenticated,
)
from moqt.events import SetupRequested
from moqt.messages import Fetch, Subscribe
from moqt.quic import EndpointConfig, QuicSettings
from moqt.quic.backend import QuicLink
from moqt.tls import PeerTrust
from moqt.wire import Location

PREFIX = "@interop "
T = 10.0  # one request's bound, as in tests/test_interop.py


def emit(kind: str, **fields: object) -> None:
    print(PREFIX + json.dumps({"kind": kind, **fields}, sort_keys=True), flush=True)


def settings(drafts: Sequence[int] | None) -> QuicSettings:
    """The interop suite's settings (interop/endpoints.py INTEROP_SETTINGS) on picoquic."""
    return QuicSettings(handshake_timeout_s=5.0, auth_timeout_s=5.0, quic="picoquic",
                        drafts=tuple(drafts) if drafts else None)


def alpn_of(endpoint: Endpoint) -> str | None:
    """The ALPN the handshake agreed, as the connection's aioquic-shaped ``quic`` (the shim) reports it."""
    return cast(QuicLink, endpoint.link).quic.tls.alpn_negotiated


def transport_of(endpoint: Endpoint) -> str:
    """The connection class under the endpoint: proof the settings chose picoquic (``PicoConnection``),
    since the ALPN, token and draft would look the same over aioquic."""
    return type(endpoint.link).__name__


def blocks_of(args: argparse.Namespace) -> tuple[list[BlockSpec], list[BlockSpec]]:
    """The ``--stored`` and ``--live`` blocks, all of the sizes given (as interop/peers/aiomoqt_publisher.py)."""
    base = BlockSpec.from_args(args.namespace, args.track, args.layers, args.k_size, args.v_size)
    return [base.with_track_arg(a) for a in args.stored], [base.with_track_arg(a) for a in args.live]


# -- publishing --------------------------------------------------------------------------------------
class BlockPublisher(Publisher):
    """A Publisher that reports its setups and requests, and produces a live block on its first SUBSCRIBE."""

    def __init__(self, stored: Sequence[BlockSpec], live: Sequence[BlockSpec], interval: float) -> None:
        source = MemoryTrackSource()
        for block in stored:
            source.put(block.namespace, block.track, [MoqtObject(0, layer, memoryview(block.payload(layer)))
                                                      for layer in range(block.layers)])
        super().__init__(source, authorize=allow_authenticated, token_rule=kvsp_token_rule)  # tokens name scopes (D3)
        self.interval = interval
        self.pending = {(b.namespace, b.track): (b, self.track(b.namespace, b.track)) for b in live}
        self.producers: list[asyncio.Task[None]] = []

    def on_setup(self, endpoint: Endpoint, event: SetupRequested) -> None:
        super().on_setup(endpoint, event)
        link = endpoint.link
        by_draft = dict(self.server.sessions_by_draft) if self.server is not None else {}
        emit("session", accepted=endpoint.usable, identity=link.peer_identity, authenticated_by=link.authenticated_by,
             draft=endpoint.session.profile.draft, alpn=alpn_of(endpoint), transport=transport_of(endpoint),
             sessions_by_draft={str(k): v for k, v in by_draft.items()})

    def on_request(self, endpoint: Endpoint, message: Fetch | Subscribe) -> None:
        super().on_request(endpoint, message)
        if isinstance(message, Subscribe):
            emit("request", type="subscribe", track=message.track_name.decode(), draft=endpoint.session.profile.draft)
            self._produce((tuple(message.track_namespace), message.track_name))
        else:
            wanted = message.standalone
            track = wanted.track_name.decode() if wanted is not None else None
            emit("request", type="fetch", track=track, draft=endpoint.session.profile.draft)

    def _produce(self, key: tuple[tuple[bytes, ...], bytes]) -> None:
        # The block is "computed" only once someone listens, so a Largest Object subscriber sees every layer.
        found = self.pending.pop(key, None)
        if found is not None:
            self.producers.append(asyncio.ensure_future(self._layers(*found)))

    async def _layers(self, block: BlockSpec, track: LiveTrack) -> None:
        for layer in range(block.layers):
            if layer:
                await asyncio.sleep(self.interval)
            track.publish(0, layer, block.payload(layer))
        track.end_group()
        track.close()  # PUBLISH_DONE TRACK_ENDED to every subscriber
        emit("served", track=block.track.decode(), layers=block.layers)


def token_keys(path: str | None) -> tuple[ec.EllipticCurvePublicKey, ...]:
    if path is None:
        return ()
    key = load_pem_public_key(Path(path).read_bytes())
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise SystemExit(f"{path}: not an EC public key")
    return (key,)


async def serve(args: argparse.Namespace) -> None:
    publisher = BlockPublisher(*blocks_of(args), args.interval)
    config = EndpointConfig.from_files(Path(args.cert), Path(args.key), Path(args.ca), settings(args.drafts),
                                       token_keys=token_keys(args.token_key))
    port = await publisher.listen("127.0.0.1", args.port, config)
    emit("ready", port=port)
    try:
        await asyncio.sleep(args.lifetime)
    finally:
        await asyncio.wait_for(publisher.close(), 5.0)


async def announce(args: argparse.Namespace) -> None:
    stored, live = blocks_of(args)
    publisher = BlockPublisher(stored, live, args.interval)
    for namespace in dict.fromkeys(b.namespace for b in (*stored, *live)):
        await publisher.publish_namespace(namespace)  # sent to the relay once it is connected
    config = EndpointConfig(PeerTrust.load(Path(args.ca)), settings=settings(args.drafts))
    token = bytes.fromhex(args.token) if args.token else None
    endpoint = await publisher.connect_relay(args.uri, config, token=token)
    emit("ready", draft=endpoint.session.profile.draft, alpn=alpn_of(endpoint), transport=transport_of(endpoint),
         peer_identity=endpoint.link.peer_identity, authenticated_by=endpoint.link.authenticated_by)
    try:
        await asyncio.sleep(args.lifetime)
    finally:
        await asyncio.wait_for(publisher.close(), 5.0)


# -- subscribing -------------------------------------------------------------------------------------
def object_json(obj: MoqtObject, at: float) -> dict[str, object]:
    return {"group": obj.group, "subgroup": obj.subgroup, "object": obj.object_id, "status": obj.status.value,
            "payload": bytes(obj.payload).hex(), "at": at}


async def collect(sub: Subscriber, block: BlockSpec, mode: str) -> dict[str, object]:
    """One FETCH of the whole block or one SUBSCRIBE (Largest Object: from the next object on), to its end."""
    loop = asyncio.get_running_loop()
    if mode == "fetch":
        stream = sub.fetch(block.namespace, block.track, Location(0, 0), Location(0, block.layers), timeout_s=T)
    else:
        stream = sub.subscribe(block.namespace, block.track, start=None, timeout_s=T)
    objects: list[dict[str, object]] = []
    result: dict[str, object] = {"mode": mode, "track": block.track.decode(), "objects": objects}
    try:
        async with stream:
            result["reply"] = type(await stream.answered()).__name__
            async for obj in stream:
                objects.append(object_json(obj, loop.time()))
        result["ended"] = True
    except (MoqtApiError, TimeoutError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result


async def subscribe(args: argparse.Namespace) -> None:
    stored, live = blocks_of(args)
    config = EndpointConfig(PeerTrust.load(Path(args.ca)), settings=settings(args.drafts))
    token = bytes.fromhex(args.token) if args.token else None
    sub = await Subscriber.connect(args.uri, config, token=token)
    try:
        endpoint = sub.endpoint
        setup = endpoint.session.peer_parameters
        report: dict[str, object] = {
            "draft": endpoint.session.profile.draft, "alpn": alpn_of(endpoint), "peer_identity": sub.peer_identity,
            "authenticated_by": endpoint.link.authenticated_by, "transport": transport_of(endpoint),
            "implementation": setup.implementation if setup is not None else None}
        # FETCH first: aiomoqt sends no PUBLISH_DONE for Request ID 0 (interop/README.md, difference 2).
        requests = [(b, "fetch") for b in stored] + [(b, "subscribe") for b in live]
        report["tracks"] = [await collect(sub, block, mode) for block, mode in requests]
    finally:
        await sub.close()
    emit("result", **report)


# -- command line ------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("mode", choices=("serve", "subscribe", "announce"))
    p.add_argument("--uri", help="moqt:// URI to dial (subscribe, announce)")
    p.add_argument("--port", type=int, help="UDP port to listen on (serve; aiopquic cannot bind port 0)")
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--ca", required=True, help="the CA our peer's certificate must chain to (and our server's)")
    p.add_argument("--token-key", help="PEM public key whose tokens a server accepts (serve)")
    p.add_argument("--token", default="", help="AUTHORIZATION TOKEN to present, hex (subscribe, announce)")
    p.add_argument("--drafts", type=int, action="append", help="offer / accept only these drafts (default: all)")
    p.add_argument("--stored", action="append", default=[], metavar="HEX,.../TRACK")
    p.add_argument("--live", action="append", default=[], metavar="HEX,.../TRACK")
    p.add_argument("--interval", type=float, default=0.05)
    p.add_argument("--lifetime", type=float, default=60.0)
    for name in ("--namespace", "--track"):
        p.add_argument(name, required=True)
    for name in ("--layers", "--k-size", "--v-size"):
        p.add_argument(name, type=int, required=True)
    return p


async def run(args: argparse.Namespace) -> None:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    work = {"serve": serve, "subscribe": subscribe, "announce": announce}[args.mode]
    with contextlib.suppress(asyncio.CancelledError):  # SIGTERM: leave through the finally blocks
        await work(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        asyncio.run(run(args))
    except Exception as exc:  # reported, so the test's message says what failed rather than "exited"
        emit("error", error=f"{type(exc).__name__}: {exc}")
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
