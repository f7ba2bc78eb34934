"""MOQT primitive encodings: QUIC varints, a bounded reader/writer and the draft's common structures.

Why a reader of our own instead of ``aioquic.buffer.Buffer``: incremental parsing needs to tell
"not enough bytes yet" (``NeedMoreData``, wait for the next QUIC event) from "these bytes are wrong"
(``ProtocolViolation`` with the draft's error code), and reads must hand back ``memoryview`` slices so
object payloads are never copied. Every length read from the wire is checked against a limit *before*
the reader waits for that many bytes, so a peer cannot make us buffer an absurd amount.

Structures (draft-14 "Notational Conventions"): varint (RFC 9000 section 16), byte strings ``(b)``,
Track Namespace tuples, Key-Value-Pair, Location and Reason Phrase. Draft-16 writes a Key-Value-Pair's
type as a delta from the previous pair's (``delta=True`` below); the caller reads which from its profile.

Draft-18 replaces the QUIC varint by the vi64 (section "Variable-Length Integers": the count of leading
1 bits of the first octet gives the length, 1..9 octets, any length that holds the value is valid).
``Vi64Reader`` / ``Vi64Writer`` override only ``pull_varint`` / ``push_varint``, so every structure
below reads and writes either encoding unchanged, and draft-14's hot path keeps its own methods
(no per-call test of the encoding); ``make_reader`` / ``make_writer`` pick the class by the
profile's ``layout.vi64``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias

from moqt.errors import NeedMoreData, ProtocolViolation
from moqt.kinds import SessionError

VARINT_MAX: Final = (1 << 62) - 1
VI64_MAX: Final = (1 << 64) - 1
#: Draft-16: "the previous Type value plus the Delta Type MUST NOT be greater than 2^64 - 1".
KVP_TYPE_MAX: Final = (1 << 64) - 1
MAX_NAMESPACE_FIELDS: Final = 32
MAX_FULL_TRACK_NAME_LENGTH: Final = 4096
MAX_REASON_PHRASE_LENGTH: Final = 1024
MAX_KVP_VALUE_LENGTH: Final = 0xFFFF

#: A Track Namespace: 1..32 byte-string fields, compared byte for byte.
Namespace: TypeAlias = tuple[bytes, ...]
Bytes: TypeAlias = bytes | bytearray | memoryview

_PV: Final = SessionError.PROTOCOL_VIOLATION


def varint_size(value: int) -> int:
    """Octets of the minimal encoding of ``value``."""
    if value < 0x40:
        return 1
    if value < 0x4000:
        return 2
    if value < 0x40000000:
        return 4
    if value <= VARINT_MAX:
        return 8
    raise ValueError(f"{value} does not fit a QUIC varint")


def encode_varint(value: int) -> bytes:
    """Minimal encoding (the draft says SHOULD; we always do, so our vectors are canonical)."""
    if value < 0:
        raise ValueError(f"{value} does not fit a QUIC varint")
    size = varint_size(value)
    prefix = {1: 0x00, 2: 0x40, 4: 0x80, 8: 0xC0}[size]
    raw = bytearray(value.to_bytes(size, "big"))
    raw[0] |= prefix
    return bytes(raw)


def decode_varint(data: Bytes) -> tuple[int, int]:
    """(value, octets used) of the varint at the start of ``data``; any valid length is accepted."""
    reader = Reader(data)
    value = reader.pull_varint()
    return value, reader.pos


# --- vi64 (draft-18) -----------------------------------------------------------------------------

#: Octets of the vi64 whose first octet is the index (its leading 1 bits plus one; 0xFF: nine).
_VI64_SIZE: Final = bytes(min(9, 8 - (b ^ 0xFF).bit_length() + 1) for b in range(256))
#: The value bits of an n-octet vi64 (n < 9), after the length prefix.
_VI64_MASK: Final = tuple((1 << (7 * n)) - 1 for n in range(9))
#: The length prefix of an n-octet vi64 (n < 9) in place: n-1 one bits then a zero bit.
_VI64_PREFIX: Final = tuple(((1 << n) - 2) << (7 * n) for n in range(9))


def vi64_size(value: int) -> int:
    """Octets of the minimal vi64 encoding of ``value``."""
    if value < 0 or value > VI64_MAX:
        raise ValueError(f"{value} does not fit a vi64")
    if value < 0x80:
        return 1
    return min(9, (value.bit_length() + 6) // 7)


def encode_vi64(value: int) -> bytes:
    """Minimal vi64 encoding (longer ones are valid too; we always write the shortest)."""
    if 0 <= value < 0x80:
        return bytes((value,))
    size = vi64_size(value)
    if size == 9:
        return b"\xff" + value.to_bytes(8, "big")
    return (value | _VI64_PREFIX[size]).to_bytes(size, "big")


def decode_vi64(data: Bytes) -> tuple[int, int]:
    """(value, octets used) of the vi64 at the start of ``data``: every length, all 64 bits."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    if not len(view):
        raise NeedMoreData(1)
    size = _VI64_SIZE[view[0]]
    if len(view) < size:
        raise NeedMoreData(size)
    if size == 9:
        return int.from_bytes(view[1:9], "big"), 9
    return int.from_bytes(view[:size], "big") & _VI64_MASK[size], size


