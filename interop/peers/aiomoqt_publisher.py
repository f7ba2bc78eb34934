"""aiomoqt publisher: serve KVSP-style blocks with aiomoqt's own ``PublishedTrack``.

Run by the interop venv (Python 3.12, aiomoqt 0.13.3). Every track is one block (interop/content.py
computes each octet; the sizes are --layers/--k-size/--v-size): group 0, object l = layer l.

* ``--stored NS/TRACK``: a block already complete. Its layers are in the track's FETCH history
  from the start, so FETCH (0,0)..(0,layers) is answered by aiomoqt's ``PublishedTrack._on_fetch``;
  a SUBSCRIBE gets SUBSCRIBE_OK with Largest Location (0, layers-1) and, nothing being new,
  PUBLISH_DONE.
* ``--live NS/TRACK``: a block being produced. The first SUBSCRIBE starts production
  (``PublishedTrack.produce``): layer l is written every ``--interval`` seconds on one subgroup
  stream, which aiomoqt ends with an END_OF_GROUP object and FIN, then PUBLISH_DONE.

Two ways to reach it:

* ``--listen PORT --cert C --key K``: a raw-QUIC ``MOQTServer`` accepting the ALPN of ``--draft``
  only (or, with ``--draft all``, every draft aiomoqt has); every session gets its own tracks.
  Reports ``{"kind": "ready", "port": PORT}`` once listening, and ``{"kind": "session", "draft": N}``
  when a session's first request arrives (N: the draft its handshake agreed).
* ``--connect moqt://relay:port/path --ca CA``: a client offering ``--draft`` that announces the
  namespace with PUBLISH_NAMESPACE (``PublishedTrack.publish(announce_namespace=True,
  publish_track=False)``) so a relay routes SUBSCRIBE and FETCH for it here. Reports ``ready`` (with
  the ``draft`` agreed) once PUBLISH_NAMESPACE_OK arrived.

Runs until ``--lifetime`` seconds pass or SIGTERM; reports ``{"kind": "served", ...}`` counters when
a track finishes production.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from functools import partial

from _common import (
    BlockSpec,
    add_block_args,
    add_draft_arg,
    block_from,
    emit,
    parse_moqt_uri,
    quiet_logging,
    supported_drafts,
)
from aiomoqt.client import MOQTClient
from aiomoqt.server import MOQTServer
from aiomoqt.track import PublishedTrack
from aiomoqt.types import MOQTMessageType


class BlockTrack(PublishedTrack):
    """One block on one session, stored (FETCH history filled up front) or live (produced)."""

    def __init__(self, session, block: BlockSpec, *, stored: bool, interval: float) -> None:
        size = block.k_size + block.v_size
        super().__init__(session, namespace=block.namespace, trackname=block.track, object_size=size,
                         group_size=block.layers, fetch_history_bytes=max(1 << 20, 2 * size * block.layers))
        self.block, self.stored, self.interval = block, stored, interval
        if stored:
            for layer in range(block.layers):
                self._remember(0, layer, block.payload(layer), subgroup_id=0)

    async def produce(self, out) -> None:
        if self.stored:
            return  # complete already: a subscriber past Largest Location gets PUBLISH_DONE
        for layer in range(self.block.layers):
            if layer:
                await asyncio.sleep(self.interval)  # "computing" the next layer
            await out.write(0, layer, self.block.payload(layer), group_start=layer == 0)
        emit("served", track=self.block.track.decode(), layers=self.block.layers)


def make_tracks(session, args: argparse.Namespace) -> list[BlockTrack]:
    base = block_from(args)  # --namespace/--track name the first block; every block has its sizes
    tracks = []
    for names, stored in ((args.stored, True), (args.live, False)):
        for name in names:
            tracks.append(BlockTrack(session, base.with_track_arg(name), stored=stored, interval=args.interval))
    return tracks


async def serve(args: argparse.Namespace) -> None:
    server = MOQTServer("127.0.0.1", args.listen, certificate=args.cert, private_key=args.key, use_quic=True,
                        supported_drafts=supported_drafts(args))
    attached: dict[int, list[BlockTrack]] = {}

    async def route(default: str, session, msg) -> None:
        # MOQTServer has no per-session hook, so a session's tracks attach on its first request;
        # from then on aiomoqt routes each SUBSCRIBE/FETCH for a track name to that track.
        if id(session) not in attached:
            attached[id(session)] = make_tracks(session, args)
            emit("session", draft=session.negotiated_draft)
            for track in attached[id(session)]:
                track.attach(session)
        track_handler = session._track_handler(msg)
        if track_handler is not None:
            await track_handler(session, msg)
        else:
            await getattr(session, default)(msg)  # aiomoqt's refusal (TRACK_DOES_NOT_EXIST / NOT_SUPPORTED)

    server.register_handler(MOQTMessageType.SUBSCRIBE, partial(route, "_handle_subscribe"))
    server.register_handler(MOQTMessageType.FETCH, partial(route, "_handle_fetch"))
    handle = await server.serve()
    emit("ready", port=args.listen)
    try:
        await asyncio.sleep(args.lifetime)
    finally:
        await server.close_sessions(timeout=0.5)
        handle.close()


async def announce(args: argparse.Namespace) -> None:
    host, port, path = parse_moqt_uri(args.connect)
    client = MOQTClient(host, port, path=path, use_quic=True, ca_file=args.ca,
                        supported_drafts=supported_drafts(args))
    async with client.connect() as session:
        await session.client_session_init(timeout=10)
        announced: set[tuple[bytes, ...]] = set()
        for track in make_tracks(session, args):
            if track.block.namespace in announced:
                track.attach(session)
                continue
            announced.add(track.block.namespace)
            # PUBLISH_NAMESPACE, answered before the next: the relay routes the namespace here.
            await track.publish(announce_namespace=True, publish_track=False)
        emit("ready", draft=session.negotiated_draft, namespaces=[[f.hex() for f in ns] for ns in sorted(announced)])
        closed = asyncio.ensure_future(session.async_closed())
        await asyncio.wait([closed], timeout=args.lifetime)
        closed.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--listen", type=int, help="serve raw QUIC on this UDP port")
    where.add_argument("--connect", help="moqt:// URI of a relay to PUBLISH_NAMESPACE to")
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--ca", help="CA file the relay's certificate must chain to (--connect)")
    parser.add_argument("--stored", action="append", default=[], metavar="HEX,HEX,.../TRACK",
                        help="a complete block (FETCH history filled up front)")
    parser.add_argument("--live", action="append", default=[], metavar="HEX,HEX,.../TRACK",
                        help="a block produced on the first SUBSCRIBE")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between live layers")
    parser.add_argument("--lifetime", type=float, default=60.0)
    parser.add_argument("--debug", action="store_true")
    add_draft_arg(parser)
    add_block_args(parser)
    args = parser.parse_args()
    if not args.stored and not args.live:
        parser.error("serve at least one --stored or --live block")
    if args.listen is not None and not (args.cert and args.key):
        parser.error("--listen needs --cert and --key")
    quiet_logging(args.debug)

    async def run() -> None:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):  # SIGTERM: leave through the finally blocks
            await (serve(args) if args.listen is not None else announce(args))

    try:
        asyncio.run(run())
    except Exception as exc:
        emit("error", error=f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    main()
