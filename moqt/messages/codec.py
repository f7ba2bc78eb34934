"""Control message registry, whole-message decoding and the incremental control stream parser.

Why the parser buffers raw octets and copies each payload out: control messages are small (at most
64 KiB) and decoded into immutable values, so one copy per message lets the decoders read from a
``memoryview`` without pinning the growing receive buffer. Data streams never go through here.

Draft-18 runs control messages on three kinds of stream: each side's control stream (it begins with
SETUP, whose Message Type is the stream's type; then only GOAWAY) and each request's bidirectional
stream (it begins with the request; replies there carry no Request ID, which the parser fills in
from the stream). ``control_stream_parser`` and ``request_stream_parser`` make the parser for each.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from moqt.errors import NeedMoreData, ProtocolViolation
from moqt.kinds import MessageKind, SessionError
from moqt.messages.base import STREAM_REQUEST_ID, ControlMessage
from moqt.messages.fetch import Fetch, FetchCancel, FetchError, FetchOk
from moqt.messages.namespace import (
    NamespaceDone,
    NamespaceNotice,
    PublishBlocked,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishNamespaceError,
    PublishNamespaceOk,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
    SubscribeTracks,
    UnsubscribeNamespace,
)
from moqt.messages.publish import Publish, PublishError, PublishOk
from moqt.messages.request import RequestErrorReply, RequestOk, RequestUpdate
from moqt.messages.setup import ClientSetup, GoAway, MaxRequestId, RequestsBlocked, ServerSetup, Setup
from moqt.messages.subscribe import (
    PublishDone,
    Subscribe,
    SubscribeError,
    SubscribeOk,
    SubscribeUpdate,
    TrackStatus,
    TrackStatusError,
    TrackStatusOk,
    Unsubscribe,
)
from moqt.profiles import DRAFT_14, Profile
from moqt.wire import decode_vi64, make_reader

_PV: Final = SessionError.PROTOCOL_VIOLATION

ALL_MESSAGES: Final[tuple[type[ControlMessage], ...]] = (
    ClientSetup, ServerSetup, GoAway, MaxRequestId, RequestsBlocked,
    Subscribe, SubscribeOk, SubscribeError, SubscribeUpdate, Unsubscribe, PublishDone,
    Publish, PublishOk, PublishError,
    Fetch, FetchOk, FetchError, FetchCancel,
    TrackStatus, TrackStatusOk, TrackStatusError,
    PublishNamespace, PublishNamespaceOk, PublishNamespaceError, PublishNamespaceDone, PublishNamespaceCancel,
    SubscribeNamespace, SubscribeNamespaceOk, SubscribeNamespaceError, UnsubscribeNamespace,
    RequestOk, RequestErrorReply, RequestUpdate, NamespaceNotice, NamespaceDone,
    Setup, SubscribeTracks, PublishBlocked,
)


@functools.cache
def message_classes(profile: Profile) -> Mapping[int, type[ControlMessage]]:
    """Message classes by this profile's wire type (a message the draft lacks is not decoded)."""
    codes = profile.message_types.codes
    return MappingProxyType({codes[cls.KIND]: cls for cls in ALL_MESSAGES if cls.KIND in codes})


def decode_message(message_type: int, payload: bytes | memoryview, profile: Profile = DRAFT_14) -> ControlMessage:
    """Decode one payload; it must be consumed exactly, else PROTOCOL_VIOLATION (length mismatch)."""
    cls = message_classes(profile).get(message_type)
    if cls is None:
        raise ProtocolViolation(_PV, f"unknown control message type 0x{message_type:x}")
    reader = make_reader(payload, profile.layout.vi64)
    try:
        message = cls.decode_payload(reader, profile)
    except NeedMoreData:
        raise ProtocolViolation(_PV, f"{cls.KIND.value} is longer than its Message Length") from None
    if not reader.at_end():
        raise ProtocolViolation(_PV, f"{cls.KIND.value} is shorter than its Message Length")
    return message


def encode_message(message: ControlMessage, profile: Profile = DRAFT_14) -> bytes:
    return message.encode(profile)


def _peek_varint(buf: bytearray, pos: int) -> tuple[int, int] | None:
    if pos >= len(buf):
        return None
    size = 1 << (buf[pos] >> 6)
    if pos + size > len(buf):
        return None
    value = buf[pos] & 0x3F
    for i in range(1, size):
        value = (value << 8) | buf[pos + i]
    return value, pos + size


def _peek_vi64(buf: bytearray, pos: int) -> tuple[int, int] | None:
    if pos >= len(buf):
        return None
    try:
        value, used = decode_vi64(bytes(buf[pos : pos + 9]))
    except NeedMoreData:
        return None
    return value, pos + used


