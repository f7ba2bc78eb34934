"""The relay in one process over real QUIC and mutual TLS on loopback: routing, cache, fan-out, auth.

Every party (publishers, relays, subscribers) has its own UDP socket and certificate; the process
tests (test_relay_processes.py) run the relays as ``kvsp serve relay`` processes. Every test runs once
per draft, with every party pinned to it (bridging drafts: test_relay_bridge.py, test_moqt_drafts_e2e.py).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from control.deploy.pki import DevPki
from moqt.api import (
    FetchRefused,
    MoqtObject,
    NamespaceRefused,
    Publisher,
    SetupRefused,
    StoredTrack,
    Subscriber,
    SubscribeRefused,
    SubscriptionEnded,
    TransferError,
    allow_authenticated,
)
from moqt.events import ControlMessageReceived, MoqtEvent
from moqt.kinds import PublishDoneStatus, RequestError, SessionError
from moqt.messages import NamespaceNotice, PublishNamespace
from moqt.profiles import Profile
from moqt.wire import Location
from tests.support import relay as relay_support
from tests.support.drafts import PROFILE_PARAMS
from tests.support.relay import (
    NAMES,
    TRACK,
    CountingSource,
    block_namespace,
    client_token,
    endpoint_config,
    fetch_all,
    holder_prefix,
    layers,
    start_publisher,
    start_relay,
    subscriber,
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return DevPki.make(Path(tmp_path_factory.mktemp("relay-pki")), NAMES)


@pytest.fixture(autouse=True, params=PROFILE_PARAMS)
def draft(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, quic_backend: str) -> Profile:
    """Every relay, publisher and subscriber of the test offers and accepts this draft alone, over the
    test's QUIC back-end (``quic_backend``: each one present, tests/support/backends.py)."""
    profile: Profile = request.param
    monkeypatch.setattr(relay_support, "PINNED_DRAFTS", (profile.draft,))
    return profile


async def test_fetch_through_a_relay_then_from_its_cache(pki: DevPki, draft: Profile) -> None:
    node = await start_relay(pki, "relay-a")
    source = CountingSource()
    namespace = block_namespace(pki.uri("pub"), 1)
    sent = layers(8, 4096)
    source.put(namespace, TRACK, sent)
    publisher = await start_publisher(pki, node.uri, source)
    try:
        async with subscriber(pki, node.uri) as sub:
            first = await fetch_all(sub, namespace, 8)
            second = await fetch_all(sub, namespace, 8)
            part = await fetch_all_range(sub, namespace, 2, 5)
        assert [bytes(o.payload) for o in first] == [bytes(o.payload) for o in sent]
        assert [bytes(o.payload) for o in second] == [bytes(o.payload) for o in sent]
        assert [o.object_id for o in part] == [2, 3, 4]
        stats = node.relay.stats
        assert (stats.cache_misses, stats.cache_hits, stats.upstream_fetches) == (1, 2, 1)
        assert source.lookups == 1  # the publisher saw one FETCH
        assert stats.bytes_in == 8 * 4096 and stats.bytes_out == 19 * 4096
        server = node.relay.server
        assert server is not None and server.sessions_by_draft == {draft.draft: 2}  # publisher, subscriber
    finally:
        await publisher.close()
        await node.close()


async def fetch_all_range(sub: Subscriber, namespace: tuple[bytes, ...], first: int, stop: int) -> list[MoqtObject]:
    async with sub.fetch(namespace, TRACK, Location(0, first), Location(0, stop)) as objects:
        return [obj async for obj in objects]


async def test_chain_of_relays_rack_b_spine_rack_a(pki: DevPki) -> None:
    spine = await start_relay(pki, "spine", peers=("relay-a", "relay-b"))
    rack_a = await start_relay(pki, "relay-a", upstream=(spine.uri,), peers=("spine",))
    rack_b = await start_relay(pki, "relay-b", upstream=(spine.uri,), peers=("spine",))
    source = CountingSource()
    namespace = block_namespace(pki.uri("pub"), 2)
    source.put(namespace, TRACK, layers(4, 10_000))
    publisher = await start_publisher(pki, rack_a.uri, source)
    try:
        await wait_for(lambda: spine.relay.table.route(namespace) != [])
        async with subscriber(pki, rack_b.uri) as sub:
            assert len(await fetch_all(sub, namespace, 4)) == 4
            assert len(await fetch_all(sub, namespace, 4)) == 4
        assert rack_b.relay.stats.upstream_fetches == 1 and rack_b.relay.stats.cache_hits == 1
        assert spine.relay.stats.upstream_fetches == 1
        assert rack_a.relay.stats.upstream_fetches == 1
        assert source.lookups == 1
    finally:
        await publisher.close()
        for node in (rack_b, rack_a, spine):
            await node.close()


