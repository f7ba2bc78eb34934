"""Scopes and Block Keys (spec section 4.2).

``K[i] = HMAC-SHA-256(scope_key, "KVSP-BLOCK-1" || 0x00 || compat_id || K[i-1] || uint32(t...))``

`BlockKeyChain` extends a chain incrementally: an engine that already knows the key of the last
complete block of a prompt computes the keys of a longer prompt from it without rehashing the prefix.
"""

from __future__ import annotations

import array
import hashlib
import hmac
import secrets
import struct
import sys
from collections.abc import Iterable, Sequence
from typing import Final

from kvsp.errors import ValidationError

SCOPE_LABEL: Final = b"KVSP-SCOPE-1\x00"
BLOCK_LABEL: Final = b"KVSP-BLOCK-1\x00"
MIN_SCOPE_KEY_OCTETS: Final = 32
ZERO_KEY: Final = bytes(32)
MAX_TOKEN: Final = 2**32 - 1


class ScopeKey:
    """A Scope Key.  Its repr never shows the key, so it cannot leak into logs by accident."""

    __slots__ = ("_key", "scope_id")

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_SCOPE_KEY_OCTETS:
            raise ValidationError("scope_key", f"must be at least {MIN_SCOPE_KEY_OCTETS} octets")
        self._key = bytes(key)
        self.scope_id: bytes = scope_id(self._key)

    @classmethod
    def generate(cls, octets: int = MIN_SCOPE_KEY_OCTETS) -> ScopeKey:
        return cls(secrets.token_bytes(octets))

    @classmethod
    def from_hex(cls, text: str) -> ScopeKey:
        try:
            key = bytes.fromhex(text)
        except ValueError:
            # Do not echo the text (nor chain the error that quotes it): it is a mistyped secret.
            raise ValidationError("scope_key", "must be hex") from None
        return cls(key)

    def secret(self) -> bytes:
        """The key octets, for HMAC and for storage by the scope's principals only."""
        return self._key

    def __repr__(self) -> str:
        return f"ScopeKey(scope_id={self.scope_id.hex()})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ScopeKey) and hmac.compare_digest(self._key, other._key)

    def __hash__(self) -> int:
        return hash(self.scope_id)


def scope_id(scope_key: bytes) -> bytes:
    """First 16 octets of SHA-256("KVSP-SCOPE-1" || 0x00 || scope_key)."""
    if len(scope_key) < MIN_SCOPE_KEY_OCTETS:
        raise ValidationError("scope_key", f"must be at least {MIN_SCOPE_KEY_OCTETS} octets")
    return hashlib.sha256(SCOPE_LABEL + scope_key).digest()[:16]


_U32_ARRAY: Final = "I" if array.array("I").itemsize == 4 else "L"


def pack_tokens(tokens: Sequence[int]) -> bytes:
    """Tokens as uint32 in network byte order, rejecting values outside 0..2**32-1."""
    # array() converts and range-checks in C: ~2x faster than struct.pack(*tokens) on long prompts.
    try:
        packed = array.array(_U32_ARRAY, tokens)
    except (OverflowError, TypeError) as exc:
        raise ValidationError("tokens", "each token must be an integer in 0..4294967295") from exc
    if sys.byteorder == "little":
        packed.byteswap()
    return packed.tobytes()


class BlockKeyChain:
    """Incremental Block Key computation for one (scope, compat_id, block size).

    Feed tokens with `extend`; it returns the keys of the blocks completed by them.  Tokens after the
    last complete block wait for more (only complete blocks have keys).
    """

    __slots__ = ("_base", "_pending", "block_tokens", "blocks", "last_key")

    def __init__(self, scope_key: ScopeKey | bytes, compat_id: bytes, block_tokens: int, *,
                 last_key: bytes = ZERO_KEY, blocks: int = 0) -> None:
        key = scope_key if isinstance(scope_key, ScopeKey) else ScopeKey(scope_key)
        if len(compat_id) != 32:
            raise ValidationError("compat_id", "must be 32 octets")
        if block_tokens < 1:
            raise ValidationError("block_tokens", "must be at least 1")
        if len(last_key) != 32:
            raise ValidationError("last_key", "must be 32 octets")
        # HMAC state after the constant label and compat_id: each block copies it (C-level) instead
        # of re-deriving the key pads, which makes the chain faster than one-shot hmac.digest.
        self._base = hmac.new(key.secret(), BLOCK_LABEL + compat_id, hashlib.sha256)
        self._pending = bytearray()  # packed uint32 tokens not yet in a complete block
        self.block_tokens = block_tokens
        self.last_key = last_key
        self.blocks = blocks  # complete blocks so far, i.e. the index of the next key

    @property
    def pending_tokens(self) -> tuple[int, ...]:
        return struct.unpack(f">{len(self._pending) // 4}I", self._pending)

    def extend(self, tokens: Iterable[int]) -> list[bytes]:
        # Pack (and so validate) before touching state: a bad token leaves the chain as it was.
        new = pack_tokens(tokens if isinstance(tokens, Sequence) else list(tokens))
        step = 4 * self.block_tokens
        if len(self._pending) + len(new) < step:
            self._pending += new
            return []
        packed = bytes(self._pending + new) if self._pending else new
        usable = len(packed) - len(packed) % step
        self._pending = bytearray(packed[usable:])
        view = memoryview(packed)
        base = self._base
        out: list[bytes] = []
        prev = self.last_key
        for off in range(0, usable, step):
            h = base.copy()
            h.update(prev)
            h.update(view[off : off + step])
            prev = h.digest()
            out.append(prev)
        self.last_key = prev
        self.blocks += len(out)
        return out


def block_keys(scope_key: ScopeKey | bytes, compat_id: bytes, block_tokens: int,
               tokens: Sequence[int]) -> list[bytes]:
    """Block Keys of every complete block of ``tokens``."""
    return BlockKeyChain(scope_key, compat_id, block_tokens).extend(tokens)
