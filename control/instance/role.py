"""Wiring of the instance role: what `setup` knows from the configuration, and what starts with the loop.

`InstanceRole` is put under `control.instance.app.INSTANCE` at setup; its parts that need a running
event loop (the HTTPS client session, the holder of this process, the session table, the background
tasks) are made in `start`; `stop_work` ends the background work at shutdown, before the cleanup
contexts of the process's roles run, and `close` releases the client session at cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging

from aiohttp import web

from control.holder.app import HOLDER
from control.holder.moqt import HOLDER_MOQT
from control.holder.tiers import MemoryTier
from control.instance.blocks import HolderBlocks, LocalBlocks, MemoryBlocks, Replicator, Tiers
from control.instance.core import PrefetchTracker
from control.instance.engines import (
    PREFILL_REFERENCE_TOKENS,
    EngineFactory,
    Pacing,
    RateMeter,
    calibrate,
    engine_factory,
)
from control.instance.loading import ContextLoader
from control.instance.metrics import InstanceMetrics
from control.instance.pc_client import PcClient
from control.instance.prefetching import PrefetchRunner
from control.instance.resharding import ShardHost
from control.instance.service import Instance
from control.instance.sessions import LiveSource, SessionDeps
from control.instance.settings import HF_PREFIX, InstanceSettings
from kvsp.client.fetch import BlockFetcher, ClientStats, FetchOptions
from kvsp.client.holder import HolderClient
from kvsp.client.http import KvspSession
from kvsp.client.index import IndexClient
from kvsp.client.moqt import BLOCK_CLIENT_QUIC, MoqtBlockClient, MoqtClientOptions
from kvsp.container import Geometry
from kvsp.errors import ValidationError
from kvsp.service.app import Clock
from kvsp.service.config import RoleConfig
from kvsp.service.tls import client_context

log = logging.getLogger("kvsp.instance")


def memory_tier(engine: str) -> MemoryTier | None:
    """The tier of the instance's own block cache when no holder role runs here (None: plain `HostTier`).

    With the transformers engine (torch is there anyway) blocks are kept as torch tensors
    (`TorchHostTier`, pinned when CUDA is present), so a cached block goes to the accelerator in one DMA
    transfer; the test engine keeps plain octets and needs no torch."""
    if not engine.startswith(HF_PREFIX):
        return None
    try:
        from control.holder.torch_tiers import TorchHostTier  # noqa: PLC0415 - torch only for this engine
    except ImportError:  # pragma: no cover - the hf engine itself needs torch
        return None
    return TorchHostTier()


class NotStarted(RuntimeError):
    """A part that exists only while the application runs was used before startup."""


class InstanceRole:
    """Everything of the instance role in one process."""

    def __init__(self, config: RoleConfig, settings: InstanceSettings, metrics: InstanceMetrics,
                 clock: Clock) -> None:
        self.config = config
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        descriptor = settings.descriptor
        self.engines: EngineFactory
        limits = settings.limits
        pacing = Pacing(limits.test_prefill_us_per_token, limits.test_decode_us_per_token)
        self.engines, _ = engine_factory(settings.engine, descriptor, vocab_size=limits.vocab_size, pacing=pacing,
                                         chunk_tokens=limits.hf_chunk_tokens)
        self.geometry = Geometry.for_dtype(descriptor.kv_heads, descriptor.head_dim, descriptor.kv_dtype,
                                           descriptor.layers)
        self.tracker = PrefetchTracker(config.policy.pc or "", compat_id=descriptor.compat_id,
                                       max_pending=config.policy.quotas.pending_directives_per_instance)
        self.shards = ShardHost(config.server.base_uri, self.geometry, self._session, clock, metrics,
                                max_maps=settings.limits.max_maps)
        self.stats = ClientStats()
        self._http: KvspSession | None = None
        self._moqt: MoqtBlockClient | None = None
        self._instance: Instance | None = None
        self._prefetch: PrefetchRunner | None = None
        self._replicator: Replicator | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- parts that exist while running ----------------------------------------------------------
    def _session(self) -> KvspSession:
        if self._http is None:
            raise NotStarted("the instance role has not started")
        return self._http

    @property
    def instance(self) -> Instance:
        if self._instance is None:
            raise NotStarted("the instance role has not started")
        return self._instance

    @property
    def prefetch(self) -> PrefetchRunner:
        if self._prefetch is None:
            raise NotStarted("the instance role has not started")
        return self._prefetch

    @property
    def replicator(self) -> Replicator:
        if self._replicator is None:
            raise NotStarted("the instance role has not started")
        return self._replicator

    def _index_client(self, session: KvspSession) -> IndexClient:
        return IndexClient(session, self.settings.index, max_lookup_keys=self.config.policy.quotas.keys_per_lookup)

    def fetcher(self, lease_ms: int | None, deadline_s: float | None) -> BlockFetcher:
        """moqt:// replicas compete with https ones on the reported links' cost when ``moqt_fetch`` is set."""
        session = self._session()
        options = FetchOptions(lease_ms=lease_ms, deadline_s=deadline_s, geometry=self.geometry,
                               links=self.settings.links, concurrency=self.settings.limits.fetch_concurrency,
                               local_relay=self.settings.moqt_relay)
        return BlockFetcher(session, self._index_client(session), holder=HolderClient(session),
                            options=options, stats=self.stats, moqt=self._moqt)

    def _moqt_client(self) -> MoqtBlockClient | None:
        """The MOQT block client (``moqt_fetch``): the role's certificate and CA, as over HTTPS (D3)."""
        tls = self.config.tls
        if not self.settings.moqt_fetch:
            return None
        if tls is None:
            raise ValidationError("instance.moqt_fetch", "needs [tls]: MOQT peers authenticate mutually (D3)")
        options = MoqtClientOptions(object_timeout_s=self.settings.limits.moqt_object_timeout_ms / 1000)
        moqt = self.config.moqt
        settings = dataclasses.replace(BLOCK_CLIENT_QUIC, drafts=self.settings.moqt_drafts, quic=moqt.quic)
        return MoqtBlockClient.from_files(tls.cert, tls.key, tls.ca, options=options, settings=settings,
                                          token=moqt.token_source("instance.moqt_fetch"))

    def _live_source(self, app: web.Application) -> LiveSource | None:
        """``publish_live``: computed blocks go out on this process's holder's MOQT listener."""
        if not self.settings.publish_live:
            return None
        moqt = app.get(HOLDER_MOQT)
        if moqt is None:
            raise ValidationError("instance.publish_live", "needs the holder role in this process with "
                                                           "[holder] moqt_listen and moqt_uri")
        return LiveSource(moqt.publisher, moqt.holder_id)

    def _local_blocks(self, app: web.Application) -> LocalBlocks:
        holder = app.get(HOLDER)
        if holder is None:
            log.warning("no holder role in this process: loaded and generated blocks are cached, not published")
            tier = memory_tier(self.settings.engine)
            return MemoryBlocks(self.settings.limits.memory_blocks_octets, self.geometry, tier)
        if self.settings.descriptor.compat_id not in holder.settings.descriptors:
            log.warning("[holder] descriptors lack this instance's model: peers cannot PUT its blocks here")
        return HolderBlocks(holder, self.geometry)

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self, app: web.Application) -> None:
        settings, limits = self.settings, self.settings.limits
        tls = self.config.tls
        live = self._live_source(app)
        self._moqt = self._moqt_client()
        self._http = session = KvspSession(client_context(tls) if tls is not None else None)
        self._replicator = Replicator(HolderClient(session), settings.replicate_to, self.metrics)
        tiers = Tiers(self._local_blocks(app), self._replicator, self.metrics)
        block_tokens = settings.descriptor.block_tokens
        # Measured before the first status: the PC prices recompute with these (0 would be infinite).
        prefill_rate, decode_rate = await asyncio.to_thread(calibrate, self.engines, block_tokens)
        prefill, decode = RateMeter(prefill_rate, PREFILL_REFERENCE_TOKENS), RateMeter(decode_rate)
        deps = SessionDeps(
            loader=ContextLoader(settings.descriptor.compat_id, block_tokens, tiers, self.fetcher, self.metrics),
            tiers=tiers, pc=PcClient(session, settings.pc, self.config.server.base_uri,
                                     timeout_s=limits.pc_timeout_ms / 1000),
            batch=asyncio.Semaphore(limits.batch_size), prefill=prefill, decode=decode,
            metrics=self.metrics, limits=limits, geometry=self.geometry, block_tokens=block_tokens,
            layerwise=settings.layerwise, live=live)
        self._prefetch = PrefetchRunner(self.tracker, tiers, index=lambda: self._index_client(session),
                                        fetchers=self.fetcher, clock=self.clock, metrics=self.metrics,
                                        concurrency=limits.prefetch_concurrency, block_tokens=block_tokens)
        deps = dataclasses.replace(deps, prefetched=self._prefetch.settled)
        self._instance = Instance(settings, self.config.server.base_uri, self.engines, deps, self.clock)
        self._tasks.append(asyncio.get_running_loop().create_task(self._instance.status_loop()))

    async def stop_work(self) -> None:
        """Stop every background task and session (on shutdown, before any role's cleanup: the holder of
        this process must not get blocks placed while it withdraws its replicas and closes)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._prefetch is not None:
            await self._prefetch.close()
        if self._instance is not None:
            await self._instance.close()
        await self.shards.close()
        if self._replicator is not None:
            await self._replicator.close()

    async def close(self) -> None:
        await self.stop_work()
        if self._moqt is not None:
            await self._moqt.close()
        if self._http is not None:
            await self._http.close()
