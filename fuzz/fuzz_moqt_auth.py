"""Fuzz target ``moqt_auth``: the AUTHORIZATION_TOKEN verifier (moqt/auth.py, decision D3): a CWT in a
COSE_Sign1 envelope, signed ES256.

Input: one octet choosing what the fuzzer controls, then octets: the whole token (envelope, header,
signature: what an unauthenticated peer sends), or the claims (CBOR octets, or claim values built
from the input: texts, integers and arrays of the fuzzer's choosing) or the protected header of a
token that the harness then signs with the trusted key, so that the claim checks behind the signature
are reached too.  Contract: ``verify_token`` returns claims or raises ``AuthError`` (malformed, bad
signature, expired), nothing else -- whatever cbor2 raises on the way is mapped; accepted claims obey
the token rules (scope IDs of 16 octets, 1..32 namespace fields, an https/moqt subject with a host,
within their validity window at ``now``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cbor2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from fuzz.common import Cursor, OpWriter, check, fuzz_main
from moqt.auth import (
    ALG_ES256,
    COSE_SIGN1_TAG,
    CWT_TAG,
    HEADER_ALG,
    HEADER_KID,
    MAX_CLOCK_SKEW_S,
    AuthError,
    key_id,
    verify_token,
)

TARGET = "moqt_auth"
INSTRUMENT = ("moqt.auth", "urllib.parse")
KEY: Final = ec.derive_private_key(0x6B767370, ec.SECP256R1())  # fixed, so that inputs replay
TRUSTED: Final = (KEY.public_key(),)
NOW: Final = 1_700_000_000
PROTECTED: Final = cbor2.dumps({HEADER_ALG: ALG_ES256, HEADER_KID: key_id(KEY.public_key())})


def sign(protected: bytes, payload: bytes) -> bytes:
    """A CWT whose envelope and signature are right, around whatever protected header and claims."""
    # Deterministic (RFC 6979), so that an input replays to the same token and the seeds stay the same.
    der = KEY.sign(cbor2.dumps(["Signature1", protected, b"", payload]),
                   ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
    r, s = decode_dss_signature(der)
    envelope = [protected, {}, payload, r.to_bytes(32, "big") + s.to_bytes(32, "big")]
    return cbor2.dumps(cbor2.CBORTag(CWT_TAG, cbor2.CBORTag(COSE_SIGN1_TAG, envelope)))


def value(cursor: Cursor, kind: int) -> object:
    """A claim value of the kind the claim wants (0: text, 1: integer, 2: texts, 3: arrays of octets), or,
    when the next octet's top bit says so, of another kind."""
    choice = cursor.u8()
    if choice & 0x80:
        kind = choice % 5
    if kind == 0:
        return cursor.chunk().decode("latin-1")
    if kind == 1:
        return int.from_bytes(cursor.take(8), "big") - (2**63 if choice & 0x40 else 0)
    if kind == 2:
        return [cursor.chunk().decode("latin-1") for _ in range(cursor.choice(4))]
    if kind == 3:
        return [[cursor.chunk() for _ in range(cursor.choice(4))] for _ in range(cursor.choice(3))]
    return None


def claims_of(cursor: Cursor) -> bytes:
    claims: dict[int, object] = {}
    for label, kind in ((1, 0), (2, 0), (4, 1), (6, 1), (5, 1), (-65537, 2), (-65538, 3)):
        if cursor.u8() & 1:
            claims[label] = value(cursor, kind)
    return cbor2.dumps(claims)


def token_of(data: bytes) -> bytes:
    mode, octets = data[0] % 4, data[1:]
    if mode == 0:
        return octets
    if mode == 1:
        return sign(PROTECTED, octets)
    if mode == 2:
        return sign(octets, cbor2.dumps({}))
    return sign(PROTECTED, claims_of(Cursor(octets)))


def test_one_input(data: bytes) -> None:
    if not data:
        return
    token = token_of(data)
    try:
        claims = verify_token(token, TRUSTED, NOW)
    except AuthError:
        return
    check(all(len(s) == 16 for s in claims.scopes), f"a scope ID of other than 16 octets: {claims.scopes!r}")
    check(all(0 < len(p) <= 32 for p in claims.namespaces), "a namespace prefix of 0 or more than 32 fields")
    subject = urlsplit(claims.subject)  # schemes are case-insensitive (RFC 3986 section 3.1)
    check(subject.scheme in ("https", "moqt") and bool(subject.hostname), "a subject that is not an identity URI")
    check(claims.expires_at > NOW and claims.issued_at <= NOW + MAX_CLOCK_SKEW_S, "a token outside its window")
    check(claims.not_before is None or claims.not_before <= NOW, "a token used before its nbf")


def seeds() -> list[bytes]:
    issued = {1: "kvsp", 2: "https://client.example/", 4: NOW + 60, 6: NOW, 5: NOW - 5,
              -65537: [bytes(16).hex(), bytes(range(16)).hex()], -65538: [[b"kvsp", b"ab"]]}
    token = sign(PROTECTED, cbor2.dumps(issued))  # what issue_token writes, signed deterministically
    claims = {1: "kvsp", 2: "moqt://relay.example:4443/x", 4: NOW + 60, 6: NOW, -65537: ["00" * 16],
              -65538: [[b"kvsp"]]}
    return [OpWriter().u8(0).raw(token).getvalue(), OpWriter().u8(1).raw(cbor2.dumps(claims)).getvalue(),
            OpWriter().u8(2).raw(PROTECTED).getvalue(), structured_seed()]


def structured_seed() -> bytes:
    w = OpWriter().u8(3)
    w.u8(1).u8(0).chunk(b"kvsp").u8(1).u8(0).chunk(b"https://client.example/")
    for date in (NOW + 60, NOW, NOW - 5):
        w.u8(1).u8(1).raw(date.to_bytes(8, "big"))
    w.u8(1).u8(2).u8(2).chunk(b"00" * 16).chunk(b"ab" * 16)
    return w.u8(1).u8(3).u8(1).u8(2).chunk(b"kvsp").chunk(b"a").getvalue()


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT, max_len=1024)
