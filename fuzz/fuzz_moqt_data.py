"""Fuzz target ``moqt_data``: the data-stream parser and the datagram decoder (moqt/data.py, draft-14
section 10).

Input: one octet (bit 0: a datagram rather than a stream; bit 1: the stream ends with FIN; bit 2: a
small object size limit), for a stream one octet saying how many cut points follow and the cut points,
then the octets.  Contract: ``DataStreamParser.feed`` returns events or raises ``ProtocolViolation``
with a draft code (never INTERNAL_ERROR), nothing else, and gives the same headers, objects and
payload octets, or the same error, however the stream is cut (it buffers only straddling header
octets, at most its header bound); payload chunks stay within the object's declared length; and a
decoded datagram re-encodes and decodes back equal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import ROOT, VARINT_EDGES, Cursor, OpWriter, check, fuzz_main, split_points
from moqt.data import (
    DataEvent,
    DataStreamParser,
    FetchHeader,
    FetchWriter,
    ObjectDatagram,
    ObjectHeader,
    PayloadChunk,
    StreamFinished,
    SubgroupHeader,
    SubgroupWriter,
)
from moqt.errors import ProtocolViolation
from moqt.kinds import ObjectStatus, SessionError
from moqt.wire import KeyValuePair

TARGET = "moqt_data"
INSTRUMENT = ("moqt.data", "moqt.wire", "moqt.profiles", "moqt.errors")
VECTORS = ROOT / "tests" / "vectors" / "moqt" / "aiomoqt_vectors.json"
SMALL_OBJECTS = 64
# What cutting a stream may change: how a payload is split into chunks.  Everything else -- headers,
# objects, the concatenated payload of each, the end, the error -- must not change.
Normal = tuple[list[object], tuple[SessionError, str] | None]


def normalise(events: list[DataEvent]) -> list[object]:
    out: list[object] = []
    for event in events:
        if isinstance(event, PayloadChunk):
            if out and isinstance(out[-1], bytearray):
                out[-1] += event.data
            else:
                out.append(bytearray(event.data))
        else:
            out.append(event)
    return out


def run_stream(pieces: list[bytes], fin: bool, max_object: int) -> Normal:
    parser = DataStreamParser(max_object_size=max_object)
    events: list[DataEvent] = []
    current: ObjectHeader | None = None
    try:
        for i, piece in enumerate(pieces):
            new = parser.feed(piece, end_stream=fin and i == len(pieces) - 1)
            for event in new:
                if isinstance(event, ObjectHeader):
                    current = event
                elif isinstance(event, PayloadChunk):
                    check(current is not None and event.offset + len(event.data) <= current.payload_length,
                          "a payload chunk runs past its object")
            events += new
    except ProtocolViolation as exc:
        check(exc.error is not SessionError.INTERNAL_ERROR, "the parser raised INTERNAL_ERROR")
        return normalise(events), (exc.error, exc.reason)
    if fin and pieces:
        check(isinstance(events[-1], StreamFinished), "a stream ended with FIN did not finish")
    return normalise(events), None


def stream(cursor: Cursor, flags: int) -> None:
    cuts = Cursor(cursor.take(cursor.u8() % 16))
    octets = cursor.rest()
    fin = bool(flags & 2)
    max_object = SMALL_OBJECTS if flags & 4 else 1 << 26
    whole_events, whole_error = run_stream([octets], fin, max_object)
    cut_events, cut_error = run_stream(split_points(octets, cuts, max_pieces=16), fin, max_object)
    if whole_error is None:
        check(cut_error is None and cut_events == whole_events, "cutting the stream changed its events")
    else:
        # The events of the feed that fails are lost with it (the session closes), so only the error compares.
        check(cut_error == whole_error, f"cutting the stream changed the outcome: {cut_error} vs {whole_error}")


def datagram(octets: bytes) -> None:
    try:
        decoded = ObjectDatagram.decode(octets)
    except ProtocolViolation as exc:
        check(exc.error is not SessionError.INTERNAL_ERROR, "the datagram decoder raised INTERNAL_ERROR")
        return
    check(ObjectDatagram.decode(decoded.encode()) == decoded, "datagram does not round-trip")


def test_one_input(data: bytes) -> None:
    cursor = Cursor(data)
    flags = cursor.u8()
    if flags & 1:
        datagram(cursor.rest())
    else:
        stream(cursor, flags)


def seeds() -> list[bytes]:
    vectors = json.loads(VECTORS.read_text())["vectors"]
    out = []
    for v in vectors:
        octets = bytes.fromhex(v["hex"])
        if v["kind"] == "datagram":
            out.append(OpWriter().u8(1).raw(octets).getvalue())
        elif v["kind"] != "control":
            out.append(OpWriter().u8(2).chunk(bytes([1, 2, 3])).raw(octets).getvalue())
    sub = SubgroupWriter(SubgroupHeader.create(7, 3, 5, extensions_present=True, end_of_group=True))
    parts = [sub.encode_header(), *sub.encode_object(0, b"abc", extensions=[KeyValuePair(0x4B56, 1)]),
             *sub.encode_object(4, status=ObjectStatus.END_OF_GROUP)]
    out.append(OpWriter().u8(2).chunk(bytes([2, 5, 1])).raw(b"".join(parts)).getvalue())
    fetch = FetchWriter(FetchHeader(2))
    parts = [fetch.encode_header(), *fetch.encode_object(0, 0, 1, b"x" * 100), *fetch.encode_object(1, 0, 0, b"")]
    out.append(OpWriter().u8(6).chunk(bytes([1, 40, 2])).raw(b"".join(parts)).getvalue())
    datagram = ObjectDatagram(1, 2, 3, 9, b"payload", (KeyValuePair(3, b"e"),))
    out.append(OpWriter().u8(1).raw(datagram.encode()).getvalue())
    return out


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT, max_len=2048, dictionary=VARINT_EDGES)
