"""Loading the cached prefix of a context: the own tiers first, then the IS and other holders.

Only a leading run of blocks is useful (Block Keys are chained, section 4.2), so loading stops at the
first block that is neither held here nor fetchable; the engine recomputes from there.  Fetches go
through `kvsp.client.fetch.BlockFetcher` (lookup, lease, GET, every digest of section 6.7, fallback
to the next replica, withdrawal of bad replicas), bounded by a deadline.  Blocks fetched from other
holders are placed in the own tiers, so this instance becomes one more replica (published when the
holder role runs in this process).

`ContextLoader.begin` is the layer-wise variant (`control.instance.layerwise`): it imports the own
tiers' blocks, looks the rest up, and starts fetching them in the background with each verified layer
handed to the engine's ``import_kv`` the moment it arrives (HTTPS streaming read or MOQT objects), so
that ``prefill_layerwise`` computes layer l while later layers are on the wire.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from control.holder.store import BlockId
from control.instance.blocks import Tiers
from control.instance.layerwise import WAIT_MARGIN_S, LayerGate
from control.instance.metrics import InstanceMetrics
from kvsp.client.fetch import BlockFetcher, FetchResult, Outcome
from kvsp.client.http import TransportError
from kvsp.container import Container, LayerView
from kvsp.engine import Engine, block_importer
from kvsp.errors import ValidationError
from kvsp.problems import ProblemError
from kvsp.records import LookupRequest, ReplicaRecord
from kvsp.registry import Codec

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


@dataclass(slots=True, eq=False)
class StreamingLoad:
    """A prefix being loaded layer by layer into one engine (`ContextLoader.begin`).

    ``gate`` covers the ``local`` own-tier blocks (already imported) and the ``remote`` blocks the IS
    matched; ``task`` fetches those, then settles the gate and places what was loaded in the own tiers.
    """

    gate: LayerGate
    local: list[Container]
    remote: int
    task: asyncio.Task[FetchResult] | None = None
    overlap: bool = True  # False ("auto" found nothing to overlap): blocks are fetched whole, nothing imported

    @property
    def blocks(self) -> int:
        return len(self.local) + self.remote

    async def result(self) -> LoadedPrefix:
        """The blocks loaded in the end (whole and verified), own-tier ones first."""
        prefix = LoadedPrefix(list(self.local), len(self.local))
        if self.task is not None:
            try:
                fetched = await asyncio.shield(self.task)
            except (asyncio.CancelledError, TimeoutError):
                return prefix
            prefix.blocks.extend(loaded.container for loaded in fetched.blocks)
        return prefix

    async def close(self, *, cancel: bool) -> None:
        """The session ended: release a waiting engine thread; let the fetch finish placing what it loaded
        in the own tiers (bounded by its deadline), or stop it (``cancel``: the session failed or was fenced)."""
        self.gate.fail("the session ended")
        if self.task is not None and not self.task.done():
            if cancel:
                self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


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

    async def begin(self, scope_id: bytes, keys: Sequence[bytes], engine: Engine, *, layers: int,
                    deadline_s: float, auto_tail: int | None = None) -> StreamingLoad:
        """Import the own tiers' leading blocks, look the rest up, and start fetching them layer-wise.

        ``auto_tail`` (layerwise "auto"): overlap only when some blocks are fetched and the context leaves
        at least that many tokens to compute past the cached ones (``keys`` cover the context's complete
        blocks; the caller adds its partial block); otherwise fetch whole blocks and import nothing
        (``overlap`` False: the caller imports them whole and prefills once they are in)."""
        local: list[Container] = []
        for key in keys:
            held = await self.tiers.local.read(BlockId(self.compat_id, scope_id, key))
            if held is None:
                break
            local.append(held)
        rest = keys[len(local) :]
        fetcher = self.fetchers(LOAD_LEASE_MS, deadline_s)
        replicas = await self._lookup(fetcher, scope_id, rest, deadline_s) if rest else ()
        computed = (len(keys) - len(local) - len(replicas)) * self.block_tokens
        overlap = auto_tail is None or (bool(replicas) and computed >= auto_tail)
        blocks = len(local) + len(replicas) if overlap else 0
        load = StreamingLoad(LayerGate(blocks, layers, timeout_s=deadline_s + WAIT_MARGIN_S), local, len(replicas),
                             overlap=overlap)
        if overlap:
            await asyncio.to_thread(import_prefix, engine, local)
            for block in range(len(local)):
                load.gate.imported_all(block)
        if replicas:
            load.task = asyncio.get_running_loop().create_task(
                self._stream(fetcher, scope_id, rest, replicas, engine=engine if overlap else None, load=load))
        return load

    async def _lookup(self, fetcher: BlockFetcher, scope_id: bytes, keys: Sequence[bytes],
                      deadline_s: float) -> tuple[tuple[ReplicaRecord, ...], ...]:
        """The replica groups of the leading matched keys; none when the IS cannot answer (recompute)."""
        stats = fetcher.stats
        stats.lookups += 1
        stats.lookup_keys += len(keys)
        try:
            async with asyncio.timeout(deadline_s):
                response = await fetcher.index.lookup(LookupRequest(scope_id, self.compat_id, tuple(keys)))
        except (ProblemError, TransportError, ValidationError, TimeoutError) as exc:
            stats.lookup_failures += 1
            log.warning("lookup failed, recomputing %d blocks: %s", len(keys), exc)
            return ()
        stats.matched_keys += response.matched
        return response.replicas

    async def _stream(self, fetcher: BlockFetcher, scope_id: bytes, keys: Sequence[bytes],
                      replicas: Sequence[Sequence[ReplicaRecord]], *, engine: Engine | None,
                      load: StreamingLoad) -> FetchResult:
        """Fetch the matched blocks; with an ``engine``, hand it each verified layer as it arrives."""
        first, gate = len(load.local), load.gate

        def arrived(index: int, view: LayerView) -> None:  # event loop; import_kv is a copy at most
            if engine is not None:
                engine.import_kv(first + index, view.layer, view.k, view.v)
            gate.imported(first + index, view.layer)

        try:
            result = await fetcher.load(scope_id, self.compat_id, replicas, requested=len(keys),
                                        block_tokens=self.block_tokens,
                                        on_layer=arrived if engine is not None else None)
        except BaseException:
            gate.fail("the fetch was stopped")
            raise
        if result.loaded_blocks < len(replicas):
            gate.fail(f"block {first + result.loaded_blocks} could not be loaded"
                      + (" before the deadline" if result.deadline_expired else ""))
        record_attempts(result, self.metrics)
        for loaded in result.blocks:
            await self.tiers.place(BlockId(self.compat_id, scope_id, loaded.block_key),
                                   container_bytes(loaded.container), computed=False)
        return result

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
    """Stage every layer of the loaded blocks in the engine (runs in a worker thread, before prefill).

    The blocks are whole here, so an engine with ``import_block`` takes each raw one at once (one view,
    then one copy into its cache); per-layer `import_kv` is for blocks still arriving (layer-wise)."""
    whole = block_importer(engine)
    for index, block in enumerate(blocks):
        if whole is not None and block.codec == Codec.RAW:
            whole.import_block(index, block)
            continue
        for layer in block.layers:
            engine.import_kv(index, layer.layer, layer.k, layer.v)
