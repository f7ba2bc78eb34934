"""The MOQT drafts a test runs at: one parameter per profile of ``moqt.profiles.PROFILES``.

Why from PROFILES and not a list of our own: a draft the package learns (draft-18) then runs every
parametrized test without an edit here. ``DRAFTS`` parametrizes a test's ``profile`` argument;
``BRIDGES`` gives every (upstream, downstream) pair of two different drafts, for the relay, and
`MemoryRelay` runs a relay in memory with each peer at its own draft.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from moqt.api import ObjectStream, Publisher, Subscriber, allow_authenticated
from moqt.api.memory import MemoryNet
from moqt.profiles import PROFILES, Profile
from moqt.tracks import ObjectAssembler, RequestKind, RequestTracker
from moqt.wire import Namespace
from relay.server import Relay
from relay.settings import RelaySettings


def draft_id(profile: Profile) -> str:
    """``d14``, ``d16``, ...: the test id of a profile."""
    return f"d{profile.draft}"


PROFILE_PARAMS: list[Any] = [pytest.param(p, id=draft_id(p)) for p in PROFILES]
BRIDGE_PARAMS: list[Any] = [pytest.param(up, down, id=f"{draft_id(up)}-to-{draft_id(down)}")
                            for up, down in itertools.permutations(PROFILES, 2)]

#: ``@DRAFTS`` runs the test once per draft with its ``profile`` argument.
DRAFTS = pytest.mark.parametrize("profile", PROFILE_PARAMS)
#: ``@BRIDGES`` runs the test once per (publisher's draft, subscriber's draft) pair of different drafts.
BRIDGES = pytest.mark.parametrize(("upstream", "downstream"), BRIDGE_PARAMS)


def joining(sub: Subscriber, subscription: int, start: int, timeout_s: float = 20.0) -> ObjectStream:
    """A relative joining FETCH of ``subscription``, ``start`` groups back (the API has no call of its
    own for one)."""
    endpoint = sub.endpoint
    request_id = endpoint.session.joining_fetch(subscription, start)
    inbox = endpoint.open_inbox(request_id, RequestTracker(RequestKind.FETCH), ObjectAssembler())
    endpoint.link.transmit_soon()
    return ObjectStream(endpoint, request_id, inbox, timeout_s)


class MemoryRelay:
    """A `Relay` in memory with one `MemoryNet` per peer, each at its own draft (a relay bridging drafts).

    ``publisher(p, profile)`` connects a publisher as relays' publishers do (it is the client and
    announces its namespaces); ``subscriber(profile)`` opens a subscriber's session.
    """

    def __init__(self, **settings: Any) -> None:
        options = {"upstream_stall_s": 10.0, "upstream_timeout_s": 20.0, **settings}
        self.relay = Relay(RelaySettings("127.0.0.1", 0, "moqt://127.0.0.1:1/relay", **options),
                           authorize=allow_authenticated)
        self.nets: list[MemoryNet] = []

    async def publisher(self, publisher: Publisher, profile: Profile, *namespaces: Namespace) -> MemoryNet:
        net = MemoryNet(profile=profile, client_identity="https://publisher.test/",
                        server_identity="https://relay.test/")
        self.nets.append(net)
        net.serve(self.relay)
        await net.connect_publisher(publisher)
        for namespace in namespaces:
            await publisher.publish_namespace(namespace)
        return net

    async def subscriber(self, profile: Profile) -> Subscriber:
        net = MemoryNet(profile=profile, server_identity="https://relay.test/")
        self.nets.append(net)
        net.serve(self.relay)
        return await net.subscriber(timeout_s=10.0)

    async def close(self) -> None:
        await self.relay.close()
