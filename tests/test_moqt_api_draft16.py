"""moqt.api's duties where drafts answer differently (issue 18 item 1), at every draft, in memory.

Each expectation is read from the profile (its error table, framing flags, messages), as the API
decides it, so a new profile runs these without an edit: an empty FETCH range (NO_OBJECTS, or from
draft-16 FETCH_OK and an empty fetch stream), a joining FETCH before any object (INVALID_RANGE), no
Object Status on a fetch stream that cannot carry one, REQUEST_UPDATE answered (and a refused one
ending its subscription with UPDATE_FAILED), SUBSCRIBE_NAMESPACE served by its Subscribe Options.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest

from moqt.api import (
    FetchRefused,
    MemoryTrackSource,
    MoqtObject,
    Publisher,
    StreamResetError,
    Subscriber,
    SubscriptionEnded,
    allow_authenticated,
)
from moqt.api.drafts import has_error, writable_status
from moqt.api.memory import MemoryLink, MemoryNet
from moqt.events import ControlMessageReceived, MoqtEvent
from moqt.kinds import MessageKind, ObjectStatus, PublishDoneStatus, RequestError, SubscribeOptions
from moqt.messages import (
    ControlMessage,
    FetchOk,
    NamespaceDone,
    NamespaceNotice,
    PublishDone,
    PublishNamespace,
    SubscribeNamespaceOk,
)
from moqt.params import RequestParameters
from moqt.profiles import PROFILES, Profile
from moqt.wire import Location, Namespace
from tests.support.drafts import DRAFTS, MemoryRelay, draft_id, joining

T = 20.0
NS: Namespace = (b"kvsp", b"d16", b"api")
UPDATING = [pytest.param(p, id=draft_id(p)) for p in PROFILES if p.has_message(MessageKind.REQUEST_UPDATE)]
NOTICES = [pytest.param(p, id=draft_id(p)) for p in PROFILES if p.layout.subscribe_namespace_options]


async def served(publisher: Publisher, profile: Profile) -> Subscriber:
    net = MemoryNet(profile=profile)
    net.serve(publisher)
    return await net.subscriber(timeout_s=10.0)


def spy(sub: Subscriber) -> list[ControlMessage]:
    """The control messages the subscriber's endpoint receives from now on (and still handles)."""
    seen: list[ControlMessage] = []
    handle = sub.endpoint.handle

    def watch(event: MoqtEvent) -> None:
        if isinstance(event, ControlMessageReceived):
            seen.append(event.message)
        handle(event)

    link = sub.endpoint.link
    assert isinstance(link, MemoryLink)
    link.handler = watch  # the in-memory link hands each event to this handler
    return seen


async def settle(condition: object, seen: list[ControlMessage]) -> None:
    """Wait (bounded) until a message of type ``condition`` has been seen."""
    async with asyncio.timeout(T):
        while not any(isinstance(m, condition) for m in seen):  # type: ignore[arg-type]
            await asyncio.sleep(0.005)


async def collect(stream: AsyncIterator[MoqtObject]) -> list[MoqtObject]:
    return [obj async for obj in stream]


@DRAFTS
async def test_an_empty_track_is_refused_or_answered_with_an_empty_fetch_stream(profile: Profile) -> None:
    source = MemoryTrackSource()
    source.put(NS, b"empty", [])
    sub = await served(Publisher(source, authorize=allow_authenticated), profile)
    objects = sub.fetch(NS, b"empty", Location(0, 0), Location(0, 4))
    if has_error(profile, MessageKind.FETCH_ERROR, RequestError.NO_OBJECTS):
        with pytest.raises(FetchRefused) as info:
            async with asyncio.timeout(T), objects:
                await collect(objects)
        assert info.value.error is RequestError.NO_OBJECTS
        return
    async with asyncio.timeout(T), objects:
        ok = await objects.answered()
        assert await collect(objects) == []  # the header, then FIN: "no Objects exist in the requested range"
    assert isinstance(ok, FetchOk) and ok.end_location == Location(0, 0) and not ok.end_of_track


@DRAFTS
async def test_fetch_streams_carry_object_status_only_where_the_draft_can(profile: Profile) -> None:
    source = MemoryTrackSource()
    source.put(NS, b"t", [MoqtObject(0, 0, memoryview(b"abc")), MoqtObject(0, 1, memoryview(b"def")),
                          MoqtObject(0, 2, memoryview(b""), status=ObjectStatus.END_OF_GROUP)])
    sub = await served(Publisher(source, authorize=allow_authenticated), profile)
    async with asyncio.timeout(T), sub.fetch(NS, b"t", Location(0, 0), Location(1, 0)) as objects:
        got = await collect(objects)
    marker = writable_status(profile, ObjectStatus.END_OF_GROUP, fetch=True)
    assert [(o.object_id, o.status) for o in got] == [(0, ObjectStatus.NORMAL), (1, ObjectStatus.NORMAL)] + (
        [(2, ObjectStatus.END_OF_GROUP)] if marker else [])
    assert marker is not profile.data_framing.fetch_serialization_flags


