"""Fuzz target ``http_params``: what the HTTP roles read from paths, queries and header fields before any
body, and the OpenAI completions body of the front end.

Input: one octet choosing the parser, then the text (UTF-8; undecodable octets become lone
surrogates, which a str from the network may hold).  The parsers: ``parse_decimal`` and
``parse_decimal_range`` (kvsp/numbers.py: every integer in a path, query or header), ``layers=a-b``
(``LayerRange.parse``), holder-ids, hex identifiers, digests, base64url, lease ids, UUIDs, base URIs
and MOQT namespaces (kvsp/identifiers.py, kvsp/encoding.py, kvsp/records), the ``Repr-Digest`` field
as the client and the holder read it, the replica routes of the index (``_replica_path`` in
control/index/app.py), the block routes of the holder and the session and shard routes of the
instance -- called with a stand-in request that has only ``match_info`` and ``query``, which is all
they read -- the holder's ``?codec=``, the ``moqt://`` URI parser, and the front end's
``parse_completion``.

Contract: each returns a value or raises its typed error (``ValidationError``; the client's
``ReprDigestMissingError``; the front end's ``ApiError``; ``ValueError`` for the ``moqt://`` URI of a
configuration file), nothing else; and an accepted value is the canonical reading of the text (the
integer is in its bounds and spelled by the text, hex and base64url decode back to the same text, a
namespace re-encodes to the same string).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiohttp import web

from control.frontend.openai import ApiError, Limits, parse_completion
from control.frontend.tokenizer import ByteTokenizer
from control.holder import app as holder_app
from control.index import app as index_app
from control.instance import app as instance_app
from fuzz.common import OpWriter, check, fuzz_main
from kvsp.client.verify import ReprDigestMissingError
from kvsp.client.verify import parse_repr_digest as client_repr_digest
from kvsp.container import LayerRange
from kvsp.encoding import b64url_decode, b64url_encode, parse_digest, parse_hex
from kvsp.errors import ValidationError
from kvsp.identifiers import TrackNamespace, check_base_uri, check_role_id, role_id
from kvsp.numbers import parse_decimal, parse_decimal_range
from kvsp.records.base import HOLDER_SCHEMES, check_uri
from kvsp.records.lease import check_lease_id
from moqt.quic.config import MoqtUri

TARGET = "http_params"
INSTRUMENT = ("kvsp.numbers", "kvsp.encoding", "kvsp.identifiers", "kvsp.records.base", "kvsp.records.lease",
              "kvsp.container.header", "kvsp.client.verify", "kvsp.reader", "control.http", "control.holder.app",
              "control.index.app", "control.instance.app", "control.frontend.openai", "moqt.quic.config",
              "urllib.parse")
LIMITS = Limits("tiny", max_prompt_tokens=64, max_tokens_limit=128)
TOKENIZER = ByteTokenizer()
K0 = "9ca9d8b60f37f84726a27deb4cdc0d075714607a131632c2366e30b99fb1163b"
HOLDER_ID = role_id("https://h1.example/kvsp/")


class FakeRequest:
    """What the route helpers read of an aiohttp request: the path's match_info and the query."""

    def __init__(self, match_info: dict[str, str], query: dict[str, str] | None = None) -> None:
        self.match_info = match_info
        self.query = query or {}


def request(match_info: dict[str, str], query: dict[str, str] | None = None) -> web.Request:
    return cast(web.Request, FakeRequest(match_info, query))


def two(text: str) -> tuple[str, str]:
    first, _, second = text.partition("/")
    return first, second


def decimal(text: str) -> None:
    # The bound comes from the text's first character, so that the fuzzer reaches both refusals.
    maximum = [0, 1, 255, 0xFFFF, 2**53 - 1, 2**64][ord(text[0]) % 6] if text else 10
    value = parse_decimal(text[1:], "n", maximum=maximum)
    check(0 <= value <= maximum and int(text[1:]) == value, "parse_decimal out of bounds or misread")


def decimal_range(text: str) -> None:
    first, last = parse_decimal_range(text, "tokens", maximum=2**53 - 1)
    start, _, end = text.partition("-")
    check(first < last and (int(start), int(end)) == (first, last), "range misread")


def layer_range(text: str) -> None:
    layers = LayerRange.parse(text)
    check(LayerRange.parse(str(layers)) == layers and layers.first <= layers.last, "layer range misread")


def role(text: str) -> None:
    check(check_role_id(text) == text and b64url_encode(b64url_decode(text, "x")) == text, "holder-id misread")


def hex32(text: str) -> None:
    check(parse_hex(text, 32, "block_key").hex() == text, "hex32 misread")


def hex16(text: str) -> None:
    check(parse_hex(text, 16, "scope").hex() == text, "hex16 misread")


def digest(text: str) -> None:
    check("sha-256:" + parse_digest(text, "digest").hex() == text, "digest misread")


def b64url(text: str) -> None:
    check(b64url_encode(b64url_decode(text, "x")) == text, "base64url misread")


