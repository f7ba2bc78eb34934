"""Session-level messages: CLIENT_SETUP, SERVER_SETUP, draft-18's SETUP, GOAWAY, MAX_REQUEST_ID,
REQUESTS_BLOCKED."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Self

from moqt.errors import ProtocolViolation
from moqt.kinds import AliasType, MessageKind, SessionError
from moqt.messages.base import ControlMessage
from moqt.params import SetupParameters
from moqt.profiles import DRAFT_14, Profile
from moqt.wire import Reader, Writer


def _check_alpn_version(versions: tuple[int, ...], profile: Profile) -> None:
    """Where the ALPN chose the version (draft-16), a setup message can only be about that one."""
    if not profile.layout.setup_versions and versions not in ((), (profile.version,)):
        raise ValueError(f"draft-{profile.draft} setup messages carry no versions (the ALPN chose the version)")


@dataclass(frozen=True, slots=True)
class ClientSetup(ControlMessage):
    """CLIENT_SETUP (section 9.3): Number of Supported Versions, Supported Versions, Setup Parameters.

    Draft-16 negotiates the version by ALPN and sends only the parameters; decoded there,
    ``supported_versions`` is the profile's version, the one the ALPN agreed.
    """

    KIND: ClassVar[MessageKind] = MessageKind.CLIENT_SETUP
    supported_versions: tuple[int, ...]
    parameters: SetupParameters = field(default_factory=SetupParameters)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        if profile.layout.setup_versions:
            writer.push_varint(len(self.supported_versions))
            for version in self.supported_versions:
                writer.push_varint(version)
        else:
            _check_alpn_version(self.supported_versions, profile)
        self.parameters.encode(writer, profile)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        versions: tuple[int, ...] = (profile.version,)
        if profile.layout.setup_versions:
            count = reader.pull_varint()
            # A count larger than the payload runs out of octets (NeedMoreData -> length mismatch).
            versions = tuple(reader.pull_varint() for _ in range(count))
        parameters = SetupParameters.decode(reader, profile)
        _check_setup_tokens(parameters, profile, cls.KIND)
        return cls(versions, parameters)


def _check_setup_tokens(parameters: SetupParameters, profile: Profile, kind: MessageKind) -> None:
    if not profile.layout.setup_token_aliases and any(
            t.alias_type in (AliasType.DELETE, AliasType.USE_ALIAS) for t in parameters.authorization_tokens):
        raise ProtocolViolation(SessionError.PROTOCOL_VIOLATION, f"DELETE or USE_ALIAS token in {kind.value}")


@dataclass(frozen=True, slots=True)
class Setup(ControlMessage):
    """SETUP (0x2F00, draft-18): each side's first message on its control stream, whose type it also is.

    The payload is the Setup Options alone, delta-coded Key-Value-Pairs to the end of the message
    (no count); unknown options are kept (``parameters.unknown``) and repeats of them allowed.
    """

    KIND: ClassVar[MessageKind] = MessageKind.SETUP
    parameters: SetupParameters = field(default_factory=SetupParameters)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        self.parameters.encode(writer, profile, counted=False)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        parameters = SetupParameters.decode(reader, profile, counted=False)
        _check_setup_tokens(parameters, profile, cls.KIND)
        return cls(parameters)


@dataclass(frozen=True, slots=True)
class ServerSetup(ControlMessage):
    """SERVER_SETUP (section 9.3): Selected Version, Setup Parameters (draft-16: only the parameters;
    decoded there, ``selected_version`` is the profile's version)."""

    KIND: ClassVar[MessageKind] = MessageKind.SERVER_SETUP
    selected_version: int
    parameters: SetupParameters = field(default_factory=SetupParameters)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        if profile.layout.setup_versions:
            writer.push_varint(self.selected_version)
        else:
            _check_alpn_version((self.selected_version,), profile)
        self.parameters.encode(writer, profile)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        version = reader.pull_varint() if profile.layout.setup_versions else profile.version
        return cls(version, SetupParameters.decode(reader, profile))


@dataclass(frozen=True, slots=True)
class GoAway(ControlMessage):
    """GOAWAY (section 9.4): New Session URI (at most 8192 octets; empty = reuse the current URI).

    Draft-18 adds ``timeout`` (ms the sender waits for a graceful close; 0: none said) and, on the
    control stream only, ``request_id`` (the smallest peer Request ID not processed); a GOAWAY on a
    request stream has none (None). Earlier drafts have neither, and refuse to send them.
    """

    KIND: ClassVar[MessageKind] = MessageKind.GOAWAY
    new_session_uri: str = ""
    timeout: int = 0
    request_id: int | None = None

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        data = self.new_session_uri.encode("utf-8")
        if len(data) > profile.max_goaway_uri_length:
            raise ValueError(f"New Session URI longer than {profile.max_goaway_uri_length} octets")
        writer.push_length_prefixed(data)
        if not profile.layout.goaway_timeout:
            if self.timeout or self.request_id is not None:
                raise ValueError(f"draft-{profile.draft} GOAWAY has no Timeout or Request ID")
            return
        writer.push_varint(self.timeout)
        if self.request_id is not None:
            writer.push_varint(self.request_id)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        raw = reader.pull_length_prefixed(profile.max_goaway_uri_length, "New Session URI")
        try:
            uri = str(raw, "utf-8")
        except UnicodeDecodeError:
            raise ProtocolViolation(SessionError.PROTOCOL_VIOLATION, "New Session URI is not UTF-8") from None
        if not profile.layout.goaway_timeout:
            return cls(uri)
        timeout = reader.pull_varint()
        return cls(uri, timeout, None if reader.at_end() else reader.pull_varint())


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
