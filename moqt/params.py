"""Setup parameters and version-specific (request) parameters, decoded into typed values.

Why typed: the draft attaches rules to each known parameter (even/odd serialization, which messages
may carry it, whether it may repeat, what a bad value closes the session with), and those rules are
checked once here, at the boundary. Unknown parameters -- and known ones in a message where the draft
says they MUST be ignored -- are kept as raw ``KeyValuePair`` in ``unknown`` so a relay can re-encode
them and duplicates of them stay legal.

Encoding order is canonical: known parameters by ascending type, then ``unknown`` in their order
(draft-16 delta-codes the types, so there every pair goes by ascending type).

Draft-16 moved the fields of SUBSCRIBE, PUBLISH, FETCH and their answers into parameters and closes
the session on an unknown Message Parameter; ``RequestParameters`` holds every parameter any draft
defines, and encoding one the profile lacks is refused (``ValueError``), never silently dropped.
Draft-18 writes Message Parameters as Type-Value pairs whose value encoding each type defines (no
even/odd rule, so an unknown one cannot be skipped) and closes on one outside its messages; that
codec is ``moqt.params_typed`` (``Layout.typed_parameter_values``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from moqt.errors import NeedMoreData, ProtocolViolation
from moqt.kinds import AliasType, FilterType, GroupOrder, MessageKind, RequestParameter, SessionError, SetupParameter
from moqt.params_typed import RawValue, pull_typed, push_typed
from moqt.profiles import DRAFT_14, Profile
from moqt.wire import (
    VARINT_MAX,
    KeyValuePair,
    Location,
    Namespace,
    Reader,
    Writer,
    kvp_order,
    make_reader,
    make_writer,
    pull_kvps,
    push_kvps,
)

_KVF: Final = SessionError.KEY_VALUE_FORMATTING_ERROR
_PV: Final = SessionError.PROTOCOL_VIOLATION
# RFC 3986 path-abempty [ "?" query ]: pchar = unreserved / pct-encoded / sub-delims / ":" / "@".
_PATH_RE: Final = re.compile(
    r"^(/([A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})*)*"
    r"(\?([A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2})*)?$")
# RFC 3986 authority = [ userinfo "@" ] host [ ":" port ], host a reg-name, IPv4 or [IP-literal].
_AUTHORITY_RE: Final = re.compile(
    r"^(([A-Za-z0-9\-._~!$&'()*+,;=:]|%[0-9A-Fa-f]{2})*@)?"
    r"(\[[0-9A-Fa-f:.vV]+\]|([A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})+)(:[0-9]*)?$")


@dataclass(frozen=True, slots=True)
class ResolvedToken:
    """A token as the message means it: its Token Type and Token Value, aliases looked up."""

    token_type: int
    value: bytes



@dataclass(frozen=True, slots=True)
class AuthToken:
    """The AUTHORIZATION TOKEN parameter's Token structure.

    DELETE and USE_ALIAS carry only ``alias``; REGISTER carries ``alias``, ``token_type`` and
    ``value``; USE_VALUE carries ``token_type`` and ``value``.
    """

    alias_type: AliasType
    alias: int | None = None
    token_type: int | None = None
    value: bytes | None = None

    def __post_init__(self) -> None:
        has_alias = self.alias_type != AliasType.USE_VALUE
        has_value = self.alias_type in (AliasType.REGISTER, AliasType.USE_VALUE)
        if (self.alias is not None) != has_alias or (self.token_type is not None) != has_value \
                or (self.value is not None) != has_value:
            raise ValueError(f"Token fields do not match Alias Type {self.alias_type.name}")

    @classmethod
    def use_value(cls, token_type: int, value: bytes) -> AuthToken:
        return cls(AliasType.USE_VALUE, token_type=token_type, value=value)

    def token_size(self) -> int:
        """Bytes counted against MAX_AUTH_TOKEN_CACHE_SIZE: 16 + the Token Value."""
        return 16 + len(self.value or b"")

    def encode(self, profile: Profile = DRAFT_14) -> bytes:
        writer = make_writer(profile.layout.vi64)
        writer.push_varint(profile.alias_types.code(self.alias_type))
        if self.alias is not None:
            writer.push_varint(self.alias)
        if self.token_type is not None:
            writer.push_varint(self.token_type)
        if self.value is not None:
            writer.push_bytes(self.value)
        return writer.getvalue()

    @classmethod
    def decode(cls, data: bytes, profile: Profile = DRAFT_14) -> AuthToken:
        """A Token that cannot be decoded closes the session with KEY_VALUE_FORMATTING_ERROR."""
        reader = make_reader(data, profile.layout.vi64)
        try:
            raw_type = reader.pull_varint()
            alias_type = profile.alias_types.name(raw_type)
            if alias_type is None:
                raise ProtocolViolation(_KVF, f"unknown token Alias Type {raw_type}")
            alias = reader.pull_varint() if alias_type != AliasType.USE_VALUE else None
            if alias_type in (AliasType.DELETE, AliasType.USE_ALIAS):
                if not reader.at_end():
                    raise ProtocolViolation(_KVF, "trailing octets after a token alias")
                return cls(alias_type, alias=alias)
            token_type = reader.pull_varint()
        except NeedMoreData:
            raise ProtocolViolation(_KVF, "truncated AUTHORIZATION TOKEN") from None
        return cls(alias_type, alias=alias, token_type=token_type, value=bytes(reader.pull_bytes(reader.remaining)))


def _type_of(pair: KeyValuePair) -> int:
    return pair.type


def _decode_text(raw: bytes, error: SessionError, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolViolation(error, f"{what} is not UTF-8") from None


def check_path(path: str) -> bool:
    """True when ``path`` is a ``path-abempty [ "?" query ]`` as the PATH parameter requires."""
    return _PATH_RE.match(path) is not None


def check_authority(authority: str) -> bool:
    """True when ``authority`` is an RFC 3986 authority with a non-empty host."""
    return _AUTHORITY_RE.match(authority) is not None


def _pull_pairs(reader: Reader, profile: Profile) -> list[KeyValuePair]:
    """Number of Parameters, then the pairs (types delta-coded where the profile says)."""
    count = reader.pull_varint()
    return pull_kvps(reader, count, max_value_length=profile.max_kvp_value_length,
                     delta=profile.layout.kvp_delta_types)


def _push_pairs(writer: Writer, pairs: list[KeyValuePair], profile: Profile) -> None:
    writer.push_varint(len(pairs))
    push_kvps(writer, pairs, delta=profile.layout.kvp_delta_types)


def _once(seen: set[int], kind: int) -> None:
    if kind in seen:
        raise ProtocolViolation(_PV, f"parameter 0x{kind:x} repeated")
    seen.add(kind)


@dataclass(frozen=True, slots=True)
class SetupParameters:
    """CLIENT_SETUP / SERVER_SETUP parameters (a namespace shared by all MOQT versions)."""

    path: str | None = None
    max_request_id: int | None = None
    authorization_tokens: tuple[AuthToken, ...] = ()
    max_auth_token_cache_size: int | None = None
    authority: str | None = None
    implementation: str | None = None
    unknown: tuple[KeyValuePair, ...] = ()

    def _pairs(self, profile: Profile) -> list[KeyValuePair]:
        t, code = SetupParameter, _setup_code(profile)
        pairs: list[KeyValuePair] = []
        if self.path is not None:
            pairs.append(KeyValuePair(code(t.PATH), self.path.encode("utf-8")))
        if self.max_request_id is not None:
            pairs.append(KeyValuePair(code(t.MAX_REQUEST_ID), self.max_request_id))
        pairs += [KeyValuePair(code(t.AUTHORIZATION_TOKEN), tok.encode(profile)) for tok in self.authorization_tokens]
        if self.max_auth_token_cache_size is not None:
            pairs.append(KeyValuePair(code(t.MAX_AUTH_TOKEN_CACHE_SIZE), self.max_auth_token_cache_size))
        if self.authority is not None:
            pairs.append(KeyValuePair(code(t.AUTHORITY), self.authority.encode("utf-8")))
        if self.implementation is not None:
            pairs.append(KeyValuePair(code(t.MOQT_IMPLEMENTATION), self.implementation.encode("utf-8")))
        return kvp_order(sorted(pairs, key=_type_of) + list(self.unknown), profile.layout.kvp_delta_types)

    def encode(self, writer: Writer, profile: Profile = DRAFT_14, *, counted: bool = True) -> None:
        """Number of Parameters then the pairs; not ``counted`` (draft-18 SETUP), the pairs alone."""
        if counted:
            _push_pairs(writer, self._pairs(profile), profile)
        else:
            push_kvps(writer, self._pairs(profile), delta=profile.layout.kvp_delta_types)

    @classmethod
    def decode(cls, reader: Reader, profile: Profile = DRAFT_14, *, counted: bool = True) -> SetupParameters:
        """Counted pairs, or (draft-18 SETUP) pairs to the end of the reader."""
        t = SetupParameter
        ints: dict[SetupParameter, int] = {}
        texts: dict[SetupParameter, str] = {}
        tokens: list[AuthToken] = []
        unknown: list[KeyValuePair] = []
        seen: set[int] = set()
        for pair in _pull_pairs(reader, profile) if counted else _pull_to_end(reader, profile):
            value = pair.value
            kind = profile.setup_parameters.name(pair.type)
            if kind is None:
                unknown.append(pair)
            elif isinstance(value, int):
                _once(seen, pair.type)
                ints[kind] = value
            elif kind is t.AUTHORIZATION_TOKEN:
                tokens.append(AuthToken.decode(value, profile))
            else:
                _once(seen, pair.type)
                texts[kind] = _setup_text(kind, value)
        return cls(
            path=texts.get(t.PATH),
            max_request_id=ints.get(t.MAX_REQUEST_ID),
            authorization_tokens=tuple(tokens),
            max_auth_token_cache_size=ints.get(t.MAX_AUTH_TOKEN_CACHE_SIZE),
            authority=texts.get(t.AUTHORITY),
            implementation=texts.get(t.MOQT_IMPLEMENTATION),
            unknown=tuple(unknown),
        )


def _setup_code(profile: Profile) -> Callable[[SetupParameter], int]:
    def code(kind: SetupParameter) -> int:
        number = profile.setup_parameters.codes.get(kind)
        if number is None:
            raise ValueError(f"draft-{profile.draft} has no {kind.value} setup parameter")
        return number
    return code


def _pull_to_end(reader: Reader, profile: Profile) -> list[KeyValuePair]:
    pairs: list[KeyValuePair] = []
    previous: int | None = 0 if profile.layout.kvp_delta_types else None
    while not reader.at_end():
        pair = KeyValuePair.decode(reader, max_value_length=profile.max_kvp_value_length, previous=previous)
        pairs.append(pair)
        if previous is not None:
            previous = pair.type
    return pairs


def _setup_text(kind: SetupParameter, raw: bytes) -> str:
    """PATH and AUTHORITY must be well-formed URI parts; the implementation name is free text."""
    if kind is SetupParameter.PATH:
        path = _decode_text(raw, SessionError.MALFORMED_PATH, "PATH")
        if not check_path(path):
            raise ProtocolViolation(SessionError.MALFORMED_PATH, "PATH is not a URI path")
        return path
    if kind is SetupParameter.AUTHORITY:
        authority = _decode_text(raw, SessionError.MALFORMED_AUTHORITY, "AUTHORITY")
        if not check_authority(authority):
            raise ProtocolViolation(SessionError.MALFORMED_AUTHORITY, "AUTHORITY is not a URI authority")
        return authority
    return raw.decode("utf-8", "replace")


# --- Subscription Filter (draft-14 fields of SUBSCRIBE / PUBLISH_OK; draft-16 a parameter) ----------

def check_filter(filter_type: FilterType, start: Location | None, end_group: int | None) -> None:
    """Start Location is present exactly for the Absolute filters, End Group for AbsoluteRange."""
    absolute = filter_type in (FilterType.ABSOLUTE_START, FilterType.ABSOLUTE_RANGE)
    if (start is not None) != absolute or (end_group is not None) != (filter_type == FilterType.ABSOLUTE_RANGE):
        raise ValueError(f"filter {filter_type.name} does not match start={start} end_group={end_group}")


def push_filter(writer: Writer, profile: Profile, filter_type: FilterType, start: Location | None,
                end_group: int | None) -> None:
    """The filter's fields; draft-18 writes AbsoluteRange's End Group as a delta from the Start Group."""
    writer.push_varint(profile.filter_types.code(filter_type))
    if start is not None:
        start.encode(writer)
    if end_group is not None:
        if profile.layout.filter_end_group_delta:
            if start is None or end_group < start.group:
                raise ValueError(f"End Group {end_group} before the Start Group")
            end_group -= start.group
        writer.push_varint(end_group)


def pull_filter(reader: Reader, profile: Profile) -> tuple[FilterType, Location | None, int | None]:
    raw = reader.pull_varint()
    filter_type = profile.filter_types.name(raw)
    if filter_type is None:
        raise ProtocolViolation(_PV, f"unknown Filter Type {raw}")
    start = end = None
    if filter_type in (FilterType.ABSOLUTE_START, FilterType.ABSOLUTE_RANGE):
        start = Location.decode(reader)
    if filter_type == FilterType.ABSOLUTE_RANGE:
        end = reader.pull_varint()
        if profile.layout.filter_end_group_delta and start is not None:
            end += start.group
            if end > VARINT_MAX:  # the draft's bound is 2^64-1; our Group IDs end at 2^62-1
                raise ProtocolViolation(_PV, "End Group Delta takes the End Group past the Group ID range")
    return filter_type, start, end


@dataclass(frozen=True, slots=True)
class SubscriptionFilter:
    """A Subscription Filter as one value: the SUBSCRIPTION_FILTER parameter's content (draft-16)."""

    filter_type: FilterType
    start: Location | None = None
    end_group: int | None = None

    def __post_init__(self) -> None:
        check_filter(self.filter_type, self.start, self.end_group)

    def encode(self, profile: Profile) -> bytes:
        writer = make_writer(profile.layout.vi64)
        push_filter(writer, profile, self.filter_type, self.start, self.end_group)
        return writer.getvalue()


