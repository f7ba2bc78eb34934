"""The draft-16 profile: every draft-16 code point, parameter type, error table, layout flag and limit.

Why a sibling of ``draft14``: this is the only place that knows draft-16's numbers; the codecs and
the session read them from the ``Profile`` they are given. What changed from draft-14 -- and where
our code reads each difference -- is tabled in docs/moqt-drafts.md. Section names refer to
draft-ietf-moq-transport-16.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from types import MappingProxyType
from typing import Final

from moqt import kinds
from moqt.kinds import (
    ExtensionHeader,
    MessageKind,
    PublishDoneStatus,
    RequestError,
    RequestParameter,
    SessionError,
    SetupParameter,
    StreamReset,
    SubgroupIdMode,
    SubscribeOptions,
)
from moqt.profiles.base import (
    CodeMap,
    DataFraming,
    DatagramForm,
    Layout,
    N,
    Profile,
    SessionShape,
    SubgroupForm,
)
from moqt.profiles.draft14 import AliasType, FetchType, FilterType, SessionErrorCode, SetupParameterType


class MessageType(IntEnum):
    """Control messages (section "Control Messages", draft-16 table)."""

    REQUEST_UPDATE = 0x02
    SUBSCRIBE = 0x03
    SUBSCRIBE_OK = 0x04
    REQUEST_ERROR = 0x05
    PUBLISH_NAMESPACE = 0x06
    REQUEST_OK = 0x07
    NAMESPACE = 0x08
    PUBLISH_NAMESPACE_DONE = 0x09
    UNSUBSCRIBE = 0x0A
    PUBLISH_DONE = 0x0B
    PUBLISH_NAMESPACE_CANCEL = 0x0C
    TRACK_STATUS = 0x0D
    NAMESPACE_DONE = 0x0E
    GOAWAY = 0x10
    SUBSCRIBE_NAMESPACE = 0x11
    MAX_REQUEST_ID = 0x15
    FETCH = 0x16
    FETCH_CANCEL = 0x17
    FETCH_OK = 0x18
    REQUESTS_BLOCKED = 0x1A
    PUBLISH = 0x1D
    PUBLISH_OK = 0x1E
    CLIENT_SETUP = 0x20
    SERVER_SETUP = 0x21


class MessageParameterType(IntEnum):
    """Message Parameters (IANA "Message Parameters"; draft-14 called them version-specific)."""

    DELIVERY_TIMEOUT = 0x02
    AUTHORIZATION_TOKEN = 0x03
    EXPIRES = 0x08
    LARGEST_OBJECT = 0x09
    FORWARD = 0x10
    SUBSCRIBER_PRIORITY = 0x20
    SUBSCRIPTION_FILTER = 0x21
    GROUP_ORDER = 0x22
    NEW_GROUP_REQUEST = 0x32


class RequestErrorCode(IntEnum):
    """REQUEST_ERROR codes (IANA "REQUEST_ERROR Codes"): one table for every request."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    MALFORMED_AUTH_TOKEN = 0x4
    EXPIRED_AUTH_TOKEN = 0x5
    DOES_NOT_EXIST = 0x10
    INVALID_RANGE = 0x11
    MALFORMED_TRACK = 0x12
    DUPLICATE_SUBSCRIPTION = 0x19
    UNINTERESTED = 0x20
    PREFIX_OVERLAP = 0x30
    INVALID_JOINING_REQUEST_ID = 0x32


class PublishDoneCode(IntEnum):
    """PUBLISH_DONE status codes (IANA table; MALFORMED_TRACK moved from 0x7 to 0x12)."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TRACK_ENDED = 0x2
    SUBSCRIPTION_ENDED = 0x3
    GOING_AWAY = 0x4
    EXPIRED = 0x5
    TOO_FAR_BEHIND = 0x6
    UPDATE_FAILED = 0x8
    MALFORMED_TRACK = 0x12


class StreamResetCode(IntEnum):
    """Data Stream Reset Error Codes."""

    INTERNAL_ERROR = 0x0
    CANCELLED = 0x1
    DELIVERY_TIMEOUT = 0x2
    SESSION_CLOSED = 0x3
    UNKNOWN_OBJECT_STATUS = 0x4
    MALFORMED_TRACK = 0x12


class GroupOrder(IntEnum):
    """GROUP_ORDER parameter values; the publisher's order is the parameter's absence."""

    ASCENDING = 0x1
    DESCENDING = 0x2


class ObjectStatus(IntEnum):
    """Object Status (section "Object Status"): draft-16 has no "Object Does Not Exist"."""

    NORMAL = 0x0
    END_OF_GROUP = 0x3
    END_OF_TRACK = 0x4


class ExtensionHeaderType(IntEnum):
    """Extension Headers (IANA "MOQ Extension Headers"); the first six are Track Extensions."""

    DELIVERY_TIMEOUT = 0x02
    MAX_CACHE_DURATION = 0x04
    IMMUTABLE_EXTENSIONS = 0x0B
    DEFAULT_PUBLISHER_PRIORITY = 0x0E
    DEFAULT_PUBLISHER_GROUP_ORDER = 0x22
    DYNAMIC_GROUPS = 0x30
    PRIOR_GROUP_ID_GAP = 0x3C
    PRIOR_OBJECT_ID_GAP = 0x3E


class SubscribeOptionsCode(IntEnum):
    """SUBSCRIBE_NAMESPACE's Subscribe Options."""

    PUBLISH = 0x00
    NAMESPACE = 0x01
    BOTH = 0x02


