"""Objects received before a request's error reach the consumer before the error (moqt.api).

The publisher here is a bare ``MoqtSession`` driven synchronously from the in-memory pair's event
handling, so that the answer, the objects and then the stream reset (or an erroring PUBLISH_DONE) have
all arrived and been queued before the consumer takes anything: the order the consumer sees is then
decided by the API alone. The error is sent only after the objects crossed (``finish``): a QUIC
RESET_STREAM abandons what has not been sent yet.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from moqt.api import FetchRefused, StreamResetError, Subscriber, SubscriptionEnded
from moqt.api.memory import MemoryNet
from moqt.events import ControlMessageReceived, MoqtEvent, SetupRequested
from moqt.kinds import PublishDoneStatus, RequestError, StreamReset
from moqt.messages import Fetch, Subscribe
from moqt.profiles import Profile
from moqt.session import MoqtSession
from moqt.wire import Location
from tests.support.drafts import DRAFTS

NAMESPACE = (b"kvsp", b"ordering")
PAYLOADS = [bytes([i]) * (1000 + i) for i in range(3)]


Finish = Callable[[], None]
Answer = Callable[[MoqtSession, Fetch | Subscribe], Finish | None]


def serve(net: MemoryNet, answer: Answer, finish: list[Finish]) -> None:
    """Accept the session; answer each FETCH/SUBSCRIBE with ``answer``, synchronously; what it leaves
    to do once its objects crossed goes to ``finish``."""
    session = net.server.peer.moqt

    def handler(event: MoqtEvent) -> None:
        if isinstance(event, SetupRequested):
            session.accept_setup()
        elif isinstance(event, ControlMessageReceived) and isinstance(event.message, Fetch | Subscribe):
            then = answer(session, event.message)
            if then is not None:
                finish.append(then)

    net.server.handler = handler


def fetch_then_reset(session: MoqtSession, message: Fetch | Subscribe) -> Finish:
    assert isinstance(message, Fetch)
    session.fetch_ok(message.request_id, Location(0, len(PAYLOADS) + 1))
    stream = session.open_fetch_stream(message.request_id)
    for object_id, payload in enumerate(PAYLOADS):
        session.send_fetch_object(stream, 0, 0, object_id, payload)
    return lambda: session.reset_stream(stream, StreamReset.INTERNAL_ERROR)


def subscribe_then_reset(session: MoqtSession, message: Fetch | Subscribe) -> Finish:
    """Two subgroups: the first one complete (FIN), the second reset after its objects."""
    assert isinstance(message, Subscribe)
    session.subscribe_ok(message.request_id)
    whole = session.open_subgroup(message.request_id, 0, 0)
    session.send_object(whole, 0, PAYLOADS[0], end_of_stream=True)
    broken = session.open_subgroup(message.request_id, 0, 1)
    session.send_object(broken, 1, PAYLOADS[1])
    session.send_object(broken, 2, PAYLOADS[2])
    return lambda: session.reset_stream(broken, StreamReset.INTERNAL_ERROR)


def subscribe_then_fail(session: MoqtSession, message: Fetch | Subscribe) -> Finish:
    assert isinstance(message, Subscribe)
    session.subscribe_ok(message.request_id)
    stream = session.open_subgroup(message.request_id, 0, 0)
    for object_id, payload in enumerate(PAYLOADS):
        session.send_object(stream, object_id, payload, end_of_stream=object_id == len(PAYLOADS) - 1)
    return lambda: session.publish_done(message.request_id, PublishDoneStatus.INTERNAL_ERROR, "the source failed")


class Peers:
    def __init__(self, net: MemoryNet, sub: Subscriber, finish: list[Finish]) -> None:
        self.net, self.sub, self._finish = net, sub, finish

    def exchange(self) -> None:
        """The request out and its whole answer in (objects, then the error), without the consumer."""
        self.net.pump()
        for then in self._finish:
            then()
        self.net.pump()


async def connected(answer: Answer, profile: Profile) -> Peers:
    net, finish = MemoryNet(profile=profile), list[Finish]()
    serve(net, answer, finish)
    return Peers(net, await net.subscriber(), finish)


@DRAFTS
async def test_fetch_objects_before_a_reset_come_first(profile: Profile) -> None:
    peers = await connected(fetch_then_reset, profile)
    received: list[bytes] = []
    async with peers.sub.fetch(NAMESPACE, b"t", Location(0, 0), Location(0, 4)) as objects:
        peers.exchange()
        assert objects.buffered_octets == sum(map(len, PAYLOADS))
        await objects.answered()  # the OK came first: not the reset's error
        with pytest.raises(StreamResetError) as caught:
            async for obj in objects:
                received.append(bytes(obj.payload))
    assert received == PAYLOADS
    assert caught.value.error is StreamReset.INTERNAL_ERROR


@DRAFTS
@pytest.mark.parametrize("answer", [subscribe_then_reset, subscribe_then_fail])
async def test_subscribe_objects_before_an_error_come_first(answer: Answer, profile: Profile) -> None:
    peers = await connected(answer, profile)
    received: list[bytes] = []
    async with peers.sub.subscribe(NAMESPACE, b"t") as objects:
        peers.exchange()
        assert objects.buffered_octets == sum(map(len, PAYLOADS))
        await objects.answered()
        with pytest.raises((StreamResetError, SubscriptionEnded)):
            async for obj in objects:
                received.append(bytes(obj.payload))
    assert received == PAYLOADS


@DRAFTS
async def test_an_error_before_any_ok_is_still_raised_by_answered(profile: Profile) -> None:
    def refuse(session: MoqtSession, message: Fetch | Subscribe) -> None:
        session.fetch_error(message.request_id, RequestError.TRACK_DOES_NOT_EXIST, "nothing there")

    peers = await connected(refuse, profile)
    async with peers.sub.fetch(NAMESPACE, b"t", Location(0, 0), Location(0, 4)) as objects:
        peers.exchange()
        with pytest.raises(FetchRefused):
            await objects.answered()