#: What a draft-16 SUBSCRIBE or PUBLISH_OK without a filter asks for: every object ("an AbsoluteStart
#: filter with Start = {0, 0} is equivalent to an unfiltered subscription").
UNFILTERED: Final = SubscriptionFilter(FilterType.ABSOLUTE_START, Location(0, 0))


# --- Message (version-specific) parameters --------------------------------------------------------

def _whole(raw: bytes, parse: Callable[[Reader], Any], error: SessionError, what: str, vi64: bool = False) -> Any:
    """A parameter value that must be exactly one structure (a Location, a Subscription Filter)."""
    reader = make_reader(raw, vi64)
    try:
        value = parse(reader)
    except NeedMoreData:
        raise ProtocolViolation(error, f"{what} is shorter than its structure") from None
    if not reader.at_end():
        raise ProtocolViolation(error, f"{what} is longer than its structure")
    return value


def _bounded(value: int, high: int, what: str) -> int:
    if value > high:
        raise ProtocolViolation(_PV, f"{what} {value} outside 0..{high}")
    return value


def _value(kind: RequestParameter, value: int | bytes, profile: Profile) -> Any:
    """A known parameter's typed value, checked as its definition says (None: not its serialization)."""
    t = RequestParameter
    if isinstance(value, bytes):
        if kind is t.AUTHORIZATION_TOKEN:
            return AuthToken.decode(value, profile)
        if kind is t.LARGEST_OBJECT:
            return _whole(value, Location.decode, _KVF, "LARGEST_OBJECT", profile.layout.vi64)
        if kind is t.SUBSCRIPTION_FILTER:
            parsed = _whole(value, lambda r: pull_filter(r, profile), _PV, "SUBSCRIPTION_FILTER", profile.layout.vi64)
            return SubscriptionFilter(*parsed)
        return None
    if kind is t.FORWARD:
        return _bounded(value, 1, "FORWARD") == 1
    if kind is t.SUBSCRIBER_PRIORITY:
        return _bounded(value, 0xFF, "SUBSCRIBER_PRIORITY")
    if kind is t.GROUP_ORDER:
        order = profile.group_orders.name(value)
        if order is None or order is GroupOrder.PUBLISHER_DEFAULT:
            raise ProtocolViolation(_PV, f"GROUP_ORDER {value} is neither ascending nor descending")
        return order
    if kind is t.DELIVERY_TIMEOUT and value == 0 and profile.layout.zero_delivery_timeout_closes:
        raise ProtocolViolation(_PV, "DELIVERY_TIMEOUT of 0")
    return value if kind in _INT_FIELDS else None


