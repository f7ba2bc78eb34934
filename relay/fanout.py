"""Fan-out: one upstream subscription per track, served to every downstream subscriber from its own queue.

Why this shape: the upstream pump hands each object to every subscriber's bounded `SendQueue` and never
waits, so the upstream session is read at the publisher's pace whatever the subscribers do. Each
downstream subscriber has a sender task that moves its queue to its own subgroup streams, awaiting
``drain`` per object; a subscriber that stalls stops only its sender, its queue fills, and the next
push ends it with PUBLISH_DONE TOO_FAR_BEHIND (draft-14 section 9.x, "publisher's queue of objects to
be sent to the given subscriber exceeds its implementation defined limit"). Payloads are forwarded as
the views they arrived in (no copy, no re-encoding); one group travels on one subgroup stream whose
header says "end of group", as the publishers of the KVSP binding send it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from moqt.api import (
    Endpoint,
    MoqtObject,
    ObjectStream,
    SubscribeRefused,
    SubscriptionEnded,
    TransferError,
)
from moqt.api.drafts import done_status, writable_status
from moqt.api.live import abandon
from moqt.errors import LocalError
from moqt.kinds import PublishDoneStatus, StreamReset
from moqt.messages import SubscribeOk
from moqt.profiles import Profile
from moqt.tracks import NORMAL_END, GroupLog
from moqt.wire import Location
from relay.core import QueueItem, RelayStats, SendQueue, TrackEnd, TrackKey, objects_from

log = logging.getLogger("kvsp.relay.fanout")


class Downstream:
    """One downstream subscription: its queue and the task that sends it (a job of its endpoint)."""

    def __init__(self, endpoint: Endpoint, request_id: int, start: Location, *, end_group: int | None,
                 max_octets: int, stats: RelayStats) -> None:
        self.endpoint = endpoint
        self.request_id = request_id
        self.start = start
        self.end_group = end_group
        self.queue = SendQueue(max_octets)
        self.stats = stats
        self.stream: int | None = None
        self.group: int | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._draining = False
        self.ended_too_far_behind = False

    def push(self, item: QueueItem) -> None:
        if isinstance(item, MoqtObject) and item.location < self.start:
            return
        if not self.queue.push(item) and not self.ended_too_far_behind:
            self.ended_too_far_behind = True
            self.stats.too_far_behind += 1
            log.info("subscriber request %d is too far behind (> %d octets queued): ending it",
                     self.request_id, self.queue.max_octets)
            if self._draining and self._task is not None:
                self._task.cancel()  # interrupt its wait for a stream that may never drain
        self._wake.set()

    async def run(self) -> None:
        """Send until the track ends, the subscription's end group is passed, or it falls too far behind."""
        session, link = self.endpoint.session, self.endpoint.link
        self._task = asyncio.current_task()
        try:
            while True:
                if self.ended_too_far_behind:
                    self._end(PublishDoneStatus.TOO_FAR_BEHIND, "too far behind")
                    return
                item = self.queue.pop()
                if item is None:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if isinstance(item, TrackEnd):
                    self._end(done_status(session.profile, item.status, source=item.source), item.reason)
                    return
                if self.end_group is not None and item.group > self.end_group:
                    self._end(PublishDoneStatus.SUBSCRIPTION_ENDED, "")
                    return
                if not writable_status(session.profile, item.status, fetch=False):
                    continue  # a status this subscriber's draft has no code for (a gap says it there)
                if self.group != item.group:
                    self._finish_stream()
                    self.stream = session.open_subgroup(self.request_id, item.group, end_of_group=True,
                                                        extensions_present=bool(item.extensions))
                    self.group = item.group
                assert self.stream is not None
                if not await self._drain(self.stream):
                    continue
                session.send_object(self.stream, item.object_id, item.payload, extensions=item.extensions,
                                    status=item.status)
                link.transmit_soon()
                self.stats.sent(item)
        except (LocalError, ConnectionError):
            pass  # the subscriber left (UNSUBSCRIBE, STOP_SENDING) or its session ended
        except asyncio.CancelledError:
            abandon(self.endpoint, self.stream)  # PUBLISH_DONE (an UPDATE_FAILED) may follow only then
            self.stream = None
            raise

    async def _drain(self, stream: int) -> bool:
        """Wait for room on the stream; False when the subscriber was found too far behind meanwhile
        (`push` interrupts the wait: a stalled peer may never make room)."""
        self._draining = True
        try:
            await self.endpoint.link.drain(stream)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self.ended_too_far_behind or task is None:
                raise
            task.uncancel()
            return False
        finally:
            self._draining = False
        return not self.ended_too_far_behind

    def _finish_stream(self) -> None:
        if self.stream is not None:
            self.endpoint.session.finish_stream(self.stream)
            self.stream = None

    def _end(self, status: PublishDoneStatus | int | None, reason: str) -> None:
        """PUBLISH_DONE: after the open stream's FIN when the end is normal, after its reset otherwise."""
        session = self.endpoint.session
        if status is None or status in NORMAL_END:
            self._finish_stream()
            status = PublishDoneStatus.TRACK_ENDED if status is None else status
        elif self.stream is not None:
            session.reset_stream(self.stream, StreamReset.INTERNAL_ERROR)
            self.stream = None
        session.publish_done(self.request_id, status, reason)
        self.endpoint.link.transmit_soon()


