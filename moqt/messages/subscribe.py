"""Subscription messages: SUBSCRIBE, SUBSCRIBE_OK/ERROR, SUBSCRIBE_UPDATE, UNSUBSCRIBE, PUBLISH_DONE,
and TRACK_STATUS/_OK/_ERROR, whose formats the draft defines as identical to SUBSCRIBE/_OK/_ERROR.

Draft-16 keeps SUBSCRIBE, SUBSCRIBE_OK and TRACK_STATUS but moves their fields into parameters
(``Layout.fields_as_parameters``); the messages keep the fields, and the codec moves them. A field at
its draft-16 default is not sent (priority 128, forward 1, the publisher's group order, expires 0).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Self

from moqt.kinds import FilterType, GroupOrder, MessageKind
from moqt.messages.base import (
    ControlMessage,
    RequestErrorMessage,
    RequestIdMessage,
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
from moqt.params import (
    UNFILTERED,
    RequestParameters,
    SubscriptionFilter,
    check_filter,
    pull_filter,
    push_filter,
)
from moqt.profiles import DRAFT_14, Profile
from moqt.wire import (
    VARINT_MAX,
    KeyValuePair,
    Location,
    Namespace,
    Reader,
    Writer,
    pull_reason_phrase,
    push_reason_phrase,
)


@dataclass(frozen=True, slots=True)
class SubscribeBody(ControlMessage):
    """SUBSCRIBE fields (section 9.7); also the TRACK_STATUS format."""

    request_id: int
    track_namespace: Namespace
    track_name: bytes
    subscriber_priority: int = 128
    group_order: GroupOrder = GroupOrder.PUBLISHER_DEFAULT
    forward: bool = True
    filter_type: FilterType = FilterType.LARGEST_OBJECT
    start_location: Location | None = None
    end_group: int | None = None
    parameters: RequestParameters = field(default_factory=RequestParameters)

    #: Draft-16 TRACK_STATUS leaves out the delivery fields (priority, group order, forward, filter).
    CARRIES_DELIVERY: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_track(self.track_namespace, self.track_name)
        check_filter(self.filter_type, self.start_location, self.end_group)
        if not 0 <= self.subscriber_priority <= 0xFF:
            raise ValueError("Subscriber Priority is 8 bits")

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.request_id)
        push_full_track_name(writer, self.track_namespace, self.track_name)
        if profile.layout.fields_as_parameters:
            self._parameters_with_fields().encode(writer, profile)
            return
        writer.push_uint8(self.subscriber_priority)
        writer.push_uint8(profile.group_orders.code(self.group_order))
        writer.push_uint8(int(self.forward))
        push_filter(writer, profile, self.filter_type, self.start_location, self.end_group)
        self.parameters.encode(writer, profile)

    def _parameters_with_fields(self) -> RequestParameters:
        if not self.CARRIES_DELIVERY:
            return self.parameters
        return dataclasses.replace(
            self.parameters, subscriber_priority=None if self.subscriber_priority == 128 else self.subscriber_priority,
            group_order=None if self.group_order is GroupOrder.PUBLISHER_DEFAULT else self.group_order,
            forward=None if self.forward else False,
            subscription_filter=SubscriptionFilter(self.filter_type, self.start_location, self.end_group))

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = reader.pull_varint()
        namespace, name = read_full_track_name(reader, profile)
        if profile.layout.fields_as_parameters:
            params = RequestParameters.decode(reader, cls.KIND, profile)
            flt = params.subscription_filter or (UNFILTERED if cls.CARRIES_DELIVERY else SubscriptionFilter(
                FilterType.LARGEST_OBJECT))
            priority = 128 if params.subscriber_priority is None else params.subscriber_priority
            rest = dataclasses.replace(params, subscriber_priority=None, group_order=None, forward=None,
                                       subscription_filter=None)
            return cls(request_id, namespace, name, priority, params.group_order or GroupOrder.PUBLISHER_DEFAULT,
                       params.forward is not False, flt.filter_type, flt.start, flt.end_group, rest)
        priority = reader.pull_uint8()
        order = pull_group_order(reader, profile, allow_default=True)
        forward = pull_flag(reader, "Forward")
        filter_type, start, end = pull_filter(reader, profile)
        params = RequestParameters.decode(reader, cls.KIND, profile)
        return cls(request_id, namespace, name, priority, order, forward, filter_type, start, end, params)


@dataclass(frozen=True, slots=True)
class Subscribe(SubscribeBody):
    """SUBSCRIBE (0x3)."""

    KIND: ClassVar[MessageKind] = MessageKind.SUBSCRIBE


@dataclass(frozen=True, slots=True)
class TrackStatus(SubscribeBody):
    """TRACK_STATUS (0xD): same format as SUBSCRIBE; creates no subscription. Draft-16 sends none of
    the delivery fields; decoded there they read as SUBSCRIBE's defaults."""

    KIND: ClassVar[MessageKind] = MessageKind.TRACK_STATUS
    CARRIES_DELIVERY: ClassVar[bool] = False