_T = RequestParameter
#: Field of ``RequestParameters`` for each parameter (the tokens, which may repeat, are apart).
_FIELDS: Final = {
    _T.DELIVERY_TIMEOUT: "delivery_timeout", _T.MAX_CACHE_DURATION: "max_cache_duration", _T.EXPIRES: "expires",
    _T.LARGEST_OBJECT: "largest_object", _T.FORWARD: "forward", _T.SUBSCRIBER_PRIORITY: "subscriber_priority",
    _T.SUBSCRIPTION_FILTER: "subscription_filter", _T.GROUP_ORDER: "group_order",
    _T.NEW_GROUP_REQUEST: "new_group_request", _T.SUBGROUP_DELIVERY_TIMEOUT: "subgroup_delivery_timeout",
    _T.RENDEZVOUS_TIMEOUT: "rendezvous_timeout", _T.FILL_TIMEOUT: "fill_timeout",
    _T.TRACK_NAMESPACE_PREFIX: "track_namespace_prefix",
}
_INT_FIELDS: Final = frozenset({_T.DELIVERY_TIMEOUT, _T.MAX_CACHE_DURATION, _T.EXPIRES, _T.NEW_GROUP_REQUEST,
                                _T.SUBGROUP_DELIVERY_TIMEOUT, _T.RENDEZVOUS_TIMEOUT, _T.FILL_TIMEOUT})


