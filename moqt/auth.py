"""AUTHORIZATION_TOKEN for peers without a client certificate (decision D3).

A deployment lets a peer that cannot present a client certificate (third-party MOQT clients such as
aiomoqt) authenticate with a token instead, sent as the AUTHORIZATION_TOKEN parameter of CLIENT_SETUP
(draft-14 section 9.2.1.1; Token Type 0, "negotiated out of band", Alias Type USE_VALUE). The token
is a CBOR Web Token (RFC 8392) in a COSE_Sign1 envelope (RFC 9052 section 4.2) signed with ES256:

    61( 18( [ protected: bstr .cbor {1: -7, 4: kid},      ; alg ES256, key ID
              unprotected: {},
              payload: bstr .cbor claims,
              signature: bstr (r || s, 64 octets) ] ) )

    claims = {1: iss, 2: sub, 4: exp, 6: iat, ? 5: nbf,
              -65537: [scope_id as lowercase hex, ...],      ; private-use labels (RFC 8392 9.1)
              -65538: [[namespace field bstr, ...], ...]}    ; namespace prefixes

``sub`` is the subject identity (a ``https://`` or ``moqt://`` URI, as in a certificate's URI SAN).
The signature covers ``Sig_structure = ["Signature1", protected, h'', payload]`` exactly as received,
so nothing is re-encoded before verification. Decoding is fuzz-safe: any input either verifies or
raises an :class:`AuthError`, whose ``error`` names the MOQT session termination to close
with. Tokens are bounded (:data:`MAX_TOKEN_OCTETS`) before any parsing.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Final
from urllib.parse import urlsplit

import cbor2
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

from moqt.errors import MoqtError
from moqt.kinds import SessionError

# -- wire constants --------------------------------------------------------------------------------
CWT_TAG: Final = 61  # RFC 8392 section 6
COSE_SIGN1_TAG: Final = 18  # RFC 9052 section 2
HEADER_ALG: Final = 1  # RFC 9052 section 3.1
HEADER_CRIT: Final = 2
HEADER_KID: Final = 4
ALG_ES256: Final = -7  # RFC 9053 section 2.1
CLAIM_ISS, CLAIM_SUB, CLAIM_EXP, CLAIM_NBF, CLAIM_IAT = 1, 2, 4, 5, 6  # RFC 8392 section 3.1
CLAIM_SCOPES: Final = -65537  # private use: scope IDs the subject may use (lowercase hex)
CLAIM_NAMESPACES: Final = -65538  # private use: track namespace prefixes (arrays of bstr fields)

# -- limits ----------------------------------------------------------------------------------------
MAX_TOKEN_OCTETS: Final = 8192
"""Largest token accepted: bounds parsing work before the signature is checked."""
MAX_URI_CHARS: Final = 2048
MAX_NAMESPACE_FIELDS: Final = 32  # draft-14: a Track Namespace has at most 32 fields
MAX_FIELD_OCTETS: Final = 4096
SCOPE_ID_OCTETS: Final = 16
KEY_ID_OCTETS: Final = 8
MAX_CLOCK_SKEW_S: Final = 300
"""An ``iat`` further in the future than this means a broken issuer clock: reject the token."""
_CBOR_MAX_DEPTH: Final = 6
# cbor2 decodes these tags into Python objects (datetimes, regexes, MIME messages, shared references);
# none belongs in a token, so they are refused before any such decoder runs.
_CBOR2_SEMANTIC_TAGS: Final = (0, 1, 2, 3, 4, 5, 25, 28, 29, 30, 35, 36, 37, 52, 54, 100, 256, 258, 260,
                               261, 1004, 55799)

# MOQT session termination codes (draft-14 section 3.4) the errors map to.


class AuthError(MoqtError):
    """A peer failed authentication. ``error`` names the MOQT session termination to close with (the
    session's profile gives its number)."""

    error: ClassVar[SessionError] = SessionError.UNAUTHORIZED


class MalformedTokenError(AuthError):
    """Not a COSE_Sign1 CWT of the expected shape, or over the size limit."""

    error = SessionError.MALFORMED_AUTH_TOKEN


class UnsupportedAlgorithmError(MalformedTokenError):
    """The protected header names an algorithm other than ES256, or critical headers we don't know."""


class BadSignatureError(AuthError):
    """The signature does not verify under any trusted key (or the key ID is unknown)."""


class ExpiredTokenError(AuthError):
    """The token is past its ``exp`` or before its ``nbf``."""

    error = SessionError.EXPIRED_AUTH_TOKEN


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """The verified claims of a token: who the subject is and what it may use."""

    issuer: str
    subject: str
    expires_at: int
    issued_at: int
    not_before: int | None
    scopes: frozenset[bytes]
    namespaces: tuple[tuple[bytes, ...], ...]
    key_id: bytes

    def allows_scope(self, scope_id: bytes) -> bool:
        """Whether the token names this scope ID (D3: SUBSCRIBE/FETCH authorization)."""
        return scope_id in self.scopes

    def allows_namespace(self, namespace: Sequence[bytes]) -> bool:
        """Whether ``namespace`` starts with one of the token's namespace prefixes."""
        return any(tuple(namespace[: len(prefix)]) == prefix for prefix in self.namespaces)


def key_id(public_key: ec.EllipticCurvePublicKey) -> bytes:
    """First 8 octets of SHA-256 over the key's SubjectPublicKeyInfo: picks the key without trial."""
    spki = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).digest()[:KEY_ID_OCTETS]


