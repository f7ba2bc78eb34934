"""Fuzz target ``moqt_wire``: the MOQT primitive decoders (moqt/wire.py): varints, Track Namespaces, Full
Track Names, Key-Value-Pairs and their blocks, Locations and Reason Phrases.

Input: one octet choosing the structure, then its octets.  Contract: each decoder returns a value or
raises ``NeedMoreData`` (the input ends early) or ``ProtocolViolation`` carrying a draft code (never
INTERNAL_ERROR), nothing else; ``NeedMoreData.at_least`` is more than the input holds; a decoded value
is one we may send (it passes the encoder's own checks) and decodes back to itself once re-encoded.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import VARINT_EDGES, OpWriter, check, fuzz_main
from moqt.errors import NeedMoreData, ProtocolViolation
from moqt.kinds import SessionError
from moqt.wire import (
    MAX_REASON_PHRASE_LENGTH,
    KeyValuePair,
    Location,
    Reader,
    Writer,
    check_namespace,
    decode_kvp_block,
    decode_varint,
    encode_kvps,
    encode_varint,
    pull_full_track_name,
    pull_namespace,
    pull_reason_phrase,
    push_namespace,
    push_reason_phrase,
    varint_size,
)

TARGET = "moqt_wire"
INSTRUMENT = ("moqt.wire", "moqt.errors")


def varint(data: bytes) -> None:
    value, used = decode_varint(data)
    check(used == 1 << (data[0] >> 6) and used >= varint_size(value), "varint length misread")
    check(decode_varint(encode_varint(value)) == (value, varint_size(value)), "varint does not round-trip")


def namespace(data: bytes) -> None:
    ns = pull_namespace(Reader(data))
    check_namespace(ns)
    writer = Writer()
    push_namespace(writer, ns)
    check(pull_namespace(Reader(writer.getvalue())) == ns, "namespace does not round-trip")


def full_track_name(data: bytes) -> None:
    ns, name = pull_full_track_name(Reader(data))
    check_namespace(ns)
    check(sum(map(len, ns)) + len(name) <= 4096, "Full Track Name over 4096 octets accepted")
    writer = Writer()
    push_namespace(writer, ns)
    writer.push_length_prefixed(name)
    check(pull_full_track_name(Reader(writer.getvalue())) == (ns, name), "Full Track Name does not round-trip")


def kvp(data: bytes) -> None:
    pair = KeyValuePair.decode(Reader(data))
    writer = Writer()
    pair.encode(writer)
    check(KeyValuePair.decode(Reader(writer.getvalue())) == pair, "Key-Value-Pair does not round-trip")


def kvp_block(data: bytes) -> None:
    pairs = decode_kvp_block(data)
    check(decode_kvp_block(encode_kvps(pairs)) == pairs, "Key-Value-Pair block does not round-trip")


def location(data: bytes) -> None:
    loc = Location.decode(Reader(data))
    writer = Writer()
    loc.encode(writer)
    check(Location.decode(Reader(writer.getvalue())) == loc, "Location does not round-trip")


def reason_phrase(data: bytes) -> None:
    reason = pull_reason_phrase(Reader(data))
    writer = Writer()
    push_reason_phrase(writer, reason)  # a relay passes reasons on: what we read, we must be able to send
    check(pull_reason_phrase(Reader(writer.getvalue())) == reason, "Reason Phrase does not round-trip")


DECODERS: tuple[Callable[[bytes], None], ...] = (varint, namespace, full_track_name, kvp, kvp_block, location,
                                                 reason_phrase)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    octets = data[1:]
    try:
        DECODERS[data[0] % len(DECODERS)](octets)
    except NeedMoreData as short:
        check(short.at_least > len(octets), f"NeedMoreData({short.at_least}) with {len(octets)} octets at hand")
    except ProtocolViolation as exc:
        check(exc.error is not SessionError.INTERNAL_ERROR, "a decoder raised INTERNAL_ERROR")


def seeds() -> list[bytes]:
    def frame(index: int, fill: Callable[[Writer], None]) -> bytes:
        writer = Writer()
        fill(writer)
        return OpWriter().u8(index).raw(writer.getvalue()).getvalue()

    ns = (b"kvsp", b"5e" * 32, b"6d" * 16)
    out = [OpWriter().u8(0).raw(encode_varint(v)).getvalue() for v in (0, 63, 64, 16383, 2**30, 2**62 - 1)]
    out.append(frame(1, lambda w: push_namespace(w, ns)))
    def track(writer: Writer) -> None:
        push_namespace(writer, ns)
        writer.push_length_prefixed(b"raw")

    out.append(frame(2, track))
    pairs = (KeyValuePair(2, 7), KeyValuePair(3, b"token"), KeyValuePair(0x3F, b""))
    out.append(frame(3, pairs[1].encode))
    out.append(OpWriter().u8(4).raw(encode_kvps(pairs)).getvalue())
    out.append(frame(5, lambda w: Location(3, 2**40).encode(w)))
    out.append(frame(6, lambda w: push_reason_phrase(w, "no such track \u00e9")))
    out.append(frame(6, lambda w: w.push_length_prefixed(b"\xff" * MAX_REASON_PHRASE_LENGTH)))
    return out


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT, max_len=1200, dictionary=VARINT_EDGES)
