"""Namespace discovery: PUBLISH_NAMESPACE family and SUBSCRIBE_NAMESPACE family (sections 9.23-9.31),
and draft-16's NAMESPACE / NAMESPACE_DONE (sent on a SUBSCRIBE_NAMESPACE's own stream).

Draft-16 names the PUBLISH_NAMESPACE that PUBLISH_NAMESPACE_DONE / _CANCEL end by its Request ID
(``Layout.namespace_ends_by_request_id``); those messages carry both fields, and each draft's codec
sends the one it has (the session fills the other from its request table).

Draft-18 splits discovery: SUBSCRIBE_NAMESPACE (0x50) asks only for namespaces (NAMESPACE /
NAMESPACE_DONE come back on its stream), SUBSCRIBE_TRACKS (0x51) for the tracks (PUBLISH on streams
of their own; PUBLISH_BLOCKED on its stream when one cannot be sent); neither has Subscribe Options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Self

from moqt.errors import ProtocolViolation
from moqt.kinds import MessageKind, SessionError, SubscribeOptions
from moqt.messages.base import ControlMessage, RequestErrorMessage, RequestIdMessage, read_namespace
from moqt.params import RequestParameters
from moqt.profiles import DRAFT_14, Profile
from moqt.wire import (
    MAX_FULL_TRACK_NAME_LENGTH,
    Namespace,
    Reader,
    Writer,
    check_namespace,
    pull_reason_phrase,
    push_namespace,
    push_reason_phrase,
)


def _check_ending(namespace: Namespace, request_id: int | None) -> None:
    if namespace:
        check_namespace(namespace)
    elif request_id is None:
        raise ValueError("the message needs the Track Namespace or the Request ID it ends")


def _push_ending(writer: Writer, profile: Profile, namespace: Namespace, request_id: int | None) -> None:
    if profile.layout.namespace_ends_by_request_id:
        if request_id is None:
            raise ValueError(f"draft-{profile.draft} names the PUBLISH_NAMESPACE by its Request ID")
        writer.push_varint(request_id)
    else:
        if not namespace:
            raise ValueError(f"draft-{profile.draft} names the Track Namespace")
        push_namespace(writer, namespace)


def _pull_ending(reader: Reader, profile: Profile) -> tuple[Namespace, int | None]:
    if profile.layout.namespace_ends_by_request_id:
        return (), reader.pull_varint()
    return read_namespace(reader, profile), None


@dataclass(frozen=True, slots=True)
class PublishNamespace(ControlMessage):
    """PUBLISH_NAMESPACE (0x6): Request ID, Track Namespace, Parameters."""

    KIND: ClassVar[MessageKind] = MessageKind.PUBLISH_NAMESPACE
    request_id: int
    track_namespace: Namespace
    parameters: RequestParameters = field(default_factory=RequestParameters)

    def __post_init__(self) -> None:
        check_namespace(self.track_namespace)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.request_id)
        push_namespace(writer, self.track_namespace)
        self.parameters.encode(writer, profile)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = reader.pull_varint()
        namespace = read_namespace(reader, profile)
        return cls(request_id, namespace, RequestParameters.decode(reader, cls.KIND, profile))


@dataclass(frozen=True, slots=True)
class PublishNamespaceOk(RequestIdMessage):
    """PUBLISH_NAMESPACE_OK (0x7)."""

    KIND: ClassVar[MessageKind] = MessageKind.PUBLISH_NAMESPACE_OK


@dataclass(frozen=True, slots=True)
class PublishNamespaceError(RequestErrorMessage):
    """PUBLISH_NAMESPACE_ERROR; its Error Code is named by the profile's ``request_errors``."""

    KIND: ClassVar[MessageKind] = MessageKind.PUBLISH_NAMESPACE_ERROR


@dataclass(frozen=True, slots=True)
class PublishNamespaceDone(ControlMessage):
    """PUBLISH_NAMESPACE_DONE (0x9): the Track Namespace (draft-14) or the Request ID (draft-16)."""

    KIND: ClassVar[MessageKind] = MessageKind.PUBLISH_NAMESPACE_DONE
    track_namespace: Namespace = ()
    request_id: int | None = None

    def __post_init__(self) -> None:
        _check_ending(self.track_namespace, self.request_id)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        _push_ending(writer, profile, self.track_namespace, self.request_id)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        return cls(*_pull_ending(reader, profile))


