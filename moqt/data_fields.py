"""Object fields shared by the data-stream and datagram codecs of ``moqt.data``: Object Status,
Extension Headers, the checks on both, and draft-16's fetch-object Serialization Flags.

Why apart from ``moqt.data``: these are pure functions of octets and a profile, with no parser state;
``moqt.data`` keeps the streams, their state and the payloads. Draft-14 writes every field of a
fetched object; draft-16 starts each with Serialization Flags saying which fields are present and
which repeat (or follow) the prior object's, and adds End of Range markers (``FetchRangeEnd``);
``moqt.data`` picks that layout when the profile's ``data_framing.fetch_serialization_flags`` says so.
Draft-18 keeps the flags but writes Group and Object IDs as deltas from the prior object's (the
group's direction the FETCH's group order; ``pull_delta_fields`` / ``push_delta_fields``), and adds
padding streams and datagrams and the control stream among the unidirectional stream types
(``uni_stream_kind``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, TypeAlias

from moqt.errors import NeedMoreData, ProtocolViolation
from moqt.kinds import ObjectStatus, SessionError
from moqt.profiles import Profile
from moqt.profiles.base import DataFraming
from moqt.wire import (
    VARINT_MAX,
    Bytes,
    KeyValuePair,
    Reader,
    Vi64Writer,
    Writer,
    decode_kvp_block,
    decode_vi64,
    encode_varint,
)

_PV: Final = SessionError.PROTOCOL_VIOLATION

Extensions: TypeAlias = tuple[KeyValuePair, ...]
Payload: TypeAlias = bytes | bytearray | memoryview


# --- Object Status and Extension Headers ------------------------------------------------------------

def pull_status(reader: Reader, profile: Profile) -> ObjectStatus:
    raw = reader.pull_varint()
    status = profile.object_statuses.name(raw)
    if status is None:
        raise ProtocolViolation(_PV, f"unknown Object Status {raw}")
    return status


def pull_extensions(reader: Reader, limit: int, delta: bool, vi64: bool = False) -> Extensions:
    length = reader.pull_length(limit, "Extension Headers")
    return decode_kvp_block(reader.pull_bytes(length), delta=delta, vi64=vi64)


def pull_length_and_status(reader: Reader, limit: int, profile: Profile) -> tuple[int, ObjectStatus]:
    length = reader.pull_length(limit, "Object Payload")
    return length, (pull_status(reader, profile) if length == 0 else ObjectStatus.NORMAL)


def check_status_extensions(status: ObjectStatus, extensions: Extensions, framing: DataFraming) -> None:
    if extensions and (status == ObjectStatus.DOES_NOT_EXIST
                       or (status != ObjectStatus.NORMAL and not framing.status_objects_extensions)):
        raise ProtocolViolation(_PV, f"an Object of status {status.value} carries Extension Headers")


def check_object(payload: Payload, extensions: Sequence[KeyValuePair], status: ObjectStatus) -> None:
    check_length_status(len(payload), extensions, status)


def check_length_status(length: int, extensions: Sequence[KeyValuePair], status: ObjectStatus,
                         framing: DataFraming | None = None) -> None:
    if length < 0 or length > VARINT_MAX:
        raise ValueError(f"payload length {length} out of range")
    if status != ObjectStatus.NORMAL and length:
        raise ValueError("only a Normal object has a payload")
    if status == ObjectStatus.DOES_NOT_EXIST and extensions:
        raise ValueError("an Object that does not exist cannot carry Extension Headers")
    if framing is not None and extensions and status != ObjectStatus.NORMAL and not framing.status_objects_extensions:
        raise ValueError("this draft allows Extension Headers only on Normal objects")


def varint(value: int) -> bytes:
    """Minimal QUIC varint (as ``moqt.wire.encode_varint``), without its table look-up and copies."""
    if value < 0x40:
        return bytes((value,)) if value >= 0 else encode_varint(value)
    if value < 0x4000:
        return (value | 0x4000).to_bytes(2, "big")
    if value < 0x40000000:
        return (value | 0x80000000).to_bytes(4, "big")
    return (value | 0xC000000000000000).to_bytes(8, "big") if value <= VARINT_MAX else encode_varint(value)


def check_no_object_open(remaining: int) -> None:
    if remaining:
        raise ValueError(f"the object begun still owes {remaining} payload octets")


def take_part(remaining: int, part: Payload) -> int:
    size = len(part) if not isinstance(part, memoryview) else part.nbytes
    if size > remaining:
        raise ValueError(f"a payload part of {size} octets exceeds the {remaining} the object still owes")
    return remaining - size


def push_length_status(head: Writer, length: int, status: ObjectStatus, profile: Profile) -> None:
    head.push_varint(length)
    if not length:
        head.push_varint(profile.object_statuses.code(status))



# --- draft-16 fetch objects: Serialization Flags ----------------------------------------------------

SUBGROUP_MASK: Final = 0x03  # 0 zero, 1 prior's, 2 prior's plus one, 3 present
SUBGROUP_ZERO: Final = 0x00
SUBGROUP_PRIOR: Final = 0x01
SUBGROUP_NEXT: Final = 0x02
SUBGROUP_PRESENT: Final = 0x03
OBJECT_ID_PRESENT: Final = 0x04
GROUP_ID_PRESENT: Final = 0x08
PRIORITY_PRESENT: Final = 0x10
EXTENSIONS_PRESENT: Final = 0x20
DATAGRAM: Final = 0x40
END_OF_NON_EXISTENT_RANGE: Final = 0x8C
END_OF_UNKNOWN_RANGE: Final = 0x10C


@dataclass(frozen=True, slots=True)
class FetchRangeEnd:
    """An End of Range marker: the objects after the previous one, up to and including
    (``group_id``, ``object_id``), do not exist (``unknown`` False) or have unknown status (True)."""

    group_id: int
    object_id: int
    unknown: bool


class FetchPrior(NamedTuple):
    """What the previous object on the stream said, for the flags that refer to it (None: nothing yet).

    An End of Range marker is the prior of the next object's Group and Object IDs only: its Subgroup ID
    and priority stay the last real object's (draft-22 says so; draft-16 is silent).
    """

    group_id: int | None = None
    subgroup_id: int | None = None
    object_id: int | None = None
    priority: int | None = None


class FetchFields(NamedTuple):
    """A fetched object's fields before its extensions and payload length."""

    group_id: int
    subgroup_id: int
    object_id: int
    priority: int
    extensions_present: bool
    datagram: bool


