"""Namespace discovery: PUBLISH_NAMESPACE family and SUBSCRIBE_NAMESPACE family (sections 9.23-9.31)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Self

from moqt.kinds import MessageKind
from moqt.messages.base import ControlMessage, RequestErrorMessage, RequestIdMessage, read_namespace
from moqt.params import RequestParameters
from moqt.profiles import DRAFT_14, Profile
from moqt.wire import Namespace, Reader, Writer, check_namespace, pull_reason_phrase, push_namespace, push_reason_phrase


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
    """PUBLISH_NAMESPACE_DONE (0x9): only the Track Namespace (no Request ID in draft-14)."""

    KIND: ClassVar[MessageKind] = MessageKind.PUBLISH_NAMESPACE_DONE
    track_namespace: Namespace

    def __post_init__(self) -> None:
        check_namespace(self.track_namespace)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        push_namespace(writer, self.track_namespace)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        return cls(read_namespace(reader, profile))


@dataclass(frozen=True, slots=True)
class PublishNamespaceCancel(ControlMessage):
    """PUBLISH_NAMESPACE_CANCEL (0xC): Track Namespace, Error Code, Error Reason."""

    KIND: ClassVar[MessageKind] = MessageKind.PUBLISH_NAMESPACE_CANCEL
    track_namespace: Namespace
    error_code: int
    reason: str = ""

    def __post_init__(self) -> None:
        check_namespace(self.track_namespace)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        push_namespace(writer, self.track_namespace)
        writer.push_varint(self.error_code)
        push_reason_phrase(writer, self.reason, profile.max_reason_phrase_length)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        namespace = read_namespace(reader, profile)
        return cls(namespace, reader.pull_varint(), pull_reason_phrase(reader, profile.max_reason_phrase_length))


@dataclass(frozen=True, slots=True)
class SubscribeNamespace(ControlMessage):
    """SUBSCRIBE_NAMESPACE (0x11): Request ID, Track Namespace Prefix (1..32 fields), Parameters."""

    KIND: ClassVar[MessageKind] = MessageKind.SUBSCRIBE_NAMESPACE
    request_id: int
    track_namespace_prefix: Namespace
    parameters: RequestParameters = field(default_factory=RequestParameters)

    def __post_init__(self) -> None:
        check_namespace(self.track_namespace_prefix)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.request_id)
        push_namespace(writer, self.track_namespace_prefix)
        self.parameters.encode(writer, profile)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = reader.pull_varint()
        prefix = read_namespace(reader, profile)
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
        check_namespace(self.track_namespace_prefix)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        push_namespace(writer, self.track_namespace_prefix)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        return cls(read_namespace(reader, profile))