@dataclass(frozen=True, slots=True)
class PublishNamespaceCancel(ControlMessage):
    """PUBLISH_NAMESPACE_CANCEL (0xC): Track Namespace (draft-16: Request ID), Error Code, Error Reason."""

    KIND: ClassVar[MessageKind] = MessageKind.PUBLISH_NAMESPACE_CANCEL
    track_namespace: Namespace
    error_code: int
    reason: str = ""
    request_id: int | None = None

    def __post_init__(self) -> None:
        _check_ending(self.track_namespace, self.request_id)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        _push_ending(writer, profile, self.track_namespace, self.request_id)
        writer.push_varint(self.error_code)
        push_reason_phrase(writer, self.reason, profile.max_reason_phrase_length)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        namespace, request_id = _pull_ending(reader, profile)
        code = reader.pull_varint()
        return cls(namespace, code, pull_reason_phrase(reader, profile.max_reason_phrase_length), request_id)


@dataclass(frozen=True, slots=True)
class SubscribeNamespace(ControlMessage):
    """SUBSCRIBE_NAMESPACE (0x11): Request ID, Track Namespace Prefix (1..32 fields; draft-16 0..32),
    [Subscribe Options (i), draft-16], Parameters. Draft-14 always asks for both (``BOTH``)."""

    KIND: ClassVar[MessageKind] = MessageKind.SUBSCRIBE_NAMESPACE
    request_id: int
    track_namespace_prefix: Namespace
    parameters: RequestParameters = field(default_factory=RequestParameters)
    options: SubscribeOptions = SubscribeOptions.BOTH

    def __post_init__(self) -> None:
        check_namespace(self.track_namespace_prefix, min_fields=0)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        with_options = profile.layout.subscribe_namespace_options
        if not with_options and self.options is not _implied_options(profile):
            raise ValueError(f"draft-{profile.draft} SUBSCRIBE_NAMESPACE always asks for "
                             f"{_implied_options(profile).value}, not {self.options.value}")
        if not self.track_namespace_prefix and not _empty_prefix(profile):
            raise ValueError(f"draft-{profile.draft} SUBSCRIBE_NAMESPACE has a non-empty prefix")
        writer.push_varint(self.request_id)
        push_namespace(writer, self.track_namespace_prefix)
        if with_options:
            writer.push_varint(profile.subscribe_options.code(self.options))
        self.parameters.encode(writer, profile)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = reader.pull_varint()
        with_options = profile.layout.subscribe_namespace_options
        prefix = read_namespace(reader, profile, min_fields=0 if _empty_prefix(profile) else 1)
        options = _implied_options(profile)
        if with_options:
            raw = reader.pull_varint()
            named = profile.subscribe_options.name(raw)
            if named is None:
                raise ProtocolViolation(SessionError.PROTOCOL_VIOLATION, f"Subscribe Options {raw}")
            options = named
        return cls(request_id, prefix, RequestParameters.decode(reader, cls.KIND, profile), options)


def _empty_prefix(profile: Profile) -> bool:
    return profile.layout.subscribe_namespace_options or profile.layout.empty_namespace_prefix


def _implied_options(profile: Profile) -> SubscribeOptions:
    """What a SUBSCRIBE_NAMESPACE without Subscribe Options asks for: both (draft-14), namespaces only
    (draft-18, where SUBSCRIBE_TRACKS asks for the tracks)."""
    return SubscribeOptions.NAMESPACE if profile.has_message(MessageKind.SUBSCRIBE_TRACKS) else SubscribeOptions.BOTH


@dataclass(frozen=True, slots=True)
class SubscribeTracks(ControlMessage):
    """SUBSCRIBE_TRACKS (0x51, draft-18): Request ID, Track Namespace Prefix (0..32 fields), Parameters;
    the publisher answers with PUBLISH for each matching track, on streams of their own."""

    KIND: ClassVar[MessageKind] = MessageKind.SUBSCRIBE_TRACKS
    request_id: int
    track_namespace_prefix: Namespace
    parameters: RequestParameters = field(default_factory=RequestParameters)

    def __post_init__(self) -> None:
        check_namespace(self.track_namespace_prefix, min_fields=0)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.request_id)
        push_namespace(writer, self.track_namespace_prefix)
        self.parameters.encode(writer, profile)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = reader.pull_varint()
        prefix = read_namespace(reader, profile, min_fields=0)
        return cls(request_id, prefix, RequestParameters.decode(reader, cls.KIND, profile))