async def test_objects_larger_than_a_datagram_cross_two_relays_cut_through(pki: DevPki) -> None:
    """Objects of several datagrams are passed on piece by piece at each hop, arrive intact, and the
    copy assembled for the cache is intact too (the second FETCH is a hit at rack B)."""
    spine = await start_relay(pki, "spine", peers=("relay-a", "relay-b"))
    rack_a = await start_relay(pki, "relay-a", upstream=(spine.uri,), peers=("spine",))
    rack_b = await start_relay(pki, "relay-b", upstream=(spine.uri,), peers=("spine",))
    source = CountingSource()
    namespace = block_namespace(pki.uri("pub"), 9)
    sent = [MoqtObject(0, i, memoryview(os.urandom(300_000 + i))) for i in range(3)]
    source.put(namespace, TRACK, sent)
    publisher = await start_publisher(pki, rack_a.uri, source)
    try:
        await wait_for(lambda: spine.relay.table.route(namespace) != [])
        async with subscriber(pki, rack_b.uri) as sub:
            first = await fetch_all(sub, namespace, 3)
            second = await fetch_all(sub, namespace, 3)
        assert [bytes(o.payload) for o in first] == [bytes(o.payload) for o in sent]
        assert [bytes(o.payload) for o in second] == [bytes(o.payload) for o in sent]
        assert rack_b.relay.stats.cache_hits == 1
        for node in (rack_b, spine, rack_a):  # rack A relays the FETCH to the publisher's session
            assert node.relay.stats.cut_through >= 1, node.relay.stats.to_json()
            assert node.relay.stats.objects_in == 3
    finally:
        await publisher.close()
        for node in (rack_b, rack_a, spine):
            await node.close()


class FailingTrack:
    """A stored track whose read fails after ``good`` objects: the publisher resets the fetch stream."""

    def __init__(self, objects: list[MoqtObject], good: int) -> None:
        self.objects, self.good = objects, good
        self.complete = True

    @property
    def largest(self) -> Location | None:
        return self.objects[-1].location

    async def read(self, start: Location, end: Location) -> AsyncIterator[MoqtObject]:
        for obj in self.objects[: self.good]:
            yield obj
        # A QUIC RESET_STREAM abandons what is not sent yet (no RESET_STREAM_AT in aioquic), here and at the
        # relay's downstream reset: let the good objects cross both hops before the failure.
        await asyncio.sleep(0.3)
        raise OSError("the block store failed mid-read")


class FailingSource(CountingSource):
    def __init__(self, track: FailingTrack) -> None:
        super().__init__()
        self.track = track

    async def lookup(self, namespace: tuple[bytes, ...], track_name: bytes) -> StoredTrack | None:
        self.lookups += 1
        return self.track


async def test_upstream_fetch_failing_after_cut_through_resets_downstream_and_caches_nothing(pki: DevPki) -> None:
    node = await start_relay(pki, "relay-a")
    sent = [MoqtObject(0, i, memoryview(os.urandom(200_000))) for i in range(4)]
    source = FailingSource(FailingTrack(sent, good=2))
    namespace = block_namespace(pki.uri("pub"), 10)
    publisher = await start_publisher(pki, node.uri, source)
    try:
        async with subscriber(pki, node.uri) as sub:
            for attempt in (1, 2):
                received: list[bytes] = []
                with pytest.raises(TransferError):
                    async with sub.fetch(namespace, TRACK, Location(0, 0), Location(0, 4)) as objects:
                        async for obj in objects:
                            received.append(bytes(obj.payload))
                assert received == [bytes(o.payload) for o in sent[:2]]  # what came was intact, then the reset
                assert source.lookups == attempt  # nothing was cached: the second FETCH went upstream again
        assert node.relay.stats.cut_through >= 1 and node.relay.stats.cache_hits == 0
    finally:
        await publisher.close()
        await node.close()


async def wait_for(condition: object, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.02)


