"""Text <-> token ids for the front end, and incremental detokenization of a token stream.

``bytes`` is the tokenizer of the test engine deployments: a token is one UTF-8 octet (ids 0..255).
A ``tokenizer.json`` (Hugging Face ``tokenizers``) is used for real models; it is loaded once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

REPLACEMENT: Final = "\ufffd"
BYTE_VOCAB: Final = 256


class Tokenizer(Protocol):
    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 octets as token ids; ids past 255 (a model with a larger vocabulary) decode to U+FFFD."""

    @property
    def vocab_size(self) -> int:
        return BYTE_VOCAB

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, tokens: Sequence[int]) -> str:
        return bytes(t if t < BYTE_VOCAB else 0xFF for t in tokens).decode("utf-8", "replace")


class HfTokenizer:
    """A ``tokenizer.json`` through the ``tokenizers`` library (no special tokens added or skipped)."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer as _Hf  # noqa: PLC0415 - only deployments of real models need it

        self._tok = _Hf.from_file(path)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._tok.decode(list(tokens), skip_special_tokens=False))


def load_tokenizer(spec: str) -> Tokenizer:
    return ByteTokenizer() if spec == "bytes" else HfTokenizer(spec)


class TextStream:
    """Turns tokens, one at a time, into text pieces that never split a character.

    It decodes a short window (the tokens since the last emitted piece, plus the one before it, for
    tokenizers whose output depends on the previous token) and holds text back while it ends in an
    incomplete character (U+FFFD), so the pieces concatenate to the decoding of the whole output.
    """

    __slots__ = ("_prefix", "_read", "_tok", "_tokens")

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._tokens: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, token: int) -> str:
        self._tokens.append(token)
        before = self._tok.decode(self._tokens[self._prefix:self._read])
        text = self._tok.decode(self._tokens[self._prefix:])
        if len(text) > len(before) and not text.endswith(REPLACEMENT):
            self._prefix, self._read = self._read, len(self._tokens)
            return text[len(before):]
        return ""

    def flush(self) -> str:
        """What is held back at the end (an incomplete character becomes U+FFFD)."""
        before = self._tok.decode(self._tokens[self._prefix:self._read])
        text = self._tok.decode(self._tokens[self._prefix:])
        self._prefix = self._read = len(self._tokens)
        return text[len(before):]
