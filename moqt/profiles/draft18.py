"""The draft-18 profile: every draft-18 code point, parameter type, error table, layout flag and limit.

Why a sibling of ``draft16``: this is the only place that knows draft-18's numbers; the codecs and
the session read them from the ``Profile`` they are given. Draft-18 (with draft-17's changes) is the
largest step yet: vi64 integers, a pair of control streams opened by SETUP, every request on its own
bidirectional stream (so replies carry no Request ID), Message Parameters as Type-Value pairs,
SUBSCRIBE_TRACKS, PUBLISH_BLOCKED, REDIRECT, delta-coded IDs on fetch streams and padding.
What changed -- and where our code reads each difference -- is tabled in docs/moqt-drafts.md.
Section names refer to draft-ietf-moq-transport-18.
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
)
from moqt.profiles.base import CodeMap, DataFraming, Layout, N, Profile, SessionShape, SubgroupForm
from moqt.profiles.draft14 import AliasType, FetchType, FilterType, SessionErrorCode
from moqt.profiles.draft16 import DRAFT_16_DATA_FRAMING, GroupOrder, ObjectStatus  # unchanged in draft-18


class MessageType(IntEnum):
    """Control messages (section "Control Messages", draft-18 table; the Stream column in comments)."""

    SETUP = 0x2F00  # control; also the control stream's type
    GOAWAY = 0x10  # control, request
    SUBSCRIBE = 0x03  # request, first
    SUBSCRIBE_OK = 0x04
    PUBLISH = 0x1D  # request, first
    PUBLISH_OK = 0x1E  # "PUBLISH_OK (REQUEST_OK)": decoded; sent as REQUEST_OK (``Profile.sent_as``)
    PUBLISH_DONE = 0x0B
    FETCH = 0x16  # request, first
    FETCH_OK = 0x18
    TRACK_STATUS = 0x0D  # request, first
    PUBLISH_NAMESPACE = 0x06  # request, first
    SUBSCRIBE_NAMESPACE = 0x50  # request, first
    SUBSCRIBE_TRACKS = 0x51  # request, first
    NAMESPACE = 0x08
    NAMESPACE_DONE = 0x0E
    PUBLISH_BLOCKED = 0x0F
    REQUEST_UPDATE = 0x02
    REQUEST_OK = 0x07
    REQUEST_ERROR = 0x05


class SetupOptionType(IntEnum):
    """Setup Options (IANA "Setup Options"): MAX_REQUEST_ID (0x02) is gone with MAX_REQUEST_ID."""

    PATH = 0x01
    AUTHORIZATION_TOKEN = 0x03
    MAX_AUTH_TOKEN_CACHE_SIZE = 0x04
    AUTHORITY = 0x05
    MOQT_IMPLEMENTATION = 0x07


class MessageParameterType(IntEnum):
    """Message Parameters (IANA "Message Parameters"); the comment is each one's value encoding."""

    OBJECT_DELIVERY_TIMEOUT = 0x02  # varint (the neutral DELIVERY_TIMEOUT)
    AUTHORIZATION_TOKEN = 0x03  # length-prefixed Token
    RENDEZVOUS_TIMEOUT = 0x04  # varint
    SUBGROUP_DELIVERY_TIMEOUT = 0x06  # varint
    EXPIRES = 0x08  # varint
    LARGEST_OBJECT = 0x09  # Location, inline
    FILL_TIMEOUT = 0x0A  # varint
    FORWARD = 0x10  # uint8
    SUBSCRIBER_PRIORITY = 0x20  # uint8
    SUBSCRIPTION_FILTER = 0x21  # length-prefixed Subscription Filter
    GROUP_ORDER = 0x22  # uint8
    NEW_GROUP_REQUEST = 0x32  # varint
    TRACK_NAMESPACE_PREFIX = 0x34  # Track Namespace


