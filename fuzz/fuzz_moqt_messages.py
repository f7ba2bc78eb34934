"""Fuzz target ``moqt_messages``: every MOQT draft-14 control message decoder and the control stream parser
(moqt/messages/).

Input: one octet, then octets.  When the octet's top bit is clear, its low bits choose a message type
of the profile and the octets are that message's payload (``decode_message``); when set, the octets
are a control stream, fed to ``ControlStreamParser`` whole and, separately, in pieces cut where the
input's next octets say.

Contract: decoding returns a message or raises ``ProtocolViolation`` carrying a draft code (never
INTERNAL_ERROR), nothing else (no ``NeedMoreData`` escapes a length-framed payload); a decoded message
can be sent again (``encode`` does not raise: a relay re-encodes what it forwards) and decodes back to
an equal message; the stream parser finds the same messages, and fails with the same code and
reason, however the stream is cut; and what it buffers is only the incomplete tail (bounded by the
16-bit Message Length).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import ROOT, VARINT_EDGES, Cursor, OpWriter, check, fuzz_main, split_points
from moqt.errors import ProtocolViolation
from moqt.kinds import SessionError
from moqt.messages import ControlMessage, ControlStreamParser, decode_message
from moqt.profiles import DRAFT_14
from moqt.wire import encode_varint

TARGET = "moqt_messages"
INSTRUMENT = ("moqt.messages", "moqt.wire", "moqt.params", "moqt.profiles", "moqt.errors")
MESSAGE_TYPES = tuple(sorted(DRAFT_14.message_types.codes.values()))
VECTORS = ROOT / "tests" / "vectors" / "moqt" / "aiomoqt_vectors.json"
Outcome = tuple[list[ControlMessage], tuple[SessionError, str] | None]


def check_resendable(message: ControlMessage) -> None:
    frame = message.encode(DRAFT_14)
    again = ControlStreamParser().feed(frame)
    check(again == [message], f"{message.KIND.value} does not round-trip through encode")


def one_message(message_type: int, payload: bytes) -> None:
    try:
        message = decode_message(message_type, payload, DRAFT_14)
    except ProtocolViolation as exc:
        check(exc.error is not SessionError.INTERNAL_ERROR, "a decoder raised INTERNAL_ERROR")
        return
    check_resendable(message)


def feed(pieces: list[bytes]) -> Outcome:
    parser = ControlStreamParser(DRAFT_14)
    messages: list[ControlMessage] = []
    for piece in pieces:
        try:
            messages += parser.feed(piece)
        except ProtocolViolation as exc:
            return messages, (exc.error, exc.reason)
        check(parser.buffered <= 0xFFFF + 10, f"the parser holds {parser.buffered} octets")
    return messages, None


def stream(cursor: Cursor) -> None:
    cuts = Cursor(cursor.take(cursor.u8() % 16))
    octets = cursor.rest()
    whole, whole_error = feed([octets])
    pieces, pieces_error = feed(split_points(octets, cuts, max_pieces=16))
    check(pieces_error == whole_error, f"cutting the stream changed the outcome: {pieces_error} vs {whole_error}")
    if whole_error is None:
        check(pieces == whole, "cutting the stream changed the messages")
    else:
        check(whole_error[0] is not SessionError.INTERNAL_ERROR, "the parser raised INTERNAL_ERROR")
    for message in pieces:
        check_resendable(message)


def test_one_input(data: bytes) -> None:
    cursor = Cursor(data)
    selector = cursor.u8()
    if selector & 0x80:
        stream(cursor)
    else:
        one_message(MESSAGE_TYPES[selector % len(MESSAGE_TYPES)], cursor.rest())


def vector_frames() -> list[bytes]:
    """The control messages of tests/vectors/moqt (aiomoqt's encoders: a third-party cross-check)."""
    vectors = json.loads(VECTORS.read_text())["vectors"]
    return [bytes.fromhex(v["hex"]) for v in vectors if v["kind"] == "control"]


def seeds() -> list[bytes]:
    out = []
    frames = vector_frames()
    for frame in frames:
        cursor = Cursor(frame)
        message_type = 0
        first = cursor.u8()
        size = 1 << (first >> 6)
        message_type = int.from_bytes(bytes([first & 0x3F]) + cursor.take(size - 1), "big")
        cursor.take(2)
        out.append(OpWriter().u8(MESSAGE_TYPES.index(message_type)).raw(cursor.rest()).getvalue())
    setup, rest = frames[0], b"".join(frames[4:12])
    out.append(OpWriter().u8(0x80).chunk(bytes([1, 3, 7, 30])).raw(setup + rest).getvalue())
    out.append(OpWriter().u8(0x80).chunk(b"").raw(encode_varint(0x7F) + b"\x00\x00").getvalue())  # unknown type
    return out


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT, dictionary=VARINT_EDGES)
