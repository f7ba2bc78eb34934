"""Control message registry, whole-message decoding and the incremental control stream parser.

Why the parser buffers raw octets and copies each payload out: control messages are small (at most
64 KiB) and decoded into immutable values, so one copy per message lets the decoders read from a
``memoryview`` without pinning the growing receive buffer. Data streams never go through here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from moqt.errors import NeedMoreData, ProtocolViolation
from moqt.kinds import SessionError
from moqt.messages.base import ControlMessage
from moqt.messages.fetch import Fetch, FetchCancel, FetchError, FetchOk
from moqt.messages.namespace import (
    NamespaceDone,
    NamespaceNotice,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishNamespaceError,
    PublishNamespaceOk,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
    UnsubscribeNamespace,
)
from moqt.messages.publish import Publish, PublishError, PublishOk
from moqt.messages.request import RequestErrorReply, RequestOk, RequestUpdate
from moqt.messages.setup import ClientSetup, GoAway, MaxRequestId, RequestsBlocked, ServerSetup
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
from moqt.wire import Reader

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
    reader = Reader(payload)
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


class ControlStreamParser:
    """Turns control stream octets, fed in any split (one at a time works), into messages.

    An unknown Message Type is refused as soon as its varint is complete, and a Message Length over
    ``max_message_length`` as soon as the length is, so neither makes us buffer the payload.
    """

    def __init__(self, profile: Profile = DRAFT_14, *, max_message_length: int | None = None) -> None:
        self._profile = profile
        self._classes = message_classes(profile)
        self._max = profile.max_control_message_length if max_message_length is None else max_message_length
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Octets received but not yet part of a complete message."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[ControlMessage]:
        self._buf += data
        messages: list[ControlMessage] = []
        pos = 0
        while True:
            head = _peek_varint(self._buf, pos)
            if head is None:
                break
            message_type, after_type = head
            if message_type not in self._classes:
                raise ProtocolViolation(_PV, f"unknown control message type 0x{message_type:x}")
            if after_type + 2 > len(self._buf):
                break
            length = (self._buf[after_type] << 8) | self._buf[after_type + 1]
            if length > self._max:
                raise ProtocolViolation(_PV, f"control message of {length} octets exceeds {self._max}")
            start = after_type + 2
            if start + length > len(self._buf):
                break
            messages.append(decode_message(message_type, bytes(self._buf[start : start + length]), self._profile))
            pos = start + length
        del self._buf[:pos]
        return messages
