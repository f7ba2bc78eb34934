"""`Subscriber`: one MOQT session to a publisher or relay; FETCH and SUBSCRIBE as async iterators.

    sub = await Subscriber.connect("moqt://h1:4433/holder", config)        # client certificate
    sub = await Subscriber.connect(uri, config, token=cwt)                  # or AUTHORIZATION_TOKEN
    async with sub.fetch(namespace, b"raw", Location(0, 0), Location(0, 32)) as objects:
        async for obj in objects:          # MoqtObject: group, object_id, payload (memoryview)
            ...
    async with sub.subscribe(namespace, b"raw", end_group=0) as objects:
        async for obj in objects:          # each object as the producer publishes it
            ...

Objects are yielded as soon as their last octet arrives. Payloads are views: of the received octets
when an object came in one piece, else of the one buffer it was assembled into -- the caller's, when
an ``allocate`` callback says where (a slot of a block buffer), so that no second copy is ever made.
What the consumer has not taken yet is bounded (``max_inbox_octets``); beyond it the request is
cancelled with `ReceiveBufferFull`. ``stall_timeout_s`` bounds a transfer that has started: once a
piece of an object has arrived, waiting that long with no further piece (while the consumer waits)
ends the request with `TransferStalled` -- a publisher or relay that died mid-FETCH is given up in a
fraction of a second instead of the per-object ``timeout_s``, and the caller can fall back.
Errors are the typed ones of ``moqt.tracks.errors``; a request that is abandoned (``break``, an
exception, a timeout) is cancelled at the publisher (FETCH_CANCEL / UNSUBSCRIBE).
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Final

from aioquic.quic.connection import QuicConnection

from moqt.api.endpoint import DEFAULT_INBOX_OCTETS, Endpoint, Inbox
from moqt.api.publisher import TOKEN_TYPE
from moqt.events import MoqtEvent
from moqt.kinds import FilterType, GroupOrder, SessionError
from moqt.messages import ControlMessage
from moqt.params import AuthToken, SetupParameters
from moqt.quic import EndpointConfig, MoqtUri
from moqt.quic.backend import Link, QuicLink, dial
from moqt.session import MoqtSession
from moqt.tracks import Allocator, MoqtObject, ObjectAssembler, RequestKind, RequestTracker, TransferError
from moqt.wire import Location, Namespace

FIRST: Final = Location(0, 0)


class TransferStalled(TransferError):
    """Objects had started to arrive, then nothing arrived for the stream's ``stall_timeout_s``."""

    def __init__(self, stall_s: float) -> None:
        super().__init__(None, f"the transfer stalled: nothing arrived for {stall_s:g} s")
        self.stall_s = stall_s


