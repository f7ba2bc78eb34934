"""The publisher/subscriber API (moqt.api): its sans-I/O rules, then two peers in memory, then loopback QUIC.

Every await is bounded (``T``): a bug shows up as a failure, never as a hung test run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from kvsp.pki import RoleSpec, make_dev_pki
from moqt.api import (
    Action,
    FetchRefused,
    LiveTrack,
    MalformedTrackError,
    MemoryTrackSource,
    MoqtObject,
    NamespaceRefused,
    Publisher,
    PublisherSettings,
    ReceiveBufferFull,
    SessionLostError,
    SetupRefused,
    StreamResetError,
    Subscriber,
    SubscribeRefused,
    SubscriptionEnded,
    allow_authenticated,
)
from moqt.api.memory import MemoryNet
from moqt.auth import issue_token
from moqt.events import MoqtEvent, ObjectChunkReceived, ObjectSource
from moqt.kinds import ObjectStatus, PublishDoneStatus, RequestError, SessionError, StreamReset
from moqt.messages import PublishNamespace
from moqt.profiles import Profile
from moqt.quic import ConnectionClosedError, EndpointConfig, MoqtConnection, MoqtUri, QuicSettings
from moqt.quic.backend import listen
from moqt.quic.pico import PicoConnection
from moqt.session import MoqtSession
from moqt.tracks import GroupLog, ObjectAssembler, RequestKind, RequestTracker, check_fetch, fetch_ok_end
from moqt.wire import Location, Namespace
from tests.support import backends
from tests.support.drafts import DRAFTS

T = 20.0
NS: Namespace = (b"kvsp-test", b"a")
OTHER: Namespace = (b"elsewhere", b"b")


def payload(i: int, size: int = 1000) -> bytes:
    return bytes([i % 251]) * size


def stored(count: int = 6, size: int = 1000) -> MemoryTrackSource:
    source = MemoryTrackSource()
    source.put(NS, b"t", [MoqtObject(0, i, memoryview(payload(i, size))) for i in range(count)])
    return source


def only_ns(identity: str, namespace: Namespace, action: Action) -> bool:
    return namespace[0] == NS[0]


async def collect(stream: AsyncIterator[MoqtObject]) -> list[MoqtObject]:
    return [obj async for obj in stream]


# -- sans-I/O rules -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("start", "end", "largest", "code"), [
    (Location(0, 0), Location(0, 4), Location(0, 9), None),
    (Location(0, 0), Location(0, 0), Location(0, 9), None),  # object 0: the whole group
    (Location(0, 10), Location(0, 12), Location(0, 9), RequestError.INVALID_RANGE),  # start after largest
    (Location(0, 5), Location(0, 5), Location(0, 9), RequestError.INVALID_RANGE),  # empty range
    (Location(0, 0), Location(0, 4), None, RequestError.NO_OBJECTS),
])
def test_fetch_range_checks(start: Location, end: Location, largest: Location | None,
                            code: RequestError | None) -> None:
    assert check_fetch(start, end, largest) == code


def test_fetch_ok_end_location() -> None:
    largest = Location(0, 31)
    assert fetch_ok_end(Location(0, 8), largest) == Location(0, 8)  # within: the request's
    assert fetch_ok_end(Location(0, 40), largest) == Location(0, 32)  # beyond: just past the largest
    assert fetch_ok_end(Location(0, 0), largest) == Location(0, 32)  # the whole group, which is all there


def test_group_log_cursor_and_retention() -> None:
    log = GroupLog(retain_groups=2)
    for group in range(3):
        for i in range(3):
            log.append(MoqtObject(group, i, memoryview(b"x")))
    assert [g.group for g in log.groups] == [1, 2] and log.groups[0].ended and not log.groups[1].ended
    assert log.largest == Location(2, 2)
    found = log.next_group(Location(0, 0))  # group 0 is gone: the oldest retained one
    assert found is not None and found[0].group == 1 and found[1] == 0
    found = log.next_group(Location(2, 2))
    assert found is not None and found[0].group == 2 and found[1] == 2
    assert log.next_group(Location(3, 0)) is None
    with pytest.raises(ValueError):
        log.append(MoqtObject(2, 1, memoryview(b"x")))  # not ascending
    with pytest.raises(ValueError):
        log.append(MoqtObject(1, 9, memoryview(b"x")))  # an earlier group
    assert [o.location for o in log.read(Location(1, 1), Location(2, 1))] == [Location(1, 1), Location(1, 2),
                                                                             Location(2, 0)]


def chunk(stream: int, obj: int, length: int, offset: int, data: bytes, end: bool) -> ObjectChunkReceived:
    return ObjectChunkReceived(ObjectSource.FETCH, 0, None, stream, 0, 0, obj, 128, (), ObjectStatus.NORMAL,
                               length, offset, memoryview(data), end)


def test_assembler_views_whole_objects_and_assembles_split_ones() -> None:
    assembler = ObjectAssembler()
    whole = assembler.chunk(chunk(3, 0, 4, 0, b"abcd", True))
    assert whole is not None and bytes(whole.payload) == b"abcd"
    assert assembler.chunk(chunk(3, 1, 6, 0, b"abc", False)) is None
    split = assembler.chunk(chunk(3, 1, 6, 3, b"def", True))
    assert split is not None and bytes(split.payload) == b"abcdef" and assembler.group_of[3] == 0


def test_assembler_writes_into_the_callers_buffer_and_refusals_fail() -> None:
    buffer = bytearray(8)

    def allocate(group: int, object_id: int, length: int) -> memoryview | None:
        return memoryview(buffer)[:length] if object_id == 0 else None

    assembler = ObjectAssembler(allocate)
    obj = assembler.chunk(chunk(3, 0, 4, 0, b"wxyz", True))
    assert obj is not None and obj.payload.obj is buffer and bytes(buffer[:4]) == b"wxyz"
    with pytest.raises(MalformedTrackError):
        assembler.chunk(chunk(3, 1, 4, 0, b"nope", True))


def test_request_tracker_completion_rules() -> None:
    fetch = RequestTracker(RequestKind.FETCH)
    fetch.on_ok()
    fetch.on_stream_ended(0, False)
    assert fetch.finished
    sub = RequestTracker(RequestKind.SUBSCRIBE)
    sub.on_publish_done(PublishDoneStatus.TRACK_ENDED, 2, "")  # overtook the data
    assert not sub.over
    sub.on_stream_ended(0, True)
    sub.on_stream_ended(1, True)
    assert sub.finished
    ranged = RequestTracker(RequestKind.SUBSCRIBE, end_group=0)
    ranged.on_stream_ended(0, True)
    assert ranged.finished
    failed = RequestTracker(RequestKind.SUBSCRIBE)
    failed.on_publish_done(PublishDoneStatus.INTERNAL_ERROR, 0, "boom")
    assert isinstance(failed.error, SubscriptionEnded) and failed.error.status is PublishDoneStatus.INTERNAL_ERROR
    refused = RequestTracker(RequestKind.FETCH)
    refused.on_refused(RequestError.UNAUTHORIZED, "no")
    assert isinstance(refused.error, FetchRefused) and refused.error.unauthorized
    reset = RequestTracker(RequestKind.FETCH)
    reset.on_stream_reset(StreamReset.CANCELLED)
    assert isinstance(reset.error, StreamResetError) and isinstance(reset.error, ConnectionError)


# -- two peers in memory --------------------------------------------------------------------------------
async def memory_pair(publisher: Publisher, profile: Profile, **net: object) -> tuple[MemoryNet, Subscriber]:
    pair = MemoryNet(profile=profile, **net)  # type: ignore[arg-type]
    pair.serve(publisher)
    return pair, await pair.subscriber(timeout_s=5.0)


@DRAFTS
async def test_fetch_a_range_byte_exact(profile: Profile) -> None:
    _, sub = await memory_pair(Publisher(stored(), authorize=allow_authenticated), profile)
    async with asyncio.timeout(T), sub.fetch(NS, b"t", Location(0, 1), Location(0, 4)) as objects:
        got = await collect(objects)
    assert [o.object_id for o in got] == [1, 2, 3]
    assert all(bytes(o.payload) == payload(o.object_id) and isinstance(o.payload, memoryview) for o in got)


@DRAFTS
async def test_fetch_refusals_carry_their_code(profile: Profile) -> None:
    _, sub = await memory_pair(Publisher(stored(), authorize=only_ns), profile)
    cases = [((NS, b"nope", Location(0, 0), Location(0, 2)), RequestError.TRACK_DOES_NOT_EXIST),
             ((NS, b"t", Location(0, 9), Location(0, 12)), RequestError.INVALID_RANGE),
             ((OTHER, b"t", Location(0, 0), Location(0, 2)), RequestError.UNAUTHORIZED)]
    for args, code in cases:
        with pytest.raises(FetchRefused) as info:
            async with asyncio.timeout(T), sub.fetch(*args) as objects:
                await collect(objects)
        assert info.value.error is code
    assert sub.usable  # a refusal is a request error, never a session error


@DRAFTS
async def test_live_objects_arrive_before_the_next_one_exists(profile: Profile) -> None:
    publisher = Publisher(authorize=allow_authenticated)
    _, sub = await memory_pair(publisher, profile)
    track = publisher.track(NS, b"live")
    async with asyncio.timeout(T), sub.subscribe(NS, b"live", end_group=0) as objects:
        for i in range(4):
            track.publish(0, i, payload(i))
            obj = await anext(objects)
            assert (obj.object_id, bytes(obj.payload)) == (i, payload(i))
        track.end_group()
        assert await collect(objects) == []  # the group ended: the subscription is over
    track.close()


@DRAFTS
async def test_late_subscriber_gets_the_retained_group_then_live_objects(profile: Profile) -> None:
    publisher = Publisher(authorize=allow_authenticated)
    _, sub = await memory_pair(publisher, profile)
    track = publisher.track(NS, b"live")
    for i in range(3):
        track.publish(0, i, payload(i))
    async with asyncio.timeout(T), sub.subscribe(NS, b"live") as objects:
        assert [(await anext(objects)).object_id for _ in range(3)] == [0, 1, 2]
        track.publish(0, 3, payload(3))
        track.publish(1, 0, payload(9))  # a new group ends group 0
        track.close()
        rest = await collect(objects)
    assert [o.location for o in rest] == [Location(0, 3), Location(1, 0)]


@DRAFTS
async def test_subscribe_refusals_and_track_errors(profile: Profile) -> None:
    publisher = Publisher(stored(), authorize=only_ns)
    _, sub = await memory_pair(publisher, profile)
    with pytest.raises(SubscribeRefused) as info:
        async with asyncio.timeout(T), sub.subscribe(OTHER, b"live") as objects:
            await collect(objects)
    assert info.value.unauthorized
    with pytest.raises(SubscribeRefused) as info:
        async with asyncio.timeout(T), sub.subscribe(NS, b"t") as objects:  # stored, not live
            await collect(objects)
    assert info.value.not_found
    track = publisher.track(NS, b"live")
    with pytest.raises((SubscriptionEnded, StreamResetError)):
        async with asyncio.timeout(T), sub.subscribe(NS, b"live") as objects:
            track.publish(0, 0, payload(0))
            await anext(objects)
            track.close(PublishDoneStatus.INTERNAL_ERROR)
            await collect(objects)


@DRAFTS
async def test_caller_buffer_and_inbox_bound(profile: Profile) -> None:
    publisher = Publisher(stored(count=6, size=4000), authorize=allow_authenticated)
    _, sub = await memory_pair(publisher, profile)
    buffer = bytearray(6 * 4000)

    def allocate(group: int, object_id: int, length: int) -> memoryview:
        return memoryview(buffer)[object_id * 4000 : object_id * 4000 + length]

    async with asyncio.timeout(T), sub.fetch(NS, b"t", Location(0, 0), Location(0, 6), allocate=allocate) as objects:
        got = await collect(objects)
    assert all(o.payload.obj is buffer for o in got) and bytes(buffer) == b"".join(payload(i, 4000) for i in range(6))
    tight = MemoryNet(profile=profile)
    tight.serve(publisher)
    slow = await tight.subscriber(max_inbox_octets=5000)
    objects = slow.fetch(NS, b"t", Location(0, 0), Location(0, 6))
    await asyncio.sleep(0.05)  # let everything arrive without reading it
    with pytest.raises(ReceiveBufferFull):
        async with asyncio.timeout(T), objects:
            await collect(objects)


@DRAFTS
async def test_abandoned_fetch_is_cancelled_at_the_publisher(profile: Profile) -> None:
    gate = asyncio.Event()

    class Slow:
        largest = Location(0, 99)
        complete = True

        async def read(self, start: Location, end: Location) -> AsyncIterator[MoqtObject]:
            for i in range(100):
                if i == 2:
                    await gate.wait()
                yield MoqtObject(0, i, memoryview(payload(i)))

    class Source:
        async def lookup(self, namespace: Namespace, name: bytes) -> Slow:
            return Slow()

    publisher = Publisher(Source(), authorize=allow_authenticated)
    _, sub = await memory_pair(publisher, profile)
    async with asyncio.timeout(T):
        async with sub.fetch(NS, b"t", Location(0, 0), Location(0, 100)) as objects:
            assert (await anext(objects)).object_id == 0
        while any(e._jobs for e in publisher.endpoints):  # FETCH_CANCEL reached the publisher's job
            await asyncio.sleep(0.01)
    with pytest.raises(TimeoutError):  # a stalled publisher: the per-object timeout, no hang
        async with asyncio.timeout(T), sub.fetch(NS, b"t", Location(0, 0), Location(0, 100), timeout_s=0.2) as o:
            await collect(o)
    gate.set()


@DRAFTS
async def test_token_authentication_and_scope(profile: Profile) -> None:
    issuer = ec.generate_private_key(ec.SECP256R1())
    now = int(time.time())
    token = issue_token(issuer, "https://tok.test/", namespaces=[NS[:1]], expires_at=now + 60, now=now)
    publisher = Publisher(stored(), authorize=allow_authenticated)
    pair, sub = await memory_pair(publisher, profile, client_identity=None, token=token,
                                  token_keys=[issuer.public_key()])
    assert pair.server.peer_identity == "https://tok.test/" and pair.server.authenticated_by == "token"
    async with asyncio.timeout(T), sub.fetch(NS, b"t", Location(0, 0), Location(0, 2)) as objects:
        assert len(await collect(objects)) == 2
    with pytest.raises(FetchRefused) as info:  # the token names NS's prefix only
        async with asyncio.timeout(T), sub.fetch(OTHER, b"t", Location(0, 0), Location(0, 2)) as objects:
            await collect(objects)
    assert info.value.unauthorized


@DRAFTS
@pytest.mark.parametrize("trusted", [False, None])
async def test_setup_refused_without_valid_credentials(trusted: bool | None, profile: Profile) -> None:
    issuer = ec.generate_private_key(ec.SECP256R1())
    now = int(time.time())
    token = None if trusted is None else issue_token(ec.generate_private_key(ec.SECP256R1()), "https://x.test/",
                                                     expires_at=now + 60, now=now)
    pair = MemoryNet(client_identity=None, token=token, token_keys=[issuer.public_key()], profile=profile)
    publisher = Publisher(stored(), authorize=allow_authenticated)
    pair.serve(publisher)
    with pytest.raises(SetupRefused) as info:
        await asyncio.wait_for(pair.subscriber(), T)
    assert info.value.error is SessionError.UNAUTHORIZED
    assert publisher.endpoints == []  # the refused session is forgotten


@DRAFTS
async def test_publisher_closing_fails_open_requests(profile: Profile) -> None:
    publisher = Publisher(authorize=allow_authenticated)
    _, sub = await memory_pair(publisher, profile)
    track = publisher.track(NS, b"live")
    async with asyncio.timeout(T), sub.subscribe(NS, b"live") as objects:
        track.publish(0, 0, payload(0))
        await anext(objects)
        for endpoint in publisher.endpoints:
            endpoint.close(SessionError.INTERNAL_ERROR, "gone")
        with pytest.raises(SessionLostError):
            await collect(objects)
    assert not sub.usable


# -- loopback QUIC with a development PKI, over each QUIC back-end (``quic_backend``) ------------------------
SERVER_ID, CLIENT_ID = "https://127.0.0.1:1/server/", "https://client.test/"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("pki")
    make_dev_pki(base, [RoleSpec("server", SERVER_ID), RoleSpec("client", CLIENT_ID),
                        RoleSpec("relay", "https://127.0.0.1:2/r/")])
    return base


def config(pki: Path, name: str | None, profile: Profile | None = None, **settings: object) -> EndpointConfig:
    """A party's endpoint on the test's back-end; with ``profile`` it offers and accepts that draft alone."""
    cert, key = (pki / f"{name}.pem", pki / f"{name}.key") if name else (None, None)
    drafts = (profile.draft,) if profile is not None else None
    quic = QuicSettings(auth_timeout_s=2.0, handshake_timeout_s=5.0, drafts=drafts, quic=backends.CURRENT,
                        **settings)  # type: ignore[arg-type]
    return EndpointConfig.from_files(cert, key, pki / "ca.pem", quic, token_keys=backends.token_keys())


def client_token() -> bytes | None:
    """The client's token on picoquic (its certificate's identity, NS's prefix); None on aioquic."""
    return backends.token_for(CLIENT_ID, namespaces=[NS[:1]])


