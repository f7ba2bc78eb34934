"""Scopes and Block Keys (spec section 4.2, Appendix A)."""

from __future__ import annotations

import hashlib
import hmac
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsp.errors import ValidationError
from kvsp.keys import BlockKeyChain, ScopeKey, block_keys, scope_id
from tests.support.vectors import (
    APPENDIX_A_COMPAT_ID,
    APPENDIX_A_K0,
    APPENDIX_A_K1,
    APPENDIX_A_SCOPE_ID,
    APPENDIX_A_SCOPE_KEY,
    APPENDIX_A_TOKENS,
)

COMPAT = bytes.fromhex(APPENDIX_A_COMPAT_ID)


def reference_keys(key: bytes, compat: bytes, b: int, tokens: list[int]) -> list[bytes]:
    """The section 4.2 formula written out literally, independent of the implementation."""
    out, prev = [], bytes(32)
    for i in range(len(tokens) // b):
        msg = b"KVSP-BLOCK-1" + b"\x00" + compat + prev
        for t in tokens[i * b : (i + 1) * b]:
            msg += struct.pack("!I", t)
        prev = hmac.new(key, msg, hashlib.sha256).digest()
        out.append(prev)
    return out


def test_appendix_a_scope_id() -> None:
    assert scope_id(APPENDIX_A_SCOPE_KEY).hex() == APPENDIX_A_SCOPE_ID
    assert ScopeKey(APPENDIX_A_SCOPE_KEY).scope_id.hex() == APPENDIX_A_SCOPE_ID


def test_appendix_a_block_keys() -> None:
    keys = block_keys(APPENDIX_A_SCOPE_KEY, COMPAT, 4, APPENDIX_A_TOKENS)
    assert [k.hex() for k in keys] == [APPENDIX_A_K0, APPENDIX_A_K1]


def test_only_complete_blocks_have_keys() -> None:
    assert len(block_keys(APPENDIX_A_SCOPE_KEY, COMPAT, 4, [*APPENDIX_A_TOKENS, 1, 2, 3])) == 2
    assert block_keys(APPENDIX_A_SCOPE_KEY, COMPAT, 4, [1, 2, 3]) == []


def test_incremental_extension_from_last_known_key() -> None:
    # An engine that knows K[0] computes K[1] from it without the first block's tokens.
    chain = BlockKeyChain(APPENDIX_A_SCOPE_KEY, COMPAT, 4, last_key=bytes.fromhex(APPENDIX_A_K0), blocks=1)
    assert [k.hex() for k in chain.extend(APPENDIX_A_TOKENS[4:])] == [APPENDIX_A_K1]
    assert chain.blocks == 2


def test_chain_covers_prefix() -> None:
    # Same block-1 tokens after a different block 0 give a different K[1].
    other = [1, 2, 3, 4, *APPENDIX_A_TOKENS[4:]]
    assert block_keys(APPENDIX_A_SCOPE_KEY, COMPAT, 4, other)[1].hex() != APPENDIX_A_K1


def test_scopes_are_unrelated() -> None:
    other = bytes(range(1, 33))
    assert block_keys(other, COMPAT, 4, APPENDIX_A_TOKENS)[0].hex() != APPENDIX_A_K0


@pytest.mark.parametrize("tokens", [[-1, 0, 0, 0], [2**32, 0, 0, 0], [1.5, 0, 0, 0]])
def test_bad_tokens_rejected_and_state_unchanged(tokens: list[int]) -> None:
    chain = BlockKeyChain(APPENDIX_A_SCOPE_KEY, COMPAT, 4)
    chain.extend([7, 8])
    with pytest.raises(ValidationError, match="token"):
        chain.extend(tokens)
    assert chain.pending_tokens == (7, 8) and chain.blocks == 0


def test_short_scope_key_rejected() -> None:
    with pytest.raises(ValidationError, match="32 octets"):
        ScopeKey(bytes(31))


def test_scope_key_never_in_repr() -> None:
    key = ScopeKey(APPENDIX_A_SCOPE_KEY)
    assert APPENDIX_A_SCOPE_KEY.hex() not in repr(key) and APPENDIX_A_SCOPE_KEY.hex() not in str(key)


def test_scope_key_bad_hex_is_not_echoed() -> None:
    secret = "zz" + "00" * 40
    with pytest.raises(ValidationError) as info:
        ScopeKey.from_hex(secret)
    assert secret not in str(info.value)


@given(st.lists(st.integers(0, 2**32 - 1), max_size=200), st.integers(1, 9), st.lists(st.integers(0, 50)))
def test_incremental_equals_reference_for_any_split(tokens: list[int], b: int, cuts: list[int]) -> None:
    expected = reference_keys(APPENDIX_A_SCOPE_KEY, COMPAT, b, tokens)
    chain = BlockKeyChain(APPENDIX_A_SCOPE_KEY, COMPAT, b)
    got: list[bytes] = []
    pos = 0
    for cut in cuts:
        got += chain.extend(tokens[pos : pos + cut])
        pos += cut
    got += chain.extend(iter(tokens[pos:]))
    assert got == expected
    assert chain.pending_tokens == tuple(tokens[len(expected) * b :])
