"""Fuzz target ``moqt_messages``: every MOQT control message decoder of draft-14, draft-16 and
draft-18 and the control stream parser (moqt/messages/).

Input: one octet, then octets.  The octet's bit 0x40 chooses the profile (clear: draft-14, set:
draft-16, or draft-18 when bit 0x20 is set too).  When its top bit is clear, its six low bits
choose a message type of the profile and the octets are that message's payload (``decode_message``);
when set, the octets are a control stream, fed to ``ControlStreamParser`` whole and, separately, in
pieces cut where the input's next octets say.

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
from moqt.kinds import FilterType, GroupOrder, SessionError, SubscribeOptions
from moqt.messages import (
    ClientSetup,
    ControlMessage,
    ControlStreamParser,
    Fetch,
    FetchOk,
    NamespaceDone,
    NamespaceNotice,
    Publish,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishOk,
    RequestErrorReply,
    RequestOk,
    RequestUpdate,
    ServerSetup,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    TrackStatus,
    decode_message,
)
from moqt.params import AuthToken, RequestParameters, SetupParameters, SubscriptionFilter
from moqt.profiles import DRAFT_14, DRAFT_16, DRAFT_18, Profile
from moqt.wire import KeyValuePair, Location, encode_varint

TARGET = "moqt_messages"
INSTRUMENT = ("moqt.messages", "moqt.wire", "moqt.params", "moqt.profiles", "moqt.errors")
DRAFT_16_BIT = 0x40
DRAFT_18_BIT = 0x20  # with DRAFT_16_BIT
MESSAGE_TYPES = {profile.draft: tuple(sorted(profile.message_types.codes.values()))
                 for profile in (DRAFT_14, DRAFT_16, DRAFT_18)}
VECTORS = ROOT / "tests" / "vectors" / "moqt" / "aiomoqt_vectors.json"
Outcome = tuple[list[ControlMessage], tuple[SessionError, str] | None]


def check_resendable(message: ControlMessage, profile: Profile) -> None:
    frame = message.encode(profile)
    again = ControlStreamParser(profile).feed(frame)
    if isinstance(message, PublishOk) and len(again) == 1 and isinstance(again[0], RequestOk):
        again = [PublishOk.from_request_ok(again[0])]  # draft-18 sends PUBLISH_OK as a REQUEST_OK
    check(again == [message], f"{message.KIND.value} does not round-trip through encode")


def one_message(message_type: int, payload: bytes, profile: Profile) -> None:
    try:
        message = decode_message(message_type, payload, profile)
    except ProtocolViolation as exc:
        check(exc.error is not SessionError.INTERNAL_ERROR, "a decoder raised INTERNAL_ERROR")
        return
    check_resendable(message, profile)


def feed(pieces: list[bytes], profile: Profile) -> Outcome:
    parser = ControlStreamParser(profile)
    messages: list[ControlMessage] = []
    for piece in pieces:
        try:
            messages += parser.feed(piece)
        except ProtocolViolation as exc:
            return messages, (exc.error, exc.reason)
        check(parser.buffered <= 0xFFFF + 10, f"the parser holds {parser.buffered} octets")
    return messages, None


def stream(cursor: Cursor, profile: Profile) -> None:
    cuts = Cursor(cursor.take(cursor.u8() % 16))
    octets = cursor.rest()
    whole, whole_error = feed([octets], profile)
    pieces, pieces_error = feed(split_points(octets, cuts, max_pieces=16), profile)
    check(pieces_error == whole_error, f"cutting the stream changed the outcome: {pieces_error} vs {whole_error}")
    if whole_error is None:
        check(pieces == whole, "cutting the stream changed the messages")
    else:
        check(whole_error[0] is not SessionError.INTERNAL_ERROR, "the parser raised INTERNAL_ERROR")
    for message in pieces:
        check_resendable(message, profile)


def test_one_input(data: bytes) -> None:
    cursor = Cursor(data)
    selector = cursor.u8()
    profile = DRAFT_14 if not selector & DRAFT_16_BIT else DRAFT_18 if selector & DRAFT_18_BIT else DRAFT_16
    if selector & 0x80:
        stream(cursor, profile)
    else:
        types = MESSAGE_TYPES[profile.draft]
        one_message(types[(selector & 0x3F) % len(types)], cursor.rest(), profile)


def vector_frames() -> list[bytes]:
    """The control messages of tests/vectors/moqt (aiomoqt's encoders: a third-party cross-check)."""
    vectors = json.loads(VECTORS.read_text())["vectors"]
    return [bytes.fromhex(v["hex"]) for v in vectors if v["kind"] == "control"]


def draft_16_frames() -> list[bytes]:
    """One of each draft-16 message, in our encoding (tests/test_moqt_draft16_vectors.py has the text's
    and aiomoqt's octets for them)."""
    ns, token = (b"kvsp", b"ab"), AuthToken.use_value(0, b"tk")
    flt = SubscriptionFilter(FilterType.ABSOLUTE_RANGE, Location(5, 0), 9)
    messages: list[ControlMessage] = [
        ClientSetup((DRAFT_16.version,), SetupParameters(path="/kvsp", max_request_id=100,
                                                         authorization_tokens=(token,))),
        ServerSetup(DRAFT_16.version, SetupParameters(max_request_id=50, unknown=(KeyValuePair(0x41, b"x"),))),
        Subscribe(2, ns, b"raw", 7, GroupOrder.DESCENDING, False, FilterType.ABSOLUTE_START, Location(1, 0), None,
                  RequestParameters(delivery_timeout=500, authorization_tokens=(token,))),
        SubscribeOk(2, 5, 600, GroupOrder.DESCENDING, Location(9, 3), track_extensions=(KeyValuePair(0x0E, 64),)),
        RequestUpdate(4, 2, RequestParameters(forward=False, subscription_filter=flt, new_group_request=0)),
        RequestOk(4, Location(9, 3)), RequestErrorReply(6, 0x10, "gone", 1001),
        Publish(1, ns, b"raw", 3, GroupOrder.DESCENDING, Location(2, 7), False, RequestParameters(expires=9)),
        PublishOk(1, True, 9, GroupOrder.ASCENDING, FilterType.NEXT_GROUP_START),
        Fetch.standalone_fetch(8, ns, b"raw", Location(0, 0), Location(0, 4), subscriber_priority=1),
        FetchOk(8, Location(0, 4), end_of_track=True), TrackStatus(10, ns, b"raw"),
        PublishNamespaceDone(request_id=3), PublishNamespaceCancel((), 1, "t/o", 3),
        SubscribeNamespace(12, (), RequestParameters(forward=False), SubscribeOptions.NAMESPACE),
        NamespaceNotice((b"ab",)), NamespaceDone((b"ab",)),
    ]
    return [message.encode(DRAFT_16) for message in messages]


def _message_seed(frame: bytes, profile: Profile) -> bytes:
    cursor = Cursor(frame)
    first = cursor.u8()
    size = 1 << (first >> 6)
    message_type = int.from_bytes(bytes([first & 0x3F]) + cursor.take(size - 1), "big")
    cursor.take(2)
    selector = MESSAGE_TYPES[profile.draft].index(message_type) | (DRAFT_16_BIT if profile is DRAFT_16 else 0)
    return OpWriter().u8(selector).raw(cursor.rest()).getvalue()


def seeds() -> list[bytes]:
    frames = vector_frames()
    out = [_message_seed(frame, DRAFT_14) for frame in frames]
    setup, rest = frames[0], b"".join(frames[4:12])
    out.append(OpWriter().u8(0x80).chunk(bytes([1, 3, 7, 30])).raw(setup + rest).getvalue())
    out.append(OpWriter().u8(0x80).chunk(b"").raw(encode_varint(0x7F) + b"\x00\x00").getvalue())  # unknown type
    frames16 = draft_16_frames()
    out += [_message_seed(frame, DRAFT_16) for frame in frames16]
    out.append(OpWriter().u8(0x80 | DRAFT_16_BIT).chunk(bytes([2, 5, 11, 40])).raw(b"".join(frames16)).getvalue())
    return out


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT, dictionary=VARINT_EDGES)