@dataclass(frozen=True, slots=True)
class SubscribeOkBody(ControlMessage):
    """SUBSCRIBE_OK fields (section 9.8); ``largest_location`` is None when Content Exists is 0.

    Draft-16: ``expires`` and ``largest_location`` travel as EXPIRES and LARGEST_OBJECT, the group
    order as the DEFAULT_PUBLISHER_GROUP_ORDER Track Extension; ``track_extensions`` are the others.
    Draft-18 sends no Request ID (the SUBSCRIBE's stream names it).
    """

    STREAM_ID_FIELD: ClassVar[str | None] = "request_id"
    request_id: int
    track_alias: int
    expires: int = 0
    group_order: GroupOrder = GroupOrder.ASCENDING
    largest_location: Location | None = None
    parameters: RequestParameters = field(default_factory=RequestParameters)
    track_extensions: tuple[KeyValuePair, ...] = ()

    def __post_init__(self) -> None:
        check_response_group_order(self.group_order)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        push_request_id(writer, profile, self.request_id)
        writer.push_varint(self.track_alias)
        if profile.layout.fields_as_parameters:
            dataclasses.replace(self.parameters, expires=self.expires or None,
                                largest_object=self.largest_location).encode(writer, profile)
        else:
            writer.push_varint(self.expires)
            writer.push_uint8(profile.group_orders.code(self.group_order))
            push_optional_location(writer, self.largest_location)
            self.parameters.encode(writer, profile)
        push_track_extensions(writer, profile, self.track_extensions, self.group_order)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = pull_request_id(reader, profile)
        alias = reader.pull_varint()
        if not profile.layout.fields_as_parameters:
            expires = reader.pull_varint()
            order = pull_group_order(reader, profile, allow_default=False)
            largest = pull_optional_location(reader)
            return cls(request_id, alias, expires, order, largest, RequestParameters.decode(reader, cls.KIND, profile))
        params = RequestParameters.decode(reader, cls.KIND, profile)
        order, extensions = pull_track_extensions(reader, profile)
        rest = dataclasses.replace(params, expires=None, largest_object=None)
        return cls(request_id, alias, params.expires or 0, order, params.largest_object, rest, extensions)


@dataclass(frozen=True, slots=True)
class SubscribeOk(SubscribeOkBody):
    """SUBSCRIBE_OK (0x4)."""

    KIND: ClassVar[MessageKind] = MessageKind.SUBSCRIBE_OK


@dataclass(frozen=True, slots=True)
class TrackStatusOk(SubscribeOkBody):
    """TRACK_STATUS_OK (0xE): same format as SUBSCRIBE_OK, Track Alias set to 0."""

    KIND: ClassVar[MessageKind] = MessageKind.TRACK_STATUS_OK


@dataclass(frozen=True, slots=True)
class SubscribeError(RequestErrorMessage):
    """SUBSCRIBE_ERROR; its Error Code is named by the profile's ``request_errors``."""

    KIND: ClassVar[MessageKind] = MessageKind.SUBSCRIBE_ERROR