def server_identity(uri: str) -> str:
    """Who the client knows the server as: its certificate's URI on aioquic; on picoquic, which reads no
    server certificate, the URI it dialled (picotls checked chain and host name)."""
    return str(MoqtUri.parse(uri)) if backends.picoquic() else SERVER_ID


@DRAFTS
async def test_loopback_fetch_with_backpressure(pki: Path, monkeypatch: pytest.MonkeyPatch, profile: Profile,
                                                quic_backend: str) -> None:
    size, count = 64 << 10, 32
    publisher = Publisher(stored(count, size), authorize=allow_authenticated, settings=PublisherSettings(path="/p"))
    port = await publisher.listen("127.0.0.1", 0, config(pki, "server", profile, send_high_water=256 << 10))
    peak = 0
    original = MoqtSession.send_fetch_object

    def watched(self: MoqtSession, stream_id: int, *args: object, **kwargs: object) -> None:
        nonlocal peak
        original(self, stream_id, *args, **kwargs)  # type: ignore[arg-type]
        peak = max(peak, publisher.endpoints[0].link.send_buffered(stream_id))  # type: ignore[attr-defined]

    monkeypatch.setattr(MoqtSession, "send_fetch_object", watched)
    try:
        async with asyncio.timeout(T):
            uri = f"moqt://127.0.0.1:{port}/p"
            sub = await Subscriber.connect(uri, config(pki, "client", profile), token=client_token())
            assert sub.peer_identity == server_identity(uri)
            assert publisher.endpoints[0].session.profile is profile
            async with sub.fetch(NS, b"t", Location(0, 0), Location(0, count)) as objects:
                got = await collect(objects)
            await sub.close()
    finally:
        await publisher.close()
    assert b"".join(bytes(o.payload) for o in got) == b"".join(payload(i, size) for i in range(count))
    assert 0 < peak <= (256 << 10) // 2 + size + 64  # drained to half the high-water mark before each object


