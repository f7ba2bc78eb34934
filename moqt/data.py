"""MOQT data streams and datagrams (draft-14 section 10): headers, object fields, parsers, encoders.

The stream and datagram type code points come from the profile's ``data_framing`` table (read once
per parser or writer), as do draft-16's changes: types without a Publisher Priority (the
subscription's applies), delta-coded extension types, no extensions on status objects, and fetch
objects led by Serialization Flags (``moqt.data_fields``); and draft-18's: vi64 integers (the
profile's reader and writer), the FIRST_OBJECT subgroup bit, delta-coded fetch IDs (whose direction
is the FETCH's group order: ``fetch_order``), padding streams and datagrams (``uni_stream_kind``).

Why this shape:

* Parsing is incremental and allocation-light: ``DataStreamParser.feed`` returns the stream header,
  each object header, and payload chunks that are ``memoryview`` slices of the octets it was given.
  Only the (small, bounded) header octets that straddle two QUIC events are ever buffered.
* Encoding never copies a payload: ``SubgroupWriter.encode_object`` and ``FetchWriter.encode_object``
  return ``[header_bytes, payload]`` so the caller hands the payload object straight to QUIC.
* Every length from the wire is bounded before anything waits on it: ``max_object_size`` for
  payloads, ``max_extensions_length`` for Extension Headers; any header is at most 64 octets plus the
  extensions, so a straddling header never makes us buffer more than that.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from moqt.data_fields import (
    Extensions,
    FetchFields,
    FetchPrior,
    FetchRangeEnd,
    Payload,
    UniStreamKind,
    after,
    check_length_status,
    check_no_object_open,
    check_object,
    check_status_extensions,
    encode_padding_datagram,
    encode_padding_stream_type,
    is_padding_datagram,
    pull_delta_fields,
    pull_extensions,
    pull_flagged_fields,
    pull_length_and_status,
    pull_status,
    push_delta_fields,
    push_flagged_fields,
    push_length_status,
    push_range_end,
    take_part,
    uni_stream_kind,
    varint,
)
from moqt.errors import NeedMoreData, ProtocolViolation
from moqt.kinds import GroupOrder, ObjectStatus, SessionError, SubgroupIdMode
from moqt.profiles import DRAFT_14, Profile
from moqt.profiles.base import DatagramForm, SubgroupForm
from moqt.wire import VARINT_MAX, Bytes, KeyValuePair, Reader, Vi64Reader, encode_kvps, make_reader, make_writer

DEFAULT_MAX_OBJECT_SIZE: Final = 64 * 1024 * 1024
DEFAULT_MAX_EXTENSIONS_LENGTH: Final = 16 * 1024
_HEADER_SLACK: Final = 64  # every fixed header field of any stream or object header fits in this
DEFAULT_PUBLISHER_PRIORITY: Final = 128  # a default-priority header's, until the track says otherwise
_PV: Final = SessionError.PROTOCOL_VIOLATION

__all__ = [  # with the value types of moqt.data_fields that the codecs' users name
    "DEFAULT_MAX_EXTENSIONS_LENGTH", "DEFAULT_MAX_OBJECT_SIZE", "DEFAULT_PUBLISHER_PRIORITY", "DataEvent",
    "DataStreamParser", "Extensions", "FetchHeader", "FetchRangeEnd", "FetchWriter", "ObjectDatagram",
    "ObjectHeader", "Payload", "PayloadChunk", "StreamFinished", "StreamHeader", "SubgroupHeader", "SubgroupWriter",
    "UniStreamKind", "encode_padding_datagram", "encode_padding_stream_type", "is_padding_datagram", "uni_stream_kind",
]


@dataclass(frozen=True, slots=True)
class SubgroupHeader:
    """SUBGROUP_HEADER (its type, one of the profile's ``subgroup_types``, says the three flags).

    ``subgroup_id`` is 0 for mode ZERO; for FIRST_OBJECT it is None when decoded (the first object's
    ID supplies it) and, when encoding, the ID the first object must carry (or None: unchecked).
    ``default_priority`` (draft-16): the header has no Publisher Priority; decoded, the priority
    reads 128 (the track's DEFAULT_PUBLISHER_PRIORITY is not applied yet). ``first_object``
    (draft-18): the stream's first object is the subgroup's first.
    """

    track_alias: int
    group_id: int
    subgroup_id: int | None
    publisher_priority: int = 128
    subgroup_id_mode: SubgroupIdMode = SubgroupIdMode.PRESENT
    extensions_present: bool = False
    end_of_group: bool = False
    default_priority: bool = False
    first_object: bool = False

    def __post_init__(self) -> None:
        if self.subgroup_id_mode == SubgroupIdMode.ZERO and self.subgroup_id != 0:
            raise ValueError("Subgroup ID mode ZERO needs subgroup_id 0")
        if self.subgroup_id_mode == SubgroupIdMode.PRESENT and self.subgroup_id is None:
            raise ValueError("Subgroup ID mode PRESENT needs a subgroup_id")
        if not 0 <= self.publisher_priority <= 0xFF:
            raise ValueError("Publisher Priority is 8 bits")

    @classmethod
    def create(cls, track_alias: int, group_id: int, subgroup_id: int = 0, publisher_priority: int = 128, *,
               extensions_present: bool = False, end_of_group: bool = False,
               default_priority: bool = False, first_object: bool = False) -> SubgroupHeader:
        """The shortest type: Subgroup ID 0 is implied, any other is written out."""
        mode = SubgroupIdMode.ZERO if subgroup_id == 0 else SubgroupIdMode.PRESENT
        return cls(track_alias, group_id, subgroup_id, publisher_priority, mode, extensions_present, end_of_group,
                   default_priority, first_object)

    def stream_type(self, profile: Profile = DRAFT_14) -> int:
        form = SubgroupForm(self.subgroup_id_mode, self.extensions_present, self.end_of_group, self.default_priority,
                            self.first_object)
        code = profile.data_framing.subgroup_codes.get(form)
        if code is None:
            raise ValueError(f"draft-{profile.draft} has no subgroup stream type for {form}")
        return code

    def encode(self, profile: Profile = DRAFT_14) -> bytes:
        writer = make_writer(profile.layout.vi64)
        writer.push_varint(self.stream_type(profile))
        writer.push_varint(self.track_alias)
        writer.push_varint(self.group_id)
        if self.subgroup_id_mode == SubgroupIdMode.PRESENT and self.subgroup_id is not None:
            writer.push_varint(self.subgroup_id)
        if not self.default_priority:
            writer.push_uint8(self.publisher_priority)
        return writer.getvalue()

    @classmethod
    def decode_after_type(cls, reader: Reader, form: SubgroupForm) -> SubgroupHeader:
        mode = form.subgroup_id_mode
        alias = reader.pull_varint()
        group = reader.pull_varint()
        subgroup: int | None = None
        if mode == SubgroupIdMode.PRESENT:
            subgroup = reader.pull_varint()
        elif mode == SubgroupIdMode.ZERO:
            subgroup = 0
        priority = DEFAULT_PUBLISHER_PRIORITY if form.default_priority else reader.pull_uint8()
        return cls(alias, group, subgroup, priority, mode, form.extensions_present, form.end_of_group,
                   form.default_priority, form.first_object)


@dataclass(frozen=True, slots=True)
class FetchHeader:
    """FETCH_HEADER: the Request ID of the FETCH this stream answers."""

    request_id: int

    def encode(self, profile: Profile = DRAFT_14) -> bytes:
        writer = make_writer(profile.layout.vi64)
        writer.push_varint(profile.data_framing.fetch_header)
        writer.push_varint(self.request_id)
        return writer.getvalue()


StreamHeader: TypeAlias = SubgroupHeader | FetchHeader


@dataclass(frozen=True, slots=True)
class ObjectHeader:
    """An object's fields as parsed from a subgroup or fetch stream (Object ID delta resolved).

    ``payload_length`` octets follow as ``PayloadChunk`` events; a length of 0 means this header is
    the whole object and no chunk follows.
    """

    group_id: int
    subgroup_id: int
    object_id: int
    publisher_priority: int
    extensions: Extensions
    status: ObjectStatus
    payload_length: int


@dataclass(frozen=True, slots=True)
class PayloadChunk:
    """Part of the current object's payload: a view of the fed octets, at ``offset`` in the payload."""

    data: memoryview
    offset: int
    end_of_object: bool


@dataclass(frozen=True, slots=True)
class StreamFinished:
    """The stream ended (FIN) at an object boundary."""


#: ``FetchRangeEnd`` (draft-16) comes only on a fetch stream: objects known absent or unknown.
DataEvent: TypeAlias = SubgroupHeader | FetchHeader | ObjectHeader | PayloadChunk | StreamFinished | FetchRangeEnd


class DataStreamParser:
    """Incremental parser of one unidirectional data stream (subgroup or fetch)."""

    def __init__(self, *, max_object_size: int = DEFAULT_MAX_OBJECT_SIZE,
                 max_extensions_length: int = DEFAULT_MAX_EXTENSIONS_LENGTH, profile: Profile = DRAFT_14,
                 fetch_order: Callable[[int], GroupOrder] | None = None) -> None:
        """``fetch_order`` (draft-18): the group order of the FETCH a fetch stream answers, asked with
        its Request ID once the header is read (the Group ID deltas run that way); None: ascending."""
        self._profile = profile
        self._reader: type[Reader] = Vi64Reader if profile.layout.vi64 else Reader
        self._vi64 = profile.layout.vi64
        self._fetch_order = fetch_order
        self._descending = False
        framing = profile.data_framing  # read once: a stream's header is parsed at most once per parser
        self._framing = framing
        self._fetch_header = framing.fetch_header
        self._subgroup_types = framing.subgroup_types
        self._delta = profile.layout.kvp_delta_types
        self._fetch_prior = FetchPrior()
        self._fetch_parsed: FetchFields | FetchRangeEnd | None = None  # the last parse, for _commit
        self._max_object = max_object_size
        self._max_ext = max_extensions_length
        self._max_header = _HEADER_SLACK + max_extensions_length
        self._pending = bytearray()
        self._need = 0
        self.header: StreamHeader | None = None
        self._subgroup_id: int | None = None
        self._prev_object_id: int | None = None
        self._ended_by_status = False
        self._remaining = 0
        self._offset = 0
        self.finished = False

    def feed(self, data: Bytes, end_stream: bool = False) -> list[DataEvent]:
        """Parse ``data``; with ``end_stream`` the stream must end at an object boundary."""
        if self.finished:
            raise ProtocolViolation(_PV, "data after the end of a data stream")
        view = memoryview(data).cast("B") if len(data) else memoryview(b"")
        events: list[DataEvent] = []
        pos = 0
        while pos < len(view):
            if self._remaining:
                pos = self._take_payload(view, pos, events)
                continue
            parse = self._parse_stream_header if self.header is None else self._parse_object
            taken = self._take_header(view, pos, parse)
            if taken is None:
                break
            event, pos = taken
            self._commit(event)
            events.append(event)
        if end_stream:
            if self.header is None or self._pending or self._remaining:
                raise ProtocolViolation(_PV, "data stream ended inside a header or an object")
            self.finished = True
            events.append(StreamFinished())
        return events

    def _take_payload(self, view: memoryview, pos: int, events: list[DataEvent]) -> int:
        count = min(self._remaining, len(view) - pos)
        self._remaining -= count
        events.append(PayloadChunk(view[pos : pos + count], self._offset, self._remaining == 0))
        self._offset += count
        return pos + count

    def _take_header(self, view: memoryview, pos: int,
                     parse: Callable[[Reader], DataEvent]) -> tuple[DataEvent, int] | None:
        """Parse one header from buffered octets plus ``view[pos:]``, buffering only header octets."""
        old = len(self._pending)
        available = len(view) - pos
        if old + available < self._need:  # still short of what the last attempt asked for
            self._pending += view[pos:]
            return None
        if not self._pending:
            reader = self._reader(view[pos:])
            try:
                return parse(reader), pos + reader.pos
            except NeedMoreData as short:
                self._wait(view[pos:], short.at_least)
                return None
        take = min(available, self._max_header - old)
        self._pending += view[pos : pos + take]
        reader = self._reader(bytes(self._pending))
        try:
            event = parse(reader)
        except NeedMoreData as short:
            self._wait(view[0:0], short.at_least)
            return None
        self._pending.clear()
        self._need = 0
        return event, pos + reader.pos - old

    def _wait(self, rest: memoryview, at_least: int) -> None:
        """Keep the partial header and remember how long it must grow before the next attempt."""
        if at_least > self._max_header:
            raise ProtocolViolation(_PV, "data stream header too long")
        self._pending += rest
        self._need = at_least

    def _parse_stream_header(self, reader: Reader) -> DataEvent:
        stream_type = reader.pull_varint()
        if stream_type == self._fetch_header:
            return FetchHeader(reader.pull_varint())
        form = self._subgroup_types.get(stream_type)
        if form is None:
            raise ProtocolViolation(_PV, f"unknown data stream type 0x{stream_type:x}")
        return SubgroupHeader.decode_after_type(reader, form)

    def _parse_object(self, reader: Reader) -> DataEvent:
        header = self.header
        if isinstance(header, SubgroupHeader):
            return self._parse_subgroup_object(reader, header)
        if self._framing.fetch_serialization_flags:
            return self._parse_flagged_fetch_object(reader)
        group, subgroup, object_id = reader.pull_varint(), reader.pull_varint(), reader.pull_varint()
        priority = reader.pull_uint8()
        extensions = pull_extensions(reader, self._max_ext, self._delta, self._vi64)
        length, status = pull_length_and_status(reader, self._max_object, self._profile)
        check_status_extensions(status, extensions, self._framing)
        return ObjectHeader(group, subgroup, object_id, priority, extensions, status, length)

    def _parse_flagged_fetch_object(self, reader: Reader) -> DataEvent:
        """Draft-16: Serialization Flags, the fields they keep, and no Object Status (length 0 is an
        empty Normal object)."""
        if self._framing.fetch_id_deltas:
            item = pull_delta_fields(reader, self._fetch_prior, self._descending)
        else:
            item = pull_flagged_fields(reader, self._fetch_prior)
        self._fetch_parsed = item
        if isinstance(item, FetchRangeEnd):
            return item
        extensions = pull_extensions(reader, self._max_ext, self._delta, self._vi64) if item.extensions_present else ()
        length = reader.pull_length(self._max_object, "Object Payload")
        return ObjectHeader(item.group_id, item.subgroup_id, item.object_id, item.priority, extensions,
                            ObjectStatus.NORMAL, length)

    def _parse_subgroup_object(self, reader: Reader, header: SubgroupHeader) -> ObjectHeader:
        if self._ended_by_status:
            raise ProtocolViolation(_PV, "object after End of Group / End of Track on a subgroup stream")
        delta = reader.pull_varint()
        object_id = delta if self._prev_object_id is None else self._prev_object_id + delta + 1
        if object_id > VARINT_MAX:
            raise ProtocolViolation(_PV, "Object ID overflows")
        extensions: Extensions = ()
        if header.extensions_present:
            extensions = pull_extensions(reader, self._max_ext, self._delta, self._vi64)
        length, status = pull_length_and_status(reader, self._max_object, self._profile)
        check_status_extensions(status, extensions, self._framing)
        subgroup = self._subgroup_id if self._subgroup_id is not None else header.subgroup_id
        return ObjectHeader(header.group_id, object_id if subgroup is None else subgroup, object_id,
                            header.publisher_priority, extensions, status, length)

    def _commit(self, event: DataEvent) -> None:
        """Apply a parsed header to the parser state (parses are retried, so they do not mutate)."""
        if self._fetch_parsed is not None and isinstance(event, ObjectHeader | FetchRangeEnd):
            self._fetch_prior = after(self._fetch_prior, self._fetch_parsed)
            self._fetch_parsed = None
        if isinstance(event, SubgroupHeader | FetchHeader):
            self.header = event
            if isinstance(event, SubgroupHeader):
                self._subgroup_id = event.subgroup_id
            elif self._fetch_order is not None:
                self._descending = self._fetch_order(event.request_id) is GroupOrder.DESCENDING
        elif isinstance(event, ObjectHeader):
            if isinstance(self.header, SubgroupHeader):
                self._prev_object_id = event.object_id
                self._subgroup_id = event.subgroup_id
                self._ended_by_status = event.status in (ObjectStatus.END_OF_GROUP, ObjectStatus.END_OF_TRACK)
            self._remaining = event.payload_length
            self._offset = 0


@dataclass(slots=True)
class SubgroupWriter:
    """Encodes the objects of one subgroup stream, tracking the previous Object ID for the deltas.

    An object is encoded whole (``encode_object``) or as its fields first (``encode_object_header``
    with the payload length) and then its payload in parts (``payload_part``): what a relay needs to
    pass an object on while it is still arriving. ``remaining`` is what the object begun still owes.
    """

    header: SubgroupHeader
    profile: Profile = DRAFT_14
    _prev_object_id: int | None = field(default=None, init=False)
    remaining: int = field(default=0, init=False)

    def encode_header(self) -> bytes:
        return self.header.encode(self.profile)

    def encode_object(self, object_id: int, payload: Payload = b"", *, extensions: Sequence[KeyValuePair] = (),
                      status: ObjectStatus = ObjectStatus.NORMAL) -> list[Payload]:
        """Object fields then the payload itself (not copied); Object IDs must increase."""
        check_object(payload, extensions, status)
        head = self.encode_object_header(object_id, len(payload), extensions=extensions, status=status)
        self.remaining = 0
        return [head, payload] if len(payload) else [head]

    def encode_object_header(self, object_id: int, payload_length: int, *, extensions: Sequence[KeyValuePair] = (),
                             status: ObjectStatus = ObjectStatus.NORMAL) -> bytes:
        """The object's fields for a payload of ``payload_length`` octets that follows in parts."""
        check_no_object_open(self.remaining)
        prev = self._prev_object_id
        if prev is not None and object_id <= prev:
            raise ValueError(f"Object ID {object_id} does not follow {prev} on this subgroup stream")
        if prev is None and self.header.subgroup_id_mode == SubgroupIdMode.FIRST_OBJECT \
                and self.header.subgroup_id not in (None, object_id):
            raise ValueError("the first Object ID must equal the Subgroup ID in FIRST_OBJECT mode")
        if extensions and not self.header.extensions_present:
            raise ValueError("this subgroup's header type has no Extension Headers")
        check_length_status(payload_length, extensions, status, self.profile.data_framing)
        layout = self.profile.layout
        head = make_writer(layout.vi64)
        head.push_varint(object_id if prev is None else object_id - prev - 1)
        if self.header.extensions_present:
            head.push_length_prefixed(encode_kvps(list(extensions), delta=layout.kvp_delta_types, vi64=layout.vi64))
        push_length_status(head, payload_length, status, self.profile)
        self._prev_object_id = object_id
        self.remaining = payload_length
        return head.getvalue()

    def payload_part(self, part: Payload) -> Payload:
        """Account for the next part of the object begun; returns it (not copied)."""
        self.remaining = take_part(self.remaining, part)
        return part


@dataclass(slots=True)
class FetchWriter:
    """Encodes the objects of one fetch stream (whole, or fields then payload parts: see SubgroupWriter).

    Draft-16 fetch objects start with Serialization Flags (fields equal to the prior object's are left
    out) and carry no Object Status: a status other than Normal is refused, and ``encode_range_end``
    writes an End of Range marker instead.
    """

    header: FetchHeader
    profile: Profile = DRAFT_14
    group_order: GroupOrder = GroupOrder.ASCENDING
    remaining: int = field(default=0, init=False)
    _prior: FetchPrior = field(default_factory=FetchPrior, init=False)

    def encode_header(self) -> bytes:
        return self.header.encode(self.profile)

    def encode_object(self, group_id: int, subgroup_id: int, object_id: int, payload: Payload = b"", *,
                      publisher_priority: int = 128, extensions: Sequence[KeyValuePair] = (),
                      status: ObjectStatus = ObjectStatus.NORMAL) -> list[Payload]:
        check_object(payload, extensions, status)
        head = self.encode_object_header(group_id, subgroup_id, object_id, len(payload),
                                         publisher_priority=publisher_priority, extensions=extensions, status=status)
        self.remaining = 0
        return [head, payload] if len(payload) else [head]

    def encode_object_header(self, group_id: int, subgroup_id: int, object_id: int, payload_length: int, *,
                             publisher_priority: int = 128, extensions: Sequence[KeyValuePair] = (),
                             status: ObjectStatus = ObjectStatus.NORMAL) -> bytes:
        """The object's fields for a payload of ``payload_length`` octets that follows in parts."""
        check_no_object_open(self.remaining)
        check_length_status(payload_length, extensions, status, self.profile.data_framing)
        if not 0 <= publisher_priority <= 0xFF:
            raise ValueError("Publisher Priority is 8 bits")
        if self.profile.data_framing.fetch_serialization_flags:
            fields = FetchFields(group_id, subgroup_id, object_id, publisher_priority, bool(extensions), False)
            return self._flagged_header(fields, extensions, payload_length, status)
        # Built directly rather than through Writer: a relay writes one per object it passes on (hot path).
        ext = encode_kvps(list(extensions)) if extensions else b""
        parts = [varint(group_id), varint(subgroup_id), varint(object_id), bytes((publisher_priority,)),
                 varint(len(ext)), ext, varint(payload_length)]
        if not payload_length:
            parts.append(varint(self.profile.object_statuses.code(status)))
        self.remaining = payload_length
        return b"".join(parts)

    def _flagged_header(self, fields: FetchFields, extensions: Sequence[KeyValuePair], payload_length: int,
                        status: ObjectStatus) -> bytes:
        if status != ObjectStatus.NORMAL:
            raise ValueError(f"draft-{self.profile.draft} fetch objects carry no Object Status")
        layout = self.profile.layout
        head = make_writer(layout.vi64)
        if self.profile.data_framing.fetch_id_deltas:
            push_delta_fields(head, self._prior, fields, self.group_order is GroupOrder.DESCENDING)
        else:
            push_flagged_fields(head, self._prior, fields)
        if extensions:
            head.push_length_prefixed(encode_kvps(list(extensions), delta=layout.kvp_delta_types, vi64=layout.vi64))
        head.push_varint(payload_length)
        self._prior = after(self._prior, fields)
        self.remaining = payload_length
        return head.getvalue()

    def encode_range_end(self, group_id: int, object_id: int, *, unknown: bool = False) -> bytes:
        """Draft-16 End of Range: the objects after the last one sent, up to (group_id, object_id), do
        not exist (or, ``unknown``, have unknown status)."""
        check_no_object_open(self.remaining)
        if not self.profile.data_framing.fetch_serialization_flags:
            raise ValueError(f"draft-{self.profile.draft} has no End of Range marker")
        end = FetchRangeEnd(group_id, object_id, unknown)
        head = make_writer(self.profile.layout.vi64)
        push_range_end(head, end)
        self._prior = after(self._prior, end)
        return head.getvalue()

    def payload_part(self, part: Payload) -> Payload:
        """Account for the next part of the object begun; returns it (not copied)."""
        self.remaining = take_part(self.remaining, part)
        return part


@dataclass(frozen=True, slots=True)
class ObjectDatagram:
    """OBJECT_DATAGRAM, or its status form (its type, one of the profile's ``datagram_types``)."""

    track_alias: int
    group_id: int
    object_id: int
    publisher_priority: int = 128
    payload: bytes | memoryview = b""
    extensions: Extensions = ()
    status: ObjectStatus = ObjectStatus.NORMAL
    end_of_group: bool = False
    default_priority: bool = False  # draft-16: no Publisher Priority field (decoded: 128, as for subgroups)

    def __post_init__(self) -> None:
        check_object(self.payload, self.extensions, self.status)
        if self.status != ObjectStatus.NORMAL and self.end_of_group:
            raise ValueError("a status datagram has no End of Group flag (use status END_OF_GROUP)")

    def form_for(self, profile: Profile = DRAFT_14) -> DatagramForm:
        """The shortest form the profile has: an Object ID of 0 is left out where a form allows it
        (draft-14: only payload forms; draft-16: status forms too)."""
        status = self.status != ObjectStatus.NORMAL
        form = DatagramForm(bool(self.extensions), self.end_of_group, True, status, self.default_priority)
        short = form._replace(object_id_present=False)
        codes = profile.data_framing.datagram_codes
        if self.object_id == 0 and short in codes:
            return short
        if form not in codes:
            raise ValueError(f"draft-{profile.draft} has no datagram type for {form}")
        return form

    @property
    def form(self) -> DatagramForm:
        """The shortest draft-14 form."""
        return self.form_for(DRAFT_14)

    def datagram_type(self, profile: Profile = DRAFT_14) -> int:
        return profile.data_framing.datagram_codes[self.form_for(profile)]

    def encode(self, profile: Profile = DRAFT_14) -> bytes:
        form = self.form_for(profile)
        check_length_status(len(self.payload), self.extensions, self.status, profile.data_framing)
        layout = profile.layout
        writer = make_writer(layout.vi64)
        writer.push_varint(profile.data_framing.datagram_codes[form])
        writer.push_varint(self.track_alias)
        writer.push_varint(self.group_id)
        if form.object_id_present:
            writer.push_varint(self.object_id)
        if not form.default_priority:
            writer.push_uint8(self.publisher_priority)
        if self.extensions:
            writer.push_length_prefixed(encode_kvps(self.extensions, delta=layout.kvp_delta_types, vi64=layout.vi64))
        if form.status:
            writer.push_varint(profile.object_statuses.code(self.status))
        else:
            writer.push_bytes(self.payload)
        return writer.getvalue()

    @classmethod
    def decode(cls, data: Bytes, *, max_extensions_length: int = DEFAULT_MAX_EXTENSIONS_LENGTH,
               profile: Profile = DRAFT_14) -> ObjectDatagram:
        """Decode a whole datagram; the payload is a view of ``data`` (zero-copy). A draft-18 padding
        datagram is not one (``is_padding_datagram`` first): its type reads as unknown here."""
        reader = make_reader(data, profile.layout.vi64)
        try:
            return cls._decode(reader, max_extensions_length, profile)
        except NeedMoreData:
            raise ProtocolViolation(_PV, "truncated OBJECT_DATAGRAM") from None

    @classmethod
    def _decode(cls, reader: Reader, max_ext: int, profile: Profile) -> ObjectDatagram:
        kind = reader.pull_varint()
        form = profile.data_framing.datagram_types.get(kind)
        if form is None:
            raise ProtocolViolation(_PV, f"unknown datagram type 0x{kind:x}")
        alias, group = reader.pull_varint(), reader.pull_varint()
        object_id = reader.pull_varint() if form.object_id_present else 0
        priority = DEFAULT_PUBLISHER_PRIORITY if form.default_priority else reader.pull_uint8()
        extensions: Extensions = ()
        if form.extensions_present:
            extensions = pull_extensions(reader, max_ext, profile.layout.kvp_delta_types, profile.layout.vi64)
            if not extensions:
                raise ProtocolViolation(_PV, "datagram says Extensions Present with an empty block")
        if not form.status:
            payload = reader.pull_bytes(reader.remaining)
            return cls(alias, group, object_id, priority, payload, extensions, ObjectStatus.NORMAL, form.end_of_group,
                       form.default_priority)
        status = pull_status(reader, profile)
        if not reader.at_end():
            raise ProtocolViolation(_PV, "payload after an Object Status in a datagram")
        check_status_extensions(status, extensions, profile.data_framing)
        return cls(alias, group, object_id, priority, b"", extensions, status, default_priority=form.default_priority)
