"""The control message base class, control framing and field helpers shared by every message.

Why a base with ``encode_payload``/``decode_payload``: the framing (Type varint, 16-bit Length,
Payload, draft-14 section 9) is the same for all thirty messages, so it is written once here; each
message only describes its own fields, in the order of its section's wire format figure.
"""

from __future__ import annotations

from dataclasses import Field, dataclass
from typing import Any, ClassVar, Final, Self

from moqt.errors import LocalError, ProtocolViolation
from moqt.kinds import GroupOrder, MessageKind, SessionError
from moqt.profiles import DRAFT_14, Profile
from moqt.wire import (
    Location,
    Namespace,
    Reader,
    Writer,
    check_namespace,
    pull_full_track_name,
    pull_namespace,
    pull_reason_phrase,
    push_namespace,
    push_reason_phrase,
)

_PV: Final = SessionError.PROTOCOL_VIOLATION


class MessageTooLarge(LocalError, ValueError):
    """The encoded payload does not fit the 16-bit Message Length."""


class ControlMessage:
    """A control message: a frozen slotted dataclass with a ``KIND``; the profile gives its number."""

    __slots__ = ()
    KIND: ClassVar[MessageKind]
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # every concrete message is a dataclass

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        raise NotImplementedError

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        raise NotImplementedError

    def encode(self, profile: Profile = DRAFT_14) -> bytes:
        """Type (i), Length (16), Payload -- ready for the control stream."""
        payload = Writer()
        self.encode_payload(payload, profile)
        if len(payload) > profile.max_control_message_length:
            raise MessageTooLarge(f"{self.KIND.value} payload of {len(payload)} octets exceeds "
                                  f"{profile.max_control_message_length}")
        frame = Writer()
        frame.push_varint(profile.message_types.code(self.KIND))
        frame.push_uint16(len(payload))
        frame.push_bytes(payload.getvalue())
        return frame.getvalue()


def pull_flag(reader: Reader, what: str) -> bool:
    """An 8-bit field that must be 0 or 1 (Forward, Content Exists, End Of Track)."""
    value = reader.pull_uint8()
    if value > 1:
        raise ProtocolViolation(_PV, f"{what} is {value}, must be 0 or 1")
    return value == 1


def pull_group_order(reader: Reader, profile: Profile, *, allow_default: bool) -> GroupOrder:
    """Group Order: ascending or descending; the publisher's order only where the message is a request."""
    value = reader.pull_uint8()
    order = profile.group_orders.name(value)
    if order is None or (order is GroupOrder.PUBLISHER_DEFAULT and not allow_default):
        raise ProtocolViolation(_PV, f"Group Order {value} not allowed here")
    return order


def check_response_group_order(order: GroupOrder) -> None:
    if order not in (GroupOrder.ASCENDING, GroupOrder.DESCENDING):
        raise ValueError("a response's Group Order is ASCENDING or DESCENDING")


def push_optional_location(writer: Writer, location: Location | None) -> None:
    """Content Exists (8) then the Location when it does."""
    writer.push_uint8(0 if location is None else 1)
    if location is not None:
        location.encode(writer)


def pull_optional_location(reader: Reader) -> Location | None:
    return Location.decode(reader) if pull_flag(reader, "Content Exists") else None


@dataclass(frozen=True, slots=True)
class RequestIdMessage(ControlMessage):
    """Body shared by messages that are only a Request ID (UNSUBSCRIBE, FETCH_CANCEL, *_OK)."""

    request_id: int

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.request_id)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        return cls(reader.pull_varint())


@dataclass(frozen=True, slots=True)
class RequestErrorMessage(ControlMessage):
    """Body shared by the *_ERROR messages: Request ID, Error Code (i), Error Reason (Reason Phrase)."""

    request_id: int
    error_code: int
    reason: str = ""

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.request_id)
        writer.push_varint(self.error_code)
        push_reason_phrase(writer, self.reason, profile.max_reason_phrase_length)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        return cls(reader.pull_varint(), reader.pull_varint(),
                   pull_reason_phrase(reader, profile.max_reason_phrase_length))


def check_track(namespace: Namespace, name: bytes, profile: Profile = DRAFT_14) -> None:
    """Local check of a Full Track Name before it is sent (the decoder enforces the same limits)."""
    check_namespace(namespace, max_fields=profile.max_namespace_fields,
                    max_length=profile.max_full_track_name_length)
    if sum(len(f) for f in namespace) + len(name) > profile.max_full_track_name_length:
        raise ValueError(f"Full Track Name longer than {profile.max_full_track_name_length} octets")


def push_full_track_name(writer: Writer, namespace: Namespace, name: bytes) -> None:
    push_namespace(writer, namespace)
    writer.push_length_prefixed(name)


def read_full_track_name(reader: Reader, profile: Profile) -> tuple[Namespace, bytes]:
    return pull_full_track_name(reader, max_fields=profile.max_namespace_fields,
                                max_length=profile.max_full_track_name_length)


def read_namespace(reader: Reader, profile: Profile) -> Namespace:
    return pull_namespace(reader, max_fields=profile.max_namespace_fields,
                          max_length=profile.max_full_track_name_length)