def _prior(value: int | None, what: str) -> int:
    if value is None:
        raise ProtocolViolation(_PV, f"the first fetched object refers to a prior object's {what}")
    return value


def pull_flagged_fields(reader: Reader, prior: FetchPrior) -> FetchFields | FetchRangeEnd:
    """Serialization Flags and the fields they say are present; any other flags value is refused."""
    flags = reader.pull_varint()
    if flags in (END_OF_NON_EXISTENT_RANGE, END_OF_UNKNOWN_RANGE):
        return FetchRangeEnd(reader.pull_varint(), reader.pull_varint(), flags == END_OF_UNKNOWN_RANGE)
    if flags >= 0x80:
        raise ProtocolViolation(_PV, f"fetch object Serialization Flags 0x{flags:x}")
    group = reader.pull_varint() if flags & GROUP_ID_PRESENT else _prior(prior.group_id, "Group ID")
    mode = flags & SUBGROUP_MASK
    if flags & DATAGRAM:  # no Subgroup ID; "the subscriber MUST ignore the bits"
        subgroup = 0
    elif mode == SUBGROUP_PRESENT:
        subgroup = reader.pull_varint()
    elif mode == SUBGROUP_ZERO:
        subgroup = 0
    else:
        subgroup = _prior(prior.subgroup_id, "Subgroup ID") + (mode == SUBGROUP_NEXT)
    object_id = reader.pull_varint() if flags & OBJECT_ID_PRESENT else _prior(prior.object_id, "Object ID") + 1
    priority = reader.pull_uint8() if flags & PRIORITY_PRESENT else _prior(prior.priority, "priority")
    if subgroup > VARINT_MAX or object_id > VARINT_MAX:
        raise ProtocolViolation(_PV, "a fetched object's Subgroup or Object ID overflows")
    datagram = bool(flags & DATAGRAM)
    if datagram:  # the draft-14 convention for a datagram's Subgroup ID, kept for the application
        subgroup = object_id
    return FetchFields(group, subgroup, object_id, priority, bool(flags & EXTENSIONS_PRESENT), datagram)


def push_flagged_fields(writer: Writer, prior: FetchPrior, fields: FetchFields) -> None:
    """The shortest Serialization Flags for ``fields`` after ``prior``, then the fields they keep."""
    flags = EXTENSIONS_PRESENT if fields.extensions_present else 0
    group = object_id = None
    if fields.group_id != prior.group_id:
        flags |= GROUP_ID_PRESENT
        group = fields.group_id
    if prior.object_id is None or fields.object_id != prior.object_id + 1 or group is not None:
        flags |= OBJECT_ID_PRESENT  # a new group's first object is written out, as aiomoqt reads it
        object_id = fields.object_id
    _push_flags_and_fields(writer, flags, prior, fields, group=group, object_id=object_id)


