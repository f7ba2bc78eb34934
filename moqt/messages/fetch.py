"""FETCH (standalone, relative joining, absolute joining), FETCH_OK, FETCH_ERROR, FETCH_CANCEL.

Draft-16: FETCH's priority and group order travel as parameters (omitted at 128 and at the
publisher's order); FETCH_OK has no group order and ends with Track Extensions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Self

from moqt.errors import ProtocolViolation
from moqt.kinds import FetchType, GroupOrder, MessageKind, SessionError
from moqt.messages.base import (
    ControlMessage,
    RequestErrorMessage,
    RequestIdMessage,
    check_response_group_order,
    check_track,
    pull_flag,
    pull_group_order,
    pull_request_id,
    pull_track_extensions,
    push_full_track_name,
    push_request_id,
    push_track_extensions,
    read_full_track_name,
)
from moqt.params import RequestParameters
from moqt.profiles import DRAFT_14, Profile
from moqt.wire import KeyValuePair, Location, Namespace, Reader, Writer


@dataclass(frozen=True, slots=True)
class StandaloneFetch:
    """A fetch of [start, end) of one track; ``end`` is "End Location plus 1" and an ``end.object``
    of 0 asks for the whole of group ``end.group``."""

    track_namespace: Namespace
    track_name: bytes
    start: Location
    end: Location

    def __post_init__(self) -> None:
        check_track(self.track_namespace, self.track_name)


@dataclass(frozen=True, slots=True)
class JoiningFetch:
    """A fetch joined to the subscription ``joining_request_id``; ``joining_start`` is a group count
    back from the subscription's Largest Location (relative) or a Group ID (absolute)."""

    joining_request_id: int
    joining_start: int


@dataclass(frozen=True, slots=True)
class Fetch(ControlMessage):
    """FETCH (0x16, section 9.16): exactly one of ``standalone``/``joining``, as ``fetch_type`` says."""

    KIND: ClassVar[MessageKind] = MessageKind.FETCH
    request_id: int
    fetch_type: FetchType
    standalone: StandaloneFetch | None = None
    joining: JoiningFetch | None = None
    subscriber_priority: int = 128
    group_order: GroupOrder = GroupOrder.PUBLISHER_DEFAULT
    parameters: RequestParameters = field(default_factory=RequestParameters)

    def __post_init__(self) -> None:
        if (self.standalone is not None) != (self.fetch_type == FetchType.STANDALONE) \
                or (self.joining is not None) == (self.fetch_type == FetchType.STANDALONE):
            raise ValueError(f"{self.fetch_type.name} fetch needs exactly its own structure")
        if not 0 <= self.subscriber_priority <= 0xFF:
            raise ValueError("Subscriber Priority is 8 bits")

    @classmethod
    def standalone_fetch(cls, request_id: int, namespace: Namespace, name: bytes, start: Location,
                         end: Location, *, subscriber_priority: int = 128,
                         group_order: GroupOrder = GroupOrder.PUBLISHER_DEFAULT,
                         parameters: RequestParameters | None = None) -> Fetch:
        """Convenience constructor for a standalone FETCH of [start, end)."""
        return cls(request_id, FetchType.STANDALONE, StandaloneFetch(namespace, name, start, end), None,
                   subscriber_priority, group_order, parameters or RequestParameters())

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.request_id)
        parameters = self.parameters
        if profile.layout.fields_as_parameters:
            parameters = dataclasses.replace(
                parameters, subscriber_priority=None if self.subscriber_priority == 128 else self.subscriber_priority,
                group_order=None if self.group_order is GroupOrder.PUBLISHER_DEFAULT else self.group_order)
        else:
            writer.push_uint8(self.subscriber_priority)
            writer.push_uint8(profile.group_orders.code(self.group_order))
        writer.push_varint(profile.fetch_types.code(self.fetch_type))
        if self.standalone is not None:
            push_full_track_name(writer, self.standalone.track_namespace, self.standalone.track_name)
            self.standalone.start.encode(writer)
            self.standalone.end.encode(writer)
        if self.joining is not None:
            writer.push_varint(self.joining.joining_request_id)
            writer.push_varint(self.joining.joining_start)
        parameters.encode(writer, profile)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = reader.pull_varint()
        in_fields = not profile.layout.fields_as_parameters
        priority = reader.pull_uint8() if in_fields else 128
        order = pull_group_order(reader, profile, allow_default=True) if in_fields else GroupOrder.PUBLISHER_DEFAULT
        raw_type = reader.pull_varint()
        fetch_type = profile.fetch_types.name(raw_type)
        if fetch_type is None:
            raise ProtocolViolation(SessionError.PROTOCOL_VIOLATION, f"unknown Fetch Type {raw_type}")
        standalone = joining = None
        if fetch_type == FetchType.STANDALONE:
            namespace, name = read_full_track_name(reader, profile)
            standalone = StandaloneFetch(namespace, name, Location.decode(reader), Location.decode(reader))
        else:
            joining = JoiningFetch(reader.pull_varint(), reader.pull_varint())
        params = RequestParameters.decode(reader, cls.KIND, profile)
        if not in_fields:
            priority = priority if params.subscriber_priority is None else params.subscriber_priority
            order = params.group_order or order
            params = dataclasses.replace(params, subscriber_priority=None, group_order=None)
        return cls(request_id, fetch_type, standalone, joining, priority, order, params)


@dataclass(frozen=True, slots=True)
class FetchOk(ControlMessage):
    """FETCH_OK (0x18, section 9.17): Group Order, End Of Track, End Location, Parameters.

    Draft-16 has no Group Order here (the FETCH's own, ascending when it named none) and ends with
    Track Extensions; decoded there ``group_order`` reads ascending and the session puts the FETCH's.
    Draft-18 sends no Request ID (the FETCH's stream names it).
    """

    STREAM_ID_FIELD: ClassVar[str | None] = "request_id"
    KIND: ClassVar[MessageKind] = MessageKind.FETCH_OK
    request_id: int
    end_location: Location
    group_order: GroupOrder = GroupOrder.ASCENDING
    end_of_track: bool = False
    parameters: RequestParameters = field(default_factory=RequestParameters)
    track_extensions: tuple[KeyValuePair, ...] = ()

    def __post_init__(self) -> None:
        check_response_group_order(self.group_order)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        push_request_id(writer, profile, self.request_id)
        if not profile.layout.fields_as_parameters:
            writer.push_uint8(profile.group_orders.code(self.group_order))
        writer.push_uint8(int(self.end_of_track))
        self.end_location.encode(writer)
        self.parameters.encode(writer, profile)
        push_track_extensions(writer, profile, self.track_extensions)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = pull_request_id(reader, profile)
        order = GroupOrder.ASCENDING
        if not profile.layout.fields_as_parameters:
            order = pull_group_order(reader, profile, allow_default=False)
        end_of_track = pull_flag(reader, "End Of Track")
        end = Location.decode(reader)
        params = RequestParameters.decode(reader, cls.KIND, profile)
        _, extensions = pull_track_extensions(reader, profile, lift_order=False)
        return cls(request_id, end, order, end_of_track, params, extensions)


@dataclass(frozen=True, slots=True)
class FetchError(RequestErrorMessage):
    """FETCH_ERROR; its Error Code is named by the profile's ``request_errors``."""

    KIND: ClassVar[MessageKind] = MessageKind.FETCH_ERROR


@dataclass(frozen=True, slots=True)
class FetchCancel(RequestIdMessage):
    """FETCH_CANCEL (0x17)."""

    KIND: ClassVar[MessageKind] = MessageKind.FETCH_CANCEL
