"""The control message base class, control framing and field helpers shared by every message.

Why a base with ``encode_payload``/``decode_payload``: the framing (Type varint, 16-bit Length,
Payload, draft-14 section 9) is the same for every message of every draft, so it is written once
here; each message only describes its own fields, in the order of its section's wire format figure,
reading from the profile where a draft lays them out differently (``Profile.layout``).
"""

from __future__ import annotations

from dataclasses import Field, dataclass, replace
from typing import Any, ClassVar, Final, Self

from moqt.errors import LocalError, ProtocolViolation
from moqt.kinds import ExtensionHeader, GroupOrder, MessageKind, RequestError, SessionError
from moqt.profiles import DRAFT_14, Profile
from moqt.wire import (
    KeyValuePair,
    Location,
    Namespace,
    Reader,
    Writer,
    check_namespace,
    decode_kvp_block,
    make_writer,
    pull_full_track_name,
    pull_namespace,
    pull_reason_phrase,
    push_kvps,
    push_namespace,
    push_reason_phrase,
)

_PV: Final = SessionError.PROTOCOL_VIOLATION
#: What a Request ID that the wire leaves to the stream (draft-18 replies) reads as until a
#: request-stream parser fills in the stream's (``ControlMessage.STREAM_ID_FIELD``).
STREAM_REQUEST_ID: Final = -1


class MessageTooLarge(LocalError, ValueError):
    """The encoded payload does not fit the 16-bit Message Length."""


class ControlMessage:
    """A control message: a frozen slotted dataclass with a ``KIND``; the profile gives its number."""

    __slots__ = ()
    KIND: ClassVar[MessageKind]
    #: The field a draft-18 request stream supplies instead of the wire (``Layout.ids_from_request_stream``):
    #: a reply's Request ID, REQUEST_UPDATE's Existing Request ID; None: every field is on the wire.
    STREAM_ID_FIELD: ClassVar[str | None] = None
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # every concrete message is a dataclass

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        raise NotImplementedError

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        raise NotImplementedError

    def encode(self, profile: Profile = DRAFT_14) -> bytes:
        """Type (i), Length (16), Payload -- ready for the control stream (or a draft-18 request stream)."""
        code = profile.message_types.codes.get(profile.sent_as.get(self.KIND, self.KIND))
        if code is None:
            raise ValueError(f"draft-{profile.draft} has no {self.KIND.value} message")
        payload = make_writer(profile.layout.vi64)
        self.encode_payload(payload, profile)
        if len(payload) > profile.max_control_message_length:
            raise MessageTooLarge(f"{self.KIND.value} payload of {len(payload)} octets exceeds "
                                  f"{profile.max_control_message_length}")
        frame = make_writer(profile.layout.vi64)
        frame.push_varint(code)
        frame.push_uint16(len(payload))
        frame.push_bytes(payload.getvalue())
        return frame.getvalue()


def push_request_id(writer: Writer, profile: Profile, request_id: int) -> None:
    """A reply's Request ID, which draft-18 leaves to the request stream."""
    if not profile.layout.ids_from_request_stream:
        writer.push_varint(request_id)


def pull_request_id(reader: Reader, profile: Profile) -> int:
    return STREAM_REQUEST_ID if profile.layout.ids_from_request_stream else reader.pull_varint()


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
class Redirect:
    """REQUEST_ERROR's Redirect (draft-18): where to retry (empty URI: this session) and under which
    Full Track Name (both empty: the original request's)."""

    connect_uri: str = ""
    track_namespace: Namespace = ()
    track_name: bytes = b""

    def __post_init__(self) -> None:
        check_namespace(self.track_namespace, min_fields=0)

    def encode(self, writer: Writer, profile: Profile) -> None:
        uri = self.connect_uri.encode("utf-8")
        if len(uri) > profile.max_goaway_uri_length:
            raise ValueError(f"Connect URI longer than {profile.max_goaway_uri_length} octets")
        writer.push_length_prefixed(uri)
        push_full_track_name(writer, self.track_namespace, self.track_name)

    @classmethod
    def decode(cls, reader: Reader, profile: Profile) -> Redirect:
        uri = reader.pull_length_prefixed(profile.max_goaway_uri_length, "Connect URI")
        namespace = read_namespace(reader, profile, min_fields=0)
        used = sum(len(f) for f in namespace)
        name = bytes(reader.pull_length_prefixed(profile.max_full_track_name_length - used, "Track Name"))
        try:
            return cls(str(uri, "utf-8"), namespace, name)
        except UnicodeDecodeError:
            raise ProtocolViolation(_PV, "Connect URI is not UTF-8") from None