def push_range_end(writer: Writer, end: FetchRangeEnd) -> None:
    writer.push_varint(END_OF_UNKNOWN_RANGE if end.unknown else END_OF_NON_EXISTENT_RANGE)
    writer.push_varint(end.group_id)
    writer.push_varint(end.object_id)


def after(prior: FetchPrior, item: FetchFields | FetchRangeEnd) -> FetchPrior:
    """The prior for the next object."""
    if isinstance(item, FetchRangeEnd):
        return prior._replace(group_id=item.group_id, object_id=item.object_id)
    # a datagram has no Subgroup ID: the next object's "prior Subgroup ID" reads 0 (as aiomoqt reads it)
    return FetchPrior(item.group_id, 0 if item.datagram else item.subgroup_id, item.object_id, item.priority)


# --- draft-18 fetch objects: Group and Object ID deltas -----------------------------------------------

def pull_delta_fields(reader: Reader, prior: FetchPrior, descending: bool) -> FetchFields | FetchRangeEnd:
    """Draft-18 Serialization Flags and fields: the first object carries both IDs absolute, later
    ones a Group ID Delta (+1, down for a descending fetch; the Object ID then absolute) or an Object
    ID Delta from the prior object's; an End of Range carries both IDs absolute."""
    flags = reader.pull_varint()
    if flags in (END_OF_NON_EXISTENT_RANGE, END_OF_UNKNOWN_RANGE):
        return FetchRangeEnd(reader.pull_varint(), reader.pull_varint(), flags == END_OF_UNKNOWN_RANGE)
    if flags >= 0x80:
        raise ProtocolViolation(_PV, f"fetch object Serialization Flags 0x{flags:x}")
    first = prior.group_id is None
    if first and (flags & (GROUP_ID_PRESENT | OBJECT_ID_PRESENT)) != GROUP_ID_PRESENT | OBJECT_ID_PRESENT:
        raise ProtocolViolation(_PV, "the first fetched object lacks its Group ID or Object ID")
    group = _prior(prior.group_id, "Group ID") if not flags & GROUP_ID_PRESENT else _group(
        reader.pull_varint(), prior.group_id, descending)
    new_group = bool(flags & GROUP_ID_PRESENT)
    mode = flags & SUBGROUP_MASK
    if flags & DATAGRAM or mode == SUBGROUP_ZERO:
        subgroup = 0
    elif mode == SUBGROUP_PRESENT:
        subgroup = reader.pull_varint()
    else:
        subgroup = _prior(prior.subgroup_id, "Subgroup ID") + (mode == SUBGROUP_NEXT)
    if flags & OBJECT_ID_PRESENT:
        delta = reader.pull_varint()
        object_id = delta if new_group else _prior(prior.object_id, "Object ID") + delta
    else:
        object_id = _prior(prior.object_id, "Object ID") + 1
    priority = reader.pull_uint8() if flags & PRIORITY_PRESENT else _prior(prior.priority, "priority")
    if subgroup > VARINT_MAX or object_id > VARINT_MAX:
        raise ProtocolViolation(_PV, "a fetched object's Subgroup or Object ID overflows")
    datagram = bool(flags & DATAGRAM)
    return FetchFields(group, object_id if datagram else subgroup, object_id, priority,
                       bool(flags & EXTENSIONS_PRESENT), datagram)


def _group(delta: int, prior: int | None, descending: bool) -> int:
    if prior is None:
        return delta
    group = prior - delta - 1 if descending else prior + delta + 1
    if not 0 <= group <= VARINT_MAX:
        raise ProtocolViolation(_PV, "a fetched object's Group ID Delta leaves the Group ID range")
    return group


def push_delta_fields(writer: Writer, prior: FetchPrior, fields: FetchFields, descending: bool) -> None:
    """The draft-18 flags and fields of ``fields`` after ``prior`` (a new group's IDs written whole,
    as aiomoqt writes them); objects must follow the fetch's group order, IDs ascending in a group."""
    flags = EXTENSIONS_PRESENT if fields.extensions_present else 0
    group = object_id = None
    if prior.group_id is None or fields.group_id != prior.group_id:
        flags |= GROUP_ID_PRESENT | OBJECT_ID_PRESENT
        group, object_id = fields.group_id, fields.object_id
        if prior.group_id is not None:
            group = prior.group_id - fields.group_id - 1 if descending else fields.group_id - prior.group_id - 1
            if group < 0:
                raise ValueError(f"group {fields.group_id} does not follow {prior.group_id} in the fetch's order")
    elif prior.object_id is None or fields.object_id != prior.object_id + 1:
        object_id = fields.object_id - (prior.object_id or 0)
        if object_id < 0:
            raise ValueError(f"object {fields.object_id} does not follow {prior.object_id} in its group")
        flags |= OBJECT_ID_PRESENT
    _push_flags_and_fields(writer, flags, prior, fields, group=group, object_id=object_id)


