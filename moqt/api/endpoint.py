"""One MOQT session seen by the publisher/subscriber API: routes its events, runs its serving jobs.

Why one class for both directions: a MOQT session is symmetric after setup -- a subscriber's session
may be asked to serve (a relay subscribes back), a publisher's outgoing relay connection receives
FETCH and SUBSCRIBE. `Endpoint` routes every event of one session: answers and objects of *our*
requests go to an `Inbox` per request; the peer's requests go to the `Serving` side (the
`Publisher`), which answers them in tasks owned here. Peer errors are mapped to the API's exceptions
in this one place, where each wire code gets its draft-neutral name from the session's profile (a
code the profile does not name stays the integer), so nothing above the session knows a draft's
numbers. The link below is a small interface (`Link`) that ``moqt.quic.MoqtConnection``
implements, and so does the in-memory link of ``moqt.api.memory`` for tests without sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Coroutine
from typing import Any, Final, Protocol

from moqt.errors import LocalError, MoqtError
from moqt.events import (
    ControlMessageReceived,
    DataStreamEnded,
    DataStreamReset,
    MalformedTrack,
    MoqtEvent,
    ObjectChunkReceived,
    ObjectReceived,
    SessionEstablished,
    SessionTerminated,
    SetupRequested,
)
from moqt.kinds import MessageKind, PublishDoneStatus, RequestError, SessionError
from moqt.messages import (
    ControlMessage,
    Fetch,
    FetchCancel,
    FetchError,
    FetchOk,
    Publish,
    PublishDone,
    PublishNamespace,
    PublishNamespaceError,
    PublishNamespaceOk,
    RequestUpdate,
    Subscribe,
    SubscribeError,
    SubscribeNamespace,
    SubscribeOk,
    TrackStatus,
    Unsubscribe,
)
from moqt.quic.backend import Link
from moqt.session import MoqtSession
from moqt.tracks import (
    MalformedTrackError,
    MoqtApiError,
    MoqtObject,
    NamespaceRefused,
    ObjectAssembler,
    ReceiveBufferFull,
    RequestKind,
    RequestTracker,
    SessionLostError,
    SetupRefused,
)
from moqt.wire import Location, Namespace

log = logging.getLogger("moqt.api")

DEFAULT_INBOX_OCTETS: Final = 64 << 20


class Serving(Protocol):
    """The side that answers the peer's setup and requests (the `Publisher`)."""

    def on_setup(self, endpoint: Endpoint, event: SetupRequested) -> None: ...

    def on_request(self, endpoint: Endpoint, message: Fetch | Subscribe) -> None: ...

    def on_closed(self, endpoint: Endpoint) -> None: ...


class ControlServing(Serving, Protocol):
    """A `Serving` that also answers the other control messages (a relay: PUBLISH_NAMESPACE, PUBLISH,
    SUBSCRIBE_NAMESPACE, GOAWAY...): ``on_control`` returns False for those it leaves to the default."""

    def on_control(self, endpoint: Endpoint, message: ControlMessage) -> bool: ...


class Inbox:
    """The objects of one of our requests until the consumer takes them (at most ``max_octets``)."""

    def __init__(self, tracker: RequestTracker, assembler: ObjectAssembler, max_octets: int) -> None:
        self.tracker = tracker
        self.assembler = assembler
        self.max_octets = max_octets
        self.queue: deque[MoqtObject] = deque()
        self.buffered = 0
        self.progress_at: float | None = None  # when a piece of an object last arrived (a stall bound's clock)
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None

    def touch(self) -> None:
        """A piece of an object arrived: the transfer is making progress."""
        self.progress_at = self._loop.time()

    def push(self, obj: MoqtObject) -> bool:
        """Queue an object; False (and the request failed) when the consumer is too far behind."""
        self.queue.append(obj)
        self.buffered += obj.payload.nbytes
        if self.buffered > self.max_octets:
            self.tracker.fail(ReceiveBufferFull(None, f"more than {self.max_octets} octets not consumed"))
            return False
        self.wake()
        return True

    def wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait_answered(self) -> None:
        """Until the publisher answered (OK) or the request is over; raises the request's error if it
        failed before an OK. After an OK, a later error (a stream reset, the session lost) is `get`'s to
        raise, once the objects received before it have been taken: the consumer loses none of them."""
        while not self.tracker.accepted:
            if self.tracker.error is not None:
                raise self.tracker.error
            if self.tracker.finished:
                return
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def get(self) -> MoqtObject | None:
        """The next object; None once the request is over; raises the request's error at its end."""
        while not self.queue:
            if self.tracker.error is not None:
                raise self.tracker.error
            if self.tracker.finished:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        obj = self.queue.popleft()
        self.buffered -= obj.payload.nbytes
        return obj