@dataclass(frozen=True, slots=True)
class RequestParameters:
    """Version-specific parameters of SUBSCRIBE, FETCH, PUBLISH, ... (draft-14 section 9.2.1; draft-16
    "Message Parameters").

    ``delivery_timeout``, ``max_cache_duration``, ``expires`` and the other timeouts are milliseconds
    (draft-18 names ``delivery_timeout`` OBJECT_DELIVERY_TIMEOUT). The fields after ``unknown`` exist
    from draft-16 on, the last four from draft-18; where a message has a field of its own for one (SUBSCRIBE's
    priority, SUBSCRIBE_OK's Largest Location, ...) the message's codec carries it there instead.
    """

    delivery_timeout: int | None = None
    authorization_tokens: tuple[AuthToken, ...] = ()
    max_cache_duration: int | None = None
    unknown: tuple[KeyValuePair, ...] = ()
    expires: int | None = None
    largest_object: Location | None = None
    forward: bool | None = None
    subscriber_priority: int | None = None
    subscription_filter: SubscriptionFilter | None = None
    group_order: GroupOrder | None = None
    new_group_request: int | None = None
    subgroup_delivery_timeout: int | None = None
    rendezvous_timeout: int | None = None
    fill_timeout: int | None = None
    track_namespace_prefix: Namespace | None = None

    def __post_init__(self) -> None:
        for value in (self.delivery_timeout, self.max_cache_duration, self.expires, self.new_group_request,
                      self.subgroup_delivery_timeout, self.rendezvous_timeout, self.fill_timeout):
            if value is not None and not 0 <= value <= VARINT_MAX:
                raise ValueError(f"parameter value {value} outside the varint range")
        if self.subscriber_priority is not None and not 0 <= self.subscriber_priority <= 0xFF:
            raise ValueError("SUBSCRIBER_PRIORITY is 0..255")
        if self.group_order is GroupOrder.PUBLISHER_DEFAULT:
            raise ValueError("GROUP_ORDER is ascending or descending (the publisher's order is its absence)")

    def _pairs(self, profile: Profile) -> list[KeyValuePair]:
        pairs: list[KeyValuePair] = []
        for kind, name in _FIELDS.items():
            value = getattr(self, name)
            if value is not None:
                pairs.append(KeyValuePair(_code(profile, kind), _raw(value, profile)))
        token = RequestParameter.AUTHORIZATION_TOKEN
        pairs += [KeyValuePair(_code(profile, token), tok.encode(profile)) for tok in self.authorization_tokens]
        return kvp_order(sorted(pairs, key=_type_of) + list(self.unknown), profile.layout.kvp_delta_types)

    def encode(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        if profile.layout.typed_parameter_values:
            push_typed(writer, self._typed_items(profile))
            return
        _push_pairs(writer, self._pairs(profile), profile)

    @classmethod
    def decode(cls, reader: Reader, message: MessageKind, profile: Profile = DRAFT_14) -> RequestParameters:
        """Parameters of ``message``; a known parameter outside its scope is kept as unknown (ignored).

        An unknown parameter is kept too in draft-14 and closes the session in draft-16 and later
        (draft-18: so does one outside its scope).
        """
        if profile.layout.typed_parameter_values:
            return cls._from_typed(pull_typed(reader, message, profile), profile)
        fields: dict[str, Any] = {}
        tokens: list[AuthToken] = []
        unknown: list[KeyValuePair] = []
        seen: set[int] = set()
        for pair in _pull_pairs(reader, profile):
            kind = profile.request_parameters.name(pair.type)
            if kind is None and profile.layout.unknown_parameters_close:
                raise ProtocolViolation(_PV, f"unknown Message Parameter 0x{pair.type:x} in {message.value}")
            if kind is None or message not in profile.parameter_scope.get(kind, ()):
                unknown.append(pair)
                continue
            value = _value(kind, pair.value, profile)
            if value is None:  # not this parameter's serialization: kept as it came
                unknown.append(pair)
            elif kind is RequestParameter.AUTHORIZATION_TOKEN:
                tokens.append(value)
            else:
                _once(seen, pair.type)
                fields[_FIELDS[kind]] = value
        return cls(authorization_tokens=tuple(tokens), unknown=tuple(unknown), **fields)


    def _typed_items(self, profile: Profile) -> list[tuple[int, RequestParameter, RawValue]]:
        """Draft-18: every parameter in its own value encoding (an unknown one has none: refused)."""
        if self.unknown:
            raise ValueError(f"draft-{profile.draft} Message Parameters are all known; cannot send {self.unknown}")
        items: list[tuple[int, RequestParameter, RawValue]] = []
        for kind, name in _FIELDS.items():
            value = getattr(self, name)
            if value is not None:
                raw = value if isinstance(value, Location | tuple) else _raw(value, profile)
                items.append((_code(profile, kind), kind, raw))
        token = RequestParameter.AUTHORIZATION_TOKEN
        items += [(_code(profile, token), token, tok.encode(profile)) for tok in self.authorization_tokens]
        return items

    @classmethod
    def _from_typed(cls, items: list[tuple[RequestParameter, RawValue]], profile: Profile) -> RequestParameters:
        fields: dict[str, Any] = {}
        tokens: list[AuthToken] = []
        seen: set[RequestParameter] = set()
        for kind, raw in items:
            if kind is RequestParameter.AUTHORIZATION_TOKEN:
                assert isinstance(raw, bytes)
                tokens.append(AuthToken.decode(raw, profile))
                continue
            if kind in seen:
                raise ProtocolViolation(_PV, f"parameter {kind.value} repeated")
            seen.add(kind)
            fields[_FIELDS[kind]] = raw if isinstance(raw, Location | tuple) else _value(kind, raw, profile)
        return cls(authorization_tokens=tuple(tokens), **fields)


def _code(profile: Profile, kind: RequestParameter) -> int:
    code = profile.request_parameters.codes.get(kind)
    if code is None:
        raise ValueError(f"draft-{profile.draft} has no {kind.value} parameter")
    return code


def _raw(value: Any, profile: Profile) -> int | bytes:
    """A parameter value as its Key-Value-Pair carries it."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, GroupOrder):
        return profile.group_orders.code(value)
    if isinstance(value, Location):
        writer = make_writer(profile.layout.vi64)
        value.encode(writer)
        return writer.getvalue()
    if isinstance(value, SubscriptionFilter):
        return value.encode(profile)
    assert isinstance(value, int)
    return value


EMPTY_PARAMETERS: Final = RequestParameters()