async def test_fan_out_one_upstream_subscription(pki: DevPki) -> None:
    node = await start_relay(pki, "relay-a")
    publisher = await start_publisher(pki, node.uri)
    namespace = block_namespace(pki.uri("pub"), 3)
    track = publisher.track(namespace, TRACK)
    try:
        async with subscriber(pki, node.uri) as s1, subscriber(pki, node.uri) as s2, \
                subscriber(pki, node.uri) as s3:
            streams = [s.subscribe(namespace, TRACK, end_group=0) for s in (s1, s2, s3)]

            async def collect(stream: object) -> list[int]:
                async with stream as objects:  # type: ignore[attr-defined]
                    return [o.object_id async for o in objects]

            tasks = [asyncio.create_task(collect(s)) for s in streams]
            await wait_for(lambda: node.relay.stats.subscribers == 3)
            for i in range(10):
                track.publish(0, i, bytes(1000))
            track.end_group()
            track.close()
            results = await asyncio.gather(*tasks)
        assert results == [list(range(10))] * 3
        assert node.relay.stats.upstream_subscribes == 1
        assert node.relay.stats.bytes_in == 10_000 and node.relay.stats.bytes_out == 30_000
    finally:
        await publisher.close()
        await node.close()


async def test_publisher_lost_mid_track_ends_subscribers(pki: DevPki) -> None:
    node = await start_relay(pki, "relay-a")
    publisher = await start_publisher(pki, node.uri)
    namespace = block_namespace(pki.uri("pub"), 4)
    track = publisher.track(namespace, TRACK)
    track.publish(0, 0, bytes(100))
    try:
        async with subscriber(pki, node.uri) as sub:
            got: list[int] = []
            with pytest.raises((SubscriptionEnded, TransferError)) as caught:
                async with sub.subscribe(namespace, TRACK, end_group=0) as objects:
                    async for obj in objects:
                        got.append(obj.object_id)
                        # The publisher's session is lost mid-track. Not publisher.close(): that ends its
                        # tracks first, which picoquic delivers (a clean end) where aioquic's close drops it.
                        for endpoint in publisher.endpoints:
                            endpoint.close(SessionError.INTERNAL_ERROR, "lost")
            assert got == [0]
            if isinstance(caught.value, SubscriptionEnded):
                assert caught.value.status is PublishDoneStatus.INTERNAL_ERROR
        await wait_for(lambda: node.relay.table.route(namespace) == [])
        async with subscriber(pki, node.uri) as sub:  # the namespace went with its publisher
            with pytest.raises(FetchRefused) as refused:
                await fetch_all(sub, namespace, 1)
            assert refused.value.error is RequestError.TRACK_DOES_NOT_EXIST
    finally:
        await publisher.close()
        await node.close()


async def test_unauthorized_publish_and_subscribe_are_refused(pki: DevPki) -> None:
    node = await start_relay(pki, "relay-a")
    namespace = block_namespace(pki.uri("pub"), 5)
    evil = Publisher(None, authorize=allow_authenticated)
    try:
        await evil.connect_relay(node.uri, endpoint_config(pki, "evil"), token=client_token(pki, "evil"))
        with pytest.raises(NamespaceRefused) as refused:  # another producer's namespace
            await evil.publish_namespace(holder_prefix(pki.uri("pub")))
        assert refused.value.unauthorized
        with pytest.raises(NamespaceRefused):  # a prefix that would cover every producer
            await evil.publish_namespace((b"kvsp",))
        publisher = await start_publisher(pki, node.uri)
        publisher.track(namespace, TRACK).publish(0, 0, b"secret")
        async with subscriber(pki, node.uri, name="evil") as sub:
            with pytest.raises(FetchRefused) as fetch_refused:
                await fetch_all(sub, namespace, 1)
            assert fetch_refused.value.unauthorized
            with pytest.raises(SubscribeRefused) as sub_refused:
                async with sub.subscribe(namespace, TRACK) as objects:
                    await objects.__anext__()
            assert sub_refused.value.unauthorized
        assert node.relay.stats.refused == 4
        assert node.relay.stats.upstream_fetches == 0 and node.relay.stats.upstream_subscribes == 0
        await publisher.close()
    finally:
        await evil.close()
        await node.close()


async def test_goaway_drains_the_relay(pki: DevPki) -> None:
    node = await start_relay(pki, "relay-a")
    async with subscriber(pki, node.uri) as sub:
        assert sub.usable
        drain = asyncio.create_task(node.relay.drain(2.0))
        await wait_for(lambda: sub.endpoint.session.goaway_received)
        assert not sub.usable  # no new requests on a session told to go away
        with pytest.raises(SetupRefused):  # and no new sessions at a draining relay
            await Subscriber.connect(node.uri, endpoint_config(pki, "sub"), token=client_token(pki, "sub"),
                                     setup_timeout_s=5)
        await sub.close()  # the subscriber leaves; the relay then closes without waiting the grace out
        await asyncio.wait_for(drain, 5)
    await node.close()