class ObjectStream:
    """The objects of one FETCH or SUBSCRIBE: an async iterator and an async context manager.

    ``timeout_s`` bounds the wait for each object (and for the end); on expiry the request is
    cancelled and ``TimeoutError`` raised. ``stall_timeout_s`` (None: off) bounds, once objects have
    started to arrive, a wait with no progress at all (not one octet); on expiry the request is
    cancelled and `TransferStalled` raised. Once iteration ends -- normally or not -- the stream is
    closed; closing an unfinished one cancels the request at the publisher.
    """

    def __init__(self, endpoint: Endpoint, request_id: int, inbox: Inbox, timeout_s: float | None,
                 stall_timeout_s: float | None = None) -> None:
        self.endpoint = endpoint
        self.request_id = request_id
        self._inbox = inbox
        self._timeout_s = timeout_s
        self._stall_s = stall_timeout_s
        self._closed = False

    @property
    def buffered_octets(self) -> int:
        return self._inbox.buffered

    async def answered(self) -> ControlMessage | None:
        """Wait for the publisher's FETCH_OK / SUBSCRIBE_OK and return it (a relay forwards its End
        Location, End Of Track, Largest Location); raises the refusal (``FetchRefused``...) or a transfer
        error that came before any OK; one after the OK is raised by the iteration, after the objects
        received before it. None when the request finished without an OK being seen."""
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._inbox.wait_answered()
        except BaseException:
            self.close()
            raise
        return self._inbox.tracker.ok

    def __aiter__(self) -> ObjectStream:
        return self

    async def __anext__(self) -> MoqtObject:
        if self._closed:
            raise StopAsyncIteration
        try:
            if self._inbox.queue:  # already here: get() returns without waiting, no timer to arm
                obj = await self._inbox.get()
            elif self._stall_s is not None and self._inbox.progress_at is not None:
                obj = await self._get_unless_stalled(self._stall_s)
            else:
                async with asyncio.timeout(self._timeout_s):
                    obj = await self._inbox.get()
        except BaseException:
            self.close()
            raise
        if obj is None:
            self.close()
            raise StopAsyncIteration
        return obj

    async def _get_unless_stalled(self, stall_s: float) -> MoqtObject | None:
        """``get`` within ``timeout_s``, raising `TransferStalled` after ``stall_s`` without progress.

        The stall clock starts at the later of the last piece's arrival and this wait's start: a
        consumer that was busy elsewhere (an engine loading a layer) does not make the transfer stall.
        """
        inbox, loop = self._inbox, asyncio.get_running_loop()
        start = loop.time()
        deadline = None if self._timeout_s is None else start + self._timeout_s
        while True:
            stall_at = max(inbox.progress_at or start, start) + stall_s
            try:
                async with asyncio.timeout_at(stall_at if deadline is None else min(stall_at, deadline)):
                    return await inbox.get()
            except TimeoutError:
                now = loop.time()
                if deadline is not None and now >= deadline:
                    raise
                if max(inbox.progress_at or start, start) + stall_s <= now:
                    raise TransferStalled(stall_s) from None
                # pieces arrived meanwhile (an object is still being assembled): keep waiting

    def close(self) -> None:
        """Stop receiving; an unfinished request is cancelled (FETCH_CANCEL / UNSUBSCRIBE)."""
        if not self._closed:
            self._closed = True
            self.endpoint.close_inbox(self.request_id, cancel=True)

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> ObjectStream:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()


