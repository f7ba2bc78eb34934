"""Per-draft MOQT profile: versions, ALPN, code points, error tables and limits (decision D3).

Why a profile object: every number that changes between drafts lives here, so codecs and the session
read it from one frozen value instead of scattering constants. ``DRAFT_14`` is our wire target;
draft-16 is one more ``Profile`` (plus its message codecs) rather than a fork of the session.

Every code point is an ``IntEnum`` so logs and reprs name it, while it still compares equal to the
integer on the wire. Section names below refer to draft-ietf-moq-transport-14.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from types import MappingProxyType
from typing import Final


class MessageType(IntEnum):
    """Control message types (section "Control Messages", draft-14 table)."""

    SUBSCRIBE_UPDATE = 0x02
    SUBSCRIBE = 0x03
    SUBSCRIBE_OK = 0x04
    SUBSCRIBE_ERROR = 0x05
    PUBLISH_NAMESPACE = 0x06
    PUBLISH_NAMESPACE_OK = 0x07
    PUBLISH_NAMESPACE_ERROR = 0x08
    PUBLISH_NAMESPACE_DONE = 0x09
    UNSUBSCRIBE = 0x0A
    PUBLISH_DONE = 0x0B
    PUBLISH_NAMESPACE_CANCEL = 0x0C
    TRACK_STATUS = 0x0D
    TRACK_STATUS_OK = 0x0E
    TRACK_STATUS_ERROR = 0x0F
    GOAWAY = 0x10
    SUBSCRIBE_NAMESPACE = 0x11
    SUBSCRIBE_NAMESPACE_OK = 0x12
    SUBSCRIBE_NAMESPACE_ERROR = 0x13
    UNSUBSCRIBE_NAMESPACE = 0x14
    MAX_REQUEST_ID = 0x15
    FETCH = 0x16
    FETCH_CANCEL = 0x17
    FETCH_OK = 0x18
    FETCH_ERROR = 0x19
    REQUESTS_BLOCKED = 0x1A
    PUBLISH = 0x1D
    PUBLISH_OK = 0x1E
    PUBLISH_ERROR = 0x1F
    CLIENT_SETUP = 0x20
    SERVER_SETUP = 0x21


class SetupParameterType(IntEnum):
    """Setup parameters (section "Setup Parameters"); a namespace constant across versions.

    The draft-14 text gives both AUTHORITY and MOQT_IMPLEMENTATION the number 0x05. AUTHORITY keeps
    0x05; MOQT_IMPLEMENTATION uses 0x07, the number draft-15 and later assign (aiomoqt does the same).
    """

    PATH = 0x01
    MAX_REQUEST_ID = 0x02
    AUTHORIZATION_TOKEN = 0x03
    MAX_AUTH_TOKEN_CACHE_SIZE = 0x04
    AUTHORITY = 0x05
    MOQT_IMPLEMENTATION = 0x07


class VersionParameterType(IntEnum):
    """Version-specific (request) parameters (section "Version Specific Parameters")."""

    DELIVERY_TIMEOUT = 0x02
    AUTHORIZATION_TOKEN = 0x03
    MAX_CACHE_DURATION = 0x04


class AliasType(IntEnum):
    """Alias Type of the AUTHORIZATION TOKEN Token structure."""

    DELETE = 0x0
    REGISTER = 0x1
    USE_ALIAS = 0x2
    USE_VALUE = 0x3


class SessionErrorCode(IntEnum):
    """Session Termination Error Codes (IANA section); carried in QUIC CONNECTION_CLOSE."""

    NO_ERROR = 0x0
    INTERNAL_ERROR = 0x1
    UNAUTHORIZED = 0x2
    PROTOCOL_VIOLATION = 0x3
    INVALID_REQUEST_ID = 0x4
    DUPLICATE_TRACK_ALIAS = 0x5
    KEY_VALUE_FORMATTING_ERROR = 0x6
    TOO_MANY_REQUESTS = 0x7
    INVALID_PATH = 0x8
    MALFORMED_PATH = 0x9
    GOAWAY_TIMEOUT = 0x10
    CONTROL_MESSAGE_TIMEOUT = 0x11
    DATA_STREAM_TIMEOUT = 0x12
    AUTH_TOKEN_CACHE_OVERFLOW = 0x13
    DUPLICATE_AUTH_TOKEN_ALIAS = 0x14
    VERSION_NEGOTIATION_FAILED = 0x15
    MALFORMED_AUTH_TOKEN = 0x16
    UNKNOWN_AUTH_TOKEN_ALIAS = 0x17
    EXPIRED_AUTH_TOKEN = 0x18
    INVALID_AUTHORITY = 0x19
    MALFORMED_AUTHORITY = 0x1A


class SubscribeErrorCode(IntEnum):
    """SUBSCRIBE_ERROR codes; TRACK_STATUS_ERROR uses the same table."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    TRACK_DOES_NOT_EXIST = 0x4
    INVALID_RANGE = 0x5
    MALFORMED_AUTH_TOKEN = 0x10
    EXPIRED_AUTH_TOKEN = 0x12


