"""The draft-14 profile: every draft-14 code point, parameter type, error table and limit.

Why one module: this is the only place that knows draft-14's numbers. The session, the codecs, the
api and the relay speak in the draft-neutral names of ``moqt.kinds`` and read the numbers from the
``Profile`` they were given; draft-16 and draft-18 become sibling modules. Every code point is an
``IntEnum`` so logs name it while it still compares equal to the integer on the wire. Section
names refer to draft-ietf-moq-transport-14.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from types import MappingProxyType
from typing import Final

from moqt import kinds
from moqt.kinds import (
    MessageKind,
    PublishDoneStatus,
    RequestError,
    RequestParameter,
    SessionError,
    SetupParameter,
    StreamReset,
    SubgroupIdMode,
)
from moqt.profiles.base import CodeMap, DataFraming, DatagramForm, N, Profile, SubgroupForm


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


_K = MessageKind
_V = RequestParameter


def _table(names: type[N], codes: type[IntEnum]) -> CodeMap[N]:
    return CodeMap.by_name(names, codes)


#: Where each version-specific parameter may appear; elsewhere it MUST be ignored (kept as unknown).
DRAFT_14_PARAMETER_SCOPE: Final[Mapping[RequestParameter, frozenset[MessageKind]]] = MappingProxyType({
    _V.AUTHORIZATION_TOKEN: frozenset({
        _K.PUBLISH, _K.SUBSCRIBE, _K.SUBSCRIBE_UPDATE, _K.SUBSCRIBE_NAMESPACE,
        _K.PUBLISH_NAMESPACE, _K.TRACK_STATUS, _K.FETCH}),
    _V.DELIVERY_TIMEOUT: frozenset({
        _K.TRACK_STATUS, _K.TRACK_STATUS_OK, _K.PUBLISH, _K.PUBLISH_OK, _K.SUBSCRIBE,
        _K.SUBSCRIBE_OK, _K.SUBSCRIBE_UPDATE}),
    _V.MAX_CACHE_DURATION: frozenset({_K.PUBLISH, _K.SUBSCRIBE_OK, _K.FETCH_OK, _K.TRACK_STATUS_OK}),
})

#: Messages that carry a new Request ID (section "Request ID").
DRAFT_14_REQUEST_MESSAGES: Final[frozenset[MessageKind]] = frozenset({
    _K.FETCH, _K.SUBSCRIBE, _K.SUBSCRIBE_UPDATE, _K.SUBSCRIBE_NAMESPACE, _K.PUBLISH,
    _K.PUBLISH_NAMESPACE, _K.TRACK_STATUS})

#: Each *_ERROR message's table; PUBLISH_NAMESPACE_CANCEL uses PUBLISH_NAMESPACE_ERROR's.
DRAFT_14_REQUEST_ERRORS: Final[Mapping[MessageKind, CodeMap[RequestError]]] = MappingProxyType({
    _K.SUBSCRIBE_ERROR: _table(RequestError, SubscribeErrorCode),
    _K.TRACK_STATUS_ERROR: _table(RequestError, SubscribeErrorCode),
    _K.PUBLISH_ERROR: _table(RequestError, PublishErrorCode),
    _K.FETCH_ERROR: _table(RequestError, FetchErrorCode),
    _K.PUBLISH_NAMESPACE_ERROR: _table(RequestError, PublishNamespaceErrorCode),
    _K.PUBLISH_NAMESPACE_CANCEL: _table(RequestError, PublishNamespaceErrorCode),
    _K.SUBSCRIBE_NAMESPACE_ERROR: _table(RequestError, SubscribeNamespaceErrorCode),
})

_SUBGROUP_ID_MODES: Final = (SubgroupIdMode.ZERO, SubgroupIdMode.FIRST_OBJECT, SubgroupIdMode.PRESENT)


def _subgroup_form(code: int) -> SubgroupForm:
    """The SUBGROUP_HEADER bits of ``DataStreamType``'s docstring, read out."""
    return SubgroupForm(_SUBGROUP_ID_MODES[(code >> 1) & 0x3], bool(code & 0x01), bool(code & 0x08))


def _datagram_form(code: int) -> DatagramForm:
    """The OBJECT_DATAGRAM bits of ``DatagramType``'s docstring; the status types always carry an Object ID."""
    status = bool(code & DatagramType.STATUS)
    return DatagramForm(bool(code & 0x01), not status and bool(code & 0x02), status or not code & 0x04, status)


DRAFT_14_DATA_FRAMING: Final = DataFraming(
    fetch_header=DataStreamType.FETCH_HEADER,
    subgroup_types={int(t): _subgroup_form(t) for t in DataStreamType if t is not DataStreamType.FETCH_HEADER},
    datagram_types={int(t): _datagram_form(t) for t in DatagramType},
)

DRAFT_14: Final = Profile(
    draft=14,
    version=0xFF00000E,
    alpn="moq-00",
    message_types=_table(MessageKind, MessageType),
    session_errors=_table(SessionError, SessionErrorCode),
    request_errors=DRAFT_14_REQUEST_ERRORS,
    publish_done=_table(PublishDoneStatus, PublishDoneCode),
    stream_resets=_table(StreamReset, StreamResetCode),
    group_orders=_table(kinds.GroupOrder, GroupOrder),
    filter_types=_table(kinds.FilterType, FilterType),
    fetch_types=_table(kinds.FetchType, FetchType),
    object_statuses=_table(kinds.ObjectStatus, ObjectStatus),
    alias_types=_table(kinds.AliasType, AliasType),
    setup_parameters=_table(SetupParameter, SetupParameterType),
    request_parameters=_table(RequestParameter, VersionParameterType),
    parameter_scope=DRAFT_14_PARAMETER_SCOPE,
    request_messages=DRAFT_14_REQUEST_MESSAGES,
    data_framing=DRAFT_14_DATA_FRAMING,
)
