"""`Relay`: a MOQT draft-14 relay (decisions D3, D4) over the publisher/subscriber API.

A relay is a `Publisher` whose tracks live elsewhere. Publishers connect and PUBLISH_NAMESPACE (or
PUBLISH a track); subscribers SUBSCRIBE, FETCH and SUBSCRIBE_NAMESPACE. A request goes to the session
that published the longest matching namespace prefix, else to an upstream relay (rack -> spine ->
publisher), never back where it came from:

* **FETCH** is answered from the `ObjectCache` when the whole range is there; otherwise one upstream
  FETCH is made (concurrent identical ones wait for it), FETCH_OK is withheld until the upstream's
  arrives and carries its End Location and End Of Track, objects are forwarded as they arrive and
  kept in the cache once the upstream FETCH completed.
* **SUBSCRIBE** joins the track's one upstream subscription (made for the first subscriber; SUBSCRIBE_OK
  only once the upstream's arrived, as draft-14 requires) and fans out through bounded per-subscriber
  queues (``relay.fanout``): a slow subscriber is ended with TOO_FAR_BEHIND, nobody else waits.
* **Lifecycle**: a publisher's session that ends takes its namespaces with it (withdrawn upstream too)
  and its subscriptions end with PUBLISH_DONE; `drain` sends GOAWAY and closes after a grace period.
  A publisher that vanished ends within ``liveness_timeout_s`` of the first request forwarded to it
  (moqt/quic/liveness.py), which is then answered with an error; an upstream FETCH that stalls after
  its first object (``upstream_stall_s``) resets the subscriber's stream.

Payloads are never copied, decoded or re-encoded: the views received are the views sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from moqt.api import (
    Action,
    Authorizer,
    Endpoint,
    FetchRefused,
    Link,
    MoqtObject,
    ObjectStream,
    Publisher,
    PublisherSettings,
    Subscriber,
    SubscribeRefused,
    TokenRule,
    TransferError,
    token_namespaces,
)
from moqt.api.drafts import refusal, refuse_fetch, refuse_subscribe, writable_status
from moqt.errors import LocalError, MoqtError
from moqt.events import SetupRequested
from moqt.kinds import FilterType, GroupOrder, MessageKind, RequestError, SessionError, StreamReset
from moqt.messages import (
    ControlMessage,
    Fetch,
    FetchOk,
    Publish,
    PublishNamespace,
    PublishNamespaceDone,
    StandaloneFetch,
    Subscribe,
    SubscribeNamespace,
    UnsubscribeNamespace,
)
from moqt.quic import MoqtUri
from moqt.session import MoqtSession
from moqt.tracks import ObjectAssembler, RequestKind, RequestTracker, subscription_start
from moqt.wire import Location, Namespace
from relay.core import NamespaceTable, ObjectCache, RelayStats, TrackKey, is_prefix
from relay.cutthrough import CutThrough, ForwardingAssembler, flush
from relay.fanout import Downstream, RelayTrack, serve_downstream
from relay.namespaces import NamespaceWatch
from relay.settings import RelaySettings

log = logging.getLogger("kvsp.relay")

Clock = Callable[[], float]
FlightKey = tuple[Namespace, bytes, Location, Location]


def _with_upstreams(authorize: Authorizer, upstream: Iterable[str]) -> Authorizer:
    """``authorize``, and an upstream relay this relay dials may send it requests as a peer. Over picoquic
    that relay is known only as the URI dialled (``authenticated_by`` "server-name": its certificate's
    chain and host name were checked, its identity cannot be read), which no identity policy names; over
    aioquic identities are certificate URIs and the configured ``peers`` decide, as before."""
    dialled = frozenset(str(dataclasses.replace(MoqtUri.parse(uri), fragment="")) for uri in upstream)
    if not dialled:
        return authorize

    def authorized(identity: str, namespace: Namespace, action: Action) -> bool:
        return identity in dialled or authorize(identity, namespace, action)

    return authorized


class Relay(Publisher):
    """Routes, fans out and caches tracks between publishers and subscribers (see the module docstring)."""

    def __init__(self, settings: RelaySettings, *, authorize: Authorizer, token_rule: TokenRule = token_namespaces,
                 clock: Clock = time.monotonic) -> None:
        super().__init__(None, authorize=_with_upstreams(authorize, settings.upstream), token_rule=token_rule,
                         settings=PublisherSettings(path=settings.path))
        self.relay_settings = settings
        self.cache = ObjectCache(settings.cache_octets, settings.cache_ttl_s)
        self.table: NamespaceTable[Endpoint] = NamespaceTable()
        self.stats = RelayStats()
        self.tracks: dict[TrackKey, RelayTrack] = {}
        self.draining = False
        self._clock = clock
        self._namespace_subscribers: list[NamespaceWatch] = []
        self._flights: dict[FlightKey, asyncio.Future[None]] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- routing -------------------------------------------------------------------------------------
    def route(self, namespace: Namespace, *, exclude: Endpoint | None = None) -> list[Endpoint]:
        """Where a request for ``namespace`` may go: its publishers (longest prefix first), then the
        upstream relays; never the session it came from, nor one that is going away."""
        candidates = [*self.table.route(namespace), *self._relays]
        seen: list[Endpoint] = []
        for endpoint in candidates:
            if endpoint is not exclude and endpoint not in seen and endpoint.usable \
                    and endpoint.session.can_send_request():
                seen.append(endpoint)
        return seen

    # -- requests ------------------------------------------------------------------------------------
    def on_request(self, endpoint: Endpoint, message: Fetch | Subscribe) -> None:
        if isinstance(message, Fetch):
            endpoint.spawn(message.request_id, self._relay_fetch(endpoint, message))
        else:
            endpoint.spawn(message.request_id, self._relay_subscribe(endpoint, message))

    async def _relay_fetch(self, endpoint: Endpoint, message: Fetch) -> None:
        session, request_id, request = endpoint.session, message.request_id, message.standalone
        try:
            if request is None:  # joining: the range before the subscription's start, fetched like any
                request = self._joined_range(endpoint, message)
                if request is None:
                    return
            if not self.allowed(endpoint, request.track_namespace, Action.FETCH):
                self.stats.refused += 1
                session.fetch_error(request_id, RequestError.UNAUTHORIZED, "not authorized for this namespace")
                return
            key = (request.track_namespace, request.track_name)
            hit = await self._from_cache(key, request)
            if hit is not None:
                return await self._serve_hit(endpoint, request_id, hit)
            self.stats.cache_misses += 1
            await self._fetch_upstream(endpoint, message, request)
        except (LocalError, ConnectionError):
            pass  # cancelled by the subscriber, or its session ended
        finally:
            endpoint.link.transmit_soon()

    async def _from_cache(self, key: TrackKey, request: StandaloneFetch) -> tuple[Location, bool,
                                                                                   tuple[MoqtObject, ...]] | None:
        flight = self._flights.get((*key, request.start, request.end))
        if flight is not None:  # the same FETCH is on its way upstream: wait for it, then look again
            with contextlib.suppress(Exception):
                await asyncio.shield(flight)
        hit = self.cache.lookup(key, request.start, request.end, self._clock())
        return None if hit is None else (hit.end_location, hit.end_of_track, hit.objects)

    async def _serve_hit(self, endpoint: Endpoint, request_id: int,
                         hit: tuple[Location, bool, tuple[MoqtObject, ...]]) -> None:
        end_location, end_of_track, objects = hit
        self.stats.cache_hits += 1
        session = endpoint.session
        session.fetch_ok(request_id, end_location, end_of_track=end_of_track)
        stream = session.open_fetch_stream(request_id)
        for index, obj in enumerate(objects):
            await self._send_fetch_object(endpoint, stream, obj)
            if index == 0 and len(objects) > 1:
                flush(endpoint.link)  # the first object leaves before the rest are queued behind it
        session.finish_stream(stream)

    async def _send_fetch_object(self, endpoint: Endpoint, stream: int, obj: MoqtObject) -> None:
        if not writable_status(endpoint.session.profile, obj.status, fetch=True):
            return  # a marker cached from an older draft's upstream: FETCH_OK and the FIN say it here
        await endpoint.link.drain(stream)
        endpoint.session.send_fetch_object(stream, obj.group, obj.subgroup, obj.object_id, obj.payload,
                                           extensions=obj.extensions, status=obj.status)
        endpoint.link.transmit_soon()
        self.stats.sent(obj)

    async def _fetch_upstream(self, endpoint: Endpoint, message: Fetch, request: StandaloneFetch) -> None:
        session, request_id = endpoint.session, message.request_id
        candidates = self.route(request.track_namespace, exclude=endpoint)
        if not candidates:
            session.fetch_error(request_id, RequestError.TRACK_DOES_NOT_EXIST, "no publisher for this namespace")
            return
        flight_key = (request.track_namespace, request.track_name, request.start, request.end)
        flight = self._flights.setdefault(flight_key, asyncio.get_running_loop().create_future())
        try:
            for index, upstream in enumerate(candidates):
                last = index == len(candidates) - 1
                if await self._fetch_from(upstream, endpoint, message, request, last=last):
                    return
        finally:
            if self._flights.get(flight_key) is flight:
                del self._flights[flight_key]
            if not flight.done():
                flight.set_result(None)

    async def _fetch_from(self, upstream: Endpoint, endpoint: Endpoint, message: Fetch, request: StandaloneFetch, *,
                          last: bool) -> bool:
        """One upstream FETCH forwarded downstream; False when it said "not here" and others remain.

        Pieces are passed on as they arrive (``relay.cutthrough``, which also sends FETCH_OK and opens
        the stream); this task paces the upstream by the downstream's drain and keeps the objects for
        the cache."""
        session, request_id = endpoint.session, message.request_id
        self.stats.upstream_fetches += 1
        cut = CutThrough(endpoint, request_id)
        kept: list[MoqtObject] = []
        try:
            upstream_fetch = self._upstream_fetch(upstream, request, message.subscriber_priority, cut)
        except (LocalError, TransferError) as exc:  # that session takes no more requests (blocked, GOAWAY, lost)
            if not last:
                return False
            session.fetch_error(request_id, RequestError.INTERNAL_ERROR, f"no upstream takes the FETCH: {exc}")
            return True
        try:
            async with upstream_fetch as objects:
                ok = await objects.answered()
                if not isinstance(ok, FetchOk):
                    raise TransferError(None, "the upstream FETCH ended without FETCH_OK")
                stream = cut.open(ok)
                async for obj in objects:
                    if cut.error is not None:
                        raise cut.error
                    self.stats.received(obj)
                    self.stats.sent(obj)
                    kept.append(obj)
                    await endpoint.link.drain(stream)
            if cut.error is not None:
                raise cut.error
            session.finish_stream(stream)
        except FetchRefused as exc:
            if exc.not_found and not last:
                return False
            refuse_fetch(session, request_id, exc.error, exc.reason, start=request.start,
                         source=upstream.session.profile)
            return True
        except (TransferError, TimeoutError) as exc:
            log.info("upstream FETCH failed: %s", exc)
            if cut.stream is None:
                session.fetch_error(request_id, RequestError.INTERNAL_ERROR, "the upstream FETCH failed")
            else:
                session.reset_stream(cut.stream, StreamReset.INTERNAL_ERROR)
            return True
        finally:
            cut.error = cut.error or LocalError("the FETCH is over")  # no more writes from late pieces
            self.stats.cut_through += cut.forwarded_objects
        self.cache.store((request.track_namespace, request.track_name), request.start, request.end, kept,
                         self._clock(), ok_end=ok.end_location, end_of_track=ok.end_of_track)
        return True

    def _upstream_fetch(self, upstream: Endpoint, request: StandaloneFetch, priority: int,
                        cut: CutThrough) -> ObjectStream:
        """``Subscriber.fetch``, with an assembler that shows every piece to ``cut`` as it arrives."""
        if upstream.closed_error is not None:
            raise upstream.closed_error
        request_id = upstream.session.fetch(request.track_namespace, request.track_name, request.start, request.end,
                                            subscriber_priority=priority, group_order=GroupOrder.ASCENDING)
        tracker = cut.upstream = RequestTracker(RequestKind.FETCH)
        inbox = upstream.open_inbox(request_id, tracker, ForwardingAssembler(cut))
        flush(upstream.link)  # the request leaves now, not one event-loop turn later (first-object latency)
        settings = self.relay_settings
        return ObjectStream(upstream, request_id, inbox, settings.upstream_timeout_s, settings.upstream_stall_s)

    async def _relay_subscribe(self, endpoint: Endpoint, message: Subscribe) -> None:
        session, request_id = endpoint.session, message.request_id
        key = (message.track_namespace, message.track_name)
        try:
            if not self.allowed(endpoint, message.track_namespace, Action.SUBSCRIBE):
                self.stats.refused += 1
                session.subscribe_error(request_id, RequestError.UNAUTHORIZED,
                                        "not authorized for this namespace")
                return
            track = self.tracks.get(key) or self._open_track(key, endpoint, message)
            if track is None:
                session.subscribe_error(request_id, RequestError.TRACK_DOES_NOT_EXIST,
                                        "no publisher for this namespace")
                return
            try:
                await asyncio.shield(track.ready)
            except SubscribeRefused as exc:  # the publisher's answer, in this subscriber's draft
                refuse_subscribe(session, request_id, exc.error, exc.reason, source=track.source)
                return
            except (MoqtError, TimeoutError):
                session.subscribe_error(request_id, RequestError.INTERNAL_ERROR,
                                        "the upstream subscription failed")
                return
            largest = track.largest
            start = subscription_start(message.filter_type, message.start_location, largest)
            session.subscribe_ok(request_id, largest_location=largest)
            endpoint.served[request_id] = (*key, largest)  # a joining FETCH's range; a refused update ends it
            endpoint.link.transmit_soon()
            end_group = message.end_group if message.filter_type == FilterType.ABSOLUTE_RANGE else None
            down = Downstream(endpoint, request_id, start, end_group=end_group,
                              max_octets=self.relay_settings.subscriber_buffer_octets, stats=self.stats)
            await serve_downstream(track, down)
        except (LocalError, ConnectionError):
            pass
        finally:
            endpoint.link.transmit_soon()

    def _open_track(self, key: TrackKey, endpoint: Endpoint, message: Subscribe) -> RelayTrack | None:
        absolute = message.filter_type in (FilterType.ABSOLUTE_START, FilterType.ABSOLUTE_RANGE)
        for upstream in self.route(key[0], exclude=endpoint):
            try:
                objects = Subscriber(upstream, timeout_s=None).subscribe(
                    key[0], key[1], start=message.start_location if absolute else None, end_group=None,
                    priority=message.subscriber_priority)
            except LocalError:  # that session takes no more requests: try the next
                continue
            self.stats.upstream_subscribes += 1
            track = RelayTrack(key, self.stats, self._track_done)
            self.tracks[key] = track
            track.start(objects)
            return track
        return None

    def _track_done(self, track: RelayTrack) -> None:
        if self.tracks.get(track.key) is track:
            del self.tracks[track.key]

    # -- namespaces and PUBLISH (ControlServing) ----------------------------------------------------------
    def on_control(self, endpoint: Endpoint, message: ControlMessage) -> bool:
        match message:
            case PublishNamespace(request_id=request_id, track_namespace=namespace):
                self._on_publish_namespace(endpoint, request_id, namespace)
            case PublishNamespaceDone(track_namespace=namespace):
                if self.table.remove(namespace, endpoint):
                    self._withdraw([namespace])
            case SubscribeNamespace():
                self._on_subscribe_namespace(endpoint, message)
            case UnsubscribeNamespace(track_namespace_prefix=prefix):
                self._namespace_subscribers = [n for n in self._namespace_subscribers
                                               if (n.prefix, n.endpoint) != (prefix, endpoint)]
            case Publish():
                self._on_publish(endpoint, message)
            case _:
                return False
        endpoint.link.transmit_soon()
        return True

    @property
    def namespace_watches(self) -> list[NamespaceWatch]:
        """The accepted SUBSCRIBE_NAMESPACEs, in arrival order."""
        return list(self._namespace_subscribers)

    def _on_publish_namespace(self, endpoint: Endpoint, request_id: int, namespace: Namespace) -> None:
        session = endpoint.session
        if self.draining:
            session.publish_namespace_error(request_id, RequestError.UNINTERESTED, "relay draining")
            return
        if not self.allowed(endpoint, namespace, Action.PUBLISH_NAMESPACE):
            self.stats.refused += 1
            session.publish_namespace_error(request_id, RequestError.UNAUTHORIZED,
                                            "not authorized to publish this namespace")
            return
        self.table.add(namespace, endpoint)
        session.publish_namespace_ok(request_id)
        self.stats.publishers = self.table.owner_count()
        self._spawn(self._announce_upstream(namespace))
        for watch in list(self._namespace_subscribers):
            if watch.endpoint is not endpoint and is_prefix(watch.prefix, namespace):
                self._tell(watch, namespace)

    async def _announce_upstream(self, namespace: Namespace) -> None:
        try:
            await self.publish_namespace(namespace)
        except (MoqtError, OSError, TimeoutError) as exc:
            log.warning("announcing %r upstream failed: %s", namespace, exc)

    def _withdraw(self, namespaces: Iterable[Namespace]) -> None:
        """Namespaces nobody here publishes any more: withdrawn at the upstream relays too."""
        for namespace in namespaces:
            if namespace in self._namespaces:
                self._namespaces.remove(namespace)
            for upstream in list(self._relays):
                with contextlib.suppress(MoqtError):
                    upstream.session.publish_namespace_done(namespace)
                    upstream.link.transmit_soon()
            for watch in self._namespace_subscribers:
                if is_prefix(watch.prefix, namespace):
                    watch.withdrawn(namespace)

    def _on_subscribe_namespace(self, endpoint: Endpoint, message: SubscribeNamespace) -> None:
        session, request_id, prefix = endpoint.session, message.request_id, message.track_namespace_prefix
        kind = MessageKind.SUBSCRIBE_NAMESPACE_ERROR
        if endpoint.link.peer_identity is None:
            session.subscribe_namespace_error(request_id, refusal(session.profile, kind, RequestError.UNAUTHORIZED),
                                              "not authenticated")
            return
        if any(w.endpoint is endpoint and (is_prefix(w.prefix, prefix) or is_prefix(prefix, w.prefix))
               for w in self._namespace_subscribers):  # "cannot make overlapping namespace subscriptions"
            session.subscribe_namespace_error(
                request_id, refusal(session.profile, kind, RequestError.NAMESPACE_PREFIX_OVERLAP),
                "overlaps a namespace subscription of this session")
            return
        session.subscribe_namespace_ok(request_id)
        watch = NamespaceWatch(endpoint, request_id, prefix, message.options)
        self._namespace_subscribers.append(watch)
        for namespace in self.table.under(prefix):
            self._tell(watch, namespace)

    def _tell(self, watch: NamespaceWatch, namespace: Namespace) -> None:
        """A published namespace, to a namespace subscriber that may read it (others never learn of it)."""
        if self.allowed(watch.endpoint, namespace, Action.SUBSCRIBE):
            watch.published(namespace)

    def _on_publish(self, endpoint: Endpoint, message: Publish) -> None:
        """A publisher pushes one track: accepted from its owner, relayed like an upstream subscription."""
        session, request_id = endpoint.session, message.request_id
        key = (message.track_namespace, message.track_name)
        if not self.allowed(endpoint, message.track_namespace, Action.PUBLISH_NAMESPACE):
            self.stats.refused += 1
            session.publish_error(request_id, RequestError.UNAUTHORIZED, "not authorized to publish this track")
            return
        if key in self.tracks or self.draining:
            session.publish_error(request_id, RequestError.UNINTERESTED, "the track is already relayed")
            return
        session.publish_ok(request_id, filter_type=FilterType.ABSOLUTE_START, start_location=Location(0, 0))
        tracker = RequestTracker(RequestKind.SUBSCRIBE)
        tracker.on_ok(message)
        inbox = endpoint.open_inbox(request_id, tracker, ObjectAssembler())
        track = RelayTrack(key, self.stats, self._track_done)
        track.persistent = True
        self.tracks[key] = track
        track.start(ObjectStream(endpoint, request_id, inbox, None))

    # -- sessions ------------------------------------------------------------------------------------------
    def on_setup(self, endpoint: Endpoint, event: SetupRequested) -> None:
        """As a publisher's, but a draining relay takes no new sessions (its peers reconnect elsewhere)."""
        if self.draining:
            endpoint.session.reject_setup(SessionError.INTERNAL_ERROR, "relay draining")
            endpoint.link.transmit_soon()
            endpoint.terminated(SessionError.INTERNAL_ERROR, "relay draining")
            return
        super().on_setup(endpoint, event)

    def attach(self, link: Link, session: MoqtSession) -> Endpoint:
        """Every session of the relay delivers objects in pieces, so that they can be passed on cut-through."""
        session.deliver_partial_objects = True
        return super().attach(link, session)

    def on_closed(self, endpoint: Endpoint) -> None:
        super().on_closed(endpoint)
        self._withdraw(self.table.remove_owner(endpoint))
        self.stats.publishers = self.table.owner_count()
        self._namespace_subscribers = [w for w in self._namespace_subscribers if w.endpoint is not endpoint]

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self, grace_s: float | None = None) -> None:
        """GOAWAY to every peer, then up to ``grace_s`` for them to leave before closing (draining)."""
        self.draining = True
        for endpoint in self.endpoints:
            if endpoint.usable and endpoint not in self._relays and not endpoint.session.is_client:
                with contextlib.suppress(MoqtError):
                    endpoint.session.goaway()
                    endpoint.link.transmit_soon()
        deadline = asyncio.get_running_loop().time() + (self.relay_settings.drain_s if grace_s is None else grace_s)
        while any(e.usable and e not in self._relays for e in self.endpoints):
            if asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(0.05)
        await self.close()

    async def close(self) -> None:
        for track in list(self.tracks.values()):
            track.cancel()
        for task in list(self._background):
            task.cancel()
        await super().close()
        for endpoint in self.endpoints:
            endpoint.close(SessionError.NO_ERROR, "relay closing")