def _check_p256(key: ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey) -> None:
    if not isinstance(key.curve, ec.SECP256R1):
        raise ValueError(f"ES256 needs a P-256 key, not {key.curve.name}")


def _sig_structure(protected: bytes, payload: bytes) -> bytes:
    return cbor2.dumps(["Signature1", protected, b"", payload])


def issue_token(key: ec.EllipticCurvePrivateKey, subject: str, scopes: Iterable[bytes] = (),
                namespaces: Iterable[Sequence[bytes]] = (), *, expires_at: int, now: int,
                issuer: str = "kvsp", not_before: int | None = None) -> bytes:
    """Sign a token for ``subject`` valid until ``expires_at`` (seconds since the epoch).

    The issuer is whoever holds a key the deployment trusts (the PC, or an operator's tool); the
    result is what a client puts in the AUTHORIZATION_TOKEN parameter. Raises ``ValueError`` for
    arguments the verifier would refuse, so a bad token is never minted.
    """
    _check_p256(key)
    try:
        _check_uri(subject, "sub")
    except MalformedTokenError as exc:
        raise ValueError(str(exc)) from exc
    scope_list = sorted(bytes(s) for s in scopes)
    if any(len(s) != SCOPE_ID_OCTETS for s in scope_list):
        raise ValueError("scope IDs are 16 octets")
    prefixes = [[bytes(f) for f in ns] for ns in namespaces]
    if any(not p or len(p) > MAX_NAMESPACE_FIELDS or any(len(f) > MAX_FIELD_OCTETS for f in p) for p in prefixes):
        raise ValueError(f"namespace prefixes have 1..{MAX_NAMESPACE_FIELDS} fields")
    if expires_at <= now:
        raise ValueError("expires_at must be after now")
    claims: dict[int, object] = {CLAIM_ISS: issuer, CLAIM_SUB: subject, CLAIM_EXP: int(expires_at),
                                 CLAIM_IAT: int(now)}
    if not_before is not None:
        claims[CLAIM_NBF] = int(not_before)
    if scope_list:
        claims[CLAIM_SCOPES] = [s.hex() for s in scope_list]
    if prefixes:
        claims[CLAIM_NAMESPACES] = prefixes
    protected = cbor2.dumps({HEADER_ALG: ALG_ES256, HEADER_KID: key_id(key.public_key())})
    payload = cbor2.dumps(claims)
    der = key.sign(_sig_structure(protected, payload), ec.ECDSA(hashes.SHA256()))
    r, s = decode_dss_signature(der)
    signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    token = cbor2.dumps(cbor2.CBORTag(CWT_TAG, cbor2.CBORTag(COSE_SIGN1_TAG, [protected, {}, payload, signature])))
    if len(token) > MAX_TOKEN_OCTETS:
        raise ValueError(f"token of {len(token)} octets exceeds {MAX_TOKEN_OCTETS}")
    return token


