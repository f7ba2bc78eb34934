"""Role identifiers (spec section 5, decision D1) and the MOQT namespace encoding (decision D3)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from kvsp.encoding import b64url_decode, b64url_encode, parse_hex
from kvsp.errors import ValidationError

NAMESPACE_PREFIX: Final = b"kvsp"
ROLE_ID_LENGTH: Final = 43  # base64url of 32 octets, no padding
MAX_URI_LENGTH: Final = 2048


def role_id(base_uri: str) -> str:
    """{holder-id}/{instance-id}: base64url (no padding) of SHA-256 of the base URI as written."""
    return b64url_encode(hashlib.sha256(base_uri.encode("utf-8")).digest())


def check_role_id(value: str, member: str = "holder-id") -> str:
    if len(value) != ROLE_ID_LENGTH:
        raise ValidationError(member, f"must be {ROLE_ID_LENGTH} base64url characters")
    b64url_decode(value, member)
    return value


def check_base_uri(value: str, member: str, schemes: frozenset[str] = frozenset({"https"})) -> str:
    """A role base URI: absolute, with an allowed scheme and a host, no fragment."""
    if len(value) > MAX_URI_LENGTH:
        raise ValidationError(member, f"must be at most {MAX_URI_LENGTH} characters")
    try:
        parts = urlsplit(value)
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError as exc:
        raise ValidationError(member, f"is not a valid URI ({exc})") from exc
    if parts.scheme not in schemes:
        raise ValidationError(member, f"must be a URI with scheme {' or '.join(sorted(schemes))}")
    if not parts.hostname or not port_ok or parts.fragment:
        raise ValidationError(member, "must be an absolute URI with a host and no fragment")
    return value


@dataclass(frozen=True, slots=True)
class TrackNamespace:
    """The five Track Namespace Fields of a KVSP block (decision D3), decoded."""

    compat_id: bytes
    scope_id: bytes
    holder_id: str
    block_key: bytes

    def fields(self) -> tuple[bytes, bytes, bytes, bytes, bytes]:
        return (NAMESPACE_PREFIX, self.compat_id.hex().encode(), self.scope_id.hex().encode(),
                self.holder_id.encode(), self.block_key.hex().encode())

    def encode(self) -> str:
        """The record member ``moqt_namespace``: each field preceded by its length as one octet."""
        out = bytearray()
        for field in self.fields():
            out.append(len(field))
            out += field
        return b64url_encode(bytes(out))

    @classmethod
    def from_fields(cls, fields: tuple[bytes, ...] | list[bytes], member: str = "namespace") -> TrackNamespace:
        if len(fields) != 5 or fields[0] != NAMESPACE_PREFIX:
            raise ValidationError(member, 'must be five fields starting with "kvsp"')
        try:
            compat, scope, holder, key = (f.decode("ascii") for f in fields[1:])
        except UnicodeDecodeError as exc:
            raise ValidationError(member, "fields must be ASCII") from exc
        return cls(parse_hex(compat, 32, f"{member}[1]"), parse_hex(scope, 16, f"{member}[2]"),
                   check_role_id(holder, f"{member}[3]"), parse_hex(key, 32, f"{member}[4]"))

    @classmethod
    def decode(cls, value: str, member: str = "moqt_namespace") -> TrackNamespace:
        data = b64url_decode(value, member)
        fields: list[bytes] = []
        pos = 0
        while pos < len(data):
            n = data[pos]
            if pos + 1 + n > len(data):
                raise ValidationError(member, "field length runs past the end")
            fields.append(data[pos + 1 : pos + 1 + n])
            pos += 1 + n
        return cls.from_fields(fields, member)
