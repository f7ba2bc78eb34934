"""Inbound control messages after setup: check each against the session state, update it, emit it.

Why a table of handlers: like h2's state machine, every (message, state) pair the draft allows has
a handler here, and anything else raises ``ProtocolViolation`` with the draft's code; the session
turns that into the connection close in one place. Where the draft prescribes the answer itself
(a joining FETCH naming no subscription, an overlapping SUBSCRIBE_NAMESPACE) the handler sends it and
the application never sees the request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from moqt.errors import ProtocolViolation
from moqt.events import ControlMessageReceived
from moqt.kinds import FilterType, MessageKind, RequestError, SessionError
from moqt.messages import (
    ControlMessage,
    Fetch,
    FetchCancel,
    FetchError,
    FetchOk,
    GoAway,
    MaxRequestId,
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
from moqt.params import RequestParameters, ResolvedToken
from moqt.session.data_streams import DataReceiver
from moqt.session.request_state import Origin, RequestKind
from moqt.session.requests import Request, apply_update, namespaces_overlap, update_problem
from moqt.session.state import SessionState
from moqt.session.tokens import TokenCache
from moqt.wire import Namespace

_PV: Final = SessionError.PROTOCOL_VIOLATION


class ControlHandler:
    """Dispatch for every post-setup control message the peer may send."""

    def __init__(self, core: SessionState, data: DataReceiver, tokens: TokenCache) -> None:
        self._core = core
        self._data = data
        self._tokens = tokens
        self._authorization: tuple[ResolvedToken, ...] = ()
        self._handlers: dict[type[ControlMessage], Callable[[Any], None]] = {
            Subscribe: self._on_subscribe, TrackStatus: self._on_track_status, Fetch: self._on_fetch,
            Publish: self._on_publish, PublishNamespace: self._on_publish_namespace,
            SubscribeNamespace: self._on_subscribe_namespace, SubscribeUpdate: self._on_subscribe_update,
            SubscribeOk: self._on_subscribe_ok, SubscribeError: self._on_subscribe_error,
            TrackStatusOk: self._on_final_answer, TrackStatusError: self._on_final_answer,
            PublishOk: self._on_publish_ok, PublishError: self._on_publish_error,
            FetchOk: self._on_fetch_ok, FetchError: self._on_fetch_error,
            PublishNamespaceOk: self._on_namespace_ok, PublishNamespaceError: self._on_namespace_error,
            SubscribeNamespaceOk: self._on_namespace_ok, SubscribeNamespaceError: self._on_namespace_error,
            Unsubscribe: self._on_unsubscribe, PublishDone: self._on_publish_done, FetchCancel: self._on_fetch_cancel,
            PublishNamespaceDone: self._on_publish_namespace_done,
            PublishNamespaceCancel: self._on_publish_namespace_cancel,
            UnsubscribeNamespace: self._on_unsubscribe_namespace,
            GoAway: self._on_goaway, MaxRequestId: self._on_max_request_id, RequestsBlocked: self._on_requests_blocked,
            # draft-16 (the shape lets through only what is not a neutral answer)
            RequestUpdate: self._on_request_update, RequestOk: self._on_final_answer,
            RequestErrorReply: self._on_final_answer, NamespaceNotice: self._emit, NamespaceDone: self._emit,
        }

    def handle(self, message: ControlMessage) -> None:
        handler = self._handlers.get(type(message))
        if handler is None:
            raise ProtocolViolation(_PV, f"{message.KIND.value} after setup")
        parameters = getattr(message, "parameters", None)
        tokens = parameters.authorization_tokens if isinstance(parameters, RequestParameters) else ()
        # registrations take effect even when the message itself then fails (draft-14 9.2.1.1)
        self._authorization = self._tokens.apply(tokens)
        handler(message)

    def _emit(self, message: ControlMessage) -> None:
        self._core.events.append(ControlMessageReceived(message, self._authorization))

    # -- new requests from the peer --------------------------------------------------------------
    def _accept_id(self, request_id: int) -> None:
        core = self._core
        core.ids.accept_peer_request(request_id)
        grant = core.ids.auto_grant_due()
        if grant is not None:
            core.send_control(MaxRequestId(grant))

    def _register(self, request: Request) -> Request:
        self._core.requests[request.request_id] = request
        return request

    def _on_subscribe(self, msg: Subscribe) -> None:
        self._accept_id(msg.request_id)
        if any(other.kind == RequestKind.SUBSCRIBE and not other.local
               and (other.namespace, other.track_name) == (msg.track_namespace, msg.track_name)
               for other in self._core.requests.values()):
            self._refuse_duplicate(msg.request_id)
            return
        self._register(Request(msg.request_id, RequestKind.SUBSCRIBE, False, msg.track_namespace, msg.track_name,
                               filter_type=msg.filter_type, start=msg.start_location, end_group=msg.end_group,
                               forward=msg.forward, group_order=msg.group_order))
        self._emit(msg)

    def _refuse_duplicate(self, request_id: int) -> None:
        """A second subscription to one track: draft-16 refuses it with DUPLICATE_SUBSCRIPTION;
        draft-14, which has no such code, closes the session."""
        errors = self._core.profile.request_errors[MessageKind.SUBSCRIBE_ERROR]
        if RequestError.DUPLICATE_SUBSCRIPTION not in errors.codes:
            raise ProtocolViolation(_PV, "a second active subscription to the same track")
        code = errors.code(RequestError.DUPLICATE_SUBSCRIPTION)
        self._core.send_control(SubscribeError(request_id, code, "already subscribed to this track"))

    def _on_track_status(self, msg: TrackStatus) -> None:
        self._accept_id(msg.request_id)
        self._register(Request(msg.request_id, RequestKind.TRACK_STATUS, False, msg.track_namespace, msg.track_name))
        self._emit(msg)

    def _on_fetch(self, msg: Fetch) -> None:
        core = self._core
        self._accept_id(msg.request_id)
        if msg.standalone is not None:
            self._register(Request(msg.request_id, RequestKind.FETCH, False, msg.standalone.track_namespace,
                                   msg.standalone.track_name, fetch_start=msg.standalone.start,
                                   group_order=msg.group_order))
            self._emit(msg)
            return
        assert msg.joining is not None
        target = core.requests.get(msg.joining.joining_request_id)
        if target is None or target.kind != RequestKind.SUBSCRIBE or target.local:
            code = core.profile.request_error_code(MessageKind.FETCH_ERROR, RequestError.INVALID_JOINING_REQUEST_ID)
            core.send_control(FetchError(msg.request_id, code, "no such subscription"))
            return
        if target.filter_type != FilterType.LARGEST_OBJECT:
            raise ProtocolViolation(_PV, "joining FETCH of a subscription whose filter is not Largest Object")
        self._register(Request(msg.request_id, RequestKind.FETCH, False, target.namespace, target.track_name,
                               group_order=msg.group_order))
        self._emit(msg)

    def _on_publish(self, msg: Publish) -> None:
        core = self._core
        self._accept_id(msg.request_id)
        core.register_inbound_alias(msg.track_alias, msg.request_id)
        self._register(Request(msg.request_id, RequestKind.PUBLISH, False, msg.track_namespace, msg.track_name,
                               track_alias=msg.track_alias, forward=msg.forward, group_order=msg.group_order,
                               last_location=msg.largest_location))
        self._emit(msg)
        self._data.alias_known(msg.track_alias)

    def _on_publish_namespace(self, msg: PublishNamespace) -> None:
        self._accept_id(msg.request_id)
        self._register(Request(msg.request_id, RequestKind.PUBLISH_NAMESPACE, False, msg.track_namespace))
        self._emit(msg)

    def _on_subscribe_namespace(self, msg: SubscribeNamespace) -> None:
        core = self._core
        self._accept_id(msg.request_id)
        for other in core.requests.values():
            if other.kind == RequestKind.SUBSCRIBE_NAMESPACE and not other.local \
                    and namespaces_overlap(other.namespace, msg.track_namespace_prefix) \
                    and core.shape.overlapping(other.options, msg.options):
                code = core.profile.request_error_code(MessageKind.SUBSCRIBE_NAMESPACE_ERROR,
                                                       RequestError.NAMESPACE_PREFIX_OVERLAP)
                core.send_control(SubscribeNamespaceError(msg.request_id, code, "overlapping prefix"))
                return
        self._register(Request(msg.request_id, RequestKind.SUBSCRIBE_NAMESPACE, False, msg.track_namespace_prefix,
                               options=msg.options))
        self._emit(msg)

    def _on_subscribe_update(self, msg: SubscribeUpdate) -> None:
        core = self._core
        self._accept_id(msg.request_id)
        target = core.requests.get(msg.subscription_request_id)
        if target is None:
            if core.existed(msg.subscription_request_id):
                return  # the subscription is over; the update no longer matters
            raise ProtocolViolation(_PV, f"SUBSCRIBE_UPDATE of unknown Request ID {msg.subscription_request_id}")
        target.step(Origin.PEER, MessageKind.SUBSCRIBE_UPDATE)
        if target.start is not None and msg.start_location < target.start:
            raise ProtocolViolation(_PV, "SUBSCRIBE_UPDATE moved the Start Location back")
        if target.end_group is not None and (msg.end_group is None or msg.end_group > target.end_group):
            raise ProtocolViolation(_PV, "SUBSCRIBE_UPDATE moved the End Group forward")
        if msg.end_group is not None and msg.end_group < msg.start_location.group:
            raise ProtocolViolation(_PV, "SUBSCRIBE_UPDATE End Group before its Start")
        target.start, target.end_group, target.forward = msg.start_location, msg.end_group, msg.forward
        self._emit(msg)

    def _on_request_update(self, msg: RequestUpdate) -> None:
        """Draft-16: an update of any request the peer sent (or a subscription to its PUBLISH); it is
        a request itself, which the application answers (``update_ok`` / ``update_error``)."""
        core = self._core
        self._accept_id(msg.request_id)
        target = core.requests.get(msg.existing_request_id)
        if target is None:
            if not core.existed(msg.existing_request_id):
                raise ProtocolViolation(_PV, f"REQUEST_UPDATE of unknown Request ID {msg.existing_request_id}")
            code = core.profile.request_error_code(MessageKind.REQUEST_ERROR, RequestError.TRACK_DOES_NOT_EXIST)
            core.send_control(RequestErrorReply(msg.request_id, code, "that request is over"))
            return
        target.step(Origin.PEER, MessageKind.REQUEST_UPDATE)
        problem = update_problem(target, msg.parameters)
        if problem is not None:
            raise ProtocolViolation(_PV, problem)
        apply_update(target, msg.parameters)
        self._register(Request(msg.request_id, RequestKind.UPDATE, False, updates=target.request_id))
        self._emit(msg)

    # -- answers to our requests -----------------------------------------------------------------
    def _answer(self, request_id: int, message: MessageKind) -> Request | None:
        """The open local request this answer is for; None when we had already cancelled it."""
        request = self._core.requests.get(request_id)
        if request is None:
            raise ProtocolViolation(_PV, f"{message.value} for Request ID {request_id}, which awaits no answer")
        was_cancelled = request.cancelled
        request.step(Origin.PEER, message)
        if was_cancelled:
            self._core.remove_request(request)
            return None
        return request

    def _on_subscribe_ok(self, msg: SubscribeOk) -> None:
        core = self._core
        request = self._answer(msg.request_id, msg.KIND)
        if request is None:
            return
        core.register_inbound_alias(msg.track_alias, msg.request_id)
        request.track_alias = msg.track_alias
        request.group_order = msg.group_order
        request.start = filter_start(request.filter_type, request.start, msg.largest_location)
        self._emit(msg)
        self._data.alias_known(msg.track_alias)

    def _on_subscribe_error(self, msg: SubscribeError) -> None:
        request = self._answer(msg.request_id, msg.KIND)
        if request is not None:
            self._core.remove_request(request)
            self._emit(msg)

    def _on_final_answer(self, msg: TrackStatusOk | TrackStatusError | RequestOk | RequestErrorReply) -> None:
        """An answer after which the request is over (TRACK_STATUS's; draft-16 REQUEST_UPDATE's)."""
        request = self._answer(msg.request_id, msg.KIND)
        if request is not None:
            self._core.remove_request(request)
            self._emit(msg)

    def _on_publish_ok(self, msg: PublishOk) -> None:
        request = self._answer(msg.request_id, msg.KIND)
        if request is None:
            return
        request.forward, request.group_order = msg.forward, msg.group_order
        request.filter_type, request.end_group = msg.filter_type, msg.end_group
        request.start = filter_start(msg.filter_type, msg.start_location, request.last_location)
        self._emit(msg)

    def _on_publish_error(self, msg: PublishError) -> None:
        request = self._answer(msg.request_id, msg.KIND)
        if request is not None:
            self._core.reset_request_streams(request)
            self._core.remove_request(request)
            self._emit(msg)

    def _on_fetch_ok(self, msg: FetchOk) -> None:
        request = self._answer(msg.request_id, msg.KIND)
        if request is None:
            return
        if request.fetch_start is not None and msg.end_location < request.fetch_start:
            raise ProtocolViolation(_PV, "FETCH_OK End Location before the FETCH's Start Location")
        request.group_order = msg.group_order
        if request.fetch_stream_done:
            self._core.remove_request(request)
        self._emit(msg)

    def _on_fetch_error(self, msg: FetchError) -> None:
        request = self._answer(msg.request_id, msg.KIND)
        if request is not None:
            self._data.drop_request_streams(request.request_id)
            self._core.remove_request(request)
            self._emit(msg)

    def _on_namespace_ok(self, msg: PublishNamespaceOk | SubscribeNamespaceOk) -> None:
        if self._answer(msg.request_id, msg.KIND) is not None:
            self._emit(msg)

    def _on_namespace_error(self, msg: PublishNamespaceError | SubscribeNamespaceError) -> None:
        request = self._answer(msg.request_id, msg.KIND)
        if request is not None:
            self._core.remove_request(request)
            self._emit(msg)

    # -- ends of requests ------------------------------------------------------------------------
    def _ending(self, request_id: int, message: MessageKind) -> Request | None:
        """The request a cancel/done message ends; None when it is already over (a harmless race)."""
        core = self._core
        request = core.requests.get(request_id)
        if request is None:
            if core.existed(request_id):
                return None
            raise ProtocolViolation(_PV, f"{message.value} for unknown Request ID {request_id}")
        request.step(Origin.PEER, message)
        return request

    def _on_unsubscribe(self, msg: Unsubscribe) -> None:
        request = self._ending(msg.request_id, msg.KIND)
        if request is not None:
            self._core.reset_request_streams(request)
            self._core.remove_request(request)
            self._emit(msg)

    def _on_publish_done(self, msg: PublishDone) -> None:
        request = self._ending(msg.request_id, msg.KIND)
        if request is not None:
            self._core.finish_subscription(request, msg.stream_count)
            self._emit(msg)

    def _on_fetch_cancel(self, msg: FetchCancel) -> None:
        request = self._ending(msg.request_id, msg.KIND)
        if request is not None:
            self._core.reset_request_streams(request)
            self._core.remove_request(request)
            self._emit(msg)

    def _end_namespace(self, kind: RequestKind, namespace: Namespace, message: MessageKind) -> None:
        """The draft-14 namespace messages name no Request ID: end the request they may end, if any."""
        for request in self._core.requests.values():
            if request.kind == kind and request.namespace == namespace and request.allows(Origin.PEER, message):
                request.step(Origin.PEER, message)
                self._core.remove_request(request)
                return

    def _end_published_namespace(self, msg: PublishNamespaceDone | PublishNamespaceCancel) -> bool:
        """End the PUBLISH_NAMESPACE the message names (draft-16: by Request ID); False: already over."""
        if msg.request_id is None:
            self._end_namespace(RequestKind.PUBLISH_NAMESPACE, msg.track_namespace, msg.KIND)
            return True
        request = self._ending(msg.request_id, msg.KIND)
        if request is None:
            return False
        if request.kind != RequestKind.PUBLISH_NAMESPACE:
            raise ProtocolViolation(_PV, f"{msg.KIND.value} for {request.kind.value} {msg.request_id}")
        self._core.remove_request(request)
        return True

    def _on_publish_namespace_done(self, msg: PublishNamespaceDone) -> None:
        if self._end_published_namespace(msg):
            self._emit(msg)

    def _on_publish_namespace_cancel(self, msg: PublishNamespaceCancel) -> None:
        if self._end_published_namespace(msg):
            self._emit(msg)

    def _on_unsubscribe_namespace(self, msg: UnsubscribeNamespace) -> None:
        self._end_namespace(RequestKind.SUBSCRIBE_NAMESPACE, msg.track_namespace_prefix, msg.KIND)
        self._emit(msg)

    # -- session-level ---------------------------------------------------------------------------
    def _on_goaway(self, msg: GoAway) -> None:
        core = self._core
        if core.goaway_received:
            raise ProtocolViolation(_PV, "a second GOAWAY")
        if not core.is_client and msg.new_session_uri:
            raise ProtocolViolation(_PV, "GOAWAY from a client with a New Session URI")
        core.goaway_received = True
        self._emit(msg)

    def _on_max_request_id(self, msg: MaxRequestId) -> None:
        self._core.ids.raise_peer_max(msg.request_id)
        self._emit(msg)

    def _on_requests_blocked(self, msg: RequestsBlocked) -> None:
        core = self._core
        self._emit(msg)
        if core.ids.auto_grant:
            grant = core.ids.grant(core.ids.window)
            if grant is not None:
                core.send_control(MaxRequestId(grant))