@DRAFTS
async def test_loopback_unauthenticated_peer_is_refused(pki: Path, profile: Profile, quic_backend: str) -> None:
    publisher = Publisher(stored(), authorize=allow_authenticated)
    port = await publisher.listen("127.0.0.1", 0, config(pki, "server", profile))
    try:
        with pytest.raises((SetupRefused, ConnectionClosedError)) as info:
            async with asyncio.timeout(T):
                await Subscriber.connect(f"moqt://127.0.0.1:{port}/", config(pki, None, profile))
        refusal = info.value
        if isinstance(refusal, ConnectionClosedError):  # the close raced the SETUP answer: the wire code
            assert refusal.error_code == profile.session_errors.code(SessionError.UNAUTHORIZED)
        else:
            assert isinstance(refusal, SetupRefused) and refusal.error is SessionError.UNAUTHORIZED
    finally:
        await publisher.close()


@DRAFTS
async def test_loopback_token_peer_without_certificate(pki: Path, profile: Profile, quic_backend: str) -> None:
    issuer = ec.generate_private_key(ec.SECP256R1())
    now = int(time.time())
    token = issue_token(issuer, "https://tok.test/", namespaces=[NS], expires_at=now + 60, now=now)
    server = EndpointConfig.from_files(pki / "server.pem", pki / "server.key", pki / "ca.pem",
                                       QuicSettings(quic=quic_backend), token_keys=[issuer.public_key()])
    seen: list[str] = []

    def record(identity: str, namespace: Namespace, action: Action) -> bool:
        seen.append(identity)
        return True

    publisher = Publisher(stored(), authorize=record)
    port = await publisher.listen("127.0.0.1", 0, server)
    try:
        async with asyncio.timeout(T):
            sub = await Subscriber.connect(f"moqt://127.0.0.1:{port}/", config(pki, None, profile), token=token)
            async with sub.fetch(NS, b"t", Location(0, 0), Location(0, 3)) as objects:
                assert len(await collect(objects)) == 3
            await sub.close()
    finally:
        await publisher.close()
    assert seen == ["https://tok.test/"]