class RequestErrorCode(IntEnum):
    """REQUEST_ERROR codes (IANA "REQUEST_ERROR Codes")."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    MALFORMED_AUTH_TOKEN = 0x4
    EXPIRED_AUTH_TOKEN = 0x5
    GOING_AWAY = 0x6
    EXCESSIVE_LOAD = 0x9
    DOES_NOT_EXIST = 0x10
    INVALID_RANGE = 0x11
    MALFORMED_TRACK = 0x12
    DUPLICATE_SUBSCRIPTION = 0x19
    UNINTERESTED = 0x20
    PREFIX_OVERLAP = 0x30
    NAMESPACE_TOO_LARGE = 0x31
    INVALID_JOINING_REQUEST_ID = 0x32
    UNSUPPORTED_EXTENSION = 0x33
    REDIRECT = 0x34


class PublishDoneCode(IntEnum):
    """PUBLISH_DONE codes (IANA table): TOO_FAR_BEHIND and EXPIRED swapped numbers since draft-16."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TRACK_ENDED = 0x2
    SUBSCRIPTION_ENDED = 0x3
    GOING_AWAY = 0x4
    TOO_FAR_BEHIND = 0x5
    EXPIRED = 0x6
    UPDATE_FAILED = 0x8
    EXCESSIVE_LOAD = 0x9
    MALFORMED_TRACK = 0x12


class StreamResetCode(IntEnum):
    """Stream Reset Error Codes (every request stream's and data stream's; UNKNOWN_OBJECT_STATUS moved)."""

    INTERNAL_ERROR = 0x0
    CANCELLED = 0x1
    DELIVERY_TIMEOUT = 0x2
    SESSION_CLOSED = 0x3
    GOING_AWAY = 0x4
    TOO_FAR_BEHIND = 0x5
    UNKNOWN_OBJECT_STATUS = 0x6
    EXPIRED_AUTH_TOKEN = 0x7
    EXCESSIVE_LOAD = 0x9
    MALFORMED_TRACK = 0x12


class PropertyType(IntEnum):
    """Properties (IANA "MOQ Properties", draft-16's Extension Headers renamed)."""

    OBJECT_DELIVERY_TIMEOUT = 0x02
    MAX_CACHE_DURATION = 0x04
    SUBGROUP_DELIVERY_TIMEOUT = 0x06
    IMMUTABLE_PROPERTIES = 0x0B
    DEFAULT_PUBLISHER_PRIORITY = 0x0E
    DEFAULT_PUBLISHER_GROUP_ORDER = 0x22
    DYNAMIC_GROUPS = 0x30
    PRIOR_GROUP_ID_GAP = 0x3C
    PRIOR_OBJECT_ID_GAP = 0x3E


#: SUBGROUP_HEADER types, 0b0XX1XXXX: 0x01 properties, 0x06 subgroup ID mode (0b11 reserved), 0x08 end
#: of group, 0x20 default priority, 0x40 first object.
SUBGROUP_TYPES: Final = tuple(t for t in range(0x10, 0x80) if t & 0x10 and (t & 0x06) != 0x06)
FETCH_HEADER: Final = 0x05
CONTROL_STREAM_TYPE: Final = 0x2F00
PADDING_STREAM_TYPE: Final = 0x132B3E28
PADDING_DATAGRAM_TYPE: Final = 0x132B3E29

_K = MessageKind
_V = RequestParameter
_SUBGROUP_ID_MODES: Final = (SubgroupIdMode.ZERO, SubgroupIdMode.FIRST_OBJECT, SubgroupIdMode.PRESENT)


def _table(names: type[N], codes: type[IntEnum]) -> CodeMap[N]:
    return CodeMap.by_name(names, codes)


def _subgroup_form(code: int) -> SubgroupForm:
    return SubgroupForm(_SUBGROUP_ID_MODES[(code >> 1) & 0x3], bool(code & 0x01), bool(code & 0x08),
                        bool(code & 0x20), bool(code & 0x40))