class Reader:
    """Reads fields from a byte view; never copies, raises ``NeedMoreData`` at the end of input."""

    __slots__ = ("_data", "_end", "_pos")

    def __init__(self, data: Bytes) -> None:
        view = data if isinstance(data, memoryview) else memoryview(data)
        self._data = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        self._pos = 0
        self._end = len(self._data)

    @property
    def pos(self) -> int:
        return self._pos

    @property
    def remaining(self) -> int:
        return self._end - self._pos

    def at_end(self) -> bool:
        return self._pos >= self._end

    def _need(self, count: int) -> None:
        if self._end - self._pos < count:
            raise NeedMoreData(self._pos + count)

    def pull_uint8(self) -> int:
        self._need(1)
        value = self._data[self._pos]
        self._pos += 1
        return value

    def pull_varint(self) -> int:
        self._need(1)
        first = self._data[self._pos]
        size = 1 << (first >> 6)
        self._need(size)
        value = first & 0x3F
        for i in range(1, size):
            value = (value << 8) | self._data[self._pos + i]
        self._pos += size
        return value

    #: A Key-Value-Pair's (Delta) Type: a varint; a vi64 reader reads all 64 bits of it.
    pull_wide = pull_varint

    def pull_bytes(self, count: int) -> memoryview:
        """A view of the next ``count`` octets (zero-copy)."""
        self._need(count)
        view = self._data[self._pos : self._pos + count]
        self._pos += count
        return view

    def pull_length(self, limit: int, what: str, error: SessionError = _PV) -> int:
        """A varint length, refused (with ``error``) when above ``limit`` -- before any wait."""
        length = self.pull_varint()
        if length > limit:
            raise ProtocolViolation(error, f"{what} length {length} exceeds {limit}")
        return length

    def pull_length_prefixed(self, limit: int, what: str, error: SessionError = _PV) -> memoryview:
        """A ``(b)`` field: varint length (at most ``limit``) then that many octets."""
        length = self.pull_length(limit, what, error)
        return self.pull_bytes(length)


class Vi64Reader(Reader):
    """A ``Reader`` whose integers are vi64s (draft-18).

    ``pull_varint`` refuses a value above 2^62-1: our IDs, Locations, aliases and lengths are 62-bit
    in every draft (the session, relay and caches share them), so such a value is answered with
    PROTOCOL_VIOLATION rather than held; ``pull_wide`` (Key-Value-Pair types) reads all 64 bits.
    """

    __slots__ = ()

    def pull_varint(self) -> int:
        value = self.pull_wide()
        if value > VARINT_MAX:
            raise ProtocolViolation(_PV, f"vi64 value {value} above 2^62-1, which this implementation does not hold")
        return value

    def pull_wide(self) -> int:
        pos = self._pos
        if pos >= self._end:
            raise NeedMoreData(pos + 1)
        data = self._data
        first = data[pos]
        if first < 0x80:
            self._pos = pos + 1
            return first
        size = _VI64_SIZE[first]
        self._need(size)
        self._pos = pos + size
        if size == 9:
            return int.from_bytes(data[pos + 1 : pos + 9], "big")
        return int.from_bytes(data[pos : pos + size], "big") & _VI64_MASK[size]


class Writer:
    """Appends fields to a growing buffer; used for headers and control messages (never payloads)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def __len__(self) -> int:
        return len(self._buf)

    def getvalue(self) -> bytes:
        return bytes(self._buf)

    def push_uint8(self, value: int) -> None:
        if not 0 <= value <= 0xFF:
            raise ValueError(f"{value} does not fit 8 bits")
        self._buf.append(value)

    def push_uint16(self, value: int) -> None:
        if not 0 <= value <= 0xFFFF:
            raise ValueError(f"{value} does not fit 16 bits")
        self._buf += value.to_bytes(2, "big")

    def push_varint(self, value: int) -> None:
        self._buf += encode_varint(value)

    def push_bytes(self, data: Bytes) -> None:
        self._buf += data

    def push_length_prefixed(self, data: Bytes) -> None:
        self.push_varint(len(data))
        self._buf += data


class Vi64Writer(Writer):
    """A ``Writer`` whose integers are vi64s (draft-18)."""

    __slots__ = ()

    def push_varint(self, value: int) -> None:
        self._buf += encode_vi64(value)


def make_reader(data: Bytes, vi64: bool = False) -> Reader:
    """The reader of a profile's integers (``profile.layout.vi64``)."""
    return Vi64Reader(data) if vi64 else Reader(data)


