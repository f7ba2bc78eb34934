"""Small wire encodings shared by every record: hex, base64url, digests, canonical JSON."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Final

import rfc8785

from kvsp.errors import ValidationError

DIGEST_PREFIX: Final = "sha-256:"
_HEX_DIGITS: Final = frozenset("0123456789abcdef")


def to_hex(data: bytes) -> str:
    return data.hex()


def parse_hex(value: str, octets: int, member: str) -> bytes:
    """Parse exactly ``octets`` octets of *lowercase* hex (the spec's hex16/hex32)."""
    if len(value) != 2 * octets:
        raise ValidationError(member, f"must be {2 * octets} lowercase hex characters (hex{octets})")
    if not _HEX_DIGITS.issuperset(value):
        raise ValidationError(member, f"must be lowercase hex (hex{octets})")
    return bytes.fromhex(value)


def format_digest(digest: bytes) -> str:
    return DIGEST_PREFIX + digest.hex()


def parse_digest(value: str, member: str) -> bytes:
    """Parse ``sha-256:<64 lowercase hex>``."""
    if not value.startswith(DIGEST_PREFIX):
        raise ValidationError(member, 'must be "sha-256:" followed by 64 lowercase hex characters')
    return parse_hex(value[len(DIGEST_PREFIX) :], 32, member)


def b64url_encode(data: bytes) -> str:
    """base64url without padding (RFC 4648 section 5)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(value: str, member: str) -> bytes:
    """Strict base64url without padding: rejects padding, other alphabets and non-canonical tails."""
    if "=" in value or not value.isascii():
        raise ValidationError(member, "must be base64url without padding")
    try:
        data = base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValidationError(member, "must be base64url without padding") from exc
    if b64url_encode(data) != value:
        raise ValidationError(member, "must be canonical base64url without padding")
    return data


def canonical_json(value: Any) -> bytes:
    """JSON Canonicalization Scheme (RFC 8785) serialisation.

    Values outside I-JSON (integers beyond 2**53, lone surrogates) cannot be canonicalised; that is
    an input error, reported like any other.
    """
    try:
        return rfc8785.dumps(value)
    except rfc8785.CanonicalizationError as exc:
        raise ValidationError("$", f"cannot be canonicalised with JCS ({exc})") from exc


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(data: bytes | str, member: str = "$") -> object:
    """Parse JSON text strictly (no NaN/Infinity), as a `ValidationError` on any failure."""
    try:
        return json.loads(data, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValidationError(member, f"malformed JSON ({exc})") from exc