def verify_token(token: bytes, trusted_public_keys: Sequence[ec.EllipticCurvePublicKey], now: float) -> TokenClaims:
    """Check a token's envelope, signature and validity window at ``now``; return its claims.

    Order matters: size, then structure, then the signature, and only then the claims, so an
    unauthenticated sender learns nothing about claim checking and cannot make us parse much.
    """
    payload, verifying_key = verify_sign1(token, trusted_public_keys)
    claims = _parse_claims(_cbor(payload), key_id(verifying_key))
    if now >= claims.expires_at:
        raise ExpiredTokenError(f"token expired at {claims.expires_at}")
    if claims.not_before is not None and now < claims.not_before:
        raise ExpiredTokenError(f"token not valid before {claims.not_before}")
    if claims.issued_at > now + MAX_CLOCK_SKEW_S:
        raise ExpiredTokenError(f"token issued in the future ({claims.issued_at})")
    return claims


def verify_sign1(token: bytes, trusted_public_keys: Sequence[ec.EllipticCurvePublicKey]
                 ) -> tuple[bytes, ec.EllipticCurvePublicKey]:
    """Verify an ES256 COSE_Sign1 (optionally CWT-tagged); return its payload and the key that signed it.

    The layer below :func:`verify_token`, usable on any RFC 9052 COSE_Sign1 (e.g. RFC 8392's A.3).
    """
    if len(token) > MAX_TOKEN_OCTETS:
        raise MalformedTokenError(f"token of {len(token)} octets exceeds {MAX_TOKEN_OCTETS}")
    protected, payload, signature = _unwrap_sign1(_cbor(token))
    kid = _check_protected(protected)
    return payload, _verify_signature(protected, payload, signature, kid, trusted_public_keys)


# -- decoding --------------------------------------------------------------------------------------
def _refuse_tag(value: object, immutable: bool) -> object:
    raise MalformedTokenError("CBOR tag not allowed in a token")


_REFUSE_SEMANTIC = dict.fromkeys(_CBOR2_SEMANTIC_TAGS, _refuse_tag)


def _cbor(data: bytes) -> object:
    """Decode exactly one CBOR item; every decoder failure becomes ``MalformedTokenError``."""
    stream = io.BytesIO(data)
    try:
        item = cbor2.CBORDecoder(stream, semantic_decoders=_REFUSE_SEMANTIC, max_depth=_CBOR_MAX_DEPTH, read_size=1,
                                 allow_indefinite=False, allow_duplicate_keys=False).decode()
    except MalformedTokenError:
        raise
    except Exception as exc:  # cbor2 raises several types (CBORDecodeError, ValueError, RecursionError...)
        raise MalformedTokenError(f"not valid CBOR: {type(exc).__name__}") from exc
    if stream.tell() != len(data):  # read_size=1 keeps the position exact
        raise MalformedTokenError("trailing bytes after the CBOR item")
    return item


def _unwrap_sign1(item: object) -> tuple[bytes, bytes, bytes]:
    """Strip the optional CWT tag and the COSE_Sign1 tag; return (protected, payload, signature)."""
    if isinstance(item, cbor2.CBORTag) and item.tag == CWT_TAG:
        item = item.value
    if isinstance(item, cbor2.CBORTag) and item.tag == COSE_SIGN1_TAG:
        item = item.value
    if not isinstance(item, list | tuple) or len(item) != 4:  # cbor2 decodes arrays inside tags as tuples
        raise MalformedTokenError("not a COSE_Sign1 array of four elements")
    protected, unprotected, payload, signature = item
    if not isinstance(protected, bytes) or not isinstance(payload, bytes) or not isinstance(signature, bytes):
        raise MalformedTokenError("COSE_Sign1 protected, payload and signature must be byte strings")
    if not isinstance(unprotected, Mapping):
        raise MalformedTokenError("COSE_Sign1 unprotected header must be a map")
    if len(signature) != 64:
        raise MalformedTokenError("ES256 signature must be 64 octets (r || s)")
    return protected, payload, signature


def _check_protected(protected: bytes) -> bytes | None:
    """The protected header must name ES256; returns the key ID if present."""
    header = _cbor(protected)
    if not isinstance(header, Mapping):
        raise MalformedTokenError("protected header must be a map")
    alg = header.get(HEADER_ALG)
    if type(alg) is not int or alg != ALG_ES256:  # not bool, not -7.0
        raise UnsupportedAlgorithmError(f"alg {alg!r} is not ES256 (-7)")
    if HEADER_CRIT in header:
        raise UnsupportedAlgorithmError("critical header parameters are not supported")
    kid = header.get(HEADER_KID)
    if kid is not None and not isinstance(kid, bytes):
        raise MalformedTokenError("kid must be a byte string")
    return kid


