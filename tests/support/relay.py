"""Helpers of the relay tests: a dev PKI, KVSP-shaped namespaces, relays and publishers on loopback.

Run as a script (``python -m tests.support.relay subscribe|publish ...``) it is the child process
of the process tests: a subscriber that can be frozen with SIGSTOP, or a publisher that can be killed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from control.deploy.environment import REPO_ROOT
from control.deploy.pki import DevPki
from kvsp.identifiers import role_id
from kvsp.service.policy import Policy, ScopeGrant
from moqt.api import (
    MemoryTrackSource,
    MoqtObject,
    Publisher,
    StoredTrack,
    Subscriber,
    UpstreamLink,
    allow_authenticated,
)
from moqt.events import ControlMessageReceived, MoqtEvent
from moqt.messages import PublishDone
from moqt.quic import EndpointConfig, QuicSettings
from moqt.tracks import MoqtApiError
from moqt.wire import Location, Namespace
from relay.auth import relay_authorizer
from relay.server import Relay
from relay.settings import RelaySettings
from tests.support import backends

SCOPE = bytes(range(16))
COMPAT = hashlib.sha256(b"relay-compat").digest()
TRACK = b"raw"
NAMES = ["spine", "relay-a", "relay-b", "pub", "sub", "evil"]
REPO = REPO_ROOT  # the child processes run from the checkout's root


def block_namespace(publisher_uri: str, block: int) -> Namespace:
    """The five KVSP fields of block ``block`` produced by ``publisher_uri`` (D3)."""
    key = hashlib.sha256(b"block %d" % block).digest()
    return (b"kvsp", COMPAT.hex().encode(), SCOPE.hex().encode(), role_id(publisher_uri).encode(), key.hex().encode())


def holder_prefix(publisher_uri: str) -> Namespace:
    return block_namespace(publisher_uri, 0)[:4]


def policy_for(pki: DevPki) -> Policy:
    """``sub`` may read the scope, ``pub`` may store there; ``evil`` may do nothing."""
    return Policy(scopes={SCOPE: ScopeGrant(read=frozenset({pki.uri("sub")}), store=frozenset({pki.uri("pub")}))})


#: The MOQT drafts every party these helpers start offers and accepts (None: every draft); a test pins
#: one draft for all of them with ``monkeypatch.setattr(tests.support.relay, "PINNED_DRAFTS", (16,))``.
PINNED_DRAFTS: tuple[int, ...] | None = None


def endpoint_config(pki: DevPki, name: str, **quic: float) -> EndpointConfig:
    """``name``'s endpoint on the test's QUIC back-end (`backends.CURRENT`), at the pinned drafts."""
    files = pki.files(name)
    settings = QuicSettings(**{"drafts": PINNED_DRAFTS, "quic": backends.CURRENT, **quic})  # type: ignore[arg-type]
    return EndpointConfig.from_files(files.cert, files.key, files.ca, settings, token_keys=backends.token_keys())


def client_token(pki: DevPki, name: str) -> bytes | None:
    """What ``name`` authenticates with as a client on picoquic (None on aioquic: its certificate): its
    certificate's identity, for every KVSP namespace (the relay's policy then decides by identity)."""
    return backends.token_for(pki.uri(name), namespaces=[(b"kvsp",)])


def layers(count: int, size: int, seed: int = 0) -> list[MoqtObject]:
    return [MoqtObject(0, i, memoryview(bytes([(seed + i) % 251]) * size)) for i in range(count)]


class CountingSource(MemoryTrackSource):
    """A `MemoryTrackSource` that counts the lookups reaching the publisher."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    async def lookup(self, namespace: Namespace, track_name: bytes) -> StoredTrack | None:
        self.lookups += 1
        return await super().lookup(namespace, track_name)


@dataclass
class RelayNode:
    relay: Relay
    uri: str
    links: list[UpstreamLink]

    async def close(self) -> None:
        for link in self.links:
            await link.close()
        await self.relay.close()