class PublishDoneCode(IntEnum):
    """PUBLISH_DONE status codes."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TRACK_ENDED = 0x2
    SUBSCRIPTION_ENDED = 0x3
    GOING_AWAY = 0x4
    EXPIRED = 0x5
    TOO_FAR_BEHIND = 0x6
    MALFORMED_TRACK = 0x7


class PublishErrorCode(IntEnum):
    """PUBLISH_ERROR codes."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    UNINTERESTED = 0x4


class FetchErrorCode(IntEnum):
    """FETCH_ERROR codes."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    TRACK_DOES_NOT_EXIST = 0x4
    INVALID_RANGE = 0x5
    NO_OBJECTS = 0x6
    INVALID_JOINING_REQUEST_ID = 0x7
    UNKNOWN_STATUS_IN_RANGE = 0x8
    MALFORMED_TRACK = 0x9
    MALFORMED_AUTH_TOKEN = 0x10
    EXPIRED_AUTH_TOKEN = 0x12


class PublishNamespaceErrorCode(IntEnum):
    """PUBLISH_NAMESPACE_ERROR codes (the IANA "ANNOUNCE_ERROR" table); also PUBLISH_NAMESPACE_CANCEL."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    UNINTERESTED = 0x4
    MALFORMED_AUTH_TOKEN = 0x10
    EXPIRED_AUTH_TOKEN = 0x12


