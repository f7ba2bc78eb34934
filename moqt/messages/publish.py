"""Publisher-initiated subscriptions: PUBLISH, PUBLISH_OK, PUBLISH_ERROR (draft-14 sections 9.13-9.15).

The draft-14 figures for these three messages write ``Length (i)``; section 9 fixes the Message
Length of every control message at 16 bits, and that is what we send and expect. Draft-16 moves the
fields into parameters (and PUBLISH's group order into a Track Extension), as for SUBSCRIBE.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Self

from moqt.errors import ProtocolViolation
from moqt.kinds import FilterType, GroupOrder, MessageKind, SessionError
from moqt.messages.base import (
    ControlMessage,
    RequestErrorMessage,
    check_response_group_order,
    check_track,
    pull_flag,
    pull_group_order,
    pull_optional_location,
    pull_request_id,
    pull_track_extensions,
    push_full_track_name,
    push_optional_location,
    push_request_id,
    push_track_extensions,
    read_full_track_name,
)
from moqt.messages.request import RequestOk
from moqt.params import UNFILTERED, RequestParameters, SubscriptionFilter, check_filter, pull_filter, push_filter
from moqt.profiles import DRAFT_14, Profile
from moqt.wire import KeyValuePair, Location, Namespace, Reader, Writer


@dataclass(frozen=True, slots=True)
class Publish(ControlMessage):
    """PUBLISH (0x1D); ``largest_location`` is None when Content Exists is 0."""

    KIND: ClassVar[MessageKind] = MessageKind.PUBLISH
    request_id: int
    track_namespace: Namespace
    track_name: bytes
    track_alias: int
    group_order: GroupOrder = GroupOrder.ASCENDING
    largest_location: Location | None = None
    forward: bool = True
    parameters: RequestParameters = field(default_factory=RequestParameters)
    track_extensions: tuple[KeyValuePair, ...] = ()

    def __post_init__(self) -> None:
        check_track(self.track_namespace, self.track_name)
        check_response_group_order(self.group_order)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.request_id)
        push_full_track_name(writer, self.track_namespace, self.track_name)
        writer.push_varint(self.track_alias)
        if profile.layout.fields_as_parameters:
            dataclasses.replace(self.parameters, largest_object=self.largest_location,
                                forward=None if self.forward else False).encode(writer, profile)
        else:
            writer.push_uint8(profile.group_orders.code(self.group_order))
            push_optional_location(writer, self.largest_location)
            writer.push_uint8(int(self.forward))
            self.parameters.encode(writer, profile)
        push_track_extensions(writer, profile, self.track_extensions, self.group_order)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = reader.pull_varint()
        namespace, name = read_full_track_name(reader, profile)
        alias = reader.pull_varint()
        if profile.layout.fields_as_parameters:
            params = RequestParameters.decode(reader, cls.KIND, profile)
            order, extensions = pull_track_extensions(reader, profile)
            rest = dataclasses.replace(params, largest_object=None, forward=None)
            return cls(request_id, namespace, name, alias, order, params.largest_object, params.forward is not False,
                       rest, extensions)
        order = pull_group_order(reader, profile, allow_default=False)
        largest = pull_optional_location(reader)
        forward = pull_flag(reader, "Forward")
        params = RequestParameters.decode(reader, cls.KIND, profile)
        return cls(request_id, namespace, name, alias, order, largest, forward, params)


@dataclass(frozen=True, slots=True)
class PublishOk(ControlMessage):
    """PUBLISH_OK (0x1E): Forward, Subscriber Priority, Group Order, then a SUBSCRIBE-style filter.

    Draft-18: PUBLISH_OK is a REQUEST_OK on the PUBLISH's stream (no Request ID; its fields as
    parameters; empty Track Properties) and goes out as one (``Profile.sent_as``); a 0x1E still
    decodes here, and ``from_request_ok`` reads a REQUEST_OK that answers a PUBLISH.
    """

    STREAM_ID_FIELD: ClassVar[str | None] = "request_id"
    KIND: ClassVar[MessageKind] = MessageKind.PUBLISH_OK
    request_id: int
    forward: bool = True
    subscriber_priority: int = 128
    group_order: GroupOrder = GroupOrder.ASCENDING
    filter_type: FilterType = FilterType.LARGEST_OBJECT
    start_location: Location | None = None
    end_group: int | None = None
    parameters: RequestParameters = field(default_factory=RequestParameters)

    def __post_init__(self) -> None:
        check_response_group_order(self.group_order)
        check_filter(self.filter_type, self.start_location, self.end_group)
        if not 0 <= self.subscriber_priority <= 0xFF:
            raise ValueError("Subscriber Priority is 8 bits")

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        push_request_id(writer, profile, self.request_id)
        if profile.layout.fields_as_parameters:
            # a response's group order is always ascending or descending: always sent
            dataclasses.replace(
                self.parameters, forward=None if self.forward else False,
                subscriber_priority=None if self.subscriber_priority == 128 else self.subscriber_priority,
                group_order=self.group_order,
                subscription_filter=SubscriptionFilter(self.filter_type, self.start_location, self.end_group),
            ).encode(writer, profile)
            return
        writer.push_uint8(int(self.forward))
        writer.push_uint8(self.subscriber_priority)
        writer.push_uint8(profile.group_orders.code(self.group_order))
        push_filter(writer, profile, self.filter_type, self.start_location, self.end_group)
        self.parameters.encode(writer, profile)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = pull_request_id(reader, profile)
        if profile.layout.fields_as_parameters:
            params = RequestParameters.decode(reader, cls.KIND, profile)
            if profile.layout.request_ok_track_extensions and not reader.at_end():
                raise ProtocolViolation(SessionError.PROTOCOL_VIOLATION, "Track Properties in PUBLISH_OK")
            return cls._from_parameters(request_id, params)
        forward = pull_flag(reader, "Forward")
        priority = reader.pull_uint8()
        order = pull_group_order(reader, profile, allow_default=False)
        filter_type, start, end = pull_filter(reader, profile)
        params = RequestParameters.decode(reader, cls.KIND, profile)
        return cls(request_id, forward, priority, order, filter_type, start, end, params)


    @classmethod
    def _from_parameters(cls, request_id: int, params: RequestParameters) -> Self:
        flt = params.subscription_filter or UNFILTERED
        priority = 128 if params.subscriber_priority is None else params.subscriber_priority
        rest = dataclasses.replace(params, forward=None, subscriber_priority=None, group_order=None,
                                   subscription_filter=None)
        return cls(request_id, params.forward is not False, priority, params.group_order or GroupOrder.ASCENDING,
                   flt.filter_type, flt.start, flt.end_group, rest)

    @classmethod
    def from_request_ok(cls, ok: RequestOk) -> PublishOk:
        """The PUBLISH_OK a draft-18 REQUEST_OK on a PUBLISH's stream is (Track Properties close)."""
        if ok.track_extensions:
            raise ProtocolViolation(SessionError.PROTOCOL_VIOLATION, "Track Properties in PUBLISH_OK")
        params = ok.parameters if ok.largest_location is None else dataclasses.replace(
            ok.parameters, largest_object=ok.largest_location)
        return cls._from_parameters(ok.request_id, params)


@dataclass(frozen=True, slots=True)
class PublishError(RequestErrorMessage):
    """PUBLISH_ERROR; its Error Code is named by the profile's ``request_errors``."""

    KIND: ClassVar[MessageKind] = MessageKind.PUBLISH_ERROR
