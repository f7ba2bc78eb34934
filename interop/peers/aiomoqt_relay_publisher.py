"""aiomoqt publisher announcing to a relay that authenticates it: ``aiomoqt_publisher.py --connect`` plus
``--token HEX``, sent as the AUTHORIZATION TOKEN setup parameter (kvsp's relay, decision D3, accepts a
peer only with a client certificate or a token, and aiomoqt's client presents no certificate).

Everything else -- the blocks, ``ready``/``served`` reports, the lifetime -- is ``aiomoqt_publisher.py``'s;
this script replaces only its ``announce`` so that the setup carries the token.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import aiomoqt_publisher as base
from _common import emit, parse_moqt_uri, supported_drafts
from aiomoqt.client import MOQTClient
from aiomoqt.types import SetupParamType


def _take_token(argv: list[str]) -> bytes:
    if "--token" not in argv:
        raise SystemExit("--token HEX is required")
    index = argv.index("--token")
    token = bytes.fromhex(argv[index + 1])
    del argv[index : index + 2]
    return token


TOKEN = b""


async def announce(args: argparse.Namespace) -> None:
    host, port, path = parse_moqt_uri(args.connect)
    client = MOQTClient(host, port, path=path, use_quic=True, ca_file=args.ca,
                        supported_drafts=supported_drafts(args))
    async with client.connect() as session:
        await session.client_session_init(timeout=10, parameters={SetupParamType.AUTH_TOKEN: TOKEN})
        announced: set[tuple[bytes, ...]] = set()
        for track in base.make_tracks(session, args):
            if track.block.namespace in announced:
                track.attach(session)
                continue
            announced.add(track.block.namespace)
            await track.publish(announce_namespace=True, publish_track=False)
        emit("ready", draft=session.negotiated_draft, namespaces=[[f.hex() for f in ns] for ns in sorted(announced)])
        closed = asyncio.ensure_future(session.async_closed())
        await asyncio.wait([closed], timeout=args.lifetime)
        closed.cancel()


if __name__ == "__main__":
    TOKEN = _take_token(sys.argv)
    base.announce = announce
    base.main()