_RE = RequestErrorCode
#: One REQUEST_ERROR table for every neutral *_ERROR kind, as draft-16's (DOES_NOT_EXIST serves
#: both TRACK_DOES_NOT_EXIST and NAMESPACE_PREFIX_UNKNOWN; the former is the name 0x10 reads back as).
DRAFT_18_REQUEST_ERROR_TABLE: Final[CodeMap[RequestError]] = CodeMap({
    RequestError.INTERNAL_ERROR: _RE.INTERNAL_ERROR, RequestError.UNAUTHORIZED: _RE.UNAUTHORIZED,
    RequestError.TIMEOUT: _RE.TIMEOUT, RequestError.NOT_SUPPORTED: _RE.NOT_SUPPORTED,
    RequestError.MALFORMED_AUTH_TOKEN: _RE.MALFORMED_AUTH_TOKEN,
    RequestError.EXPIRED_AUTH_TOKEN: _RE.EXPIRED_AUTH_TOKEN, RequestError.GOING_AWAY: _RE.GOING_AWAY,
    RequestError.EXCESSIVE_LOAD: _RE.EXCESSIVE_LOAD,
    RequestError.NAMESPACE_PREFIX_UNKNOWN: _RE.DOES_NOT_EXIST, RequestError.TRACK_DOES_NOT_EXIST: _RE.DOES_NOT_EXIST,
    RequestError.INVALID_RANGE: _RE.INVALID_RANGE, RequestError.MALFORMED_TRACK: _RE.MALFORMED_TRACK,
    RequestError.DUPLICATE_SUBSCRIPTION: _RE.DUPLICATE_SUBSCRIPTION, RequestError.UNINTERESTED: _RE.UNINTERESTED,
    RequestError.NAMESPACE_PREFIX_OVERLAP: _RE.PREFIX_OVERLAP,
    RequestError.NAMESPACE_TOO_LARGE: _RE.NAMESPACE_TOO_LARGE,
    RequestError.INVALID_JOINING_REQUEST_ID: _RE.INVALID_JOINING_REQUEST_ID,
    RequestError.UNSUPPORTED_EXTENSION: _RE.UNSUPPORTED_EXTENSION, RequestError.REDIRECT: _RE.REDIRECT,
})

DRAFT_18_REQUEST_ERRORS: Final[Mapping[MessageKind, CodeMap[RequestError]]] = MappingProxyType({
    kind: DRAFT_18_REQUEST_ERROR_TABLE for kind in (
        _K.REQUEST_ERROR, _K.SUBSCRIBE_ERROR, _K.TRACK_STATUS_ERROR, _K.PUBLISH_ERROR, _K.FETCH_ERROR,
        _K.PUBLISH_NAMESPACE_ERROR, _K.SUBSCRIBE_NAMESPACE_ERROR)
})