def lease_id(text: str) -> None:
    check(check_lease_id(text) == text, "lease id changed")


def base_uri(text: str) -> None:
    check(check_base_uri(text, "holder", HOLDER_SCHEMES) == text, "base URI changed")


def record_uri(text: str) -> None:
    check(check_uri(text, "holder", HOLDER_SCHEMES) == text, "record URI changed")


def namespace(text: str) -> None:
    decoded = TrackNamespace.decode(text)
    check(decoded.encode() == text, "namespace does not re-encode to the same text")


def client_digest(text: str) -> None:
    check(len(client_repr_digest(text.split("\n"))) == 32, "Repr-Digest is not 32 octets")


def holder_digest(text: str) -> None:
    found = holder_app.parse_repr_digest(text)
    check(found is None or len(found) == 32, "Repr-Digest is not 32 octets")


def replica_path(text: str) -> None:
    holder_id, key = two(text)
    parsed = index_app._replica_path(request({"holder_id": holder_id, "block_key": key}))
    check(parsed == (holder_id, bytes.fromhex(key)), "replica path misread")


def block_path(text: str) -> None:
    compat, rest = two(text)
    scope, key = two(rest)
    holder_app._block_id(request({"compat": compat, "scope": scope, "block_key": key}))


def codec(text: str) -> None:
    check(1 <= holder_app._parse_codec(text) <= 0xFFFF, "codec out of range")


def session_path(text: str) -> None:
    check(instance_app._session_id(request({"session": text})) == text, "session id changed")


def shard_query(text: str) -> None:
    tokens, version = two(text)
    instance_app._token_range(request({}, {"tokens": tokens}))
    instance_app._version(version)


def moqt_uri(text: str) -> None:
    try:
        uri = MoqtUri.parse(text)
    except ValueError:
        return
    check(MoqtUri.parse(str(uri)) == uri, "moqt URI does not re-parse to itself")


def completion(text: str) -> None:
    with contextlib.suppress(ApiError):  # the front end's typed refusal (a 4xx answer)
        parse_completion(text.encode("utf-8", "surrogateescape"), LIMITS, TOKENIZER)


PARSERS: tuple[tuple[str, Callable[[str], None]], ...] = (
    ("decimal", decimal), ("decimal_range", decimal_range), ("layer_range", layer_range), ("role_id", role),
    ("hex32", hex32), ("hex16", hex16), ("digest", digest), ("b64url", b64url), ("lease_id", lease_id),
    ("base_uri", base_uri), ("record_uri", record_uri), ("namespace", namespace), ("client_repr_digest", client_digest),
    ("holder_repr_digest", holder_digest), ("replica_path", replica_path), ("block_path", block_path),
    ("codec", codec), ("session_path", session_path), ("shard_query", shard_query), ("moqt_uri", moqt_uri),
    ("completion", completion),
)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    _, parse = PARSERS[data[0] % len(PARSERS)]
    text = data[1:].decode("utf-8", "surrogateescape")
    with contextlib.suppress(ValidationError, ReprDigestMissingError):
        parse(text)


def seeds() -> list[bytes]:
    ns = TrackNamespace(bytes(32), bytes(16), HOLDER_ID, bytes.fromhex(K0)).encode()
    examples = {
        "decimal": ["\x040", "\x0512345678901234567890", "\x01255"], "decimal_range": ["0-4096", "7-7"],
        "layer_range": ["0-31", "3-1"], "role_id": [HOLDER_ID], "hex32": [K0], "hex16": ["6d" * 16],
        "digest": ["sha-256:" + K0], "b64url": ["AAEC"], "lease_id": ["l-8f3a_2"],
        "base_uri": ["https://h1.example/kvsp/", "moqt://[::1]:4443/kvsp?x=1"],
        "record_uri": ["https://user@h1.example:8443/kvsp/"], "namespace": [ns],
        "client_repr_digest": ["sha-256=:" + "A" * 43 + "=:, md5=:AA==:"],
        "holder_repr_digest": ["sha-256=:" + "A" * 43 + "=:;x=1"], "replica_path": [f"{HOLDER_ID}/{K0}"],
        "block_path": [f"{'5e' * 32}/{'6d' * 16}/{K0}"], "codec": ["1", "65535"],
        "session_path": ["6f1d0a9e-2c55-4d7e-9a0e-5b7f2f9f6a11"], "shard_query": ["0-32768/4"],
        "moqt_uri": ["moqt://relay.example:4443/kvsp", "moqt://[::1]/"],
        "completion": ['{"model": "tiny", "prompt": "hi", "max_tokens": 4, "temperature": 0.5, "stream": true,'
                       ' "stream_options": {"include_usage": true}}', '{"model": "tiny", "prompt": [[1, 2]]}'],
    }
    index = {name: i for i, (name, _) in enumerate(PARSERS)}
    return [OpWriter().u8(index[name]).raw(text.encode()).getvalue() for name, texts in examples.items()
            for text in texts]


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT)
