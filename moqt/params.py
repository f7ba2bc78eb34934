"""Setup parameters and version-specific (request) parameters, decoded into typed values.

Why typed: the draft attaches rules to each known parameter (even/odd serialization, which messages
may carry it, whether it may repeat, what a bad value closes the session with), and those rules are
checked once here, at the boundary. Unknown parameters -- and known ones in a message where the draft
says they MUST be ignored -- are kept as raw ``KeyValuePair`` in ``unknown`` so a relay can re-encode
them and duplicates of them stay legal.

Encoding order is canonical: known parameters by ascending type, then ``unknown`` in their order.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from moqt.errors import NeedMoreData, ProtocolViolation
from moqt.kinds import AliasType, MessageKind, RequestParameter, SessionError, SetupParameter
from moqt.profiles import DRAFT_14, Profile
from moqt.wire import VARINT_MAX, KeyValuePair, Reader, Writer

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
        writer = Writer()
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
        reader = Reader(data)
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


def _iter_kvps(reader: Reader, max_value_length: int) -> Iterator[KeyValuePair]:
    count = reader.pull_varint()
    for _ in range(count):
        yield KeyValuePair.decode(reader, max_value_length=max_value_length)


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
        t, code = SetupParameter, profile.setup_parameters.code
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
        return sorted(pairs, key=_type_of) + list(self.unknown)

    def encode(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        pairs = self._pairs(profile)
        writer.push_varint(len(pairs))
        for pair in pairs:
            pair.encode(writer)

    @classmethod
    def decode(cls, reader: Reader, profile: Profile = DRAFT_14) -> SetupParameters:
        t = SetupParameter
        ints: dict[SetupParameter, int] = {}
        texts: dict[SetupParameter, str] = {}
        tokens: list[AuthToken] = []
        unknown: list[KeyValuePair] = []
        seen: set[int] = set()
        for pair in _iter_kvps(reader, profile.max_kvp_value_length):
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


@dataclass(frozen=True, slots=True)
class RequestParameters:
    """Version-specific parameters of SUBSCRIBE, FETCH, PUBLISH, ... (draft-14 section 9.2.1).

    ``delivery_timeout`` and ``max_cache_duration`` are milliseconds.
    """

    delivery_timeout: int | None = None
    authorization_tokens: tuple[AuthToken, ...] = ()
    max_cache_duration: int | None = None
    unknown: tuple[KeyValuePair, ...] = ()

    def __post_init__(self) -> None:
        for value in (self.delivery_timeout, self.max_cache_duration):
            if value is not None and not 0 <= value <= VARINT_MAX:
                raise ValueError(f"parameter value {value} outside the varint range")

    def _pairs(self, profile: Profile) -> list[KeyValuePair]:
        t, code = RequestParameter, profile.request_parameters.code
        pairs: list[KeyValuePair] = []
        if self.delivery_timeout is not None:
            pairs.append(KeyValuePair(code(t.DELIVERY_TIMEOUT), self.delivery_timeout))
        pairs += [KeyValuePair(code(t.AUTHORIZATION_TOKEN), tok.encode(profile)) for tok in self.authorization_tokens]
        if self.max_cache_duration is not None:
            pairs.append(KeyValuePair(code(t.MAX_CACHE_DURATION), self.max_cache_duration))
        return sorted(pairs, key=_type_of) + list(self.unknown)

    def encode(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        pairs = self._pairs(profile)
        writer.push_varint(len(pairs))
        for pair in pairs:
            pair.encode(writer)

    @classmethod
    def decode(cls, reader: Reader, message: MessageKind, profile: Profile = DRAFT_14) -> RequestParameters:
        """Parameters of ``message``; a known parameter outside its scope is kept as unknown."""
        t = RequestParameter
        delivery: int | None = None
        cache: int | None = None
        tokens: list[AuthToken] = []
        unknown: list[KeyValuePair] = []
        seen: set[int] = set()
        for pair in _iter_kvps(reader, profile.max_kvp_value_length):
            kind = profile.request_parameters.name(pair.type)
            if kind is None or message not in profile.parameter_scope.get(kind, ()):
                unknown.append(pair)
            elif kind is t.AUTHORIZATION_TOKEN and isinstance(pair.value, bytes):
                tokens.append(AuthToken.decode(pair.value, profile))
            elif kind is t.DELIVERY_TIMEOUT and isinstance(pair.value, int):
                _once(seen, pair.type)
                delivery = pair.value
            elif kind is t.MAX_CACHE_DURATION and isinstance(pair.value, int):
                _once(seen, pair.type)
                cache = pair.value
            else:  # a parameter type the profile scopes but this decoder does not know
                unknown.append(pair)
        return cls(delivery, tuple(tokens), cache, tuple(unknown))


EMPTY_PARAMETERS: Final = RequestParameters()