def _push_flags_and_fields(writer: Writer, flags: int, prior: FetchPrior, fields: FetchFields, *,
                           group: int | None, object_id: int | None) -> None:
    """Add the priority and subgroup flags to ``flags`` (Group / Object ID ones already set), then write
    the flags and the fields they keep: ``group`` and ``object_id`` as given (absolute or deltas)."""
    if fields.priority != prior.priority:
        flags |= PRIORITY_PRESENT
    flags, subgroup = _subgroup_flags(flags, prior, fields)
    writer.push_varint(flags)
    for value in (group, subgroup, object_id):
        if value is not None:
            writer.push_varint(value)
    if flags & PRIORITY_PRESENT:
        writer.push_uint8(fields.priority)


def _subgroup_flags(flags: int, prior: FetchPrior, fields: FetchFields) -> tuple[int, int | None]:
    if fields.datagram:
        return flags | DATAGRAM, None
    if fields.subgroup_id == 0:
        return flags | SUBGROUP_ZERO, None
    if fields.subgroup_id == prior.subgroup_id:
        return flags | SUBGROUP_PRIOR, None
    if prior.subgroup_id is not None and fields.subgroup_id == prior.subgroup_id + 1:
        return flags | SUBGROUP_NEXT, None
    return flags | SUBGROUP_PRESENT, fields.subgroup_id


# --- draft-18 unidirectional stream types and padding -----------------------------------------------

class UniStreamKind(enum.Enum):
    """What a unidirectional stream is, by its first varint (draft-18 adds two kinds)."""

    DATA = "DATA"  # a subgroup or fetch stream: ``moqt.data.DataStreamParser``
    CONTROL = "CONTROL"  # draft-18: the peer's control stream, beginning with SETUP
    PADDING = "PADDING"  # draft-18: zeros to discard


def uni_stream_kind(data: Bytes, profile: Profile) -> UniStreamKind | None:
    """The kind of the unidirectional stream that begins with ``data`` (None: its type is not all
    there yet); an unknown type closes the session. Draft-14/16 streams are all data streams."""
    framing = profile.data_framing
    if framing.control_stream_type is None and framing.padding_stream_type is None:
        return UniStreamKind.DATA
    try:
        stream_type, _ = decode_vi64(data) if profile.layout.vi64 else _decode_quic(data)
    except NeedMoreData:
        return None
    if stream_type == framing.control_stream_type:
        return UniStreamKind.CONTROL
    if stream_type == framing.padding_stream_type:
        return UniStreamKind.PADDING
    if stream_type == framing.fetch_header or stream_type in framing.subgroup_types:
        return UniStreamKind.DATA
    raise ProtocolViolation(_PV, f"unknown unidirectional stream type 0x{stream_type:x}")


def _decode_quic(data: Bytes) -> tuple[int, int]:
    reader = Reader(data)
    return reader.pull_varint(), reader.pos


def is_padding_datagram(data: Bytes, profile: Profile) -> bool:
    """Whether a datagram is draft-18 padding (to be discarded whole)."""
    kind = profile.data_framing.padding_datagram_type
    if kind is None or not len(data):
        return False
    try:
        return decode_vi64(data)[0] == kind
    except NeedMoreData:
        return False


def encode_padding_stream_type(profile: Profile) -> bytes:
    """The first octets of a padding stream (zeros follow, as many as the sender likes)."""
    return _padding_type(profile.data_framing.padding_stream_type, profile)


def encode_padding_datagram(size: int, profile: Profile) -> bytes:
    """A padding datagram of ``size`` octets in all (its type then zeros)."""
    head = _padding_type(profile.data_framing.padding_datagram_type, profile)
    if size < len(head):
        raise ValueError(f"a padding datagram is at least {len(head)} octets")
    return head + bytes(size - len(head))


def _padding_type(kind: int | None, profile: Profile) -> bytes:
    if kind is None:
        raise ValueError(f"draft-{profile.draft} has no padding")
    writer = Vi64Writer()
    writer.push_varint(kind)
    return writer.getvalue()