#: What a REQUEST_OK may carry: it is PUBLISH_OK, REQUEST_UPDATE_OK and TRACK_STATUS_OK at once.
_OK = (_K.REQUEST_OK, _K.PUBLISH_OK)
#: Where each Message Parameter may appear (each parameter's section); elsewhere it closes the session.
DRAFT_18_PARAMETER_SCOPE: Final[Mapping[RequestParameter, frozenset[MessageKind]]] = MappingProxyType({
    _V.AUTHORIZATION_TOKEN: frozenset({
        _K.PUBLISH, _K.SUBSCRIBE, _K.REQUEST_UPDATE, _K.SUBSCRIBE_NAMESPACE, _K.SUBSCRIBE_TRACKS,
        _K.PUBLISH_NAMESPACE, _K.TRACK_STATUS, _K.FETCH}),
    _V.DELIVERY_TIMEOUT: frozenset({*_OK, _K.SUBSCRIBE, _K.REQUEST_UPDATE}),
    _V.SUBGROUP_DELIVERY_TIMEOUT: frozenset({*_OK, _K.SUBSCRIBE, _K.REQUEST_UPDATE}),
    _V.RENDEZVOUS_TIMEOUT: frozenset({_K.SUBSCRIBE}),
    _V.FILL_TIMEOUT: frozenset({_K.FETCH}),
    _V.SUBSCRIBER_PRIORITY: frozenset({_K.SUBSCRIBE, _K.FETCH, _K.REQUEST_UPDATE, *_OK}),
    _V.GROUP_ORDER: frozenset({_K.SUBSCRIBE, *_OK, _K.FETCH}),
    _V.SUBSCRIPTION_FILTER: frozenset({_K.SUBSCRIBE, *_OK, _K.REQUEST_UPDATE}),
    _V.EXPIRES: frozenset({_K.SUBSCRIBE_OK, _K.PUBLISH, *_OK}),
    _V.LARGEST_OBJECT: frozenset({_K.SUBSCRIBE_OK, _K.PUBLISH, *_OK}),
    _V.FORWARD: frozenset({_K.SUBSCRIBE, _K.REQUEST_UPDATE, _K.PUBLISH, *_OK, _K.SUBSCRIBE_TRACKS}),
    _V.NEW_GROUP_REQUEST: frozenset({*_OK, _K.SUBSCRIBE, _K.REQUEST_UPDATE}),
    _V.TRACK_NAMESPACE_PREFIX: frozenset({_K.REQUEST_UPDATE}),
})

#: Messages that consume a Request ID (section "Request ID").
DRAFT_18_REQUEST_MESSAGES: Final[frozenset[MessageKind]] = frozenset({
    _K.SUBSCRIBE, _K.PUBLISH, _K.FETCH, _K.SUBSCRIBE_NAMESPACE, _K.SUBSCRIBE_TRACKS, _K.PUBLISH_NAMESPACE,
    _K.REQUEST_UPDATE, _K.TRACK_STATUS})
#: "A request stream begins with one of these seven message types" (section "Session initialization").
DRAFT_18_STREAM_OPENING: Final[frozenset[MessageKind]] = DRAFT_18_REQUEST_MESSAGES - {_K.REQUEST_UPDATE}

DRAFT_18_DATA_FRAMING: Final = DataFraming(
    fetch_header=FETCH_HEADER,
    subgroup_types={t: _subgroup_form(t) for t in SUBGROUP_TYPES},
    datagram_types=DRAFT_16_DATA_FRAMING.datagram_types,  # draft-16's OBJECT_DATAGRAM types, unchanged
    fetch_serialization_flags=True,
    status_objects_extensions=False,
    fetch_id_deltas=True,
    control_stream_type=CONTROL_STREAM_TYPE,
    padding_stream_type=PADDING_STREAM_TYPE,
    padding_datagram_type=PADDING_DATAGRAM_TYPE,
)

DRAFT_18_LAYOUT: Final = Layout(
    setup_versions=False,
    setup_token_aliases=False,
    kvp_delta_types=True,
    unknown_parameters_close=True,
    fields_as_parameters=True,
    track_extensions=True,
    retry_interval=True,
    namespace_ends_by_request_id=True,
    subscribe_namespace_options=False,  # SUBSCRIBE_NAMESPACE asks for namespaces, SUBSCRIBE_TRACKS for tracks
    empty_namespace_field_closes=True,
    zero_delivery_timeout_closes=False,  # "Allow DELIVERY_TIMEOUT value of 0 to mean no timeout (#1450)"
    empty_namespace_prefix=True,
    vi64=True,
    typed_parameter_values=True,
    out_of_scope_parameters_close=True,
    ids_from_request_stream=True,
    goaway_timeout=True,
    request_error_redirect=True,
    filter_end_group_delta=True,
    request_ok_track_extensions=True,
)

