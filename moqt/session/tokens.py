"""The receiver's AUTHORIZATION TOKEN alias cache (draft-14 sections 9.2.1.1, 9.3.2.4 and 9.3.2.5).

Why in the session: registering, using and deleting aliases are protocol state with their own Session
Termination codes (DUPLICATE_AUTH_TOKEN_ALIAS, UNKNOWN_AUTH_TOKEN_ALIAS, AUTH_TOKEN_CACHE_OVERFLOW),
so the session resolves every token to its (Token Type, Token Value) before the application sees the
message; verifying what a token says (moqt/auth.py) stays with the application.
"""

from __future__ import annotations

from collections.abc import Sequence

from moqt.errors import ProtocolViolation
from moqt.kinds import AliasType, SessionError
from moqt.params import AuthToken, ResolvedToken


class TokenCache:
    """Aliases the peer registered with us, bounded by the MAX_AUTH_TOKEN_CACHE_SIZE we announced."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self.size = 0
        self._entries: dict[int, tuple[ResolvedToken, int]] = {}

    def apply(self, tokens: Sequence[AuthToken], *, in_client_setup: bool = False) -> tuple[ResolvedToken, ...]:
        """Register/delete as the tokens say and return what each one stands for."""
        resolved: list[ResolvedToken] = []
        for token in tokens:
            entry = self._apply_one(token, in_client_setup)
            if entry is not None:
                resolved.append(entry)
        return tuple(resolved)

    def _apply_one(self, token: AuthToken, in_client_setup: bool) -> ResolvedToken | None:
        if token.alias_type == AliasType.USE_VALUE:
            return ResolvedToken(token.token_type or 0, token.value or b"")
        alias = token.alias or 0
        if token.alias_type == AliasType.REGISTER:
            return self._register(token, alias, in_client_setup)
        known = self._entries.get(alias)
        if known is None:
            raise ProtocolViolation(SessionError.UNKNOWN_AUTH_TOKEN_ALIAS, f"token alias {alias} is not registered")
        if token.alias_type == AliasType.DELETE:
            del self._entries[alias]
            self.size -= known[1]
            return None
        return known[0]

    def _register(self, token: AuthToken, alias: int, in_client_setup: bool) -> ResolvedToken:
        value = ResolvedToken(token.token_type or 0, token.value or b"")
        if alias in self._entries:
            raise ProtocolViolation(SessionError.DUPLICATE_AUTH_TOKEN_ALIAS, f"token alias {alias} already in use")
        size = token.token_size()
        if self.size + size > self.max_size:
            if in_client_setup:  # the draft: treat it as USE_VALUE; the client purges the alias itself
                return value
            raise ProtocolViolation(SessionError.AUTH_TOKEN_CACHE_OVERFLOW,
                                    f"registering {size} octets overflows the token cache of {self.max_size}")
        self._entries[alias] = (value, size)
        self.size += size
        return value