@dataclass(frozen=True, slots=True)
class TrackStatusError(RequestErrorMessage):
    """TRACK_STATUS_ERROR (0xF): same format and codes as SUBSCRIBE_ERROR."""

    KIND: ClassVar[MessageKind] = MessageKind.TRACK_STATUS_ERROR


@dataclass(frozen=True, slots=True)
class SubscribeUpdate(ControlMessage):
    """SUBSCRIBE_UPDATE (0x2, section 9.10).

    ``end_group`` is the last Group of the subscription or None for open-ended; on the wire it is
    End Group plus 1, with 0 meaning open-ended.
    """

    KIND: ClassVar[MessageKind] = MessageKind.SUBSCRIBE_UPDATE
    request_id: int
    subscription_request_id: int
    start_location: Location
    end_group: int | None = None
    subscriber_priority: int = 128
    forward: bool = True
    parameters: RequestParameters = field(default_factory=RequestParameters)

    def __post_init__(self) -> None:
        if self.end_group is not None and not 0 <= self.end_group < VARINT_MAX:
            raise ValueError("End Group plus 1 must fit a varint")
        if not 0 <= self.subscriber_priority <= 0xFF:
            raise ValueError("Subscriber Priority is 8 bits")

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.request_id)
        writer.push_varint(self.subscription_request_id)
        self.start_location.encode(writer)
        writer.push_varint(0 if self.end_group is None else self.end_group + 1)
        writer.push_uint8(self.subscriber_priority)
        writer.push_uint8(int(self.forward))
        self.parameters.encode(writer, profile)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = reader.pull_varint()
        subscription = reader.pull_varint()
        start = Location.decode(reader)
        end_plus_one = reader.pull_varint()
        priority = reader.pull_uint8()
        forward = pull_flag(reader, "Forward")
        params = RequestParameters.decode(reader, cls.KIND, profile)
        end = None if end_plus_one == 0 else end_plus_one - 1
        return cls(request_id, subscription, start, end, priority, forward, params)


@dataclass(frozen=True, slots=True)
class Unsubscribe(RequestIdMessage):
    """UNSUBSCRIBE (0xA): the Request ID of the subscription."""

    KIND: ClassVar[MessageKind] = MessageKind.UNSUBSCRIBE


@dataclass(frozen=True, slots=True)
class PublishDone(ControlMessage):
    """PUBLISH_DONE (0xB, section 9.12); ``stream_count`` 2^62-1 means "unknown". Draft-18 sends no
    Request ID (the subscription's stream names it)."""

    STREAM_ID_FIELD: ClassVar[str | None] = "request_id"
    KIND: ClassVar[MessageKind] = MessageKind.PUBLISH_DONE
    request_id: int
    status_code: int
    stream_count: int
    reason: str = ""

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        push_request_id(writer, profile, self.request_id)
        writer.push_varint(self.status_code)
        writer.push_varint(self.stream_count)
        push_reason_phrase(writer, self.reason, profile.max_reason_phrase_length)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        return cls(pull_request_id(reader, profile), reader.pull_varint(), reader.pull_varint(),
                   pull_reason_phrase(reader, profile.max_reason_phrase_length))


def location_after(location: Location) -> Location:
    """The next Location: the next object, after a group's last Object ID the next group's first.

    Locations come from the peer (a Largest Location), so the varint's end is reached: nothing follows
    the largest Location, which is its own successor.
    """
    if location.object < VARINT_MAX:
        return Location(location.group, location.object + 1)
    return next_group(location)


def next_group(location: Location) -> Location:
    """The first Location of the group after ``location``'s (the largest Location after the last group)."""
    return Location(location.group + 1, 0) if location.group < VARINT_MAX else Location(VARINT_MAX, VARINT_MAX)


def filter_start(filter_type: FilterType | None, start: Location | None, largest: Location | None) -> Location | None:
    """The subscription's Start Location once the publisher's Largest Location is known."""
    if filter_type in (FilterType.ABSOLUTE_START, FilterType.ABSOLUTE_RANGE):
        return start
    if largest is None:
        return Location(0, 0)
    if filter_type == FilterType.LARGEST_OBJECT:
        return location_after(largest)
    return next_group(largest)