@dataclass(frozen=True, slots=True)
class SubscribeNamespaceOk(RequestIdMessage):
    """SUBSCRIBE_NAMESPACE_OK (0x12)."""

    KIND: ClassVar[MessageKind] = MessageKind.SUBSCRIBE_NAMESPACE_OK


@dataclass(frozen=True, slots=True)
class SubscribeNamespaceError(RequestErrorMessage):
    """SUBSCRIBE_NAMESPACE_ERROR; its Error Code is named by the profile's ``request_errors``."""

    KIND: ClassVar[MessageKind] = MessageKind.SUBSCRIBE_NAMESPACE_ERROR


@dataclass(frozen=True, slots=True)
class UnsubscribeNamespace(ControlMessage):
    """UNSUBSCRIBE_NAMESPACE (0x14): only the Track Namespace Prefix."""

    KIND: ClassVar[MessageKind] = MessageKind.UNSUBSCRIBE_NAMESPACE
    track_namespace_prefix: Namespace

    def __post_init__(self) -> None:
        # empty: a draft-16 subscriber closed the stream of a SUBSCRIBE_NAMESPACE for the empty prefix
        check_namespace(self.track_namespace_prefix, min_fields=0)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        if not self.track_namespace_prefix:
            raise ValueError("UNSUBSCRIBE_NAMESPACE names a prefix of 1..32 fields")
        push_namespace(writer, self.track_namespace_prefix)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        return cls(read_namespace(reader, profile))


@dataclass(frozen=True, slots=True)
class NamespaceSuffixMessage(ControlMessage):
    """Body of NAMESPACE and NAMESPACE_DONE (draft-16): the namespace's fields after the prefix.

    Sent on the SUBSCRIBE_NAMESPACE's own stream, which names the subscription (no Request ID).
    """

    STREAM_ID_FIELD: ClassVar[str | None] = "request_id"
    track_namespace_suffix: Namespace
    request_id: int | None = None  # the SUBSCRIBE_NAMESPACE it belongs to (not on the wire: its stream says)

    def __post_init__(self) -> None:
        check_namespace(self.track_namespace_suffix, min_fields=0)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        push_namespace(writer, self.track_namespace_suffix)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        return cls(read_namespace(reader, profile, min_fields=0))


@dataclass(frozen=True, slots=True)
class NamespaceNotice(NamespaceSuffixMessage):
    """NAMESPACE (0x8, draft-16): a namespace under the prefix is published. (Named apart from the
    draft so that it cannot be taken for ``moqt.wire.Namespace``, the tuple type.)"""

    KIND: ClassVar[MessageKind] = MessageKind.NAMESPACE


@dataclass(frozen=True, slots=True)
class NamespaceDone(NamespaceSuffixMessage):
    """NAMESPACE_DONE (0xE, draft-16): a namespace under the prefix is withdrawn (after its NAMESPACE)."""

    KIND: ClassVar[MessageKind] = MessageKind.NAMESPACE_DONE


@dataclass(frozen=True, slots=True)
class PublishBlocked(ControlMessage):
    """PUBLISH_BLOCKED (0xF, draft-18): on a SUBSCRIBE_TRACKS's stream, a track under the prefix
    (namespace suffix and Track Name) the publisher cannot send a PUBLISH for (no Request ID: the
    stream names the SUBSCRIBE_TRACKS; a request-stream parser fills ``request_id``)."""

    STREAM_ID_FIELD: ClassVar[str | None] = "request_id"
    KIND: ClassVar[MessageKind] = MessageKind.PUBLISH_BLOCKED
    track_namespace_suffix: Namespace
    track_name: bytes
    request_id: int | None = None

    def __post_init__(self) -> None:
        check_namespace(self.track_namespace_suffix, min_fields=0)
        if sum(len(f) for f in self.track_namespace_suffix) + len(self.track_name) > MAX_FULL_TRACK_NAME_LENGTH:
            raise ValueError(f"Full Track Name longer than {MAX_FULL_TRACK_NAME_LENGTH} octets")

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        push_namespace(writer, self.track_namespace_suffix)
        writer.push_length_prefixed(self.track_name)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        suffix = read_namespace(reader, profile, min_fields=0)
        used = sum(len(f) for f in suffix)
        name = reader.pull_length_prefixed(profile.max_full_track_name_length - used, "Full Track Name")
        return cls(suffix, bytes(name))
