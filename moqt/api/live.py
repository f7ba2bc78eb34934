"""Live tracks: objects pushed to subscribers as the producer makes them (SUBSCRIBE, one subgroup per group).

A producer gets a `LiveTrack` from ``Publisher.track`` and calls `LiveTrack.publish` for each object as
soon as it exists (a KV layer the moment it is computed). ``publish`` never waits: the object joins the
track's `GroupLog` (a view, no copy) and every subscription's sender task wakes. Each sender walks the
log with its own cursor and awaits ``drain`` on its stream before each object, so a slow subscriber
holds back only itself, and the octets waiting in the QUIC stack per subscriber stay under the
transport's high-water mark plus one object. A group travels on one subgroup stream whose header says
"end of group", so the FIN ends the group; closing the track ends every subscription with PUBLISH_DONE.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from moqt.api.endpoint import Endpoint
from moqt.data import Extensions
from moqt.errors import LocalError
from moqt.kinds import PublishDoneStatus, StreamReset
from moqt.tracks import GroupLog, LiveGroup, MoqtObject, view
from moqt.wire import Bytes, Location, Namespace

log = logging.getLogger("moqt.api.live")


class LiveTrack:
    """A track being produced. Also a ``StoredTrack``: a FETCH gets the retained objects so far."""

    def __init__(self, namespace: Namespace, name: bytes, *, extensions_present: bool = False,
                 retain_groups: int = 1, publisher_priority: int = 128,
                 on_close: Callable[[LiveTrack], None] | None = None) -> None:
        self.namespace = namespace
        self.name = name
        self.extensions_present = extensions_present
        self.publisher_priority = publisher_priority
        self.log = GroupLog(retain_groups)
        self.failure: PublishDoneStatus | int | None = None
        self.subscribers = 0
        self._on_close = on_close
        self._changed = asyncio.Event()

    # -- StoredTrack -------------------------------------------------------------------------------
    @property
    def largest(self) -> Location | None:
        return self.log.largest

    @property
    def complete(self) -> bool:
        return self.log.closed

    async def read(self, start: Location, end: Location) -> AsyncIterator[MoqtObject]:
        for obj in self.log.read(start, end):
            yield obj

    # -- the producer's side ----------------------------------------------------------------------
    def publish(self, group: int, object_id: int, payload: Bytes, extensions: Extensions = ()) -> MoqtObject:
        """Add an object (ascending within a group; a higher group ends the previous one). Never waits."""
        if extensions and not self.extensions_present:
            raise ValueError("this track was created without Extension Headers")
        obj = MoqtObject(group, object_id, view(payload), tuple(extensions))
        self.log.append(obj)
        self._notify()
        return obj

    def end_group(self) -> None:
        """The current group is complete: its subgroup streams end (FIN)."""
        self.log.end_group()
        self._notify()

    def close(self, status: PublishDoneStatus | int | None = None) -> None:
        """End the track. Without ``status``: subscribers get what was published, then PUBLISH_DONE
        TRACK_ENDED; with one (e.g. INTERNAL_ERROR): open streams are reset and PUBLISH_DONE carries it."""
        if self.log.closed:
            return
        self.failure = status
        self.log.close()
        self._notify()
        if self._on_close is not None:
            self._on_close(self)

    async def changed(self) -> None:
        """Wait for the next publish, end of group or close."""
        await self._changed.wait()

    def _notify(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()


class _Sender:
    """Sends one subscription's objects from a `LiveTrack` (run as a task of the subscriber's endpoint)."""

    def __init__(self, track: LiveTrack, endpoint: Endpoint, request_id: int, start: Location,
                 end_group: int | None) -> None:
        self.track, self.endpoint, self.request_id = track, endpoint, request_id
        self.cursor, self.end_group = start, end_group
        self.stream: int | None = None

    async def run(self) -> None:
        track = self.track
        track.subscribers += 1
        try:
            await self._groups()
        except (LocalError, ConnectionError):
            pass  # unsubscribed, stopped or the session ended: nothing left to tell this subscriber
        except asyncio.CancelledError:
            abandon(self.endpoint, self.stream)  # PUBLISH_DONE may follow only once it is closed
            raise
        finally:
            track.subscribers -= 1

    async def _groups(self) -> None:
        session, track = self.endpoint.session, self.track
        while True:
            found = track.log.next_group(self.cursor)
            if found is None:
                if track.log.closed:
                    break
                await track.changed()
                continue
            group, index = found
            if not await self._send_group(group, index):
                break
            self.cursor = Location(group.group + 1, 0)
            if self.end_group is not None and group.group >= self.end_group:
                session.publish_done(self.request_id, PublishDoneStatus.SUBSCRIPTION_ENDED)
                self.endpoint.link.transmit_soon()
                return
        if track.failure is not None and self.stream is not None:
            session.reset_stream(self.stream, StreamReset.INTERNAL_ERROR)
        session.publish_done(self.request_id, track.failure if track.failure is not None
                             else PublishDoneStatus.TRACK_ENDED)
        self.endpoint.link.transmit_soon()

    async def _send_group(self, group: LiveGroup, index: int) -> bool:
        """Send the group from ``index`` to its end (waiting for more); False when the track failed."""
        session, link, track = self.endpoint.session, self.endpoint.link, self.track
        while True:
            while index < len(group.objects):
                obj = group.objects[index]
                index += 1
                if self.stream is None:
                    self.stream = session.open_subgroup(
                        self.request_id, group.group, publisher_priority=track.publisher_priority,
                        extensions_present=track.extensions_present, end_of_group=True)
                await link.drain(self.stream)
                session.send_object(self.stream, obj.object_id, obj.payload, extensions=obj.extensions)
                link.transmit_soon()
            if track.failure is not None:
                return False
            if group.ended:
                break
            await track.changed()
        if self.stream is not None:
            session.finish_stream(self.stream)
            link.transmit_soon()
            self.stream = None
        return True


def abandon(endpoint: Endpoint, stream: int | None) -> None:
    """Reset a subgroup stream a cancelled sender left open (already gone: nothing to do)."""
    if stream is not None:
        with contextlib.suppress(LocalError, ConnectionError):
            endpoint.session.reset_stream(stream, StreamReset.CANCELLED)
            endpoint.link.transmit_soon()


async def send_subscription(track: LiveTrack, endpoint: Endpoint, request_id: int, start: Location,
                            end_group: int | None) -> None:
    """Serve one accepted subscription until its end group, the track's end, or cancellation."""
    await _Sender(track, endpoint, request_id, start, end_group).run()
