"""The relay bridges drafts (issue 18 item 4): a publisher at one draft, subscribers at another, in memory.

Each peer has its own in-memory QUIC pair at its own draft (``tests.support.drafts.MemoryRelay``); the
relay speaks each session's draft. Fetch (with its cache and cut-through), live fan-out and refusals
must cross unchanged, with each error in the code the subscriber's draft has for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from moqt.api import (
    FetchRefused,
    MoqtObject,
    Publisher,
    SubscribeRefused,
    allow_authenticated,
)
from moqt.api.drafts import done_status, has_error, refusal
from moqt.kinds import MessageKind, ObjectStatus, PublishDoneStatus, RequestError
from moqt.profiles import DRAFT_14, DRAFT_16, PROFILES, Profile
from moqt.wire import Location, Namespace
from tests.support.drafts import BRIDGES, DRAFTS, MemoryRelay, joining
from tests.support.relay import CountingSource

T = 20.0
NS: Namespace = (b"kvsp", b"bridge", b"holder")


def payload(i: int, size: int = 1000) -> bytes:
    return bytes([(i * 7) % 251]) * size


def source_of(count: int, size: int = 1000) -> CountingSource:
    source = CountingSource()
    source.put(NS, b"raw", [MoqtObject(0, i, memoryview(payload(i, size))) for i in range(count)])
    source.put(NS, b"empty", [])
    return source


@pytest.fixture
async def world() -> AsyncIterator[MemoryRelay]:
    relay = MemoryRelay()
    yield relay
    await relay.close()


async def fetched(relay: MemoryRelay, profile: Profile, end: int, name: bytes = b"raw") -> list[MoqtObject]:
    sub = await relay.subscriber(profile)
    async with asyncio.timeout(T), sub.fetch(NS, name, Location(0, 0), Location(0, end)) as objects:
        return [obj async for obj in objects]


@BRIDGES
async def test_fetch_crosses_drafts_then_hits_the_cache_at_another(world: MemoryRelay, upstream: Profile,
                                                                  downstream: Profile) -> None:
    source = source_of(8)
    await world.publisher(Publisher(source, authorize=allow_authenticated), upstream, NS[:2])
    first = await fetched(world, downstream, 8)
    assert [(o.object_id, bytes(o.payload)) for o in first] == [(i, payload(i)) for i in range(8)]
    again = await fetched(world, upstream, 8)  # the cached objects, to a subscriber at the publisher's draft
    assert [bytes(o.payload) for o in again] == [bytes(o.payload) for o in first]
    stats = world.relay.stats
    assert (source.lookups, stats.cache_hits, stats.cache_misses) == (1, 1, 1)


@BRIDGES
async def test_objects_larger_than_a_datagram_are_cut_through(world: MemoryRelay, upstream: Profile,
                                                              downstream: Profile) -> None:
    await world.publisher(Publisher(source_of(3, 200_000), authorize=allow_authenticated), upstream, NS[:2])
    got = await fetched(world, downstream, 3)
    assert [bytes(o.payload) for o in got] == [payload(i, 200_000) for i in range(3)]
    assert world.relay.stats.cut_through >= 1  # passed on piece by piece, not after each whole object


@BRIDGES
async def test_live_fan_out_to_subscribers_at_every_draft(world: MemoryRelay, upstream: Profile,
                                                          downstream: Profile) -> None:
    publisher = Publisher(authorize=allow_authenticated)
    await world.publisher(publisher, upstream, NS[:2])
    track = publisher.track(NS, b"live")
    subs = [await world.subscriber(p) for p in (downstream, *PROFILES)]
    async with asyncio.timeout(T):
        streams = [sub.subscribe(NS, b"live") for sub in subs]
        for stream in streams:
            await stream.answered()
        for i in range(4):
            track.publish(0, i, payload(i))
        track.close()  # the group's FIN, then PUBLISH_DONE TRACK_ENDED, relayed in each subscriber's draft
        received = [[(o.location, bytes(o.payload)) async for o in stream] for stream in streams]
    assert received == [[(Location(0, i), payload(i)) for i in range(4)]] * len(subs)
    assert world.relay.stats.upstream_subscribes == 1  # one upstream subscription fans out to all


@BRIDGES
async def test_a_joining_fetch_through_the_relay_reads_what_came_before_the_subscription(
        world: MemoryRelay, upstream: Profile, downstream: Profile) -> None:
    """The relay computes the joining range from the Largest Location its SUBSCRIBE_OK carried and
    fetches it like a standalone FETCH; before any object that is INVALID_RANGE, as from a publisher."""
    publisher = Publisher(authorize=allow_authenticated)
    await world.publisher(publisher, upstream, NS[:2])
    track = publisher.track(NS, b"live", retain_groups=2)
    sub = await world.subscriber(downstream)
    async with asyncio.timeout(T), sub.subscribe(NS, b"live", start=None) as live:
        await live.answered()
        with pytest.raises(FetchRefused) as info:
            async with joining(sub, live.request_id, 0) as objects:
                [o async for o in objects]
        assert info.value.error is RequestError.INVALID_RANGE
    for i in range(3):
        track.publish(0, i, payload(i))
    late = await world.subscriber(downstream)
    async with asyncio.timeout(T), late.subscribe(NS, b"live", start=None) as live:
        await live.answered()
        async with joining(late, live.request_id, 0) as objects:
            got = [(o.location, bytes(o.payload)) async for o in objects]
        track.publish(0, 3, payload(3))
        assert (await anext(live)).location == Location(0, 3)  # the subscription goes on after it
    assert got == [(Location(0, i), payload(i)) for i in range(3)]
    track.close()


@BRIDGES
async def test_refusals_travel_in_the_subscribers_draft(world: MemoryRelay, upstream: Profile,
                                                        downstream: Profile) -> None:
    await world.publisher(Publisher(source_of(4), authorize=allow_authenticated), upstream, NS[:2])
    sub = await world.subscriber(downstream)
    with pytest.raises(FetchRefused) as info:
        async with asyncio.timeout(T), sub.fetch(NS, b"nope", Location(0, 0), Location(0, 2)) as objects:
            [o async for o in objects]
    assert info.value.not_found
    with pytest.raises(FetchRefused) as info:
        async with asyncio.timeout(T), sub.fetch(NS, b"raw", Location(0, 9), Location(0, 12)) as objects:
            [o async for o in objects]
    assert info.value.error is RequestError.INVALID_RANGE
    with pytest.raises(SubscribeRefused) as refused:
        async with asyncio.timeout(T), sub.subscribe(NS, b"raw") as objects:  # stored, not live
            [o async for o in objects]
    assert refused.value.not_found
    assert sub.usable


@BRIDGES
async def test_an_empty_track_is_answered_as_each_draft_answers_it(world: MemoryRelay, upstream: Profile,
                                                                   downstream: Profile) -> None:
    """Nothing published: NO_OBJECTS where both drafts have it; otherwise an empty FETCH answered OK."""
    await world.publisher(Publisher(source_of(1), authorize=allow_authenticated), upstream, NS[:2])
    refuses = all(has_error(p, MessageKind.FETCH_ERROR, RequestError.NO_OBJECTS) for p in (upstream, downstream))
    if refuses:
        with pytest.raises(FetchRefused):
            await fetched(world, downstream, 4, b"empty")
    else:
        assert await fetched(world, downstream, 4, b"empty") == []


@DRAFTS
async def test_status_markers_cached_from_one_draft_are_left_out_where_another_cannot_carry_them(
        world: MemoryRelay, profile: Profile) -> None:
    source = source_of(0)
    source.put(NS, b"marked", [MoqtObject(0, 0, memoryview(payload(0))),
                               MoqtObject(0, 1, memoryview(b""), status=ObjectStatus.END_OF_GROUP)])
    await world.publisher(Publisher(source, authorize=allow_authenticated), DRAFT_14, NS[:2])
    got = await fetched(world, DRAFT_14, 2, b"marked")
    assert [o.status for o in got] == [ObjectStatus.NORMAL, ObjectStatus.END_OF_GROUP]
    cached = await fetched(world, profile, 2, b"marked")  # from the cache, in the subscriber's draft
    fetch_carries = profile.data_framing.fetch_serialization_flags is False
    assert [o.status for o in cached] == [ObjectStatus.NORMAL] + [ObjectStatus.END_OF_GROUP] * fetch_carries


def test_error_codes_map_to_the_closest_the_draft_documents() -> None:
    fetch_error, subscribe_error = MessageKind.FETCH_ERROR, MessageKind.SUBSCRIBE_ERROR
    for profile in PROFILES:
        for name in RequestError:
            mapped = refusal(profile, fetch_error, name)
            assert isinstance(mapped, RequestError) and has_error(profile, fetch_error, mapped)
            if has_error(profile, fetch_error, name):
                assert mapped is name
        assert refusal(profile, fetch_error, 0x7777, source=profile) == 0x7777  # same draft: passed on
        assert done_status(profile, PublishDoneStatus.TRACK_ENDED) is PublishDoneStatus.TRACK_ENDED
    assert refusal(DRAFT_16, fetch_error, RequestError.NO_OBJECTS) is RequestError.INVALID_RANGE
    assert refusal(DRAFT_14, subscribe_error, RequestError.DUPLICATE_SUBSCRIPTION) is RequestError.INTERNAL_ERROR
    assert refusal(DRAFT_14, fetch_error, 0x7777, source=DRAFT_16) is RequestError.INTERNAL_ERROR
    assert done_status(DRAFT_14, PublishDoneStatus.UPDATE_FAILED) is PublishDoneStatus.INTERNAL_ERROR
    assert done_status(DRAFT_14, 0x99, source=DRAFT_16) is PublishDoneStatus.INTERNAL_ERROR