#: SUBGROUP_HEADER types, 0b00X1XXXX: 0x01 extensions, 0x06 subgroup ID mode (0b11 reserved),
#: 0x08 end of group, 0x20 default priority (no Publisher Priority field).
SUBGROUP_TYPES: Final = tuple(t for t in range(0x10, 0x40) if t & 0x10 and (t & 0x06) != 0x06)
#: OBJECT_DATAGRAM types, 0b00X0XXXX: 0x01 extensions, 0x02 end of group, 0x04 Object ID 0 (absent),
#: 0x08 default priority, 0x20 status instead of payload (never with end of group).
DATAGRAM_TYPES: Final = tuple(t for t in range(0x30) if not t & 0x10 and not (t & 0x20 and t & 0x02))
FETCH_HEADER: Final = 0x05

_K = MessageKind
_V = RequestParameter
_SUBGROUP_ID_MODES: Final = (SubgroupIdMode.ZERO, SubgroupIdMode.FIRST_OBJECT, SubgroupIdMode.PRESENT)


def _table(names: type[N], codes: type[IntEnum]) -> CodeMap[N]:
    return CodeMap.by_name(names, codes)


def _subgroup_form(code: int) -> SubgroupForm:
    return SubgroupForm(_SUBGROUP_ID_MODES[(code >> 1) & 0x3], bool(code & 0x01), bool(code & 0x08),
                        bool(code & 0x20))


def _datagram_form(code: int) -> DatagramForm:
    status = bool(code & 0x20)
    return DatagramForm(bool(code & 0x01), bool(code & 0x02), not code & 0x04, status, bool(code & 0x08))


_RE = RequestErrorCode
#: One REQUEST_ERROR table. DOES_NOT_EXIST is "the track or namespace is not available", so both
#: neutral names take 0x10 (TRACK_DOES_NOT_EXIST is listed last: it is the name 0x10 reads back as);
#: PREFIX_OVERLAP is the neutral NAMESPACE_PREFIX_OVERLAP. NO_OBJECTS is gone (an empty FETCH answers
#: with an empty fetch stream).
DRAFT_16_REQUEST_ERROR_TABLE: Final[CodeMap[RequestError]] = CodeMap({
    RequestError.INTERNAL_ERROR: _RE.INTERNAL_ERROR, RequestError.UNAUTHORIZED: _RE.UNAUTHORIZED,
    RequestError.TIMEOUT: _RE.TIMEOUT, RequestError.NOT_SUPPORTED: _RE.NOT_SUPPORTED,
    RequestError.MALFORMED_AUTH_TOKEN: _RE.MALFORMED_AUTH_TOKEN,
    RequestError.EXPIRED_AUTH_TOKEN: _RE.EXPIRED_AUTH_TOKEN,
    RequestError.NAMESPACE_PREFIX_UNKNOWN: _RE.DOES_NOT_EXIST, RequestError.TRACK_DOES_NOT_EXIST: _RE.DOES_NOT_EXIST,
    RequestError.INVALID_RANGE: _RE.INVALID_RANGE, RequestError.MALFORMED_TRACK: _RE.MALFORMED_TRACK,
    RequestError.DUPLICATE_SUBSCRIPTION: _RE.DUPLICATE_SUBSCRIPTION, RequestError.UNINTERESTED: _RE.UNINTERESTED,
    RequestError.NAMESPACE_PREFIX_OVERLAP: _RE.PREFIX_OVERLAP,
    RequestError.INVALID_JOINING_REQUEST_ID: _RE.INVALID_JOINING_REQUEST_ID,
})

#: The neutral answer kinds the session speaks all travel as REQUEST_ERROR and share its table, as
#: does PUBLISH_NAMESPACE_CANCEL ("the same error codes as REQUEST_ERROR").
DRAFT_16_REQUEST_ERRORS: Final[Mapping[MessageKind, CodeMap[RequestError]]] = MappingProxyType({
    kind: DRAFT_16_REQUEST_ERROR_TABLE for kind in (
        _K.REQUEST_ERROR, _K.SUBSCRIBE_ERROR, _K.TRACK_STATUS_ERROR, _K.PUBLISH_ERROR, _K.FETCH_ERROR,
        _K.PUBLISH_NAMESPACE_ERROR, _K.PUBLISH_NAMESPACE_CANCEL, _K.SUBSCRIBE_NAMESPACE_ERROR)
})