async def start_relay(pki: DevPki, name: str, *, upstream: tuple[str, ...] = (), peers: tuple[str, ...] = (),
                      port: int = 0, policy: Policy | None = None, **options: object) -> RelayNode:
    """An in-process relay listening on loopback (``options``: `RelaySettings` fields)."""
    settings = RelaySettings("127.0.0.1", port, "moqt://127.0.0.1:1/relay", upstream=upstream,
                             peers=frozenset(pki.uri(p) for p in peers), **options)  # type: ignore[arg-type]
    relay = Relay(settings, authorize=relay_authorizer(policy or policy_for(pki), peers=settings.peers))
    config = endpoint_config(pki, name)
    bound = await relay.listen("127.0.0.1", port, config)
    links = [UpstreamLink(relay, uri, config, token=client_token(pki, name), base_s=0.05, cap_s=0.5)
             for uri in upstream]
    for link in links:
        link.start()
    for link in links:
        await link.wait_connected(10)
    return RelayNode(relay, f"moqt://127.0.0.1:{bound}/relay", links)


async def start_publisher(pki: DevPki, relay_uri: str, source: MemoryTrackSource | None = None, *,
                          name: str = "pub", prefix: Namespace | None = None) -> Publisher:
    """A publisher connected to ``relay_uri`` that announced its holder prefix there."""
    publisher = Publisher(source, authorize=allow_authenticated)
    await publisher.connect_relay(relay_uri, endpoint_config(pki, name), token=client_token(pki, name))
    await publisher.publish_namespace(prefix or holder_prefix(pki.uri(name)))
    return publisher


@asynccontextmanager
async def subscriber(pki: DevPki, uri: str, name: str = "sub") -> AsyncIterator[Subscriber]:
    sub = await Subscriber.connect(uri, endpoint_config(pki, name), token=client_token(pki, name), timeout_s=20)
    try:
        yield sub
    finally:
        await sub.close()


async def fetch_all(sub: Subscriber, namespace: Namespace, count: int) -> list[MoqtObject]:
    async with sub.fetch(namespace, TRACK, Location(0, 0), Location(0, count)) as objects:
        return [obj async for obj in objects]


# -- child processes ----------------------------------------------------------------------------------------
async def _child_subscribe(args: argparse.Namespace) -> None:
    """Subscribe, print "first" after the first object (the parent then freezes us), then report how it
    ended: the objects received, the API error's code and the PUBLISH_DONE statuses seen."""
    pki = DevPki(Path(args.pki), json.loads(args.uris))
    namespace = block_namespace(pki.uri("pub"), args.block)
    received, error, done = 0, None, []
    async with subscriber(pki, args.uri) as sub:
        endpoint = sub.endpoint
        handle = endpoint.handle

        def spy(event: MoqtEvent) -> None:
            if isinstance(event, ControlMessageReceived) and isinstance(event.message, PublishDone):
                done.append(event.message.status_code)
            handle(event)

        endpoint.handle = spy  # type: ignore[method-assign]
        try:
            async with sub.subscribe(namespace, TRACK, timeout_s=60) as objects:
                async for _ in objects:
                    received += 1
                    if received == 1:
                        print("first", flush=True)
        except MoqtApiError as exc:
            error = repr(getattr(exc, "error", None))
        for _ in range(100):  # PUBLISH_DONE may follow the stream reset
            if done:
                break
            await asyncio.sleep(0.02)
    print(json.dumps({"received": received, "error": error, "publish_done": done}), flush=True)


async def _child_publish(args: argparse.Namespace) -> None:
    pki = DevPki(Path(args.pki), json.loads(args.uris))
    publisher = await start_publisher(pki, args.uri)
    track = publisher.track(block_namespace(pki.uri("pub"), args.block), TRACK)
    track.publish(0, 0, b"x" * 1000)
    print("published", flush=True)
    await asyncio.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["subscribe", "publish"])
    parser.add_argument("--pki", required=True)
    parser.add_argument("--uris", required=True)
    parser.add_argument("--uri", required=True)
    parser.add_argument("--block", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(_child_subscribe(args) if args.role == "subscribe" else _child_publish(args))


if __name__ == "__main__":
    main()
