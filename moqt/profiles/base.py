"""``Profile``: everything draft-specific that the codecs and the session read, as one frozen value.

Why maps from draft-neutral names: the session decides in terms of ``moqt.kinds`` (SUBSCRIBE_OK,
PROTOCOL_VIOLATION, TRACK_DOES_NOT_EXIST) and asks the profile for the number only where it reads or
writes the wire, so a new draft is a new ``Profile`` value (its own module beside ``draft14``),
not a fork of the session. The ``*_code`` methods also take a plain integer, unchanged: a caller
that already holds a wire code (a relay passing one on) needs no name for it.

Beyond the tables, a profile says where message layouts differ (``Layout``: flags named by what
changed, read by the codecs) and which session strategy the draft needs (``SessionShape``: the
session maps it to a small strategy object for behaviour that changed shape, such as draft-16's
REQUEST_OK/REQUEST_ERROR answers and SUBSCRIBE_NAMESPACE on a stream of its own). Every default is
draft-14's, so the draft-14 profile names none of them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from types import MappingProxyType
from typing import Any, Generic, NamedTuple, TypeVar

from moqt.errors import LocalError
from moqt.kinds import (
    AliasType,
    ExtensionHeader,
    FetchType,
    FilterType,
    GroupOrder,
    MessageKind,
    ObjectStatus,
    PublishDoneStatus,
    RequestError,
    RequestParameter,
    SessionError,
    SetupParameter,
    StreamReset,
    SubgroupIdMode,
    SubscribeOptions,
)

N = TypeVar("N", bound=enum.Enum)


@dataclass(frozen=True, slots=True, eq=False)
class CodeMap(Generic[N]):
    """One table of a draft: draft-neutral name <-> wire code point."""

    codes: Mapping[N, int]
    names: Mapping[int, N] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "codes", MappingProxyType(dict(self.codes)))
        object.__setattr__(self, "names", MappingProxyType({int(c): n for n, c in self.codes.items()}))

    @classmethod
    def by_name(cls, names: type[N], codes: type[IntEnum]) -> CodeMap[N]:
        """The map of two enums whose members share names (the draft's table written as an IntEnum)."""
        return cls({name: int(codes[name.name]) for name in names if name.name in codes.__members__})

    def code(self, name: N | int) -> int:
        """The code point of ``name``; an integer is taken as a code point already and passed on."""
        return name if isinstance(name, int) else self.codes[name]

    def name(self, code: int) -> N | None:
        """The name of ``code``; None for a code point this draft does not define."""
        return self.names.get(code)


class SubgroupForm(NamedTuple):
    """What a subgroup stream's type says about its header and objects (``default_priority``: the
    header has no Publisher Priority, the subscription's applies; draft-16 and later)."""

    subgroup_id_mode: SubgroupIdMode
    extensions_present: bool
    end_of_group: bool
    default_priority: bool = False
    first_object: bool = False  # draft-18 FIRST_OBJECT bit: the subgroup's first object leads the stream


class DatagramForm(NamedTuple):
    """What a datagram's type says about its fields: a payload, or an Object Status (``status``).

    Why a NamedTuple, unlike the frozen dataclasses elsewhere: every datagram sent builds one to look
    its type up, and a tuple is built and hashed in C (a frozen dataclass costs ~0.6 us more a datagram).
    """

    extensions_present: bool
    end_of_group: bool
    object_id_present: bool
    status: bool
    default_priority: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class DataFraming:
    """A draft's data-stream and datagram type code points, as tables both ways.

    Why tables rather than bit arithmetic: drafts add flags (a priority-absent bit, more datagram
    forms) and move them; the codec asks what a type means and which type means a form, so a new
    layout is a new table. The codec reads these once, when a parser or writer is made.
    """

    fetch_header: int
    subgroup_types: Mapping[int, SubgroupForm]
    datagram_types: Mapping[int, DatagramForm]
    #: Fetch objects start with Serialization Flags and carry no Object Status (draft-16).
    fetch_serialization_flags: bool = False
    #: An End of Group / End of Track object may carry Extension Headers (draft-14; draft-16 forbids
    #: extensions on every object that is not Normal).
    status_objects_extensions: bool = True
    #: Fetch objects carry Group and Object ID *deltas* (draft-18), the group's direction the FETCH's order.
    fetch_id_deltas: bool = False
    #: Unidirectional stream types beside the data streams (draft-18): the control stream (its type is
    #: SETUP's Message Type) and padding; None where the draft has none.
    control_stream_type: int | None = None
    padding_stream_type: int | None = None
    padding_datagram_type: int | None = None
    subgroup_codes: Mapping[SubgroupForm, int] = field(init=False)
    datagram_codes: Mapping[DatagramForm, int] = field(init=False)

    def __post_init__(self) -> None:
        for name, table in (("subgroup_types", self.subgroup_types), ("datagram_types", self.datagram_types)):
            object.__setattr__(self, name, MappingProxyType(dict(table)))
        object.__setattr__(self, "subgroup_codes", MappingProxyType({f: c for c, f in self.subgroup_types.items()}))
        object.__setattr__(self, "datagram_codes", MappingProxyType({f: c for c, f in self.datagram_types.items()}))


class SessionShape(enum.Enum):
    """Which session strategy a draft needs (``moqt.session.shapes`` maps each to its class)."""

    DRAFT_14 = "one control stream, an answer message per request kind, versions in the setup messages"
    DRAFT_16 = "REQUEST_OK / REQUEST_ERROR answers, REQUEST_UPDATE answered, SUBSCRIBE_NAMESPACE streams"
    DRAFT_18 = "control over a pair of unidirectional streams opened by SETUP, every request on its own stream"


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a draft's message layouts differ from draft-14's; the codecs read these flags.

    Named by what changed, not by draft, so a later draft that keeps one change and drops another
    sets the flags it needs. Every default is draft-14's layout.
    """

    #: CLIENT_SETUP lists Supported Versions and SERVER_SETUP a Selected Version (else the ALPN did).
    setup_versions: bool = True
    #: CLIENT_SETUP may carry DELETE / USE_ALIAS tokens (draft-16: PROTOCOL_VIOLATION).
    setup_token_aliases: bool = True
    #: Key-Value-Pair types are deltas from the previous type (parameters and extension headers).
    kvp_delta_types: bool = False
    #: An unknown Message Parameter closes the session (draft-14: it is ignored, kept raw).
    unknown_parameters_close: bool = False
    #: Priority, group order, forward, filter, expires and largest location travel as parameters.
    fields_as_parameters: bool = False
    #: SUBSCRIBE_OK, PUBLISH and FETCH_OK end with Track Extensions.
    track_extensions: bool = False
    #: REQUEST_ERROR carries a Retry Interval before its reason.
    retry_interval: bool = False
    #: PUBLISH_NAMESPACE_DONE and _CANCEL name the PUBLISH_NAMESPACE's Request ID, not its namespace.
    namespace_ends_by_request_id: bool = False
    #: SUBSCRIBE_NAMESPACE has Subscribe Options and may name the empty prefix.
    subscribe_namespace_options: bool = False
    #: A Track Namespace field of length 0 closes the session.
    empty_namespace_field_closes: bool = False
    #: A DELIVERY_TIMEOUT of 0 (parameter or track extension) closes the session.
    zero_delivery_timeout_closes: bool = False
    #: SUBSCRIBE_NAMESPACE (and SUBSCRIBE_TRACKS) may name the empty prefix (draft-16 on).
    empty_namespace_prefix: bool = False
    #: Every integer is a vi64 (leading-1-bits length, 1..9 octets; draft-18), not a QUIC varint.
    vi64: bool = False
    #: Message Parameters are Type-Value pairs whose value encoding each type defines (uint8, varint,
    #: Location, length-prefixed, Track Namespace), not Key-Value-Pairs (draft-18).
    typed_parameter_values: bool = False
    #: A known Message Parameter in a message outside its scope closes the session (draft-14/16: ignored).
    out_of_scope_parameters_close: bool = False
    #: Messages on a request's own stream take its Request ID from the stream: replies carry none,
    #: REQUEST_UPDATE no Existing Request ID (draft-18).
    ids_from_request_stream: bool = False
    #: GOAWAY carries a Timeout and, on the control stream, a Request ID (draft-18).
    goaway_timeout: bool = False
    #: REQUEST_ERROR with code REDIRECT ends with a Redirect structure (draft-18).
    request_error_redirect: bool = False
    #: An AbsoluteRange filter's End Group is a delta from its Start Group (draft-18).
    filter_end_group_delta: bool = False
    #: REQUEST_OK ends with Track Properties (draft-18: TRACK_STATUS_OK's).
    request_ok_track_extensions: bool = False


def _empty_map() -> CodeMap[Any]:
    return CodeMap({})


@dataclass(frozen=True, slots=True, eq=False)
class Profile:
    """One draft's code points (name <-> number tables), parameter rules and limits."""

    draft: int
    version: int
    alpn: str
    message_types: CodeMap[MessageKind]
    session_errors: CodeMap[SessionError]
    request_errors: Mapping[MessageKind, CodeMap[RequestError]]  # by the message that carries the code
    publish_done: CodeMap[PublishDoneStatus]
    stream_resets: CodeMap[StreamReset]
    group_orders: CodeMap[GroupOrder]
    filter_types: CodeMap[FilterType]
    fetch_types: CodeMap[FetchType]
    object_statuses: CodeMap[ObjectStatus]
    alias_types: CodeMap[AliasType]
    setup_parameters: CodeMap[SetupParameter]
    request_parameters: CodeMap[RequestParameter]
    parameter_scope: Mapping[RequestParameter, frozenset[MessageKind]]  # messages that may carry each
    request_messages: frozenset[MessageKind]  # messages that carry a new Request ID
    data_framing: DataFraming
    control_length_bytes: int = 2
    max_control_message_length: int = 0xFFFF
    max_namespace_fields: int = 32
    max_full_track_name_length: int = 4096
    max_reason_phrase_length: int = 1024
    max_goaway_uri_length: int = 8192
    max_kvp_value_length: int = 0xFFFF
    client_first_request_id: int = 0
    server_first_request_id: int = 1
    layout: Layout = Layout()
    shape: SessionShape = SessionShape.DRAFT_14
    extension_headers: CodeMap[ExtensionHeader] = field(default_factory=_empty_map)
    subscribe_options: CodeMap[SubscribeOptions] = field(default_factory=_empty_map)  # empty: not on the wire
    #: Messages sent under another message's type (draft-18: PUBLISH_OK goes out as a REQUEST_OK).
    sent_as: Mapping[MessageKind, MessageKind] = field(default_factory=lambda: MappingProxyType({}))
    #: Messages a peer-opened request stream must begin with (draft-18; empty: no request streams of that kind).
    stream_opening_messages: frozenset[MessageKind] = frozenset()
    #: Messages allowed on a draft-18 control stream (empty: the control stream carries every message).
    control_stream_messages: frozenset[MessageKind] = frozenset()

    def request_error_code(self, message: MessageKind, error: RequestError | int) -> int:
        """The Error Code of ``error`` in ``message`` (FETCH_ERROR, SUBSCRIBE_ERROR, ...).

        A name the draft has no code for (draft-16 has no NO_OBJECTS) is the caller's mistake.
        """
        table = self.request_errors.get(message)
        if table is None or (not isinstance(error, int) and error not in table.codes):
            raise LocalError(f"draft-{self.draft} has no {getattr(error, 'value', error)} code in {message.value}")
        return table.code(error)

    def has_message(self, kind: MessageKind) -> bool:
        """Whether this draft has the message (draft-16 has no SUBSCRIBE_ERROR, draft-14 no REQUEST_OK)."""
        return kind in self.message_types.codes
