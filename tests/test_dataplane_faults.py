"""Dead peers on the data plane, in this process over loopback: the stall bound of a FETCH whose objects
stop arriving (moqt/api/subscriber.py), and a relay answering requests it forwarded to a publisher
that vanished (moqt/quic/liveness.py) or stalled (relay.settings ``upstream_stall_s``).

The same faults with real ``kvsp serve`` processes, SIGKILLed and SIGSTOPped: test_dataplane_faults_processes.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from control.deploy.pki import DevPki
from moqt.api import (
    FetchRefused,
    MoqtObject,
    Publisher,
    Subscriber,
    SubscribeRefused,
    TransferError,
    TransferStalled,
    allow_authenticated,
)
from moqt.kinds import RequestError
from moqt.tracks import StoredTrack
from moqt.wire import Location, Namespace
from tests.support.relay import NAMES, TRACK, block_namespace, endpoint_config, holder_prefix, layers, start_relay
from tests.test_quic_keepalive import Blackhole

pytestmark = pytest.mark.loopback

T = 20.0
BOUND_S = 10.0  # generous: the bounds under test are well below a second; the old waits were 10-30 s


class PausingTrack:
    """A stored track whose ``read`` yields ``objects`` but calls ``pause(i)`` before object ``i``."""

    def __init__(self, objects: list[MoqtObject], pause: Callable[[int], asyncio.Future[None] | None]) -> None:
        self.objects = objects
        self.pause = pause
        self.cancelled = asyncio.Event()

    @property
    def largest(self) -> Location:
        return self.objects[-1].location

    @property
    def complete(self) -> bool:
        return True

    async def read(self, start: Location, end: Location) -> AsyncIterator[MoqtObject]:
        try:
            for i, obj in enumerate(self.objects):
                waiting = self.pause(i)
                if waiting is not None:
                    await waiting
                yield obj
        except asyncio.CancelledError:
            self.cancelled.set()  # the FETCH was cancelled (FETCH_CANCEL) while the read was paused
            raise


class OneTrack:
    def __init__(self, track: PausingTrack) -> None:
        self.track = track

    async def lookup(self, namespace: Namespace, track_name: bytes) -> StoredTrack | None:
        return self.track


def stalls_after_first(objects: list[MoqtObject]) -> PausingTrack:
    forever: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    return PausingTrack(objects, lambda i: forever if i == 1 else None)


@pytest.fixture
def pki(tmp_path: Path) -> DevPki:
    return DevPki.make(tmp_path / "pki", NAMES)


async def publisher_at(pki: DevPki, track: PausingTrack) -> tuple[Publisher, str]:
    publisher = Publisher(OneTrack(track), authorize=allow_authenticated)
    port = await publisher.listen("127.0.0.1", 0, endpoint_config(pki, "pub"))
    return publisher, f"moqt://127.0.0.1:{port}/"


async def collect(sub: Subscriber, namespace: Namespace, count: int, *, stall_s: float | None,
                  busy_s: float = 0.0, after_first: Callable[[], None] | None = None) -> list[int]:
    """FETCH ``count`` objects; ``busy_s`` of other work after the first (the consumer, not the wire)."""
    got: list[int] = []
    async with sub.fetch(namespace, TRACK, Location(0, 0), Location(0, count), timeout_s=30.0,
                         stall_timeout_s=stall_s) as objects:
        async for obj in objects:
            got.append(obj.object_id)
            if len(got) == 1:
                await asyncio.sleep(busy_s)
                if after_first is not None:
                    after_first()
    return got


async def test_a_fetch_that_stops_mid_way_is_given_up_after_the_stall_bound(pki: DevPki) -> None:
    track = stalls_after_first(layers(4, 64 << 10))
    publisher, uri = await publisher_at(pki, track)
    try:
        sub = await Subscriber.connect(uri, endpoint_config(pki, "sub"))
        got: list[int] = []
        start = time.monotonic()
        with pytest.raises(TransferStalled) as stalled:
            async with sub.fetch(block_namespace(pki.uri("pub"), 1), TRACK, Location(0, 0), Location(0, 4),
                                 timeout_s=30.0, stall_timeout_s=0.3) as objects:
                async for obj in objects:
                    got.append(obj.object_id)
        assert got == [0] and time.monotonic() - start < BOUND_S  # not the 30 s object timeout
        assert stalled.value.stall_s == 0.3 and isinstance(stalled.value, TransferError)
        await asyncio.wait_for(track.cancelled.wait(), T)  # FETCH_CANCEL reached the publisher
        await sub.close()
    finally:
        await publisher.close()


async def test_a_busy_consumer_is_no_stall(pki: DevPki) -> None:
    """The stall clock starts when the consumer waits: an engine loading a layer does not stall the FETCH."""
    resumed = asyncio.Event()

    def pause(i: int) -> asyncio.Future[None] | None:
        return asyncio.ensure_future(_after(resumed, 0.05)) if i == 1 else None

    publisher, uri = await publisher_at(pki, PausingTrack(layers(3, 1 << 10), pause))
    try:
        sub = await Subscriber.connect(uri, endpoint_config(pki, "sub"))
        got = await collect(sub, block_namespace(pki.uri("pub"), 1), 3, stall_s=0.2, busy_s=0.6,
                            after_first=resumed.set)
        assert got == [0, 1, 2]
        await sub.close()
    finally:
        await publisher.close()


async def _after(event: asyncio.Event, delay_s: float) -> None:
    await event.wait()
    await asyncio.sleep(delay_s)


@pytest.mark.parametrize("request_kind", ["subscribe", "fetch"])
async def test_a_relay_answers_requests_forwarded_to_a_vanished_publisher(pki: DevPki, request_kind: str) -> None:
    node = await start_relay(pki, "relay-a", idle_timeout_s=60.0, liveness_timeout_s=0.5)
    hole = Blackhole(("127.0.0.1", int(node.uri.split(":")[2].split("/")[0])))
    publisher = Publisher(None, authorize=allow_authenticated)
    try:
        port = await hole.start()
        await publisher.connect_relay(f"moqt://127.0.0.1:{port}/relay", endpoint_config(pki, "pub"))
        await publisher.publish_namespace(holder_prefix(pki.uri("pub")))
        sub = await Subscriber.connect(node.uri, endpoint_config(pki, "sub"), timeout_s=60.0)
        hole.cut()  # the publisher is gone without a word (its session stays open at the relay)
        namespace = block_namespace(pki.uri("pub"), 1)
        start = time.monotonic()
        if request_kind == "subscribe":
            with pytest.raises(SubscribeRefused) as refused:
                async with sub.subscribe(namespace, TRACK, end_group=0) as objects:
                    await objects.answered()
        else:
            with pytest.raises(FetchRefused) as refused:  # type: ignore[assignment]
                async with sub.fetch(namespace, TRACK, Location(0, 0), Location(0, 4)) as objects:
                    await objects.answered()
        assert time.monotonic() - start < BOUND_S  # the relay's idle timeout is 60 s
        assert refused.value.error is RequestError.INTERNAL_ERROR
        async with asyncio.timeout(T):
            while node.relay.table.under(()):  # its namespaces went with its session
                await asyncio.sleep(0.02)
        await sub.close()
    finally:
        hole.close()
        await publisher.close()
        await node.close()


async def test_a_relay_resets_a_fetch_whose_upstream_stalls(pki: DevPki) -> None:
    node = await start_relay(pki, "relay-a", upstream_stall_s=0.3, upstream_timeout_s=30.0)
    track = stalls_after_first(layers(4, 64 << 10))
    publisher = Publisher(OneTrack(track), authorize=allow_authenticated)
    try:
        await publisher.connect_relay(node.uri, endpoint_config(pki, "pub"))
        await publisher.publish_namespace(holder_prefix(pki.uri("pub")))
        sub = await Subscriber.connect(node.uri, endpoint_config(pki, "sub"), timeout_s=30.0)
        start = time.monotonic()
        with pytest.raises(TransferError) as failed:  # the relay's reset of the stream, not our stall bound
            await collect(sub, block_namespace(pki.uri("pub"), 1), 4, stall_s=None)
        assert time.monotonic() - start < BOUND_S and not isinstance(failed.value, TransferStalled)
        await asyncio.wait_for(track.cancelled.wait(), T)  # the relay cancelled its upstream FETCH
        await sub.close()
    finally:
        await publisher.close()
        await node.close()
