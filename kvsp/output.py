"""Output tokens as the front end reassembles them (spec section 6.8): each index once, in order.

`OutputAssembler` (front end) delivers every index exactly once and in order.  It drops tokens whose
index was already delivered, and tokens of a lower epoch than the newest seen *at indices the newest
epoch produces* (its first index and beyond).  A lower-epoch token below that first index is kept:
the newest epoch resumed from a checkpoint that covers it, and no instance labels it again, so
dropping it (the literal reading of the spec's "discard tokens that carry a lower epoch") would leave
a gap forever when it was still in flight at the failover.  Such a token is final: a deterministic
sampler produces the same value in every epoch, and a non-deterministic one released it only after the
PC acknowledged it, i.e. it is part of every later checkpoint.

Sans-I/O: the front end feeds it the labelled tokens it reads from whichever instance serves the session.
"""

from __future__ import annotations

from typing import Final

from kvsp.errors import KvspError
from kvsp.records.generation import TokenEvent

DEFAULT_MAX_BUFFERED: Final = 1 << 16


class OutputOverflow(KvspError):
    """More out-of-order tokens are waiting than the assembler keeps: the stream is broken or hostile."""


class OutputAssembler:
    """Front-end reassembly of one session's output: each index once, in order, newest epoch first."""

    __slots__ = ("_buffer", "_epoch", "_floor", "_max", "_next")

    def __init__(self, *, max_buffered: int = DEFAULT_MAX_BUFFERED) -> None:
        self._max = max_buffered
        self._next = 0
        self._epoch = -1
        self._floor = 0  # first index seen of the newest epoch
        self._buffer: dict[int, TokenEvent] = {}

    @property
    def next_index(self) -> int:
        """Indices below this have been delivered."""
        return self._next

    @property
    def epoch(self) -> int:
        """The newest epoch seen (-1 before any token)."""
        return self._epoch

    def receive(self, token: TokenEvent) -> list[TokenEvent]:
        """Take one labelled token; returns the tokens now deliverable, in index order."""
        if token.epoch > self._epoch:
            self._epoch, self._floor = token.epoch, token.index
            # The new epoch produces every index from its first one: drop older copies buffered there.
            self._buffer = {i: t for i, t in self._buffer.items() if i < self._floor}
        elif token.epoch < self._epoch and token.index >= self._floor:
            return []  # a lower epoch where the newest one speaks
        if token.index < self._next:
            return []  # duplicate of a delivered index
        held = self._buffer.get(token.index)
        if held is not None and held.epoch >= token.epoch:
            return []  # duplicate of a buffered index
        if held is None and token.index != self._next and len(self._buffer) >= self._max:
            raise OutputOverflow(f"more than {self._max} tokens wait for index {self._next}")
        self._buffer[token.index] = token
        out: list[TokenEvent] = []
        while self._next in self._buffer:
            out.append(self._buffer.pop(self._next))
            self._next += 1
        return out
