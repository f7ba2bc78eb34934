"""Background work of the PC adapter: a set of tasks owned by the app, and bounded retry pacing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Final

log = logging.getLogger("kvsp.pc")

RETRY_BASE_S: Final = 0.05
RETRY_MAX_S: Final = 1.0


def backoff_s(attempt: int) -> float:
    """Pause before retry ``attempt`` (0-based): 50 ms doubling, at most one second."""
    return float(min(RETRY_MAX_S, RETRY_BASE_S * 2**attempt))


class Background:
    """Tasks started by the PC (deliveries, retries, the maintenance loop); all cancelled at shutdown.

    A task that fails is logged here, once, so that one bad delivery never goes unnoticed and never
    ends the process.
    """

    __slots__ = ("_closed", "_tasks")

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[object, object, None], name: str) -> asyncio.Task[None]:
        if self._closed:
            coro.close()
            raise RuntimeError("the PC is shutting down")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("PC task %s failed", task.get_name(), exc_info=task.exception())

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