async def test_publish_of_a_track_is_relayed_to_subscribers(pki: DevPki) -> None:
    """A publisher may also push one track with PUBLISH (draft-14): the relay accepts it from the owner."""
    node = await start_relay(pki, "relay-a")
    namespace = block_namespace(pki.uri("pub"), 6)
    publisher = Publisher(None, authorize=allow_authenticated)
    endpoint = await publisher.connect_relay(node.uri, endpoint_config(pki, "pub"), token=client_token(pki, "pub"))
    session = endpoint.session
    try:
        request_id = session.publish(namespace, TRACK)
        stream = session.open_subgroup(request_id, 0, end_of_group=True)
        session.send_object(stream, 0, b"layer 0")
        endpoint.link.transmit_soon()
        await wait_for(lambda: (namespace, TRACK) in node.relay.tracks and node.relay.stats.objects_in == 1)
        async with subscriber(pki, node.uri) as sub, \
                sub.subscribe(namespace, TRACK, start=Location(0, 0), end_group=0) as objects:
            got = [bytes((await objects.__anext__()).payload)]  # retained by the relay, then live ones
            session.send_object(stream, 1, b"layer 1")
            session.finish_stream(stream)
            session.publish_done(request_id)
            endpoint.link.transmit_soon()
            got += [bytes(o.payload) async for o in objects]
        assert got == [b"layer 0", b"layer 1"]
        evil = Publisher(None, authorize=allow_authenticated)
        evil_endpoint = await evil.connect_relay(node.uri, endpoint_config(pki, "evil"),
                                                 token=client_token(pki, "evil"))
        evil_endpoint.session.publish(block_namespace(pki.uri("pub"), 7), TRACK)
        evil_endpoint.link.transmit_soon()
        await wait_for(lambda: node.relay.stats.refused == 1)
        assert (block_namespace(pki.uri("pub"), 7), TRACK) not in node.relay.tracks
        await evil.close()
    finally:
        await publisher.close()
        await node.close()


async def test_subscribe_namespace_learns_of_published_namespaces(pki: DevPki) -> None:
    node = await start_relay(pki, "relay-a")
    prefix = holder_prefix(pki.uri("pub"))
    seen: dict[str, list[tuple[bytes, ...]]] = {"sub": [], "evil": []}
    try:
        async with subscriber(pki, node.uri) as sub, subscriber(pki, node.uri, name="evil") as evil:
            for name, client in (("sub", sub), ("evil", evil)):
                handle = client.endpoint.handle

                def spy(event: MoqtEvent, handle: object = handle, name: str = name) -> None:
                    # draft-14: a PUBLISH_NAMESPACE; later drafts: NAMESPACE with the fields after the prefix
                    if isinstance(event, ControlMessageReceived) and isinstance(event.message, PublishNamespace):
                        seen[name].append(event.message.track_namespace)
                    if isinstance(event, ControlMessageReceived) and isinstance(event.message, NamespaceNotice):
                        seen[name].append(prefix[:3] + event.message.track_namespace_suffix)
                    handle(event)  # type: ignore[operator]

                client.endpoint.handle = spy  # type: ignore[method-assign]
                client.endpoint.session.subscribe_namespace(prefix[:3])
                client.endpoint.link.transmit_soon()
            publisher = await start_publisher(pki, node.uri)
            await wait_for(lambda: seen["sub"] == [prefix])
            await asyncio.sleep(0.1)
            assert seen["evil"] == []  # may not read the scope: never learns of the namespace
            await publisher.close()
    finally:
        await node.close()


async def test_subscription_ends_cleanly_at_its_end_group(pki: DevPki) -> None:
    """A subscriber of group 0 only: when group 1 starts, its stream ends with FIN (not a reset) and
    PUBLISH_DONE SUBSCRIPTION_ENDED, while the track goes on for the others."""
    node = await start_relay(pki, "relay-a")
    publisher = await start_publisher(pki, node.uri)
    namespace = block_namespace(pki.uri("pub"), 8)
    track = publisher.track(namespace, TRACK)
    try:
        async with subscriber(pki, node.uri) as sub, \
                sub.subscribe(namespace, TRACK, start=Location(0, 0), end_group=0) as objects:
            await wait_for(lambda: node.relay.stats.subscribers == 1)
            for i in range(3):
                track.publish(0, i, bytes(100))
            await wait_for(lambda: node.relay.stats.objects_out == 3)
            track.publish(1, 0, bytes(100))  # group 0 is over; the track is not
            got = [(o.group, o.object_id) async for o in objects]
            assert got == [(0, 0), (0, 1), (0, 2)]
    finally:
        await publisher.close()
        await node.close()
