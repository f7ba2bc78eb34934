"""Subscription messages: SUBSCRIBE, SUBSCRIBE_OK/ERROR, SUBSCRIBE_UPDATE, UNSUBSCRIBE, PUBLISH_DONE,
and TRACK_STATUS/_OK/_ERROR, whose formats the draft defines as identical to SUBSCRIBE/_OK/_ERROR."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Self

from moqt.errors import ProtocolViolation
from moqt.kinds import FilterType, GroupOrder, MessageKind, SessionError
from moqt.messages.base import (
    ControlMessage,
    RequestErrorMessage,
    RequestIdMessage,
    check_response_group_order,
    check_track,
    pull_flag,
    pull_group_order,
    pull_optional_location,
    push_full_track_name,
    push_optional_location,
    read_full_track_name,
)
from moqt.params import RequestParameters
from moqt.profiles import DRAFT_14, Profile
from moqt.wire import VARINT_MAX, Location, Namespace, Reader, Writer, pull_reason_phrase, push_reason_phrase


def check_filter(filter_type: FilterType, start: Location | None, end_group: int | None) -> None:
    """Start Location is present exactly for the Absolute filters, End Group for AbsoluteRange."""
    absolute = filter_type in (FilterType.ABSOLUTE_START, FilterType.ABSOLUTE_RANGE)
    if (start is not None) != absolute or (end_group is not None) != (filter_type == FilterType.ABSOLUTE_RANGE):
        raise ValueError(f"filter {filter_type.name} does not match start={start} end_group={end_group}")


def push_filter(writer: Writer, profile: Profile, filter_type: FilterType, start: Location | None,
                end_group: int | None) -> None:
    writer.push_varint(profile.filter_types.code(filter_type))
    if start is not None:
        start.encode(writer)
    if end_group is not None:
        writer.push_varint(end_group)


def pull_filter(reader: Reader, profile: Profile) -> tuple[FilterType, Location | None, int | None]:
    raw = reader.pull_varint()
    filter_type = profile.filter_types.name(raw)
    if filter_type is None:
        raise ProtocolViolation(SessionError.PROTOCOL_VIOLATION, f"unknown Filter Type {raw}")
    start = end = None
    if filter_type in (FilterType.ABSOLUTE_START, FilterType.ABSOLUTE_RANGE):
        start = Location.decode(reader)
    if filter_type == FilterType.ABSOLUTE_RANGE:
        end = reader.pull_varint()
    return filter_type, start, end


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

    def __post_init__(self) -> None:
        check_track(self.track_namespace, self.track_name)
        check_filter(self.filter_type, self.start_location, self.end_group)
        if not 0 <= self.subscriber_priority <= 0xFF:
            raise ValueError("Subscriber Priority is 8 bits")

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.request_id)
        push_full_track_name(writer, self.track_namespace, self.track_name)
        writer.push_uint8(self.subscriber_priority)
        writer.push_uint8(profile.group_orders.code(self.group_order))
        writer.push_uint8(int(self.forward))
        push_filter(writer, profile, self.filter_type, self.start_location, self.end_group)
        self.parameters.encode(writer, profile)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = reader.pull_varint()
        namespace, name = read_full_track_name(reader, profile)
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
    """TRACK_STATUS (0xD): same format as SUBSCRIBE; creates no subscription."""

    KIND: ClassVar[MessageKind] = MessageKind.TRACK_STATUS


@dataclass(frozen=True, slots=True)
class SubscribeOkBody(ControlMessage):
    """SUBSCRIBE_OK fields (section 9.8); ``largest_location`` is None when Content Exists is 0."""

    request_id: int
    track_alias: int
    expires: int = 0
    group_order: GroupOrder = GroupOrder.ASCENDING
    largest_location: Location | None = None
    parameters: RequestParameters = field(default_factory=RequestParameters)

    def __post_init__(self) -> None:
        check_response_group_order(self.group_order)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.request_id)
        writer.push_varint(self.track_alias)
        writer.push_varint(self.expires)
        writer.push_uint8(profile.group_orders.code(self.group_order))
        push_optional_location(writer, self.largest_location)
        self.parameters.encode(writer, profile)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = reader.pull_varint()
        alias = reader.pull_varint()
        expires = reader.pull_varint()
        order = pull_group_order(reader, profile, allow_default=False)
        largest = pull_optional_location(reader)
        return cls(request_id, alias, expires, order, largest, RequestParameters.decode(reader, cls.KIND, profile))


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
    """PUBLISH_DONE (0xB, section 9.12); ``stream_count`` 2^62-1 means "unknown"."""

    KIND: ClassVar[MessageKind] = MessageKind.PUBLISH_DONE
    request_id: int
    status_code: int
    stream_count: int
    reason: str = ""

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.request_id)
        writer.push_varint(self.status_code)
        writer.push_varint(self.stream_count)
        push_reason_phrase(writer, self.reason, profile.max_reason_phrase_length)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        return cls(reader.pull_varint(), reader.pull_varint(), reader.pull_varint(),
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