@DRAFTS
async def test_joining_fetch_before_any_object_is_invalid_range_after_it_the_objects(profile: Profile) -> None:
    publisher = Publisher(authorize=allow_authenticated)
    track = publisher.track(NS, b"live", retain_groups=2)
    sub = await served(publisher, profile)
    async with asyncio.timeout(T), sub.subscribe(NS, b"live", start=None) as live:
        await live.answered()
        with pytest.raises(FetchRefused) as info:
            async with joining(sub, live.request_id, 0) as objects:
                await collect(objects)
        assert info.value.error is RequestError.INVALID_RANGE
    for i in range(3):
        track.publish(0, i, bytes([i]) * 10)
    async with asyncio.timeout(T), sub.subscribe(NS, b"live", start=None) as live:
        await live.answered()
        async with joining(sub, live.request_id, 0) as objects:
            got = await collect(objects)
    assert [(o.location, bytes(o.payload)) for o in got] == [(Location(0, i), bytes([i]) * 10) for i in range(3)]
    track.close()


@pytest.mark.parametrize("profile", UPDATING)
@pytest.mark.parametrize("via_relay", [False, True], ids=["publisher", "relay"])
async def test_request_update_is_answered_and_a_refused_one_ends_the_subscription(profile: Profile,
                                                                                  via_relay: bool) -> None:
    """At a publisher and at our relay (which registers the subscriptions it serves the same way)."""
    publisher = Publisher(authorize=allow_authenticated)
    track = publisher.track(NS, b"live")
    world = MemoryRelay()
    if via_relay:
        await world.publisher(publisher, profile, NS[:1])
        sub = await world.subscriber(profile)
    else:
        sub = await served(publisher, profile)
    seen = spy(sub)
    session = sub.endpoint.session
    async with asyncio.timeout(T), sub.subscribe(NS, b"live") as live:
        await live.answered()
        track.publish(0, 0, b"first")
        assert bytes((await anext(live)).payload) == b"first"
        session.request_update(live.request_id, RequestParameters(subscriber_priority=7))
        sub.endpoint.link.transmit_soon()
        await settle(MessageKindOf(MessageKind.REQUEST_OK), seen)
        track.publish(0, 1, b"second")
        assert bytes((await anext(live)).payload) == b"second"  # still served after an accepted update
        session.request_update(live.request_id, RequestParameters(forward=False))  # pausing is not served
        sub.endpoint.link.transmit_soon()
        await settle(PublishDone, seen)  # read before the consumer gives up on the reset (UNSUBSCRIBE)
        with pytest.raises((SubscriptionEnded, StreamResetError)):  # the open stream's reset may come first
            await collect(live)
    assert any(m.KIND is MessageKind.REQUEST_ERROR for m in seen)
    [done] = [m for m in seen if isinstance(m, PublishDone)]
    assert profile.publish_done.name(done.status_code) is PublishDoneStatus.UPDATE_FAILED
    track.close()
    await world.close()


class MessageKindOf:
    """``isinstance``-style match of a control message by its draft-neutral kind."""

    def __init__(self, kind: MessageKind) -> None:
        self.kind = kind

    def __instancecheck__(self, message: object) -> bool:
        return getattr(message, "KIND", None) is self.kind


@DRAFTS
async def test_subscribe_namespace_tells_published_namespaces_in_the_drafts_way(profile: Profile) -> None:
    world = MemoryRelay()
    try:
        watcher = await world.subscriber(profile)
        seen = spy(watcher)
        watcher.endpoint.session.subscribe_namespace(NS[:1])
        watcher.endpoint.link.transmit_soon()
        publisher = Publisher(authorize=allow_authenticated)
        net = await world.publisher(publisher, PROFILES[-1], NS)
        if profile.has_message(MessageKind.NAMESPACE):
            await settle(NamespaceNotice, seen)
            assert [m.track_namespace_suffix for m in seen if isinstance(m, NamespaceNotice)] == [NS[1:]]
            net.client.close()  # the publisher's session ends: its namespace is withdrawn
            await settle(NamespaceDone, seen)
            assert [m.track_namespace_suffix for m in seen if isinstance(m, NamespaceDone)] == [NS[1:]]
        else:
            await settle(PublishNamespace, seen)
            assert [m.track_namespace for m in seen if isinstance(m, PublishNamespace)] == [NS]
    finally:
        await world.close()


@pytest.mark.parametrize("profile", NOTICES)
async def test_subscribe_options_publish_alone_asks_for_no_namespace(profile: Profile) -> None:
    """Subscribe Options PUBLISH asks for PUBLISH of tracks, which the relay does not push: no NAMESPACE.
    (The session's ``subscribe_namespace`` always asks for BOTH, so the relay's record is used here.)"""
    world = MemoryRelay()
    try:
        watcher = await world.subscriber(profile)
        seen = spy(watcher)
        watcher.endpoint.session.subscribe_namespace(NS[:1])
        watcher.endpoint.link.transmit_soon()
        await settle(SubscribeNamespaceOk, seen)
        [both] = world.relay.namespace_watches
        only_publish = dataclasses.replace(both, options=SubscribeOptions.PUBLISH, told=set())
        only_publish.published(NS)
        assert not only_publish.told
        both.published(NS)
        await settle(NamespaceNotice, seen)
        assert both.told == {NS}
    finally:
        await world.close()