def make_writer(vi64: bool = False) -> Writer:
    """The writer of a profile's integers (``profile.layout.vi64``)."""
    return Vi64Writer() if vi64 else Writer()


# --- Track Namespace and Full Track Name (section "Track Naming") ------------------------------

def check_namespace(namespace: Namespace, *, min_fields: int = 1, max_fields: int = MAX_NAMESPACE_FIELDS,
                    max_length: int = MAX_FULL_TRACK_NAME_LENGTH) -> None:
    """Raise ``ValueError`` for a namespace we must not send (local misuse)."""
    if not min_fields <= len(namespace) <= max_fields:
        raise ValueError(f"a Track Namespace has {min_fields}..{max_fields} fields, not {len(namespace)}")
    if sum(len(f) for f in namespace) > max_length:
        raise ValueError(f"Track Namespace longer than {max_length} octets")


def push_namespace(writer: Writer, namespace: Namespace) -> None:
    writer.push_varint(len(namespace))
    for field in namespace:
        writer.push_length_prefixed(field)


def pull_namespace(reader: Reader, *, max_fields: int = MAX_NAMESPACE_FIELDS,
                   max_length: int = MAX_FULL_TRACK_NAME_LENGTH, min_fields: int = 1,
                   empty_field_closes: bool = False) -> Namespace:
    """A Track Namespace tuple: 1..32 fields whose lengths sum to at most ``max_length``.

    ``min_fields`` 0 is a draft-16 SUBSCRIBE_NAMESPACE prefix or NAMESPACE suffix; with
    ``empty_field_closes`` (draft-16) a field of length 0 is a PROTOCOL_VIOLATION.
    """
    count = reader.pull_varint()
    if count < min_fields or count > max_fields:
        raise ProtocolViolation(_PV, f"Track Namespace with {count} fields (must be {min_fields}..{max_fields})")
    fields: list[bytes] = []
    total = 0
    for _ in range(count):
        field = reader.pull_length_prefixed(max_length - total, "Track Namespace")
        if empty_field_closes and not len(field):
            raise ProtocolViolation(_PV, "Track Namespace field of length 0")
        total += len(field)
        fields.append(bytes(field))
    return tuple(fields)


def pull_full_track_name(reader: Reader, *, max_fields: int = MAX_NAMESPACE_FIELDS,
                         max_length: int = MAX_FULL_TRACK_NAME_LENGTH,
                         empty_field_closes: bool = False) -> tuple[Namespace, bytes]:
    """Track Namespace then Track Name; the namespace fields and the name total at most 4096 octets."""
    namespace = pull_namespace(reader, max_fields=max_fields, max_length=max_length,
                               empty_field_closes=empty_field_closes)
    used = sum(len(f) for f in namespace)
    name = reader.pull_length_prefixed(max_length - used, "Full Track Name")
    return namespace, bytes(name)


# --- Location ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, order=True)
class Location:
    """(Group, Object); field order makes Python's ordering the draft's Location ordering."""

    group: int
    object: int

    def __post_init__(self) -> None:
        if not (0 <= self.group <= VARINT_MAX and 0 <= self.object <= VARINT_MAX):
            raise ValueError(f"Location {self.group}/{self.object} outside the varint range")

    def encode(self, writer: Writer) -> None:
        writer.push_varint(self.group)
        writer.push_varint(self.object)

    @classmethod
    def decode(cls, reader: Reader) -> Location:
        return cls(reader.pull_varint(), reader.pull_varint())


