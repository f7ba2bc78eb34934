"""Outbound requests: every control message an application sends, checked against the request table.

Why a separate base class: the session facade would otherwise exceed the module size we allow; the
split follows the draft -- this file is "Control Messages" (requests and their answers), the session
module keeps the lifecycle, setup and the data plane. A request's message is built (and so checked)
before its Request ID is taken, so a rejected argument never leaves a gap in the ID sequence.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from moqt.errors import GoingAwayError, LocalError, RequestsBlockedError
from moqt.kinds import FetchType, FilterType, GroupOrder, MessageKind, PublishDoneStatus, RequestError
from moqt.messages import (
    ControlMessage,
    Fetch,
    FetchCancel,
    FetchError,
    FetchOk,
    JoiningFetch,
    NamespaceDone,
    NamespaceNotice,
    Publish,
    PublishDone,
    PublishError,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishNamespaceError,
    PublishNamespaceOk,
    PublishOk,
    RequestErrorReply,
    RequestOk,
    RequestsBlocked,
    RequestUpdate,
    StandaloneFetch,
    Subscribe,
    SubscribeError,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
    SubscribeOk,
    SubscribeUpdate,
    TrackStatus,
    TrackStatusError,
    TrackStatusOk,
    Unsubscribe,
    UnsubscribeNamespace,
)
from moqt.messages.subscribe import filter_start
from moqt.params import RequestParameters
from moqt.session.data_streams import DataReceiver
from moqt.session.request_state import Origin, RequestKind
from moqt.session.requests import Request, apply_update, update_problem
from moqt.session.state import SessionState
from moqt.wire import Location, Namespace

M = TypeVar("M", bound=ControlMessage)


class RequestApi:
    """Sending requests, answers, updates and cancellations; state checks raise ``LocalError``."""

    _core: SessionState
    _data: DataReceiver

    # -- shared checks ---------------------------------------------------------------------------
    def _check_open(self) -> SessionState:
        return self._core.check_open()

    def _new_request_id(self, *, new_request: bool = True) -> int:
        core = self._check_open()
        if new_request and core.goaway_received:
            raise GoingAwayError("the peer sent GOAWAY")
        if not core.ids.can_allocate():
            report = core.ids.take_blocked_report()
            if report is not None:
                core.send_control(RequestsBlocked(report))
            raise RequestsBlockedError(core.ids.peer_max)
        return core.ids.allocate()

    def _send_request(self, draft: M, request: Request, *, new_request: bool = True) -> M:
        """Take the next Request ID for an already-validated message, record it and send it. What the
        session's draft cannot say (draft-14 has no empty prefix) is refused before the ID is taken."""
        self._check_open().shape.check_sendable(draft)
        request_id = self._new_request_id(new_request=new_request)
        message = dataclasses.replace(draft, request_id=request_id)
        request.request_id = request_id
        self._core.requests[request_id] = request
        self._core.send_control(message)
        return message

    def _remote(self, request_id: int, answer: MessageKind) -> Request:
        """The peer's request ``request_id``, in a state that ``answer`` may follow."""
        core = self._check_open()
        request = core.requests.get(request_id)
        if request is None or not request.allows(Origin.LOCAL, answer):
            raise LocalError(f"no request {request_id} awaits {answer.value}")
        return request

    def _local(self, request_id: int, kind: RequestKind) -> Request:
        core = self._check_open()
        request = core.requests.get(request_id)
        if request is None or not request.local or request.kind != kind:
            raise LocalError(f"no open {kind.value} {request_id} of ours")
        return request

    def _ended(self, request: Request, message: ControlMessage) -> None:
        """Send a cancellation or end; the request stays only while the peer's answer is owed."""
        request.step(Origin.LOCAL, message.KIND)
        self._core.send_control(message)
        if not request.cancelled:
            self._core.remove_request(request)

    def _request_error(self, message: MessageKind, error: RequestError | int) -> int:
        return self._core.shape.error_code(message, error)

    def _require(self, kind: MessageKind, instead: str = "") -> None:
        """Refuse a send the session's draft has no message for (draft-16 has no SUBSCRIBE_UPDATE)."""
        profile = self._check_open().profile
        if not profile.has_message(kind):
            raise LocalError(f"draft-{profile.draft} has no {kind.value}{instead}")

    def _pick_alias(self, track_alias: int | None) -> int:
        """A Track Alias no subscription we publish uses: the caller's, or the next free one."""
        core = self._check_open()
        in_use = {r.track_alias for r in core.requests.values() if r.we_publish}
        if track_alias is not None:
            if track_alias in in_use:
                raise LocalError(f"Track Alias {track_alias} is in use")
            return track_alias
        alias = core.allocate_track_alias()
        while alias in in_use:
            alias = core.allocate_track_alias()
        return alias

    def _answered(self, request: Request, message: ControlMessage, *, remove: bool) -> None:
        request.step(Origin.LOCAL, message.KIND)
        self._core.send_control(message)
        if remove:
            self._core.remove_request(request)

    # -- SUBSCRIBE (subscriber side) -------------------------------------------------------------
    def subscribe(self, namespace: Namespace, track_name: bytes, *,
                  filter_type: FilterType = FilterType.LARGEST_OBJECT, start_location: Location | None = None,
                  end_group: int | None = None, subscriber_priority: int = 128,
                  group_order: GroupOrder = GroupOrder.PUBLISHER_DEFAULT, forward: bool = True,
                  parameters: RequestParameters | None = None) -> int:
        """Send SUBSCRIBE; returns its Request ID. Objects arrive as ``ObjectReceived``."""
        core = self._check_open()
        if any(r.we_subscribe and (r.namespace, r.track_name) == (namespace, track_name)
               for r in core.requests.values()):
            raise LocalError("already subscribed to this track")
        draft = Subscribe(0, namespace, track_name, subscriber_priority, group_order, forward, filter_type,
                          start_location, end_group, parameters or RequestParameters())
        request = Request(0, RequestKind.SUBSCRIBE, True, namespace, track_name, filter_type=filter_type,
                          start=start_location, end_group=end_group, forward=forward, group_order=group_order)
        return self._send_request(draft, request).request_id

    def subscribe_update(self, subscription_request_id: int, *, start_location: Location,
                         end_group: int | None = None, subscriber_priority: int = 128, forward: bool = True,
                         parameters: RequestParameters | None = None) -> int:
        """Narrow (or pause/resume with ``forward``) one of our subscriptions; returns the new Request ID.
        Draft-14; draft-16 updates with `request_update`."""
        self._require(MessageKind.SUBSCRIBE_UPDATE, " (use request_update)")
        core = self._check_open()
        target = core.requests.get(subscription_request_id)
        if target is None or not target.allows(Origin.LOCAL, MessageKind.SUBSCRIBE_UPDATE):
            raise LocalError(f"{subscription_request_id} is not an open subscription of ours")
        if target.start is not None and start_location < target.start:
            raise LocalError("SUBSCRIBE_UPDATE cannot move the Start Location back")
        if target.end_group is not None and (end_group is None or end_group > target.end_group):
            raise LocalError("SUBSCRIBE_UPDATE cannot move the End Group forward")
        if end_group is not None and end_group < start_location.group:
            raise LocalError("End Group before the Start Location's group")
        draft = SubscribeUpdate(0, subscription_request_id, start_location, end_group, subscriber_priority, forward,
                                parameters or RequestParameters())
        request_id = self._new_request_id(new_request=False)
        target.step(Origin.LOCAL, MessageKind.SUBSCRIBE_UPDATE)
        core.send_control(dataclasses.replace(draft, request_id=request_id))
        target.start, target.end_group, target.forward = start_location, end_group, forward
        return request_id

    def request_update(self, existing_request_id: int, parameters: RequestParameters) -> int:
        """Draft-16: update one of our requests (or our subscription to the peer's PUBLISH). The
        parameters it carries change (a SUBSCRIPTION_FILTER, FORWARD, SUBSCRIBER_PRIORITY, ...), the
        others keep their values; returns the update's own Request ID, which the peer answers with
        REQUEST_OK or REQUEST_ERROR (each a ``ControlMessageReceived``)."""
        self._require(MessageKind.REQUEST_UPDATE, " (use subscribe_update)")
        core = self._check_open()
        target = core.requests.get(existing_request_id)
        if target is None or not target.allows(Origin.LOCAL, MessageKind.REQUEST_UPDATE):
            raise LocalError(f"{existing_request_id} is not a request of ours that REQUEST_UPDATE may change")
        problem = update_problem(target, parameters)
        if problem is not None:
            raise LocalError(problem)
        request = Request(0, RequestKind.UPDATE, True, updates=existing_request_id)
        message = self._send_request(RequestUpdate(0, existing_request_id, parameters), request, new_request=False)
        target.step(Origin.LOCAL, MessageKind.REQUEST_UPDATE)
        apply_update(target, parameters)
        return message.request_id

    def update_ok(self, request_id: int, *, largest_location: Location | None = None,
                  parameters: RequestParameters | None = None) -> None:
        """Draft-16: accept the peer's REQUEST_UPDATE (for a subscription: with our Largest Location)."""
        request = self._remote(request_id, MessageKind.REQUEST_OK)
        self._answered(request, RequestOk(request_id, largest_location, parameters or RequestParameters()),
                       remove=True)

    def update_error(self, request_id: int, error_code: RequestError | int = RequestError.INTERNAL_ERROR,
                     reason: str = "", *, retry_interval: int = 0) -> None:
        """Draft-16: refuse the peer's REQUEST_UPDATE. For a subscription the draft also ends it: send
        PUBLISH_DONE with UPDATE_FAILED once its streams are closed."""
        request = self._remote(request_id, MessageKind.REQUEST_ERROR)
        code = self._request_error(MessageKind.REQUEST_ERROR, error_code)
        self._answered(request, RequestErrorReply(request_id, code, reason, retry_interval), remove=True)

    def unsubscribe(self, request_id: int) -> None:
        """End a subscription we receive (ours by SUBSCRIBE, or the peer's accepted PUBLISH)."""
        core = self._check_open()
        request = core.requests.get(request_id)
        if request is None or not request.we_subscribe:
            raise LocalError(f"{request_id} is not an open subscription of ours")
        if not request.local and not request.answered:
            raise LocalError("answer the PUBLISH (publish_ok / publish_error) first")
        self._ended(request, Unsubscribe(request_id))  # unanswered: its SUBSCRIBE_OK/ERROR is on the way
        self._data.drop_request_streams(request_id)

    # -- SUBSCRIBE (publisher side) --------------------------------------------------------------
    def subscribe_ok(self, request_id: int, *, track_alias: int | None = None, expires: int = 0,
                     group_order: GroupOrder = GroupOrder.ASCENDING, largest_location: Location | None = None,
                     parameters: RequestParameters | None = None) -> int:
        """Accept the peer's SUBSCRIBE; returns the Track Alias its objects will carry."""
        request = self._remote(request_id, MessageKind.SUBSCRIBE_OK)
        alias = self._pick_alias(track_alias)
        message = SubscribeOk(request_id, alias, expires, group_order, largest_location,
                              parameters or RequestParameters())
        request.track_alias, request.group_order = alias, group_order
        request.start = filter_start(request.filter_type, request.start, largest_location)
        self._answered(request, message, remove=False)
        return alias

    def subscribe_error(self, request_id: int, error_code: RequestError | int = RequestError.TRACK_DOES_NOT_EXIST,
                        reason: str = "") -> None:
        """Refuse the peer's SUBSCRIBE; no objects may follow."""
        request = self._remote(request_id, MessageKind.SUBSCRIBE_ERROR)
        code = self._request_error(MessageKind.SUBSCRIBE_ERROR, error_code)
        self._answered(request, SubscribeError(request_id, code, reason), remove=True)

    def publish_done(self, request_id: int, status_code: PublishDoneStatus | int = PublishDoneStatus.TRACK_ENDED,
                     reason: str = "", *, stream_count: int | None = None) -> None:
        """End a subscription we publish. Its streams must be closed first; Stream Count is counted."""
        core = self._check_open()
        request = core.requests.get(request_id)
        if request is None or not request.allows(Origin.LOCAL, MessageKind.PUBLISH_DONE):
            raise LocalError(f"{request_id} is not an accepted subscription to us")
        if request.open_streams:
            raise LocalError("close the subscription's data streams before PUBLISH_DONE")
        count = request.streams_opened if stream_count is None else stream_count
        self._ended(request, PublishDone(request_id, core.profile.publish_done.code(status_code), count, reason))

    # -- TRACK_STATUS ----------------------------------------------------------------------------
    def track_status(self, namespace: Namespace, track_name: bytes, *,
                     filter_type: FilterType = FilterType.LARGEST_OBJECT, start_location: Location | None = None,
                     end_group: int | None = None, subscriber_priority: int = 128,
                     group_order: GroupOrder = GroupOrder.PUBLISHER_DEFAULT, forward: bool = True,
                     parameters: RequestParameters | None = None) -> int:
        """Ask for a track's status (same fields as SUBSCRIBE; creates no subscription)."""
        draft = TrackStatus(0, namespace, track_name, subscriber_priority, group_order, forward, filter_type,
                            start_location, end_group, parameters or RequestParameters())
        return self._send_request(draft, Request(0, RequestKind.TRACK_STATUS, True, namespace, track_name)).request_id

    def track_status_ok(self, request_id: int, *, expires: int = 0, group_order: GroupOrder = GroupOrder.ASCENDING,
                        largest_location: Location | None = None, parameters: RequestParameters | None = None) -> None:
        """Answer TRACK_STATUS as a SUBSCRIBE_OK would be filled in, with Track Alias 0."""
        request = self._remote(request_id, MessageKind.TRACK_STATUS_OK)
        message = TrackStatusOk(request_id, 0, expires, group_order, largest_location,
                                parameters or RequestParameters())
        self._answered(request, message, remove=True)

    def track_status_error(self, request_id: int, error_code: RequestError | int = RequestError.TRACK_DOES_NOT_EXIST,
                           reason: str = "") -> None:
        """Answer TRACK_STATUS as a SUBSCRIBE_ERROR would be."""
        request = self._remote(request_id, MessageKind.TRACK_STATUS_ERROR)
        code = self._request_error(MessageKind.TRACK_STATUS_ERROR, error_code)
        self._answered(request, TrackStatusError(request_id, code, reason), remove=True)

    # -- FETCH -----------------------------------------------------------------------------------
    def fetch(self, namespace: Namespace, track_name: bytes, start: Location, end: Location, *,
              subscriber_priority: int = 128, group_order: GroupOrder = GroupOrder.PUBLISHER_DEFAULT,
              parameters: RequestParameters | None = None) -> int:
        """Standalone FETCH of [start, end) ("End Location plus 1"; end.object 0 = all of end.group)."""
        draft = Fetch(0, FetchType.STANDALONE, StandaloneFetch(namespace, track_name, start, end), None,
                      subscriber_priority, group_order, parameters or RequestParameters())
        request = Request(0, RequestKind.FETCH, True, namespace, track_name, fetch_start=start,
                          group_order=group_order)
        return self._send_request(draft, request).request_id

    def joining_fetch(self, subscription_request_id: int, joining_start: int, *, absolute: bool = False,
                      subscriber_priority: int = 128, group_order: GroupOrder = GroupOrder.PUBLISHER_DEFAULT,
                      parameters: RequestParameters | None = None) -> int:
        """Relative (groups back from the subscription's Largest) or absolute joining FETCH."""
        target = self._local(subscription_request_id, RequestKind.SUBSCRIBE)
        kind = FetchType.ABSOLUTE_JOINING if absolute else FetchType.RELATIVE_JOINING
        draft = Fetch(0, kind, None, JoiningFetch(subscription_request_id, joining_start), subscriber_priority,
                      group_order, parameters or RequestParameters())
        request = Request(0, RequestKind.FETCH, True, target.namespace, target.track_name, group_order=group_order)
        return self._send_request(draft, request).request_id

    def fetch_cancel(self, request_id: int) -> None:
        """Withdraw our FETCH; the fetch stream, if open, is stopped (the draft requires the message)."""
        request = self._local(request_id, RequestKind.FETCH)
        self._ended(request, FetchCancel(request_id))
        self._data.drop_request_streams(request_id)

    def fetch_ok(self, request_id: int, end_location: Location, *, end_of_track: bool = False,
                 group_order: GroupOrder = GroupOrder.ASCENDING, parameters: RequestParameters | None = None) -> None:
        """Accept the peer's FETCH; ``end_location`` is the end of what will be sent (plus 1, as in FETCH)."""
        request = self._remote(request_id, MessageKind.FETCH_OK)
        message = FetchOk(request_id, end_location, group_order, end_of_track, parameters or RequestParameters())
        self._answered(request, message, remove=request.fetch_stream_done)

    def fetch_error(self, request_id: int, error_code: RequestError | int = RequestError.TRACK_DOES_NOT_EXIST,
                    reason: str = "") -> None:
        """Refuse the peer's FETCH; an open fetch stream is reset."""
        request = self._remote(request_id, MessageKind.FETCH_ERROR)
        code = self._request_error(MessageKind.FETCH_ERROR, error_code)
        self._core.reset_request_streams(request)
        self._answered(request, FetchError(request_id, code, reason), remove=True)

    # -- PUBLISH ---------------------------------------------------------------------------------
    def publish(self, namespace: Namespace, track_name: bytes, *, track_alias: int | None = None,
                group_order: GroupOrder = GroupOrder.ASCENDING, largest_location: Location | None = None,
                forward: bool = True, parameters: RequestParameters | None = None) -> int:
        """Offer a track to the peer (PUBLISH); objects may be sent before PUBLISH_OK arrives."""
        alias = self._pick_alias(track_alias)
        draft = Publish(0, namespace, track_name, alias, group_order, largest_location, forward,
                        parameters or RequestParameters())
        request = Request(0, RequestKind.PUBLISH, True, namespace, track_name, track_alias=alias, forward=forward,
                          group_order=group_order, last_location=largest_location)
        return self._send_request(draft, request).request_id

    def publish_ok(self, request_id: int, *, forward: bool = True, subscriber_priority: int = 128,
                   group_order: GroupOrder = GroupOrder.ASCENDING, filter_type: FilterType = FilterType.LARGEST_OBJECT,
                   start_location: Location | None = None, end_group: int | None = None,
                   parameters: RequestParameters | None = None) -> None:
        """Accept the peer's PUBLISH, with our Forward State, priority and filter."""
        request = self._remote(request_id, MessageKind.PUBLISH_OK)
        message = PublishOk(request_id, forward, subscriber_priority, group_order, filter_type, start_location,
                            end_group, parameters or RequestParameters())
        request.filter_type, request.end_group = filter_type, end_group
        request.start = filter_start(filter_type, start_location, request.last_location)
        self._answered(request, message, remove=False)

    def publish_error(self, request_id: int, error_code: RequestError | int = RequestError.UNINTERESTED,
                      reason: str = "") -> None:
        """Refuse the peer's PUBLISH; streams it already opened are stopped."""
        request = self._remote(request_id, MessageKind.PUBLISH_ERROR)
        code = self._request_error(MessageKind.PUBLISH_ERROR, error_code)
        self._data.drop_request_streams(request_id)
        self._answered(request, PublishError(request_id, code, reason), remove=True)

    # -- PUBLISH_NAMESPACE -----------------------------------------------------------------------
    def publish_namespace(self, namespace: Namespace, *, parameters: RequestParameters | None = None) -> int:
        """Advertise that we have tracks under ``namespace``; returns the Request ID."""
        draft = PublishNamespace(0, namespace, parameters or RequestParameters())
        return self._send_request(draft, Request(0, RequestKind.PUBLISH_NAMESPACE, True, namespace)).request_id

    def publish_namespace_ok(self, request_id: int) -> None:
        """Accept the peer's PUBLISH_NAMESPACE."""
        request = self._remote(request_id, MessageKind.PUBLISH_NAMESPACE_OK)
        self._answered(request, PublishNamespaceOk(request_id), remove=False)

    def publish_namespace_error(self, request_id: int, error_code: RequestError | int = RequestError.UNINTERESTED,
                                reason: str = "") -> None:
        """Refuse the peer's PUBLISH_NAMESPACE (e.g. UNAUTHORIZED for a holder-id it may not publish)."""
        request = self._remote(request_id, MessageKind.PUBLISH_NAMESPACE_ERROR)
        code = self._request_error(MessageKind.PUBLISH_NAMESPACE_ERROR, error_code)
        self._answered(request, PublishNamespaceError(request_id, code, reason), remove=True)

    def publish_namespace_done(self, namespace: Namespace) -> None:
        """Withdraw a namespace we published."""
        request = self._find_namespace(RequestKind.PUBLISH_NAMESPACE, namespace, MessageKind.PUBLISH_NAMESPACE_DONE)
        self._ended(request, PublishNamespaceDone(namespace, request.request_id))

    def publish_namespace_cancel(self, namespace: Namespace,
                                 error_code: RequestError | int = RequestError.INTERNAL_ERROR,
                                 reason: str = "") -> None:
        """Revoke our acceptance of the peer's PUBLISH_NAMESPACE."""
        kind = MessageKind.PUBLISH_NAMESPACE_CANCEL
        request = self._find_namespace(RequestKind.PUBLISH_NAMESPACE, namespace, kind)
        self._ended(request, PublishNamespaceCancel(namespace, self._request_error(kind, error_code), reason,
                                                    request.request_id))

    def _find_namespace(self, kind: RequestKind, namespace: Namespace, message: MessageKind) -> Request:
        """The request of ``kind`` for ``namespace`` that ``message`` (ours) may end."""
        core = self._check_open()
        for request in core.requests.values():
            if request.kind == kind and request.namespace == namespace and request.allows(Origin.LOCAL, message):
                return request
        raise LocalError(f"no open {kind.value} for {namespace!r} that {message.value} may end")

    # -- SUBSCRIBE_NAMESPACE ---------------------------------------------------------------------
    def subscribe_namespace(self, prefix: Namespace, *, parameters: RequestParameters | None = None) -> int:
        """Ask for PUBLISH_NAMESPACE/PUBLISH of everything under ``prefix``; returns the Request ID."""
        draft = SubscribeNamespace(0, prefix, parameters or RequestParameters())
        return self._send_request(draft, Request(0, RequestKind.SUBSCRIBE_NAMESPACE, True, prefix)).request_id

    def subscribe_namespace_ok(self, request_id: int) -> None:
        """Accept the peer's SUBSCRIBE_NAMESPACE."""
        request = self._remote(request_id, MessageKind.SUBSCRIBE_NAMESPACE_OK)
        self._answered(request, SubscribeNamespaceOk(request_id), remove=False)

    def subscribe_namespace_error(self, request_id: int,
                                  error_code: RequestError | int = RequestError.NAMESPACE_PREFIX_UNKNOWN,
                                  reason: str = "") -> None:
        """Refuse the peer's SUBSCRIBE_NAMESPACE."""
        request = self._remote(request_id, MessageKind.SUBSCRIBE_NAMESPACE_ERROR)
        code = self._request_error(MessageKind.SUBSCRIBE_NAMESPACE_ERROR, error_code)
        self._answered(request, SubscribeNamespaceError(request_id, code, reason), remove=True)

    def unsubscribe_namespace(self, prefix: Namespace) -> None:
        """Withdraw our SUBSCRIBE_NAMESPACE for ``prefix``."""
        request = self._find_namespace(RequestKind.SUBSCRIBE_NAMESPACE, prefix, MessageKind.UNSUBSCRIBE_NAMESPACE)
        self._ended(request, UnsubscribeNamespace(prefix))

    def namespace(self, request_id: int, suffix: Namespace) -> None:
        """Draft-16: NAMESPACE on the peer's (accepted) SUBSCRIBE_NAMESPACE ``request_id``: a namespace
        under its prefix, named by the fields after the prefix."""
        self._namespace_notice(request_id, NamespaceNotice(suffix))

    def namespace_done(self, request_id: int, suffix: Namespace) -> None:
        """Draft-16: NAMESPACE_DONE: the namespace ``namespace`` named is withdrawn."""
        self._namespace_notice(request_id, NamespaceDone(suffix))

    def _namespace_notice(self, request_id: int, message: NamespaceNotice | NamespaceDone) -> None:
        core = self._check_open()
        request = core.requests.get(request_id)
        if request is None or request.local or request.kind != RequestKind.SUBSCRIBE_NAMESPACE or not request.answered:
            raise LocalError(f"{request_id} is not a SUBSCRIBE_NAMESPACE of the peer's that we accepted")
        core.shape.send_on_request_stream(request_id, message)