#: Where each Message Parameter may appear (section "Message Parameters"); elsewhere it MUST be ignored.
DRAFT_16_PARAMETER_SCOPE: Final[Mapping[RequestParameter, frozenset[MessageKind]]] = MappingProxyType({
    _V.AUTHORIZATION_TOKEN: frozenset({
        _K.PUBLISH, _K.SUBSCRIBE, _K.REQUEST_UPDATE, _K.SUBSCRIBE_NAMESPACE, _K.PUBLISH_NAMESPACE,
        _K.TRACK_STATUS, _K.FETCH}),
    _V.DELIVERY_TIMEOUT: frozenset({_K.PUBLISH_OK, _K.SUBSCRIBE, _K.REQUEST_UPDATE}),
    _V.SUBSCRIBER_PRIORITY: frozenset({_K.SUBSCRIBE, _K.FETCH, _K.REQUEST_UPDATE, _K.PUBLISH_OK}),
    _V.GROUP_ORDER: frozenset({_K.SUBSCRIBE, _K.PUBLISH_OK, _K.FETCH}),
    _V.SUBSCRIPTION_FILTER: frozenset({_K.SUBSCRIBE, _K.PUBLISH_OK, _K.REQUEST_UPDATE}),
    _V.EXPIRES: frozenset({_K.SUBSCRIBE_OK, _K.PUBLISH, _K.PUBLISH_OK}),
    _V.LARGEST_OBJECT: frozenset({_K.SUBSCRIBE_OK, _K.PUBLISH, _K.REQUEST_OK}),
    _V.FORWARD: frozenset({_K.SUBSCRIBE, _K.REQUEST_UPDATE, _K.PUBLISH, _K.PUBLISH_OK, _K.SUBSCRIBE_NAMESPACE}),
    _V.NEW_GROUP_REQUEST: frozenset({_K.PUBLISH_OK, _K.SUBSCRIBE, _K.REQUEST_UPDATE}),
})

#: Messages that carry a new Request ID (section "Request ID").
DRAFT_16_REQUEST_MESSAGES: Final[frozenset[MessageKind]] = frozenset({
    _K.FETCH, _K.SUBSCRIBE, _K.REQUEST_UPDATE, _K.SUBSCRIBE_NAMESPACE, _K.PUBLISH, _K.PUBLISH_NAMESPACE,
    _K.TRACK_STATUS})

DRAFT_16_DATA_FRAMING: Final = DataFraming(
    fetch_header=FETCH_HEADER,
    subgroup_types={t: _subgroup_form(t) for t in SUBGROUP_TYPES},
    datagram_types={t: _datagram_form(t) for t in DATAGRAM_TYPES},
    fetch_serialization_flags=True,
    status_objects_extensions=False,
)

DRAFT_16_LAYOUT: Final = Layout(
    setup_versions=False,
    setup_token_aliases=False,
    kvp_delta_types=True,
    unknown_parameters_close=True,
    fields_as_parameters=True,
    track_extensions=True,
    retry_interval=True,
    namespace_ends_by_request_id=True,
    subscribe_namespace_options=True,
    empty_namespace_field_closes=True,
    zero_delivery_timeout_closes=True,
)

DRAFT_16: Final = Profile(
    draft=16,
    version=0xFF000010,  # never on the wire: the ALPN "moqt-16" names the version
    alpn="moqt-16",
    message_types=_table(MessageKind, MessageType),
    session_errors=_table(SessionError, SessionErrorCode),
    request_errors=DRAFT_16_REQUEST_ERRORS,
    publish_done=_table(PublishDoneStatus, PublishDoneCode),
    stream_resets=_table(StreamReset, StreamResetCode),
    group_orders=_table(kinds.GroupOrder, GroupOrder),
    filter_types=_table(kinds.FilterType, FilterType),
    fetch_types=_table(kinds.FetchType, FetchType),
    object_statuses=_table(kinds.ObjectStatus, ObjectStatus),
    alias_types=_table(kinds.AliasType, AliasType),
    setup_parameters=_table(SetupParameter, SetupParameterType),
    request_parameters=_table(RequestParameter, MessageParameterType),
    parameter_scope=DRAFT_16_PARAMETER_SCOPE,
    request_messages=DRAFT_16_REQUEST_MESSAGES,
    data_framing=DRAFT_16_DATA_FRAMING,
    layout=DRAFT_16_LAYOUT,
    shape=SessionShape.DRAFT_16,
    extension_headers=_table(ExtensionHeader, ExtensionHeaderType),
    subscribe_options=_table(SubscribeOptions, SubscribeOptionsCode),
)