class SubscribeNamespaceErrorCode(IntEnum):
    """SUBSCRIBE_NAMESPACE_ERROR codes."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    NAMESPACE_PREFIX_UNKNOWN = 0x4
    NAMESPACE_PREFIX_OVERLAP = 0x5
    MALFORMED_AUTH_TOKEN = 0x10
    EXPIRED_AUTH_TOKEN = 0x12


class StreamResetCode(IntEnum):
    """Data Stream Reset Error Codes (RESET_STREAM / STOP_SENDING on data streams)."""

    INTERNAL_ERROR = 0x0
    CANCELLED = 0x1
    DELIVERY_TIMEOUT = 0x2
    SESSION_CLOSED = 0x3


class GroupOrder(IntEnum):
    """Group Order field; 0 (publisher's order) is only valid in requests."""

    PUBLISHER_DEFAULT = 0x0
    ASCENDING = 0x1
    DESCENDING = 0x2


class FilterType(IntEnum):
    """SUBSCRIBE / PUBLISH_OK filter types."""

    NEXT_GROUP_START = 0x1
    LARGEST_OBJECT = 0x2
    ABSOLUTE_START = 0x3
    ABSOLUTE_RANGE = 0x4


class FetchType(IntEnum):
    """FETCH types."""

    STANDALONE = 0x1
    RELATIVE_JOINING = 0x2
    ABSOLUTE_JOINING = 0x3


class ObjectStatus(IntEnum):
    """Object Status values (section "Object Status"); 0x2 is unassigned in draft-14."""

    NORMAL = 0x0
    DOES_NOT_EXIST = 0x1
    END_OF_GROUP = 0x3
    END_OF_TRACK = 0x4


class DataStreamType(IntEnum):
    """Unidirectional stream types: FETCH_HEADER and the twelve SUBGROUP_HEADER types.

    SUBGROUP_HEADER bits over 0x10: 0x01 extensions present, 0x06 subgroup ID mode (0 zero,
    2 first object ID, 4 field present), 0x08 contains end of group.
    """

    FETCH_HEADER = 0x05
    SUBGROUP_ZERO = 0x10
    SUBGROUP_ZERO_EXT = 0x11
    SUBGROUP_FIRST_OBJECT = 0x12
    SUBGROUP_FIRST_OBJECT_EXT = 0x13
    SUBGROUP_PRESENT = 0x14
    SUBGROUP_PRESENT_EXT = 0x15
    SUBGROUP_ZERO_EOG = 0x18
    SUBGROUP_ZERO_EXT_EOG = 0x19
    SUBGROUP_FIRST_OBJECT_EOG = 0x1A
    SUBGROUP_FIRST_OBJECT_EXT_EOG = 0x1B
    SUBGROUP_PRESENT_EOG = 0x1C
    SUBGROUP_PRESENT_EXT_EOG = 0x1D


class DatagramType(IntEnum):
    """OBJECT_DATAGRAM types: bit 0x01 extensions, 0x02 end of group, 0x04 no Object ID (then 0);
    0x20/0x21 carry an Object Status instead of a payload (OBJECT_DATAGRAM_STATUS)."""

    OBJECT = 0x00
    OBJECT_EXT = 0x01
    OBJECT_EOG = 0x02
    OBJECT_EXT_EOG = 0x03
    OBJECT_ID_ZERO = 0x04
    OBJECT_ID_ZERO_EXT = 0x05
    OBJECT_ID_ZERO_EOG = 0x06
    OBJECT_ID_ZERO_EXT_EOG = 0x07
    STATUS = 0x20
    STATUS_EXT = 0x21


class ExtensionHeaderType(IntEnum):
    """Object Extension Headers defined by draft-14 ("Extension Headers")."""

    IMMUTABLE_EXTENSIONS = 0x0B
    PRIOR_GROUP_ID_GAP = 0x3C
    PRIOR_OBJECT_ID_GAP = 0x3E


_M = MessageType
_V = VersionParameterType

#: Where each version-specific parameter may appear; elsewhere it MUST be ignored (kept as unknown).
DRAFT_14_PARAMETER_SCOPE: Final[Mapping[int, frozenset[int]]] = MappingProxyType({
    _V.AUTHORIZATION_TOKEN: frozenset({
        _M.PUBLISH, _M.SUBSCRIBE, _M.SUBSCRIBE_UPDATE, _M.SUBSCRIBE_NAMESPACE,
        _M.PUBLISH_NAMESPACE, _M.TRACK_STATUS, _M.FETCH}),
    _V.DELIVERY_TIMEOUT: frozenset({
        _M.TRACK_STATUS, _M.TRACK_STATUS_OK, _M.PUBLISH, _M.PUBLISH_OK, _M.SUBSCRIBE,
        _M.SUBSCRIBE_OK, _M.SUBSCRIBE_UPDATE}),
    _V.MAX_CACHE_DURATION: frozenset({_M.PUBLISH, _M.SUBSCRIBE_OK, _M.FETCH_OK, _M.TRACK_STATUS_OK}),
})

#: Messages that carry a new Request ID (section "Request ID").
DRAFT_14_REQUEST_MESSAGES: Final[frozenset[int]] = frozenset({
    _M.FETCH, _M.SUBSCRIBE, _M.SUBSCRIBE_UPDATE, _M.SUBSCRIBE_NAMESPACE, _M.PUBLISH,
    _M.PUBLISH_NAMESPACE, _M.TRACK_STATUS})


@dataclass(frozen=True, slots=True, eq=False)
class Profile:
    """Everything draft-specific that codecs and the session need, as one immutable value."""

    draft: int
    version: int
    alpn: str
    message_types: type[MessageType]
    setup_parameter_types: type[SetupParameterType]
    version_parameter_types: type[VersionParameterType]
    session_error_codes: type[SessionErrorCode]
    subscribe_error_codes: type[SubscribeErrorCode]
    publish_done_codes: type[PublishDoneCode]
    publish_error_codes: type[PublishErrorCode]
    fetch_error_codes: type[FetchErrorCode]
    publish_namespace_error_codes: type[PublishNamespaceErrorCode]
    subscribe_namespace_error_codes: type[SubscribeNamespaceErrorCode]
    stream_reset_codes: type[StreamResetCode]
    data_stream_types: type[DataStreamType]
    datagram_types: type[DatagramType]
    object_statuses: type[ObjectStatus]
    parameter_scope: Mapping[int, frozenset[int]]
    request_messages: frozenset[int]
    control_length_bytes: int = 2
    max_control_message_length: int = 0xFFFF
    max_namespace_fields: int = 32
    max_full_track_name_length: int = 4096
    max_reason_phrase_length: int = 1024
    max_goaway_uri_length: int = 8192
    max_kvp_value_length: int = 0xFFFF
    client_first_request_id: int = 0
    server_first_request_id: int = 1


DRAFT_14: Final = Profile(
    draft=14,
    version=0xFF00000E,
    alpn="moq-00",
    message_types=MessageType,
    setup_parameter_types=SetupParameterType,
    version_parameter_types=VersionParameterType,
    session_error_codes=SessionErrorCode,
    subscribe_error_codes=SubscribeErrorCode,
    publish_done_codes=PublishDoneCode,
    publish_error_codes=PublishErrorCode,
    fetch_error_codes=FetchErrorCode,
    publish_namespace_error_codes=PublishNamespaceErrorCode,
    subscribe_namespace_error_codes=SubscribeNamespaceErrorCode,
    stream_reset_codes=StreamResetCode,
    data_stream_types=DataStreamType,
    datagram_types=DatagramType,
    object_statuses=ObjectStatus,
    parameter_scope=DRAFT_14_PARAMETER_SCOPE,
    request_messages=DRAFT_14_REQUEST_MESSAGES,
)