class Subscriber:
    """Requests objects over one MOQT session (see the module docstring)."""

    def __init__(self, endpoint: Endpoint, *, timeout_s: float | None = 30.0) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s

    @classmethod
    async def connect(cls, uri: str, config: EndpointConfig, *, token: bytes | None = None,
                      expected_identity: str | None = None, timeout_s: float | None = 30.0,
                      setup_timeout_s: float = 10.0, max_inbox_octets: int = DEFAULT_INBOX_OCTETS) -> Subscriber:
        """Open a session to ``moqt://host:port/path``. Raises ``SetupRefused`` when the server refuses
        it, ``PeerCertificateError``/``ConnectionClosedError``/``TimeoutError`` from the transport."""
        path = MoqtUri.parse(uri).path
        tokens = (AuthToken.use_value(TOKEN_TYPE, token),) if token is not None else ()
        endpoints: list[Endpoint] = []

        def factory(conn: QuicLink) -> MoqtSession:
            session = subscriber_session(conn.quic, path=path, tokens=tokens)
            endpoints.append(Endpoint(conn, session, max_inbox_octets=max_inbox_octets))
            return session

        def on_event(conn: QuicLink, event: MoqtEvent) -> None:
            endpoints[0].handle(event)

        await dial(uri, config, factory, on_event=on_event, expected_identity=expected_identity)
        try:
            await asyncio.wait_for(asyncio.shield(endpoints[0].established), setup_timeout_s)
        except BaseException:
            await endpoints[0].aclose(SessionError.INTERNAL_ERROR, "setup failed", timeout_s=1.0)
            raise
        return cls(endpoints[0], timeout_s=timeout_s)

    @classmethod
    def attach(cls, link: Link, session: MoqtSession, *, timeout_s: float | None = 30.0,
               max_inbox_octets: int = DEFAULT_INBOX_OCTETS) -> Subscriber:
        """A subscriber over an existing client session (made with `subscriber_session`); feed its
        events to ``subscriber.endpoint.handle``."""
        return cls(Endpoint(link, session, max_inbox_octets=max_inbox_octets), timeout_s=timeout_s)

    @property
    def peer_identity(self) -> str | None:
        return self.endpoint.link.peer_identity

    @property
    def usable(self) -> bool:
        """Established and not closed: new requests may be sent."""
        return self.endpoint.usable and self.endpoint.session.can_send_request()

    async def wait_established(self) -> None:
        await asyncio.shield(self.endpoint.established)

    def fetch(self, namespace: Namespace, track_name: bytes, start: Location, end: Location, *,
              allocate: Allocator | None = None, priority: int = 128,
              timeout_s: float | None = None, stall_timeout_s: float | None = None) -> ObjectStream:
        """Standalone FETCH of ``[start, end)`` ("End Location plus 1"; ``end.object`` 0 = all of the
        group). Raises ``moqt.LocalError`` (e.g. ``RequestsBlockedError``) if it cannot be sent.
        ``stall_timeout_s``: see `ObjectStream` (a stored range should flow without pauses)."""
        self._check()
        request_id = self.endpoint.session.fetch(namespace, track_name, start, end, subscriber_priority=priority,
                                                 group_order=GroupOrder.ASCENDING)
        tracker = RequestTracker(RequestKind.FETCH)
        return self._stream(request_id, tracker, allocate, timeout_s, stall_timeout_s)

    def subscribe(self, namespace: Namespace, track_name: bytes, *, start: Location | None = FIRST,
                  end_group: int | None = None, allocate: Allocator | None = None, priority: int = 128,
                  timeout_s: float | None = None) -> ObjectStream:
        """SUBSCRIBE from ``start`` (absolute; None: from the next object published) up to the end of
        ``end_group`` (None: until the track ends). Objects come as they are published."""
        self._check()
        if start is None:
            filter_type = FilterType.LARGEST_OBJECT
        else:
            filter_type = FilterType.ABSOLUTE_START if end_group is None else FilterType.ABSOLUTE_RANGE
        request_id = self.endpoint.session.subscribe(namespace, track_name, filter_type=filter_type,
                                                     start_location=start, end_group=end_group,
                                                     subscriber_priority=priority,
                                                     group_order=GroupOrder.ASCENDING)
        tracker = RequestTracker(RequestKind.SUBSCRIBE, end_group=end_group)
        return self._stream(request_id, tracker, allocate, timeout_s)

    def _check(self) -> None:
        error = self.endpoint.closed_error
        if error is not None:
            raise error

    def _stream(self, request_id: int, tracker: RequestTracker, allocate: Allocator | None,
                timeout_s: float | None, stall_timeout_s: float | None = None) -> ObjectStream:
        inbox = self.endpoint.open_inbox(request_id, tracker, ObjectAssembler(allocate))
        self.endpoint.link.transmit_soon()
        return ObjectStream(self.endpoint, request_id, inbox, self.timeout_s if timeout_s is None else timeout_s,
                            stall_timeout_s)

    async def close(self) -> None:
        """Close the session and wait (bounded) until its connection has ended."""
        await self.endpoint.aclose(SessionError.NO_ERROR, "subscriber closing")


def subscriber_session(quic: QuicConnection, *, path: str | None = None,
                       tokens: tuple[AuthToken, ...] = ()) -> MoqtSession:
    """The client session a `Subscriber` needs: objects delivered in pieces, assembled by the API."""
    return MoqtSession(quic, role="client", path=path, setup_parameters=SetupParameters(authorization_tokens=tokens),
                       deliver_partial_objects=True)