@dataclass(frozen=True, slots=True)
class RequestErrorMessage(ControlMessage):
    """Body shared by the *_ERROR messages and draft-16's REQUEST_ERROR: Request ID, Error Code (i),
    [Retry Interval (i), draft-16], Error Reason (Reason Phrase), [Redirect, draft-18].

    ``retry_interval`` is "the minimum time in milliseconds before the request SHOULD be sent again,
    plus one" (0: do not retry); draft-14 has no such field, so there it is 0 and not sent. Draft-18
    sends no Request ID (the request's stream names it) and, with Error Code REDIRECT, a ``redirect``.
    """

    STREAM_ID_FIELD: ClassVar[str | None] = "request_id"
    request_id: int
    error_code: int
    reason: str = ""
    retry_interval: int = 0
    redirect: Redirect | None = None

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        push_request_id(writer, profile, self.request_id)
        writer.push_varint(self.error_code)
        if profile.layout.retry_interval:
            writer.push_varint(self.retry_interval)
        push_reason_phrase(writer, self.reason, profile.max_reason_phrase_length)
        if (self.redirect is not None) != self._redirects(profile):
            raise ValueError("a Redirect goes with Error Code REDIRECT (draft-18), and only there")
        if self.redirect is not None:
            self.redirect.encode(writer, profile)

    def _redirects(self, profile: Profile) -> bool:
        return profile.layout.request_error_redirect and self.error_code == profile.request_error_code(
            MessageKind.REQUEST_ERROR, RequestError.REDIRECT)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = pull_request_id(reader, profile)
        code = reader.pull_varint()
        retry = reader.pull_varint() if profile.layout.retry_interval else 0
        reason = pull_reason_phrase(reader, profile.max_reason_phrase_length)
        message = cls(request_id, code, reason, retry)
        return replace(message, redirect=Redirect.decode(reader, profile)) if message._redirects(profile) else message


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
                                max_length=profile.max_full_track_name_length,
                                empty_field_closes=profile.layout.empty_namespace_field_closes)


def read_namespace(reader: Reader, profile: Profile, *, min_fields: int = 1) -> Namespace:
    return pull_namespace(reader, max_fields=profile.max_namespace_fields,
                          max_length=profile.max_full_track_name_length, min_fields=min_fields,
                          empty_field_closes=profile.layout.empty_namespace_field_closes)


# --- Track Extensions (draft-16: the last field of SUBSCRIBE_OK, PUBLISH and FETCH_OK) ------------

_ORDER_EXTENSION: Final = ExtensionHeader.DEFAULT_PUBLISHER_GROUP_ORDER
#: Track Extensions whose value the draft bounds ("If an endpoint receives a value ... it MUST close
#: the session with PROTOCOL_VIOLATION"): name -> (lowest, highest).
_BOUNDED_EXTENSIONS: Final = {ExtensionHeader.DELIVERY_TIMEOUT: (1, None), ExtensionHeader.DYNAMIC_GROUPS: (0, 1)}


def push_track_extensions(writer: Writer, profile: Profile, extensions: tuple[KeyValuePair, ...],
                          group_order: GroupOrder = GroupOrder.ASCENDING) -> None:
    """Track Extensions run to the end of the message, with no length; the publisher's group order
    travels as DEFAULT_PUBLISHER_GROUP_ORDER, omitted for ascending (its default)."""
    if not profile.layout.track_extensions:
        if extensions:
            raise ValueError(f"draft-{profile.draft} has no Track Extensions")
        return
    pairs = list(extensions)
    if group_order is not GroupOrder.ASCENDING:
        pairs.append(KeyValuePair(profile.extension_headers.code(_ORDER_EXTENSION),
                                  profile.group_orders.code(group_order)))
    push_kvps(writer, pairs, delta=profile.layout.kvp_delta_types)


def pull_track_extensions(reader: Reader, profile: Profile, *,
                          lift_order: bool = True) -> tuple[GroupOrder, tuple[KeyValuePair, ...]]:
    """(the publisher's group order, the other Track Extensions) from the rest of the message; without
    ``lift_order`` (FETCH_OK: the order is the FETCH's) the group order stays among the extensions."""
    if not profile.layout.track_extensions:
        return GroupOrder.ASCENDING, ()
    block = decode_kvp_block(reader.pull_bytes(reader.remaining), max_value_length=profile.max_kvp_value_length,
                             delta=profile.layout.kvp_delta_types, vi64=profile.layout.vi64)
    order, rest = GroupOrder.ASCENDING, []
    for pair in block:
        name = profile.extension_headers.name(pair.type)
        if name is _ORDER_EXTENSION and isinstance(pair.value, int):
            named = profile.group_orders.name(pair.value)
            if named not in (GroupOrder.ASCENDING, GroupOrder.DESCENDING):
                raise ProtocolViolation(_PV, f"DEFAULT_PUBLISHER_GROUP_ORDER {pair.value}")
            if lift_order and named is GroupOrder.DESCENDING and order is GroupOrder.ASCENDING:
                order = GroupOrder.DESCENDING
                continue
        bounds = _BOUNDED_EXTENSIONS.get(name) if name is not None else None
        if bounds is not None and isinstance(pair.value, int) and not (
                bounds[0] <= pair.value and (bounds[1] is None or pair.value <= bounds[1])):
            raise ProtocolViolation(_PV, f"Track Extension {pair.type:#x} value {pair.value}")
        rest.append(pair)  # the default order written out, or a second one, is kept as it came
    return order, tuple(rest)
