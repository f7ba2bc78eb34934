"""`Publisher`: accept MOQT sessions, authenticate and authorize peers, serve FETCH and SUBSCRIBE.

* **Sessions.** ``listen`` serves ``moqt.quic`` on a UDP port; every accepted connection gets a
  ``MoqtSession`` with ``auto_accept=False``, so the setup is answered here: a peer whose client
  certificate verified (the transport did it) is accepted; one without a certificate must carry an
  AUTHORIZATION_TOKEN in CLIENT_SETUP that verifies (``moqt.auth``), else the setup is refused with
  the token error's session code (UNAUTHORIZED, MALFORMED_AUTH_TOKEN, EXPIRED_AUTH_TOKEN).
* **Authorization.** Every FETCH, SUBSCRIBE and namespace request asks the `Authorizer` with the peer
  identity, the namespace and the action; a peer authenticated by token must also be covered by its
  token (`TokenRule`). A refusal is FETCH_ERROR / SUBSCRIBE_ERROR UNAUTHORIZED.
* **FETCH** reads the track from the live tracks or the `TrackSource` and writes the range on one
  fetch stream, awaiting ``drain`` before each object so a large block never queues whole.
* **SUBSCRIBE** is served from live tracks (``moqt.api.live``).
* **Namespaces.** ``publish_namespace`` sends PUBLISH_NAMESPACE to the relays connected with
  ``connect_relay`` (and, when asked, to connected peers) and raises `NamespaceRefused` on refusal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

from moqt.api.drafts import refuse_fetch, writable_status
from moqt.api.endpoint import DEFAULT_INBOX_OCTETS, Endpoint
from moqt.api.live import LiveTrack, send_subscription
from moqt.auth import AuthError
from moqt.errors import LocalError
from moqt.events import MoqtEvent, SetupRequested
from moqt.kinds import FetchType, GroupOrder, RequestError, SessionError, StreamReset
from moqt.messages import Fetch, StandaloneFetch, Subscribe
from moqt.params import AuthToken, SetupParameters
from moqt.quic import EndpointConfig, MoqtUri
from moqt.quic.backend import Link, QuicLink, QuicServer, dial, listen
from moqt.session import MoqtSession
from moqt.tracks import (
    Action,
    Authorizer,
    MoqtObject,
    StoredTrack,
    TokenRule,
    TrackSource,
    check_fetch,
    fetch_ok_end,
    fetch_stop,
    subscription_start,
    token_namespaces,
)
from moqt.wire import Location, Namespace

log = logging.getLogger("moqt.api.publisher")

TOKEN_TYPE: Final = 0  # "negotiated out of band" (draft-14 9.2.1.1), as D3's CWT tokens use


@runtime_checkable
class Flushable(Protocol):
    """A link that can send what is queued right now (``MoqtConnection``); others get ``transmit_soon``."""

    def transmit_now(self) -> None: ...


@dataclass(frozen=True, slots=True)
class PublisherSettings:
    """``path``: the only PATH accepted (None: any); ``request_window``: requests a peer may have open."""

    path: str | None = None
    request_window: int = 100
    max_inbox_octets: int = DEFAULT_INBOX_OCTETS
    setup_timeout_s: float = 10.0


class Publisher:
    """Serves tracks to authenticated, authorized peers (see the module docstring)."""

    def __init__(self, source: TrackSource | None = None, *, authorize: Authorizer,
                 token_rule: TokenRule = token_namespaces, settings: PublisherSettings | None = None) -> None:
        self.source = source
        self.settings = settings or PublisherSettings()
        self._authorize = authorize
        self._token_rule = token_rule
        self._live: dict[tuple[Namespace, bytes], LiveTrack] = {}
        self._endpoints: dict[int, Endpoint] = {}
        self._relays: list[Endpoint] = []
        self._namespaces: list[Namespace] = []
        self.server: QuicServer | None = None

    @property
    def port(self) -> int:
        if self.server is None:
            raise RuntimeError("the publisher is not listening")
        return self.server.port

    @property
    def endpoints(self) -> list[Endpoint]:
        """The sessions of connected peers (incoming) and relays (outgoing)."""
        return list(self._endpoints.values())

    # -- sessions ----------------------------------------------------------------------------------
    async def listen(self, host: str, port: int, config: EndpointConfig) -> int:
        """Accept MOQT over QUIC (``config.settings.quic``'s stack) on ``host:port`` (0: any free port);
        returns the port."""
        self.server = await listen(host, port, config, self._session_for, on_event=self._on_event)
        return self.server.port

    def _session_for(self, conn: QuicLink) -> MoqtSession:
        session = MoqtSession(conn.quic, role="server", path=self.settings.path, auto_accept=False,
                              request_window=self.settings.request_window)
        self.attach(conn, session)
        return session

    def _on_event(self, conn: QuicLink, event: MoqtEvent) -> None:
        endpoint = self._endpoints.get(id(conn))
        if endpoint is not None:
            endpoint.handle(event)

    def attach(self, link: Link, session: MoqtSession) -> Endpoint:
        """Serve the peer of an existing session (the in-memory link of tests, or a custom transport);
        feed its events to the returned endpoint's ``handle``."""
        endpoint = Endpoint(link, session, serving=self, max_inbox_octets=self.settings.max_inbox_octets)
        self._endpoints[id(link)] = endpoint
        return endpoint

    def on_closed(self, endpoint: Endpoint) -> None:
        self._endpoints.pop(id(endpoint.link), None)
        if endpoint in self._relays:
            self._relays.remove(endpoint)

    async def connect_relay(self, uri: str, config: EndpointConfig, *, token: bytes | None = None,
                            expected_identity: str | None = None) -> Endpoint:
        """Connect to a relay (we are the QUIC client), publish our namespaces there and serve its
        FETCH/SUBSCRIBE like any peer's. Raises ``SetupRefused`` or the transport's errors."""
        tokens = (AuthToken.use_value(TOKEN_TYPE, token),) if token is not None else ()
        params = SetupParameters(authorization_tokens=tokens)
        path = MoqtUri.parse(uri).path

        def factory(conn: QuicLink) -> MoqtSession:
            session = MoqtSession(conn.quic, role="client", path=path, setup_parameters=params,
                                  request_window=self.settings.request_window)
            self.attach(conn, session)
            return session

        conn = await dial(uri, config, factory, on_event=self._on_event, expected_identity=expected_identity)
        endpoint = self._endpoints[id(conn)]
        try:
            await asyncio.wait_for(asyncio.shield(endpoint.established), self.settings.setup_timeout_s)
        except BaseException:
            await endpoint.aclose(SessionError.INTERNAL_ERROR, "setup failed", timeout_s=1.0)
            raise
        await self.adopt_relay(endpoint)
        return endpoint

    async def adopt_relay(self, endpoint: Endpoint) -> None:
        """Treat an established outgoing session (ours is the client) as a relay connection: our
        namespaces are published there, now and later (``connect_relay``, or an in-memory link)."""
        self._relays.append(endpoint)
        await asyncio.gather(*(self._announce(endpoint, ns) for ns in self._namespaces))

    async def close(self) -> None:
        """Close every session and stop listening."""
        for track in list(self._live.values()):
            track.close()
        await asyncio.gather(*(endpoint.aclose(SessionError.NO_ERROR, "publisher closing")
                               for endpoint in list(self._endpoints.values())))
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    # -- setup and authorization -------------------------------------------------------------------
    def on_setup(self, endpoint: Endpoint, event: SetupRequested) -> None:
        """Accept a verified certificate, or a token that verifies; refuse anything else."""
        link, session = endpoint.link, endpoint.session
        failure: AuthError | None = None
        for token in event.authorization:
            try:
                link.authenticate_with_token(token.value)
            except AuthError as exc:
                failure = exc
                break  # one bad token fails the setup, even beside a certificate (fail closed)
        if failure is not None or link.authenticated_by is None:
            code = failure.error if failure is not None else SessionError.UNAUTHORIZED
            reason = str(failure) if failure is not None else "no client certificate and no authorization token"
            log.info("MOQT setup refused: %s", reason)
            session.reject_setup(code, reason)
            endpoint.link.transmit_soon()
            endpoint.terminated(code, reason)  # the session closed itself: it reports no termination
            return
        for follow_up in session.accept_setup():
            endpoint.handle(follow_up)

    def allowed(self, endpoint: Endpoint, namespace: Namespace, action: Action) -> bool:
        """The authorization decision for one request of this peer (see the module docstring)."""
        link = endpoint.link
        identity = link.peer_identity
        if identity is None or link.authenticated_by is None:
            return False
        if link.authenticated_by == "token" and (link.token_claims is None
                                                 or not self._token_rule(link.token_claims, namespace)):
            return False
        return self._authorize(identity, namespace, action)

    # -- live tracks -------------------------------------------------------------------------------
    def track(self, namespace: Namespace, name: bytes, *, extensions_present: bool = False,
              retain_groups: int = 1) -> LiveTrack:
        """A new live track (an open one of the same name is closed first)."""
        old = self._live.get((namespace, name))
        if old is not None:
            old.close()
        track = LiveTrack(namespace, name, extensions_present=extensions_present, retain_groups=retain_groups,
                          on_close=self._track_closed)
        self._live[(namespace, name)] = track
        return track

    def _track_closed(self, track: LiveTrack) -> None:
        if self._live.get((track.namespace, track.name)) is track:
            del self._live[(track.namespace, track.name)]

    async def _lookup(self, namespace: Namespace, name: bytes) -> StoredTrack | None:
        live = self._live.get((namespace, name))
        if live is not None:
            return live
        return None if self.source is None else await self.source.lookup(namespace, name)

    # -- namespaces --------------------------------------------------------------------------------
    async def publish_namespace(self, namespace: Namespace, *, include_peers: bool = False) -> None:
        """PUBLISH_NAMESPACE to every connected relay (and peer, if asked), now and on later relay
        connections; raises the first ``NamespaceRefused``."""
        if namespace not in self._namespaces:
            self._namespaces.append(namespace)
        targets: Iterable[Endpoint] = self.endpoints if include_peers else list(self._relays)
        await asyncio.gather(*(self._announce(e, namespace) for e in targets if e.usable))

    async def _announce(self, endpoint: Endpoint, namespace: Namespace) -> None:
        if not self.allowed(endpoint, namespace, Action.PUBLISH_NAMESPACE) and endpoint not in self._relays:
            return  # a peer that may not see the namespace does not learn of it
        request_id = endpoint.session.publish_namespace(namespace)
        endpoint.link.transmit_soon()
        await asyncio.wait_for(endpoint.await_namespace(request_id), self.settings.setup_timeout_s)

    # -- requests ----------------------------------------------------------------------------------
    def on_request(self, endpoint: Endpoint, message: Fetch | Subscribe) -> None:
        if isinstance(message, Fetch):
            endpoint.spawn(message.request_id, self._serve_fetch(endpoint, message))
        else:
            self._accept_subscription(endpoint, message)

    def _accept_subscription(self, endpoint: Endpoint, message: Subscribe) -> None:
        session, request_id = endpoint.session, message.request_id
        namespace, name = message.track_namespace, message.track_name
        if not self.allowed(endpoint, namespace, Action.SUBSCRIBE):
            session.subscribe_error(request_id, RequestError.UNAUTHORIZED, "not authorized for this namespace")
            return
        track = self._live.get((namespace, name))
        if track is None:
            stored = self.source is not None
            session.subscribe_error(request_id, RequestError.TRACK_DOES_NOT_EXIST,
                                    "no live track of that name" + ("; stored tracks are read by FETCH" if stored
                                                                    else ""))
            return
        largest = track.largest
        start = subscription_start(message.filter_type, message.start_location, largest)
        session.subscribe_ok(request_id, group_order=GroupOrder.ASCENDING, largest_location=largest)
        endpoint.served[request_id] = (namespace, name, largest)
        endpoint.spawn(request_id, send_subscription(track, endpoint, request_id, start, message.end_group))

    async def _serve_fetch(self, endpoint: Endpoint, message: Fetch) -> None:
        session, link, request_id = endpoint.session, endpoint.link, message.request_id
        try:
            answer = await self._answer_fetch(endpoint, message)
            if answer is not None:
                stream = session.open_fetch_stream(request_id)
                link.transmit_soon()
                await self._send_range(endpoint, stream, answer)
        except (LocalError, ConnectionError):
            pass  # cancelled by the peer, or the session ended: nobody to answer
        finally:
            link.transmit_soon()

    async def _answer_fetch(self, endpoint: Endpoint, message: Fetch) -> AsyncIterator[MoqtObject] | None:
        """FETCH_OK and the objects to send, or None after a FETCH_ERROR."""
        session, request_id = endpoint.session, message.request_id
        request = message.standalone or self._joined_range(endpoint, message)
        if request is None:
            return None
        if not self.allowed(endpoint, request.track_namespace, Action.FETCH):
            session.fetch_error(request_id, RequestError.UNAUTHORIZED, "not authorized for this namespace")
            return None
        try:
            track = await self._lookup(request.track_namespace, request.track_name)
        except (LocalError, ConnectionError, asyncio.CancelledError):
            raise
        except Exception:  # the pluggable source failed: answer, never leave the FETCH hanging
            log.exception("track lookup failed")
            session.fetch_error(request_id, RequestError.INTERNAL_ERROR, "the track could not be read")
            return None
        if track is None:
            session.fetch_error(request_id, RequestError.TRACK_DOES_NOT_EXIST, "no such track")
            return None
        largest = track.largest
        code = check_fetch(request.start, request.end, largest)
        if code is not None or largest is None:
            refuse_fetch(session, request_id, code or RequestError.NO_OBJECTS, "nothing in that range",
                         start=request.start)
            return None
        stop = fetch_stop(request.end)
        session.fetch_ok(request_id, fetch_ok_end(request.end, largest), group_order=GroupOrder.ASCENDING,
                         end_of_track=track.complete and stop > largest)
        return track.read(request.start, stop)

    def _joined_range(self, endpoint: Endpoint, message: Fetch) -> StandaloneFetch | None:
        """The range a joining FETCH names ("Joining Fetch Range Calculation"), or None once refused.

        It ends just after the Largest Location our SUBSCRIBE_OK carried; with none ("no Objects have
        been published for the track, and the SUBSCRIBE_OK did not include a LARGEST_OBJECT"), the
        answer is INVALID_RANGE. The session has already refused a Joining Request ID that names no
        subscription of the peer's.
        """
        session, joining = endpoint.session, message.joining
        assert joining is not None
        served = endpoint.served.get(joining.joining_request_id)
        if served is None:
            session.fetch_error(message.request_id, RequestError.INVALID_JOINING_REQUEST_ID,
                                "that subscription is not one this publisher serves")
            return None
        namespace, name, largest = served
        if largest is None:
            session.fetch_error(message.request_id, RequestError.INVALID_RANGE,
                                "nothing was published before the subscription")
            return None
        if message.fetch_type is FetchType.ABSOLUTE_JOINING:
            start = Location(joining.joining_start, 0)
        else:
            start = Location(max(largest.group - joining.joining_start, 0), 0)
        return StandaloneFetch(namespace, name, start, Location(largest.group, largest.object + 1))

    @staticmethod
    async def _send_range(endpoint: Endpoint, stream: int, objects: AsyncIterator[MoqtObject]) -> None:
        """Write the objects, each after ``drain``; the first leaves alone, the stream's end with the last.

        The first object is flushed as soon as the next one is known to exist (a short fetch's FETCH_OK,
        object and FIN then share one transmit and its datagrams): queuing the rest first would make
        it wait for all their packets to be built. Flushing synchronously, instead of yielding to the
        event loop, saves a loop turn per fetch.
        """
        session, link = endpoint.session, endpoint.link
        flush = link.transmit_now if isinstance(link, Flushable) else link.transmit_soon
        try:
            source = aiter(objects)
            obj = await anext(source, None)
            sent = 0
            while obj is not None:
                if not writable_status(session.profile, obj.status, fetch=True):
                    obj = await anext(source, None)  # a marker the draft's fetch stream cannot carry
                    continue
                await link.drain(stream)
                session.send_fetch_object(stream, obj.group, obj.subgroup, obj.object_id, obj.payload,
                                          extensions=obj.extensions, status=obj.status)
                link.transmit_soon()
                sent += 1
                obj = await anext(source, None)
                if sent == 1 and obj is not None:
                    flush()
        except (LocalError, ConnectionError, asyncio.CancelledError):
            raise
        except Exception:  # the source failed mid-way: the stream cannot be completed
            log.exception("FETCH stream %d aborted", stream)
            session.reset_stream(stream, StreamReset.INTERNAL_ERROR)
            return
        session.finish_stream(stream)
