"""Fuzz target ``moqt_params``: setup and request parameters, authorization tokens (moqt/params.py) and the
draft profile's code-point tables (moqt/profiles/).

Input: one octet choosing the decoder (and, for request parameters, the message that carries them),
then its octets.  Contract: ``SetupParameters.decode``, ``RequestParameters.decode`` and
``AuthToken.decode`` return a value or raise ``NeedMoreData`` (input ends early) or
``ProtocolViolation`` with a draft code (KEY_VALUE_FORMATTING_ERROR, MALFORMED_PATH, ... never
INTERNAL_ERROR), nothing else; decoded parameters re-encode and decode back equal (a relay passes
tokens and unknown parameters on); and every profile table maps a code it names back to the same code.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import VARINT_EDGES, Cursor, OpWriter, check, fuzz_main
from moqt.errors import NeedMoreData, ProtocolViolation
from moqt.kinds import AliasType, MessageKind, SessionError
from moqt.params import AuthToken, RequestParameters, SetupParameters, check_authority, check_path
from moqt.profiles import DRAFT_14
from moqt.profiles.base import CodeMap
from moqt.wire import KeyValuePair, Reader, Writer

TARGET = "moqt_params"
INSTRUMENT = ("moqt.params", "moqt.profiles", "moqt.wire", "moqt.errors")
KINDS = tuple(MessageKind)
TABLES: tuple[CodeMap[Any], ...] = (
    DRAFT_14.message_types, DRAFT_14.session_errors, DRAFT_14.publish_done, DRAFT_14.stream_resets,
    DRAFT_14.group_orders, DRAFT_14.filter_types, DRAFT_14.fetch_types, DRAFT_14.object_statuses,
    DRAFT_14.alias_types, DRAFT_14.setup_parameters, DRAFT_14.request_parameters, *DRAFT_14.request_errors.values())


def setup(cursor: Cursor) -> None:
    params = SetupParameters.decode(Reader(cursor.rest()), DRAFT_14)
    writer = Writer()
    params.encode(writer, DRAFT_14)
    check(SetupParameters.decode(Reader(writer.getvalue()), DRAFT_14) == params, "setup parameters do not round-trip")
    for text, ok in ((params.path, check_path), (params.authority, check_authority)):
        check(text is None or ok(text), "a malformed PATH or AUTHORITY was accepted")


def request(cursor: Cursor) -> None:
    kind = KINDS[cursor.choice(len(KINDS))]
    params = RequestParameters.decode(Reader(cursor.rest()), kind, DRAFT_14)
    writer = Writer()
    params.encode(writer, DRAFT_14)
    check(RequestParameters.decode(Reader(writer.getvalue()), kind, DRAFT_14) == params,
          "request parameters do not round-trip")


def token(cursor: Cursor) -> None:
    tok = AuthToken.decode(cursor.rest(), DRAFT_14)
    check(AuthToken.decode(tok.encode(DRAFT_14), DRAFT_14) == tok, "token does not round-trip")


def tables(cursor: Cursor) -> None:
    code = int.from_bytes(cursor.take(8), "big") >> cursor.choice(64)
    for table in TABLES:
        name = table.name(code)
        check(name is None or table.code(name) == code, "a profile table does not map back")
    framing = DRAFT_14.data_framing
    form = framing.subgroup_types.get(code)
    check(form is None or framing.subgroup_codes[form] == code, "subgroup type table does not map back")
    datagram = framing.datagram_types.get(code)
    check(datagram is None or framing.datagram_codes[datagram] == code, "datagram type table does not map back")


def text_checks(cursor: Cursor) -> None:
    text = cursor.rest().decode("utf-8", "replace")
    check_path(text)
    check_authority(text)


DECODERS: tuple[Callable[[Cursor], None], ...] = (setup, request, token, tables, text_checks)


def test_one_input(data: bytes) -> None:
    cursor = Cursor(data)
    try:
        DECODERS[cursor.choice(len(DECODERS))](cursor)
    except NeedMoreData:
        pass
    except ProtocolViolation as exc:
        check(exc.error is not SessionError.INTERNAL_ERROR, "a decoder raised INTERNAL_ERROR")


def seeds() -> list[bytes]:
    def params(index: int, value: SetupParameters | RequestParameters, prefix: bytes = b"") -> bytes:
        writer = Writer()
        value.encode(writer, DRAFT_14)
        return OpWriter().u8(index).raw(prefix).raw(writer.getvalue()).getvalue()

    tokens = (AuthToken.use_value(0, b"cwt-token"), AuthToken(AliasType.REGISTER, 1, 0, b"tok"),
              AuthToken(AliasType.USE_ALIAS, 1), AuthToken(AliasType.DELETE, 1))
    out = [params(0, SetupParameters(path="/kvsp?x=%20", max_request_id=100, authorization_tokens=tokens[:2],
                                     max_auth_token_cache_size=4096, authority="relay.example:4443",
                                     implementation="kvsp", unknown=(KeyValuePair(0x21, b"x"), KeyValuePair(0x22, 1))))]
    request_params = RequestParameters(delivery_timeout=500, authorization_tokens=tokens[2:], max_cache_duration=9,
                                       unknown=(KeyValuePair(0x41, b"y"),))
    out += [params(1, request_params, bytes([KINDS.index(kind)]))
            for kind in (MessageKind.SUBSCRIBE, MessageKind.FETCH, MessageKind.SUBSCRIBE_OK)]
    out += [OpWriter().u8(2).raw(t.encode(DRAFT_14)).getvalue() for t in tokens]
    out.append(OpWriter().u8(3).raw((0x20).to_bytes(8, "big")).u8(56).getvalue())
    out.append(OpWriter().u8(4).raw(b"[::1]:443").getvalue())
    return out


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT, max_len=1024, dictionary=VARINT_EDGES)
