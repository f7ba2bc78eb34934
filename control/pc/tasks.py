"""Background work of the PC adapter: a set of tasks owned by the app, bounded retry pacing, and the
per-key ordering of store writes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
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

    def cancel_all(self) -> None:
        """Cancel every task now (the PC stepped down: what they would deliver is no longer its to send)."""
        for task in list(self._tasks):
            task.cancel()

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class KeyedOrder:
    """Writes of one key go out one at a time, in the order they asked (asyncio.Lock is FIFO).

    A write reads the latest in-memory state of its key once it holds the key, so two writes of one
    session never reach the store out of order (which the store would refuse as a lower epoch), while
    writes of different sessions go out concurrently."""

    __slots__ = ("_locks",)

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (None, 0))
        lock = lock or asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users > 1:
                self._locks[key] = (lock, users - 1)
            else:
                del self._locks[key]