class RelayTrack:
    """One track as the relay relays it: the upstream pump, the retained group, the subscribers."""

    def __init__(self, key: TrackKey, stats: RelayStats, on_done: Callable[[RelayTrack], None]) -> None:
        self.key = key
        self.stats = stats
        self.log = GroupLog(1)  # the current group, for subscribers that join late (views, no copies)
        self.downstream: list[Downstream] = []
        self.ready: asyncio.Future[SubscribeOk | None] = asyncio.get_running_loop().create_future()
        self.ended: TrackEnd | None = None
        self.task: asyncio.Task[None] | None = None
        self.persistent = False  # fed by a PUBLISH: kept without subscribers
        self.source: Profile | None = None  # the upstream session's draft, once started
        self._on_done = on_done

    @property
    def largest(self) -> Location | None:
        own = self.log.largest
        ok = self.ready.result() if self.ready.done() and not self.ready.exception() else None
        theirs = ok.largest_location if isinstance(ok, SubscribeOk) else None
        if own is None or theirs is None:
            return own or theirs
        return max(own, theirs)

    def start(self, objects: ObjectStream) -> None:
        self.source = objects.endpoint.session.profile
        self.task = asyncio.get_running_loop().create_task(self._pump(objects))

    async def _pump(self, objects: ObjectStream) -> None:
        end = TrackEnd()
        try:
            async with objects:
                ok = await objects.answered()
                if not self.ready.done():
                    self.ready.set_result(ok if isinstance(ok, SubscribeOk) else None)
                async for obj in objects:
                    self.deliver(obj)
        except SubscribeRefused as exc:
            self._refuse(exc)
            end = TrackEnd(PublishDoneStatus.INTERNAL_ERROR, exc.reason)
        except SubscriptionEnded as exc:
            end = TrackEnd(exc.status, exc.reason, self.source)
        except (TransferError, TimeoutError) as exc:
            log.info("upstream of %r lost: %s", self.key[1], exc)
            self._refuse(exc)
            end = TrackEnd(PublishDoneStatus.INTERNAL_ERROR, "the publisher was lost")
        except asyncio.CancelledError:
            end = TrackEnd(PublishDoneStatus.GOING_AWAY, "the relay stopped relaying the track")
            raise
        finally:
            self.finish(end)

    def _refuse(self, exc: Exception) -> None:
        if not self.ready.done():
            self.ready.set_exception(exc)
            self.ready.exception()  # retrieved: the waiters may be gone

    def deliver(self, obj: MoqtObject) -> None:
        """One object from upstream: kept as the current group's and queued for every subscriber."""
        self.stats.received(obj)
        try:
            self.log.append(obj)
        except ValueError as exc:  # out of order or duplicate: never forwarded (draft-14 Malformed Track)
            log.warning("track %r malformed upstream: %s", self.key[1], exc)
            if self.task is not None:
                self.task.cancel()
            return
        for down in list(self.downstream):
            down.push(obj)

    def join(self, down: Downstream) -> None:
        """A new subscriber: first what it missed of the retained group, then live objects."""
        for obj in objects_from([o for g in self.log.groups for o in g.objects], down.start):
            down.push(obj)
        if self.ended is not None:
            down.push(self.ended)
        self.downstream.append(down)
        self.stats.subscribers += 1

    def leave(self, down: Downstream) -> None:
        if down in self.downstream:
            self.downstream.remove(down)
            self.stats.subscribers -= 1
        if not self.downstream and not self.persistent and self.task is not None and self.ended is None:
            self.task.cancel()  # nobody listens: UNSUBSCRIBE upstream

    def finish(self, end: TrackEnd) -> None:
        if self.ended is not None:
            return
        self.ended = end
        if not self.ready.done():
            self.ready.set_exception(TransferError(None, end.reason or "the upstream subscription ended"))
            self.ready.exception()
        for down in list(self.downstream):
            down.push(end)
        self._on_done(self)

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
        else:
            self.finish(TrackEnd(PublishDoneStatus.GOING_AWAY, "the relay is closing"))


async def serve_downstream(track: RelayTrack, down: Downstream) -> None:
    """Run one subscriber's sender; it leaves the track however it ends (UNSUBSCRIBE cancels it)."""
    track.join(down)
    try:
        await down.run()
    finally:
        track.leave(down)
        with contextlib.suppress(LocalError, ConnectionError):
            down.endpoint.link.transmit_soon()