@DRAFTS
async def test_publish_namespace_to_a_relay(pki: Path, profile: Profile, quic_backend: str) -> None:
    """A stand-in relay accepts namespaces under NS and refuses others (D3's rule is the relay's)."""

    def on_event(conn: MoqtConnection[MoqtEvent] | PicoConnection[MoqtEvent], event: MoqtEvent) -> None:
        message = getattr(event, "message", None)
        session = conn.session
        assert isinstance(session, MoqtSession)
        if isinstance(message, PublishNamespace):
            if message.track_namespace[0] == NS[0]:
                session.publish_namespace_ok(message.request_id)
            else:
                session.publish_namespace_error(message.request_id, 0x1, "not yours")

    relay = await listen("127.0.0.1", 0, config(pki, "relay", profile), lambda c: MoqtSession(c.quic),
                         on_event=on_event)
    publisher = Publisher(authorize=allow_authenticated)
    try:
        async with asyncio.timeout(T):
            await publisher.publish_namespace(NS)  # remembered, sent when the relay connects
            await publisher.connect_relay(f"moqt://127.0.0.1:{relay.port}/", config(pki, "client", profile),
                                          token=client_token())
            with pytest.raises(NamespaceRefused) as info:
                await publisher.publish_namespace(OTHER)
            assert info.value.unauthorized
    finally:
        await publisher.close()
        relay.close()
        await relay.wait_closed()


@DRAFTS
async def test_live_track_is_also_fetchable(profile: Profile) -> None:
    publisher = Publisher(authorize=allow_authenticated)
    track: LiveTrack = publisher.track(NS, b"live")
    for i in range(3):
        track.publish(0, i, payload(i))
    _, sub = await memory_pair(publisher, profile)
    async with asyncio.timeout(T), sub.fetch(NS, b"live", Location(0, 0), Location(0, 10)) as objects:
        assert [o.object_id for o in await collect(objects)] == [0, 1, 2]
