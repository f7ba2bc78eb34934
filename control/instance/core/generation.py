"""Output rules of a generating session (spec section 6.8): the instance's gate.

`OutputGate` (instance side) labels every output token with its index and the session epoch, says when
a checkpoint is due, and holds tokens back when the sampler is not deterministic:

- a checkpoint is due whenever a block of the sequence (prompt + generated) completes, and at least
  every ``checkpoint_every`` (64) output tokens;
- a deterministic sampler releases each token at once: a resumed instance regenerates the same tokens
  after the last checkpoint and the front end drops the duplicates by index;
- otherwise a token is released only once the PC has acknowledged a checkpoint that covers it.  So
  that this does not wait for a whole block, a checkpoint is also due once ``release_batch`` tokens
  are waiting (1 by default; larger values trade latency for fewer checkpoints);
- a gate built from a resume checkpoint labels tokens from its output_offset, at its (new) epoch.

The front end's side of the same rules, `OutputAssembler`, is in `kvsp.output`.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from control.instance.core.events import OutputToken
from kvsp.records import Sampler, SessionCheckpoint

CHECKPOINT_EVERY: Final = 64  # "at least every 64 output tokens"


class OutputGate:
    """Labels, checkpoints and releases the output tokens of one session at one epoch."""

    __slots__ = ("_acked", "_base", "_block", "_checkpointed", "_every", "_generated", "_prompt",
                 "_release_batch", "_released")

    def __init__(self, checkpoint: SessionCheckpoint, *, block_tokens: int, checkpoint_every: int = CHECKPOINT_EVERY,
                 release_batch: int = 1) -> None:
        """Start from ``checkpoint``: output_offset 0 for a new session, or the resume checkpoint (which
        the PC has recorded, so everything it covers counts as acknowledged)."""
        if block_tokens < 1 or checkpoint_every < 1 or release_batch < 1:
            raise ValueError("block_tokens, checkpoint_every and release_batch must be positive")
        self._base = checkpoint
        self._block = block_tokens
        self._every = checkpoint_every
        self._release_batch = release_batch
        self._prompt = len(checkpoint.prompt_blocks) * block_tokens + len(checkpoint.prompt_tail)
        self._generated = list(checkpoint.generated)
        self._checkpointed = self._acked = self._released = checkpoint.output_offset

    @property
    def epoch(self) -> int:
        return self._base.epoch

    @property
    def deterministic(self) -> bool:
        return self._base.sampler.deterministic

    @property
    def output_offset(self) -> int:
        """Output tokens generated so far (the index the next token gets)."""
        return len(self._generated)

    @property
    def released(self) -> int:
        """Tokens released to the front end (indices below this)."""
        return self._released

    @property
    def acked(self) -> int:
        return self._acked

    def push(self, token: int) -> list[OutputToken]:
        """Record the next sampled token; returns the tokens to send to the front end now."""
        index = len(self._generated)
        self._generated.append(token)
        if not self.deterministic:
            return []
        self._released = index + 1
        return [OutputToken(index, self.epoch, token)]

    def checkpoint_due(self, *, final: bool = False) -> bool:
        """Whether to checkpoint now; ``final`` after the last token, so nothing stays unreleased."""
        new = len(self._generated) - self._checkpointed
        if new <= 0:
            return False
        if final or new >= self._every:
            return True
        if (self._prompt + self._checkpointed) // self._block < (self._prompt + len(self._generated)) // self._block:
            return True  # a block of the sequence completed since the last checkpoint
        return not self.deterministic and new >= self._release_batch

    def checkpoint(self, sampler: Sampler) -> SessionCheckpoint:
        """The checkpoint of everything generated so far; ``sampler`` is the sampler state right after the
        last pushed token (its step counts the tokens sampled), so a resume continues at the next one."""
        self._checkpointed = len(self._generated)
        return dataclasses.replace(self._base, generated=tuple(self._generated),
                                   output_offset=len(self._generated), sampler=sampler)

    def ack(self, output_offset: int, *, epoch: int) -> list[OutputToken]:
        """The PC acknowledged a checkpoint covering ``output_offset`` tokens; returns the tokens to release.

        An acknowledgement for another epoch is not about this gate's output and is ignored.
        """
        if epoch != self.epoch:
            return []
        if output_offset > self._checkpointed:
            raise ValueError(f"acknowledged offset {output_offset} was never checkpointed ({self._checkpointed})")
        self._acked = max(self._acked, output_offset)
        if self.deterministic or self._acked <= self._released:
            return []
        out = [OutputToken(i, self.epoch, self._generated[i]) for i in range(self._released, self._acked)]
        self._released = self._acked
        return out