def _verify_signature(protected: bytes, payload: bytes, signature: bytes, kid: bytes | None,
                      keys: Sequence[ec.EllipticCurvePublicKey]) -> ec.EllipticCurvePublicKey:
    """Verify under the key our ``kid`` names; a kid is only a hint (RFC 9052 section 3.1), so an
    unknown or foreign one means trying each trusted key (a deployment trusts a handful)."""
    candidates = [k for k in keys if kid is not None and key_id(k) == kid] or list(keys)
    if not candidates:
        raise BadSignatureError("no trusted token keys")
    der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
    message = _sig_structure(protected, payload)
    for key in candidates:
        _check_p256(key)
        try:
            key.verify(der, message, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            continue
        return key
    raise BadSignatureError("token signature does not verify")


def _parse_claims(item: object, kid: bytes) -> TokenClaims:
    if not isinstance(item, Mapping):
        raise MalformedTokenError("CWT claims must be a map")
    return TokenClaims(
        issuer=_text(item, CLAIM_ISS, "iss", MAX_URI_CHARS),
        subject=_check_uri(_text(item, CLAIM_SUB, "sub", MAX_URI_CHARS), "sub"),
        expires_at=_int(item, CLAIM_EXP, "exp"),
        issued_at=_int(item, CLAIM_IAT, "iat"),
        not_before=_int(item, CLAIM_NBF, "nbf") if CLAIM_NBF in item else None,
        scopes=frozenset(_scopes(item.get(CLAIM_SCOPES, []))),
        namespaces=tuple(_namespaces(item.get(CLAIM_NAMESPACES, []))),
        key_id=kid,
    )


def _text(claims: Mapping[object, object], label: int, name: str, limit: int) -> str:
    value = claims.get(label)
    if not isinstance(value, str) or not value or len(value) > limit:
        raise MalformedTokenError(f"claim {name} must be a text string of 1..{limit} characters")
    return value


def _int(claims: Mapping[object, object], label: int, name: str) -> int:
    value = claims.get(label)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**53:
        raise MalformedTokenError(f"claim {name} must be a NumericDate integer")
    return value


def _check_uri(value: str, name: str) -> str:
    """A subject is an identity URI with a host (https or moqt, as in certificate URI SANs)."""
    try:
        parts = urlsplit(value)
    except ValueError as exc:
        raise MalformedTokenError(f"claim {name} is not a URI") from exc
    if parts.scheme not in ("https", "moqt") or not parts.hostname or len(value) > MAX_URI_CHARS:
        raise MalformedTokenError(f"claim {name} must be an https:// or moqt:// URI with a host")
    return value


def _scopes(value: object) -> Iterable[bytes]:
    if not isinstance(value, list | tuple):
        raise MalformedTokenError("scope claim must be an array")
    for item in value:
        if not isinstance(item, str) or len(item) != 2 * SCOPE_ID_OCTETS or item != item.lower():
            raise MalformedTokenError("scope IDs are 32 lowercase hex digits")
        try:
            scope = bytes.fromhex(item)
        except ValueError as exc:
            raise MalformedTokenError("scope IDs are 32 lowercase hex digits") from exc
        if scope.hex() != item:  # fromhex also skips whitespace, which would make a shorter scope ID
            raise MalformedTokenError("scope IDs are 32 lowercase hex digits")
        yield scope


def _namespaces(value: object) -> Iterable[tuple[bytes, ...]]:
    if not isinstance(value, list | tuple):
        raise MalformedTokenError("namespace claim must be an array")
    for prefix in value:
        if not isinstance(prefix, list | tuple) or not 0 < len(prefix) <= MAX_NAMESPACE_FIELDS:
            raise MalformedTokenError(f"a namespace prefix is an array of 1..{MAX_NAMESPACE_FIELDS} fields")
        if not all(isinstance(f, bytes) and len(f) <= MAX_FIELD_OCTETS for f in prefix):
            raise MalformedTokenError("namespace fields are byte strings")
        yield tuple(prefix)
