"""Loading the cached prefix of a context: the own tiers first, then the IS and other holders.

Only a leading run of blocks is useful (Block Keys are chained, section 4.2), so loading stops at the
first block that is neither held here nor fetchable; the engine recomputes from there.  Fetches go
through `kvsp.client.fetch.BlockFetcher` (lookup, lease, GET, every digest of section 6.7, fallback
to the next replica, withdrawal of bad replicas), bounded by a deadline.  Blocks fetched from other
holders are placed in the own tiers, so this instance becomes one more replica (published when the
holder role runs in this process).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from control.holder.store import BlockId
from control.instance.blocks import Tiers
from control.instance.metrics import InstanceMetrics
from kvsp.client.fetch import BlockFetcher, FetchResult, Outcome
from kvsp.container import Container
from kvsp.engine import Engine

log = logging.getLogger("kvsp.instance.loading")

# (lease_ms, deadline_s) -> a fetcher sharing the role's HTTPS session
FetcherFactory = Callable[[int | None, float | None], BlockFetcher]
LOAD_LEASE_MS: Final = 10_000  # leases taken while loading a session's prefix (section 6.6)


@dataclass(slots=True, eq=False)
class LoadedPrefix:
    """The leading blocks of a context whose KV was loaded: ``local`` from the own tiers, then fetched."""

    blocks: list[Container] = field(default_factory=list)
    local: int = 0

    @property
    def remote(self) -> int:
        return len(self.blocks) - self.local


def container_bytes(container: Container) -> bytes:
    """The container's octets (header and data), e.g. to place a fetched block in the own tiers."""
    return b"".join((container.header.encode(), container.data))


def record_attempts(result: FetchResult, metrics: InstanceMetrics) -> None:
    for attempt in result.attempts:
        metrics.fetch_attempts.labels(attempt.outcome.value).inc()
        if attempt.outcome is Outcome.DIGEST_MISMATCH:
            metrics.digest_failures.inc()


class ContextLoader:
    """Find and load the cached prefix of a context of one compat_id."""

    def __init__(self, compat_id: bytes, block_tokens: int, tiers: Tiers, fetchers: FetcherFactory,
                 metrics: InstanceMetrics) -> None:
        self.compat_id = compat_id
        self.block_tokens = block_tokens
        self.tiers = tiers
        self.fetchers = fetchers
        self.metrics = metrics

    async def load(self, scope_id: bytes, keys: Sequence[bytes], *, deadline_s: float,
                   fetch: bool = True) -> LoadedPrefix:
        """The longest loadable prefix of ``keys``; never raises for a miss (the rest is recomputed).
        ``fetch=False``: the own tiers only (a prefetch directive already loaded what was worth it)."""
        prefix = LoadedPrefix()
        for key in keys:
            held = await self.tiers.local.read(BlockId(self.compat_id, scope_id, key))
            if held is None:
                break
            prefix.blocks.append(held)
        prefix.local = len(prefix.blocks)
        rest = keys[prefix.local :]
        if rest and fetch:
            await self._fetch(scope_id, rest, prefix, deadline_s)
        return prefix

    async def _fetch(self, scope_id: bytes, keys: Sequence[bytes], prefix: LoadedPrefix, deadline_s: float) -> None:
        fetcher = self.fetchers(LOAD_LEASE_MS, deadline_s)
        try:
            async with asyncio.timeout(deadline_s + 1.0):  # the lookup too; the fetcher bounds the loads
                result = await fetcher.fetch(scope_id, self.compat_id, keys, block_tokens=self.block_tokens)
        except TimeoutError:
            log.warning("loading %d blocks timed out after %.1f s: recomputing them", len(keys), deadline_s)
            return
        record_attempts(result, self.metrics)
        for loaded in result.blocks:
            prefix.blocks.append(loaded.container)
            await self.tiers.place(BlockId(self.compat_id, scope_id, loaded.block_key),
                                   container_bytes(loaded.container), computed=False)


def import_prefix(engine: Engine, blocks: Sequence[Container]) -> None:
    """Stage every layer of the loaded blocks in the engine (runs in a worker thread, before prefill)."""
    for index, block in enumerate(blocks):
        for layer in block.layers:
            engine.import_kv(index, layer.layer, layer.k, layer.v)
