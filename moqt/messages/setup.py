"""Session-level messages: CLIENT_SETUP, SERVER_SETUP, GOAWAY, MAX_REQUEST_ID, REQUESTS_BLOCKED."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Self

from moqt.errors import ProtocolViolation
from moqt.kinds import MessageKind, SessionError
from moqt.messages.base import ControlMessage
from moqt.params import SetupParameters
from moqt.profiles import DRAFT_14, Profile
from moqt.wire import Reader, Writer


@dataclass(frozen=True, slots=True)
class ClientSetup(ControlMessage):
    """CLIENT_SETUP (section 9.3): Number of Supported Versions, Supported Versions, Setup Parameters."""

    KIND: ClassVar[MessageKind] = MessageKind.CLIENT_SETUP
    supported_versions: tuple[int, ...]
    parameters: SetupParameters = field(default_factory=SetupParameters)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(len(self.supported_versions))
        for version in self.supported_versions:
            writer.push_varint(version)
        self.parameters.encode(writer, profile)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        count = reader.pull_varint()
        # A count larger than the payload runs out of octets (NeedMoreData -> length mismatch).
        versions = tuple(reader.pull_varint() for _ in range(count))
        return cls(versions, SetupParameters.decode(reader, profile))


@dataclass(frozen=True, slots=True)
class ServerSetup(ControlMessage):
    """SERVER_SETUP (section 9.3): Selected Version, Setup Parameters."""

    KIND: ClassVar[MessageKind] = MessageKind.SERVER_SETUP
    selected_version: int
    parameters: SetupParameters = field(default_factory=SetupParameters)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.selected_version)
        self.parameters.encode(writer, profile)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        return cls(reader.pull_varint(), SetupParameters.decode(reader, profile))


@dataclass(frozen=True, slots=True)
class GoAway(ControlMessage):
    """GOAWAY (section 9.4): New Session URI (at most 8192 octets; empty = reuse the current URI)."""

    KIND: ClassVar[MessageKind] = MessageKind.GOAWAY
    new_session_uri: str = ""

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        data = self.new_session_uri.encode("utf-8")
        if len(data) > profile.max_goaway_uri_length:
            raise ValueError(f"New Session URI longer than {profile.max_goaway_uri_length} octets")
        writer.push_length_prefixed(data)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        raw = reader.pull_length_prefixed(profile.max_goaway_uri_length, "New Session URI")
        try:
            return cls(str(raw, "utf-8"))
        except UnicodeDecodeError:
            raise ProtocolViolation(SessionError.PROTOCOL_VIOLATION, "New Session URI is not UTF-8") from None


@dataclass(frozen=True, slots=True)
class MaxRequestId(ControlMessage):
    """MAX_REQUEST_ID (section 9.5): the new Maximum Request ID plus 1 (requests use IDs below it)."""

    KIND: ClassVar[MessageKind] = MessageKind.MAX_REQUEST_ID
    request_id: int

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.request_id)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        return cls(reader.pull_varint())


@dataclass(frozen=True, slots=True)
class RequestsBlocked(ControlMessage):
    """REQUESTS_BLOCKED (section 9.6): the Maximum Request ID the sender is blocked on."""

    KIND: ClassVar[MessageKind] = MessageKind.REQUESTS_BLOCKED
    maximum_request_id: int

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.maximum_request_id)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        return cls(reader.pull_varint())
