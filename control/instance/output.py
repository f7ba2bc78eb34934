"""Output plumbing of one session: the released-token log readers stream from, and the checkpoint sender.

`TokenLog` holds the tokens the `OutputGate` released, in index order, at one epoch; any number of
readers follow it (GET sessions/{session}/tokens?from=N) and wait for more.  It is bounded by the
session's max_tokens (itself bounded by configuration); readers are bounded per session.

`CheckpointSender` PUTs checkpoints to the PC one at a time, in order, without blocking generation.
Each checkpoint is sent (one per completed block, section 6.8) while at most ``MAX_QUEUED`` wait;
beyond that the oldest waiting ones are dropped, because the newest covers them (the PC keeps the
highest output_offset).  Transport failures and refusals are retried with backoff, and while one is
retried a newer waiting checkpoint replaces it; while no PC answers as the leader (an active/standby
takeover, decision D7) the pause stays at ``LEADER_RETRY_S``, so the first checkpoint the new leader
can take reaches it within that, not after a backoff grown during the election.  Fencing (`Fenced`)
stops the sender for good.
`hold_until` keeps every checkpoint back until a condition is met (the session's prompt blocks have
reached the ``replicate_to`` holders: a checkpoint names them by key only, section 6.8).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from control.instance.core import OutputToken
from control.instance.pc_client import Fenced
from control.instance.records import CheckpointAck
from control.pc.endpoints import LeaderUnavailable
from kvsp.client.http import TransportError
from kvsp.errors import ValidationError
from kvsp.problems import ProblemError
from kvsp.records import SessionCheckpoint
from kvsp.records.generation import StreamEnd

log = logging.getLogger("kvsp.instance.output")

BACKOFF_FIRST_S: Final = 0.05
BACKOFF_MAX_S: Final = 2.0
MAX_QUEUED: Final = 8
LEADER_RETRY_S: Final = 0.1


class TokenLog:
    """Released output tokens of one session at one epoch, from index 0."""

    def __init__(self, epoch: int, initial: Sequence[int] = ()) -> None:
        self.epoch = epoch
        self.tokens: list[int] = list(initial)
        self.end: StreamEnd | None = None
        self.closed = False
        self.readers = 0
        self._changed = asyncio.Event()

    def extend(self, released: Sequence[OutputToken]) -> None:
        for token in released:
            if token.index != len(self.tokens) or token.epoch != self.epoch:
                raise RuntimeError(f"token {token} does not follow the log (next {len(self.tokens)})")
            self.tokens.append(token.token)
        if released:
            self._notify()

    def close(self, end: StreamEnd | None) -> None:
        """No more tokens: ``end`` is the stream's last line, or None when the session stopped here
        without finishing (fenced, failed): readers then see the connection end without an end line."""
        if not self.closed:
            self.end, self.closed = end, True
            self._notify()

    async def wait(self, index: int) -> None:
        """Until the token at ``index`` exists or the log is closed."""
        while len(self.tokens) <= index and not self.closed:
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


class CheckpointSender:
    """Sends a session's checkpoints to the PC in order; feeds acknowledgements back."""

    def __init__(self, put: Callable[[SessionCheckpoint], Awaitable[CheckpointAck]],
                 on_ack: Callable[[CheckpointAck], None], on_fenced: Callable[[Fenced], None],
                 on_result: Callable[[str], None]) -> None:
        self._put = put
        self._on_ack = on_ack
        self._on_fenced = on_fenced
        self._on_result = on_result
        self._queue: deque[SessionCheckpoint] = deque(maxlen=MAX_QUEUED)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._hold: asyncio.Task[None] | None = None
        self.fenced = False

    def hold_until(self, ready: Awaitable[None]) -> None:
        """Send nothing before ``ready`` is done (its errors are ignored: then it is done too)."""
        self._hold = asyncio.ensure_future(ready)

    def submit(self, checkpoint: SessionCheckpoint) -> None:
        if self.fenced:
            return
        self._queue.append(checkpoint)  # a full deque drops its oldest: the newest covers it
        self._idle.clear()
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def flush(self, timeout_s: float) -> bool:
        """Wait until every submitted checkpoint was acknowledged (or given up); False on timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return not self.fenced

    async def close(self) -> None:
        if self._hold is not None and not self._hold.done():
            self._hold.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._idle.set()

    async def _loop(self) -> None:
        if self._hold is not None:
            await asyncio.wait([self._hold])
        while not self.fenced:
            await self._wake.wait()
            self._wake.clear()
            while self._queue and not self.fenced:
                await self._deliver(self._queue.popleft())
            self._idle.set()

    async def _deliver(self, checkpoint: SessionCheckpoint) -> None:
        delay = BACKOFF_FIRST_S
        while True:
            try:
                ack = await self._put(checkpoint)
            except Fenced as exc:
                self.fenced = True
                self._on_result("stale")
                self._on_fenced(exc)
                return
            except (ProblemError, TransportError, ValidationError) as exc:
                self._on_result("refused" if isinstance(exc, ProblemError) else "failed")
                if isinstance(exc, LeaderUnavailable):
                    delay = min(delay, LEADER_RETRY_S)
                log.warning("checkpoint of %s at %d not recorded (%s); retrying in %.2f s",
                            checkpoint.session, checkpoint.output_offset, exc, delay)
                await asyncio.sleep(delay)
                delay = min(2 * delay, BACKOFF_MAX_S)
                if self._queue:  # the newest waiting checkpoint covers this one: send that instead
                    checkpoint = self._queue.pop()
                    self._queue.clear()
                continue
            self._on_result("acked")
            self._on_ack(ack)
            return
