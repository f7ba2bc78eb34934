"""Small wire encodings shared by every record: hex, base64url, digests, canonical JSON."""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any, Final

import rfc8785

from kvsp.errors import ValidationError

DIGEST_PREFIX: Final = "sha-256:"
MAX_JCS_INT: Final = 2**53 - 1  # rfc8785 refuses integers beyond the I-JSON range


def parse_hex(value: str, octets: int, member: str) -> bytes:
    """Parse exactly ``octets`` octets of *lowercase* hex (the spec's hex16/hex32)."""
    if len(value) != 2 * octets:
        raise ValidationError(member, f"must be {2 * octets} lowercase hex characters (hex{octets})")
    try:
        data = bytes.fromhex(value)
    except (ValueError, TypeError):
        data = None
    # fromhex also takes uppercase and spaces; the round trip leaves lowercase hex only (all in C).
    if data is None or data.hex() != value:
        raise ValidationError(member, f"must be lowercase hex (hex{octets})")
    return data


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


class _NotPlain(Exception):
    """A value the fast JCS path does not handle; the reference serialiser takes it."""


def _plain(value: Any) -> Any:
    """``value`` ready for `json.dumps` to write its JCS form, or `_NotPlain`.

    json.dumps (sorted keys, no spaces, ensure_ascii off) writes strings, safe integers and the object
    order exactly as RFC 8785 does when every key is ASCII (code point order is then UTF-16 order).
    Floats differ only in spelling: an integral float is written as the integer it equals (JCS "1" for
    1.0), and any other float from 1e-4 up has the same shortest-digits fixed notation in both; every
    other value (other floats, subclasses, other containers) goes to the reference serialiser.  Lists
    and objects are copied only when an item changes.
    """
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if -MAX_JCS_INT <= value <= MAX_JCS_INT:
            return value
        raise _NotPlain
    if kind is float:
        if value.is_integer():
            if -MAX_JCS_INT <= value <= MAX_JCS_INT:
                return int(value)
        elif 1e-4 <= abs(value) < math.inf:  # not integral, so below 2**52: repr uses fixed notation
            return value
        raise _NotPlain
    if kind is dict:
        out: dict[str, Any] | None = None
        for key, item in value.items():
            if type(key) is not str or not key.isascii():
                raise _NotPlain
            plain = item if type(item) is str else _plain(item)
            if plain is not item:
                if out is None:
                    out = dict(value)
                out[key] = plain
        return value if out is None else out
    if kind is list or kind is tuple:
        items: list[Any] | None = None
        for i, item in enumerate(value):
            plain = item if type(item) is str else _plain(item)
            if plain is not item:
                if items is None:
                    items = list(value)
                items[i] = plain
        return value if items is None else items
    raise _NotPlain


def canonical_json(value: Any) -> bytes:
    """JSON Canonicalization Scheme (RFC 8785) serialisation.

    Values outside I-JSON (integers beyond 2**53, lone surrogates) cannot be canonicalised; that is
    an input error, reported like any other.  Records take the C encoder through `_plain`; whatever it
    does not vouch for, and any failure (lone surrogates fail the UTF-8 encode), goes to rfc8785.
    """
    try:
        return json.dumps(_plain(value), ensure_ascii=False, separators=(",", ":"), sort_keys=True,
                          allow_nan=False).encode("utf-8")
    except (_NotPlain, ValueError, TypeError, RecursionError):  # UnicodeEncodeError is a ValueError
        pass
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError) as exc:
        # rfc8785 sorts member names by their UTF-16 form before it checks them: a lone surrogate in a
        # name fails that encode as a UnicodeEncodeError, not as its own error.
        raise ValidationError("$", f"cannot be canonicalised with JCS ({exc})") from exc


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# json.loads with keyword arguments builds a decoder per call; records are parsed on every request.
_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant)


def parse_json(data: bytes | str, member: str = "$") -> object:
    """Parse JSON text strictly (no NaN/Infinity), as a `ValidationError` on any failure.

    The steps of `json.loads` (encoding detection for octets, the BOM rule for text) with one decoder.
    """
    try:
        if isinstance(data, bytes | bytearray):
            text = data.decode(json.detect_encoding(data), "surrogatepass")
        elif isinstance(data, str):
            if data.startswith("\ufeff"):
                raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", data, 0)
            text = data
        else:
            return json.loads(data, parse_constant=_reject_constant)  # its TypeError, as before
        return _DECODER.decode(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValidationError(member, f"malformed JSON ({exc})") from exc