_XH = ExtensionHeader
_PT = PropertyType
DRAFT_18_PROPERTIES: Final[CodeMap[ExtensionHeader]] = CodeMap({
    _XH.DELIVERY_TIMEOUT: _PT.OBJECT_DELIVERY_TIMEOUT, _XH.MAX_CACHE_DURATION: _PT.MAX_CACHE_DURATION,
    _XH.SUBGROUP_DELIVERY_TIMEOUT: _PT.SUBGROUP_DELIVERY_TIMEOUT,
    _XH.IMMUTABLE_EXTENSIONS: _PT.IMMUTABLE_PROPERTIES,
    _XH.DEFAULT_PUBLISHER_PRIORITY: _PT.DEFAULT_PUBLISHER_PRIORITY,
    _XH.DEFAULT_PUBLISHER_GROUP_ORDER: _PT.DEFAULT_PUBLISHER_GROUP_ORDER, _XH.DYNAMIC_GROUPS: _PT.DYNAMIC_GROUPS,
    _XH.PRIOR_GROUP_ID_GAP: _PT.PRIOR_GROUP_ID_GAP, _XH.PRIOR_OBJECT_ID_GAP: _PT.PRIOR_OBJECT_ID_GAP,
})

_MP = MessageParameterType
DRAFT_18_PARAMETERS: Final[CodeMap[RequestParameter]] = CodeMap({
    _V.DELIVERY_TIMEOUT: _MP.OBJECT_DELIVERY_TIMEOUT, _V.AUTHORIZATION_TOKEN: _MP.AUTHORIZATION_TOKEN,
    _V.RENDEZVOUS_TIMEOUT: _MP.RENDEZVOUS_TIMEOUT, _V.SUBGROUP_DELIVERY_TIMEOUT: _MP.SUBGROUP_DELIVERY_TIMEOUT,
    _V.EXPIRES: _MP.EXPIRES, _V.LARGEST_OBJECT: _MP.LARGEST_OBJECT, _V.FILL_TIMEOUT: _MP.FILL_TIMEOUT,
    _V.FORWARD: _MP.FORWARD, _V.SUBSCRIBER_PRIORITY: _MP.SUBSCRIBER_PRIORITY,
    _V.SUBSCRIPTION_FILTER: _MP.SUBSCRIPTION_FILTER, _V.GROUP_ORDER: _MP.GROUP_ORDER,
    _V.NEW_GROUP_REQUEST: _MP.NEW_GROUP_REQUEST, _V.TRACK_NAMESPACE_PREFIX: _MP.TRACK_NAMESPACE_PREFIX,
})

DRAFT_18: Final = Profile(
    draft=18,
    version=0xFF000012,  # never on the wire: the ALPN "moqt-18" names the version
    alpn="moqt-18",
    message_types=_table(MessageKind, MessageType),
    session_errors=_table(SessionError, SessionErrorCode),
    request_errors=DRAFT_18_REQUEST_ERRORS,
    publish_done=_table(PublishDoneStatus, PublishDoneCode),
    stream_resets=_table(StreamReset, StreamResetCode),
    group_orders=_table(kinds.GroupOrder, GroupOrder),
    filter_types=_table(kinds.FilterType, FilterType),
    fetch_types=_table(kinds.FetchType, FetchType),
    object_statuses=_table(kinds.ObjectStatus, ObjectStatus),
    alias_types=_table(kinds.AliasType, AliasType),
    setup_parameters=_table(SetupParameter, SetupOptionType),
    request_parameters=DRAFT_18_PARAMETERS,
    parameter_scope=DRAFT_18_PARAMETER_SCOPE,
    request_messages=DRAFT_18_REQUEST_MESSAGES,
    data_framing=DRAFT_18_DATA_FRAMING,
    layout=DRAFT_18_LAYOUT,
    shape=SessionShape.DRAFT_18,
    extension_headers=DRAFT_18_PROPERTIES,
    sent_as=MappingProxyType({_K.PUBLISH_OK: _K.REQUEST_OK}),
    stream_opening_messages=DRAFT_18_STREAM_OPENING,
    control_stream_messages=frozenset({_K.SETUP, _K.GOAWAY}),
)