# --- Key-Value-Pair ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class KeyValuePair:
    """Even ``type``: the value is a varint (``int``). Odd ``type``: the value is bytes.

    A type above 2^62-1 can only arrive delta-coded (draft-16); it is sent again the same way.
    """

    type: int
    value: int | bytes

    def __post_init__(self) -> None:
        if not 0 <= self.type <= KVP_TYPE_MAX:
            raise ValueError(f"Key-Value-Pair type {self.type} outside 0..2^64-1")
        if self.type % 2 == 0:
            if not isinstance(self.value, int) or not 0 <= self.value <= VARINT_MAX:
                raise ValueError(f"even Key-Value-Pair type 0x{self.type:x} needs a varint value")
        elif not isinstance(self.value, bytes):
            raise ValueError(f"odd Key-Value-Pair type 0x{self.type:x} needs a bytes value")
        elif len(self.value) > MAX_KVP_VALUE_LENGTH:
            raise ValueError(f"Key-Value-Pair value longer than {MAX_KVP_VALUE_LENGTH} octets")

    def encode(self, writer: Writer, previous: int | None = None) -> None:
        """The pair; with ``previous`` (draft-16) its type is written as the delta from that type."""
        writer.push_varint(self.type if previous is None else self.type - previous)
        if isinstance(self.value, int):
            writer.push_varint(self.value)
        else:
            writer.push_length_prefixed(self.value)

    @classmethod
    def decode(cls, reader: Reader, *, max_value_length: int = MAX_KVP_VALUE_LENGTH,
               previous: int | None = None) -> KeyValuePair:
        """One pair; with ``previous`` (draft-16) the type read is a delta from that type."""
        kind = reader.pull_wide()
        if previous is not None:
            kind += previous
            if kind > KVP_TYPE_MAX:
                raise ProtocolViolation(_PV, "Key-Value-Pair Delta Type takes the type past 2^64-1")
        if kind % 2 == 0:
            return cls(kind, reader.pull_varint())
        return cls(kind, bytes(reader.pull_length_prefixed(max_value_length, "Key-Value-Pair value")))


def kvp_order(pairs: tuple[KeyValuePair, ...] | list[KeyValuePair], delta: bool) -> list[KeyValuePair]:
    """The order pairs go on the wire: as given, or (delta-coded types are unsigned) by ascending type,
    pairs of one type keeping their order."""
    return sorted(pairs, key=_pair_type) if delta else list(pairs)


def _pair_type(pair: KeyValuePair) -> int:
    return pair.type


def push_kvps(writer: Writer, pairs: tuple[KeyValuePair, ...] | list[KeyValuePair], *, delta: bool = False) -> None:
    """Pairs back to back (in ``kvp_order``), with no count or length in front."""
    previous: int | None = 0 if delta else None
    for pair in kvp_order(pairs, delta):
        pair.encode(writer, previous)
        if delta:
            previous = pair.type


def pull_kvps(reader: Reader, count: int, *, max_value_length: int = MAX_KVP_VALUE_LENGTH,
              delta: bool = False) -> list[KeyValuePair]:
    """``count`` pairs (a parameter list after its Number of Parameters)."""
    pairs: list[KeyValuePair] = []
    previous: int | None = 0 if delta else None
    for _ in range(count):
        pair = KeyValuePair.decode(reader, max_value_length=max_value_length, previous=previous)
        pairs.append(pair)
        if delta:
            previous = pair.type
    return pairs


def encode_kvps(pairs: tuple[KeyValuePair, ...] | list[KeyValuePair], *, delta: bool = False,
                vi64: bool = False) -> bytes:
    """Key-Value-Pairs back to back, with no count or length in front."""
    writer = make_writer(vi64)
    push_kvps(writer, pairs, delta=delta)
    return writer.getvalue()


def decode_kvp_block(data: Bytes, *, max_value_length: int = MAX_KVP_VALUE_LENGTH,
                     error: SessionError = _PV, delta: bool = False, vi64: bool = False) -> tuple[KeyValuePair, ...]:
    """Key-Value-Pairs that exactly fill ``data`` (an Extension Headers block, Immutable Extensions).

    A pair that runs past the end is a framing error reported with ``error``.
    """
    reader = make_reader(data, vi64)
    pairs: list[KeyValuePair] = []
    previous: int | None = 0 if delta else None
    try:
        while not reader.at_end():
            pair = KeyValuePair.decode(reader, max_value_length=max_value_length, previous=previous)
            pairs.append(pair)
            if delta:
                previous = pair.type
    except NeedMoreData:
        raise ProtocolViolation(error, "Key-Value-Pair runs past the end of its block") from None
    return tuple(pairs)


# --- Reason Phrase -------------------------------------------------------------------------------

def push_reason_phrase(writer: Writer, reason: str, limit: int = MAX_REASON_PHRASE_LENGTH) -> None:
    data = reason.encode("utf-8")
    if len(data) > limit:
        raise ValueError(f"Reason Phrase longer than {limit} octets")
    writer.push_length_prefixed(data)


def pull_reason_phrase(reader: Reader, limit: int = MAX_REASON_PHRASE_LENGTH) -> str:
    """UTF-8 diagnostic text; undecodable octets are replaced (the text carries no semantics).

    A replacement character is three octets, so the text is cut to re-encode within ``limit``: a relay
    passes a peer's reason on (SUBSCRIBE_ERROR, PUBLISH_DONE), and what it read must be sendable again.
    """
    text = str(reader.pull_length_prefixed(limit, "Reason Phrase"), "utf-8", "replace")
    encoded = text.encode("utf-8")
    return text if len(encoded) <= limit else encoded[:limit].decode("utf-8", "ignore")