class ControlStreamParser:
    """Turns control stream octets, fed in any split (one at a time works), into messages.

    An unknown Message Type is refused as soon as its varint is complete, and a Message Length over
    ``max_message_length`` as soon as the length is, so neither makes us buffer the payload.
    """

    def __init__(self, profile: Profile = DRAFT_14, *, max_message_length: int | None = None,
                 first: frozenset[MessageKind] | None = None, later: frozenset[MessageKind] | None = None,
                 request_id: int | None = None, fill_ids: bool = False) -> None:
        """``first`` / ``later``: the kinds allowed as the first message and after it (None: any of
        the draft's); ``fill_ids``: put ``request_id`` (or, while None, the first message's) into the
        field each message leaves to the stream (draft-18 request streams)."""
        self._profile = profile
        self._classes = message_classes(profile)
        self._max = profile.max_control_message_length if max_message_length is None else max_message_length
        self._buf = bytearray()
        self._peek = _peek_vi64 if profile.layout.vi64 else _peek_varint
        self._first = first
        self._later = later
        self._seen_first = False
        self._fill = fill_ids
        #: The Request ID of the stream's request (draft-18), filled into the replies read on it.
        self.request_id = request_id

    @property
    def buffered(self) -> int:
        """Octets received but not yet part of a complete message."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[ControlMessage]:
        self._buf += data
        messages: list[ControlMessage] = []
        pos = 0
        peek = self._peek
        while True:
            head = peek(self._buf, pos)
            if head is None:
                break
            message_type, after_type = head
            cls = self._classes.get(message_type)
            if cls is None:
                raise ProtocolViolation(_PV, f"unknown control message type 0x{message_type:x}")
            if self._first is not None or self._later is not None:
                self._check_kind(cls.KIND)
            if after_type + 2 > len(self._buf):
                break
            length = (self._buf[after_type] << 8) | self._buf[after_type + 1]
            if length > self._max:
                raise ProtocolViolation(_PV, f"control message of {length} octets exceeds {self._max}")
            start = after_type + 2
            if start + length > len(self._buf):
                break
            message = decode_message(message_type, bytes(self._buf[start : start + length]), self._profile)
            messages.append(self._with_stream_id(message) if self._fill else message)
            self._seen_first = True
            pos = start + length
        del self._buf[:pos]
        return messages

    def _check_kind(self, kind: MessageKind) -> None:
        allowed = self._later if self._seen_first else self._first
        if allowed is not None and kind not in allowed:
            where = "later on this stream" if self._seen_first else "as this stream's first message"
            raise ProtocolViolation(_PV, f"{kind.value} not allowed {where}")

    def _with_stream_id(self, message: ControlMessage) -> ControlMessage:
        """The message with the stream's Request ID in the field the wire left out (draft-18)."""
        if self.request_id is None:
            own = getattr(message, "request_id", None)
            self.request_id = own if own != STREAM_REQUEST_ID else None
            return message
        name = message.STREAM_ID_FIELD
        if name is None or getattr(message, name) not in (STREAM_REQUEST_ID, None):
            return message
        return dataclasses.replace(message, **{name: self.request_id})


def control_stream_parser(profile: Profile = DRAFT_14, *, max_message_length: int | None = None) -> ControlStreamParser:
    """The parser of a control stream; draft-18: fed from the stream's first octet (its type is SETUP's
    Message Type), SETUP first and then only GOAWAY."""
    if not profile.control_stream_messages:
        return ControlStreamParser(profile, max_message_length=max_message_length)
    later = profile.control_stream_messages - {MessageKind.SETUP}
    return ControlStreamParser(profile, max_message_length=max_message_length,
                               first=frozenset({MessageKind.SETUP}), later=later)


def request_stream_parser(profile: Profile, *, peer_opened: bool, request_id: int | None = None,
                          max_message_length: int | None = None) -> ControlStreamParser:
    """The parser of what we read on a draft-18 request stream: ``peer_opened`` (the peer's request),
    it must begin with one of the draft's request messages; SETUP never comes here. The stream's
    Request ID is ``request_id`` or, while None, the first message's."""
    anything = frozenset(cls.KIND for cls in message_classes(profile).values()) - {MessageKind.SETUP}
    first = profile.stream_opening_messages if peer_opened and profile.stream_opening_messages else anything
    return ControlStreamParser(profile, max_message_length=max_message_length, first=first, later=anything,
                               request_id=request_id, fill_ids=profile.layout.ids_from_request_stream)