class Endpoint:
    """Routes one session's events (see the module docstring); one per connection."""

    def __init__(self, link: Link, session: MoqtSession, *, serving: Serving | None = None,
                 max_inbox_octets: int = DEFAULT_INBOX_OCTETS) -> None:
        self.link = link
        self.session = session
        self.serving = serving
        self.max_inbox_octets = max_inbox_octets
        self.established: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed_error: SessionLostError | None = None
        self._inboxes: dict[int, Inbox] = {}
        self._jobs: dict[int, asyncio.Task[None]] = {}
        self._namespace_waiters: dict[int, asyncio.Future[None]] = {}
        #: The peer's subscriptions we accepted: track and the Largest Location our SUBSCRIBE_OK carried
        #: (what a joining FETCH of one is computed from).
        self.served: dict[int, tuple[Namespace, bytes, Location | None]] = {}
        self._ending: dict[int, tuple[PublishDoneStatus, str]] = {}  # subscriptions to end once their job stopped

    @property
    def usable(self) -> bool:
        return self.closed_error is None and self.session.is_established and not self.link.closed

    # -- our requests ----------------------------------------------------------------------------
    def open_inbox(self, request_id: int, tracker: RequestTracker, assembler: ObjectAssembler) -> Inbox:
        inbox = Inbox(tracker, assembler, self.max_inbox_octets)
        self._inboxes[request_id] = inbox
        return inbox

    def close_inbox(self, request_id: int, *, cancel: bool) -> None:
        """The consumer is done with a request; an unfinished one is cancelled at the publisher."""
        inbox = self._inboxes.pop(request_id, None)
        if inbox is None or not cancel or inbox.tracker.finished:
            return
        if self.closed_error is None:
            try:
                if inbox.tracker.kind is RequestKind.FETCH:
                    self.session.fetch_cancel(request_id)
                else:
                    self.session.unsubscribe(request_id)
            except LocalError:
                pass  # already over at the session (answered with an error, or ended)
            self.link.transmit_soon()

    def await_namespace(self, request_id: int) -> asyncio.Future[None]:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._namespace_waiters[request_id] = waiter
        return waiter

    # -- serving jobs ----------------------------------------------------------------------------
    def spawn(self, request_id: int, work: Coroutine[Any, Any, None]) -> None:
        """Run a serving job for the peer's request; cancelled by its FETCH_CANCEL/UNSUBSCRIBE."""
        task = asyncio.get_running_loop().create_task(work)
        self._jobs[request_id] = task
        task.add_done_callback(lambda t: self._job_done(request_id, t))

    def end_served(self, request_id: int, status: PublishDoneStatus, reason: str) -> None:
        """End a subscription we serve: its job stops (resetting the stream it had open), then PUBLISH_DONE."""
        job = self._jobs.get(request_id)
        if job is None:
            return
        self._ending[request_id] = (status, reason)
        job.cancel()

    def _finish_ending(self, request_id: int) -> None:
        status, reason = self._ending.pop(request_id)
        with contextlib.suppress(LocalError):  # the senders reset their open streams when cancelled
            self.session.publish_done(request_id, status, reason)
        self.link.transmit_soon()

    def _job_done(self, request_id: int, task: asyncio.Task[None]) -> None:
        if self._jobs.get(request_id) is task:
            del self._jobs[request_id]
            self.served.pop(request_id, None)
        if request_id in self._ending and self.closed_error is None:
            self._finish_ending(request_id)
        if not task.cancelled() and (error := task.exception()) is not None:
            if isinstance(error, ConnectionError) or (isinstance(error, LocalError) and not self.usable):
                # the peer went away, or ended the session under the job: no bug of ours
                log.info("serving request %d ended early: %s", request_id, error,
                         extra={"kvsp_peer": "moqt.request-ended"})  # one line (kvsp/service/logs.py)
            else:
                log.error("serving request %d failed", request_id, exc_info=error)

    # -- events in -------------------------------------------------------------------------------
    def handle(self, event: MoqtEvent) -> None:
        """Consume one session event (called synchronously by the transport for each)."""
        match event:
            case ObjectChunkReceived():
                self._on_chunk(event)
            case ObjectReceived():
                self._on_object(event)
            case ControlMessageReceived(message=message):
                self._on_control(message)
            case DataStreamEnded(stream_id=stream_id, request_id=request_id, end_of_group=end_of_group):
                inbox = self._inboxes.get(request_id)
                if inbox is not None:
                    inbox.tracker.on_stream_ended(inbox.assembler.group_of.pop(stream_id, None), end_of_group)
                    inbox.wake()
            case DataStreamReset(stream_id=stream_id, request_id=request_id, error_code=code):
                inbox = self._inboxes.get(request_id) if request_id is not None else None
                if inbox is not None:
                    inbox.assembler.drop_stream(stream_id)
                    inbox.tracker.on_stream_reset(self.session.profile.stream_resets.name(code) or code)
                    inbox.wake()
            case MalformedTrack(request_id=request_id, reason=reason):
                self._fail(request_id, MalformedTrackError(SessionError.PROTOCOL_VIOLATION, reason))
            case SetupRequested():
                self._on_setup(event)
            case SessionEstablished():
                if not self.established.done():
                    self.established.set_result(None)
            case SessionTerminated(error_code=code, reason_phrase=reason, error=error):
                self.terminated(error or code, reason)

    def _on_setup(self, event: SetupRequested) -> None:
        if self.serving is not None:
            self.serving.on_setup(self, event)
        else:
            self.session.reject_setup(SessionError.PROTOCOL_VIOLATION, "not a MOQT server")

    def _on_chunk(self, event: ObjectChunkReceived) -> None:
        inbox = self._inboxes.get(event.request_id)
        if inbox is None or inbox.tracker.over:
            return
        inbox.touch()
        try:
            obj = inbox.assembler.chunk(event)
        except MoqtApiError as exc:
            self._fail(event.request_id, exc)
            return
        if obj is not None and not inbox.push(obj):
            self.close_inbox(event.request_id, cancel=True)
            self._inboxes[event.request_id] = inbox  # keep it: the consumer still reads the error

    def _on_object(self, event: ObjectReceived) -> None:
        inbox = self._inboxes.get(event.request_id)
        if inbox is not None and not inbox.tracker.over:
            inbox.touch()
            if event.stream_id is not None:
                inbox.assembler.group_of[event.stream_id] = event.group_id
            inbox.push(MoqtObject(event.group_id, event.object_id, event.payload, event.extensions,
                                  event.subgroup_id or 0, event.status))

    def _fail(self, request_id: int, error: MoqtApiError) -> None:
        inbox = self._inboxes.get(request_id)
        if inbox is not None:
            inbox.tracker.fail(error)
            inbox.wake()

    def _on_control(self, message: ControlMessage) -> None:
        match message:
            case Fetch() | Subscribe():
                self._on_request(message)
            case FetchCancel(request_id=request_id) | Unsubscribe(request_id=request_id):
                job = self._jobs.get(request_id)
                if job is not None:
                    job.cancel()
            case FetchOk(request_id=request_id) | SubscribeOk(request_id=request_id):
                inbox = self._inboxes.get(request_id)
                if inbox is not None:
                    inbox.tracker.on_ok(message)
                    inbox.wake()
            case FetchError():
                self._on_refused(message.request_id, self._request_error(MessageKind.FETCH_ERROR, message.error_code),
                                 message.reason)
            case SubscribeError():
                self._on_refused(message.request_id,
                                 self._request_error(MessageKind.SUBSCRIBE_ERROR, message.error_code), message.reason)
            case PublishDone(request_id=request_id, status_code=code, stream_count=count, reason=reason):
                inbox = self._inboxes.get(request_id)
                if inbox is not None:
                    inbox.tracker.on_publish_done(self.session.profile.publish_done.name(code) or code, count, reason)
                    inbox.wake()
            case PublishNamespaceOk(request_id=request_id):
                self._namespace_answer(request_id, None)
            case PublishNamespaceError(request_id=request_id, error_code=code, reason=reason):
                error = self._request_error(MessageKind.PUBLISH_NAMESPACE_ERROR, code)
                self._namespace_answer(request_id, NamespaceRefused(error, reason))
            case RequestUpdate():
                self._on_update(message)
            case _:
                handler = getattr(self.serving, "on_control", None)  # a relay serves the rest (ControlServing)
                if handler is None or not handler(self, message):
                    self._not_supported(message)

    def _on_request(self, message: Fetch | Subscribe) -> None:
        if self.serving is not None:
            self.serving.on_request(self, message)
        elif isinstance(message, Fetch):
            self.session.fetch_error(message.request_id, RequestError.NOT_SUPPORTED,
                                     "this endpoint publishes nothing")
        else:
            self.session.subscribe_error(message.request_id, RequestError.NOT_SUPPORTED,
                                         "this endpoint publishes nothing")

    def _on_update(self, message: RequestUpdate) -> None:
        """The peer's REQUEST_UPDATE of a request we serve (draft-16 and later; answered, unlike
        draft-14's SUBSCRIBE_UPDATE). What our senders do not act on is accepted (priority, delivery
        timeout, tokens, a new-group request, FORWARD staying 1); pausing or moving a subscription is
        not served: REQUEST_ERROR NOT_SUPPORTED, and a subscription refused an update ends with
        PUBLISH_DONE UPDATE_FAILED ("the publisher MUST also send a PUBLISH_DONE with UPDATE_FAILED")."""
        params, target = message.parameters, message.existing_request_id
        if params.forward is not False and params.subscription_filter is None and params.group_order is None:
            self.session.update_ok(message.request_id)
            return
        self.session.update_error(message.request_id, RequestError.NOT_SUPPORTED,
                                  "this publisher does not pause or move a subscription")
        if target in self.served:
            self.end_served(target, PublishDoneStatus.UPDATE_FAILED, "REQUEST_UPDATE refused")

    def _request_error(self, message: MessageKind, code: int) -> RequestError | int:
        return self.session.profile.request_errors[message].name(code) or code

    def _on_refused(self, request_id: int, error: RequestError | int, reason: str) -> None:
        inbox = self._inboxes.get(request_id)
        if inbox is not None:
            inbox.tracker.on_refused(error, reason)
            inbox.wake()

    def _namespace_answer(self, request_id: int, error: NamespaceRefused | None) -> None:
        waiter = self._namespace_waiters.pop(request_id, None)
        if waiter is not None and not waiter.done():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    def _not_supported(self, message: ControlMessage) -> None:
        """Requests this API does not serve get the draft's NOT_SUPPORTED-style answer; the rest is
        session housekeeping (GOAWAY, MAX_REQUEST_ID, SUBSCRIBE_UPDATE...) that needs nothing here."""
        session = self.session
        match message:
            case PublishNamespace(request_id=request_id):
                session.publish_namespace_error(request_id, RequestError.NOT_SUPPORTED, "not a relay")
            case SubscribeNamespace(request_id=request_id):
                session.subscribe_namespace_error(request_id, RequestError.NOT_SUPPORTED,
                                                  "not a relay")
            case TrackStatus(request_id=request_id):
                session.track_status_error(request_id, RequestError.NOT_SUPPORTED, "not supported")
            case Publish(request_id=request_id):
                session.publish_error(request_id, RequestError.NOT_SUPPORTED, "not a relay")

    # -- the end -----------------------------------------------------------------------------------
    def terminated(self, why: SessionError | int, reason: str) -> None:
        """The session is over: every open request fails, every serving job stops."""
        if self.closed_error is not None:
            return
        error = self.closed_error = SessionLostError(why, f"MOQT session ended: {reason or 'closed'}")
        if not self.established.done():
            self.established.set_exception(SetupRefused(why, reason))
            self.established.exception()  # retrieved: nobody may be waiting
        for inbox in self._inboxes.values():
            inbox.tracker.fail(error)
            inbox.wake()
        for waiter in self._namespace_waiters.values():
            if not waiter.done():
                waiter.set_exception(error)
        self._namespace_waiters.clear()
        for job in list(self._jobs.values()):
            job.cancel()
        if self.serving is not None:
            self.serving.on_closed(self)

    def close(self, why: SessionError | int = SessionError.NO_ERROR, reason: str = "") -> None:
        """Close the session and its connection."""
        with contextlib.suppress(MoqtError):
            self.session.close(why, reason)
        self.link.close(self.session.profile.session_errors.code(why), reason)
        self.terminated(why, reason or "closed locally")

    async def aclose(self, why: SessionError | int = SessionError.NO_ERROR, reason: str = "", *,
                     timeout_s: float = 5.0) -> None:
        """`close`, then wait (bounded) until the connection has ended and released its socket."""
        self.close(why, reason)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.link.wait_closed(), timeout_s)
