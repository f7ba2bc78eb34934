"""Generating sessions (spec section 6.8 and the kvsp extension resources), around `OutputGate`.

A `SessionSpec` says what to compute, whether it came from POST sessions/{session}/start or from
POST sessions/{session}/resume; a `SessionRun` carries it out:

1. load the cached prefix (own tiers, then the IS and other holders), import it layer by layer into
   the engine and prefill the rest (recompute), in a worker thread; with a layer-wise engine a start
   (``layerwise`` on, or "auto" when blocks are fetched and at least 4 blocks are computed) fetches and
   computes at once (`control.instance.layerwise`): layer l is computed as soon as layer l
   of every prefix block arrived, and a block that cannot be loaded makes it recompute from there;
   with ``publish_live`` the blocks computed here go out as MOQT objects layer by layer meanwhile;
2. generate up to max_tokens: each sampled token goes through the gate, which labels it (index,
   epoch), releases it at once (deterministic sampler) or after the PC acknowledged a covering
   checkpoint (otherwise), and says when a checkpoint is due (each completed block, at least every
   64 tokens); checkpoints go to the PC through `CheckpointSender`, acknowledgements come back;
3. every block of the sequence whose KV is complete in the engine and was not loaded is exported,
   encoded as a kvsp-layout-1 container and placed in the own tiers (published as a replica);
4. the last checkpoint is flushed and the stream gets its end line.  A session the PC fences (a newer
   epoch, another owner) stops at once and its stream ends without an end line.

A resume is a start whose gate begins at the checkpoint: its prompt blocks must be loaded (the
checkpoint carries only their keys), prompt_tail and generated tokens not covered by loaded blocks
are recomputed, the sampler is restored (method, params, seed, step), and labels continue from
output_offset at the new epoch.  Tokens below output_offset come from the checkpoint and are served
at the new epoch too: they are final (section 6.8), so a reader that missed them gets them here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

from control.holder.store import BlockId
from control.instance.blocks import Tiers
from control.instance.core import OutputGate
from control.instance.engines import RateMeter, timed
from control.instance.layerwise import LiveBlocks, LoadAborted, layerwise
from control.instance.loading import ContextLoader, LoadedPrefix, StreamingLoad, import_prefix
from control.instance.metrics import InstanceMetrics
from control.instance.output import CheckpointSender, TokenLog
from control.instance.pc_client import Fenced, PcClient
from control.instance.records import CheckpointAck
from control.instance.settings import Layerwise, Limits
from kvsp.container import Geometry, encode_container
from kvsp.engine import Engine, Step, WaitLayer, block_exporter
from kvsp.errors import KvspError
from kvsp.identifiers import TrackNamespace
from kvsp.keys import ZERO_KEY, BlockKeyChain, ScopeKey
from kvsp.records import PrefetchStatus, SessionCheckpoint
from kvsp.records.generation import ResumeRequest, StartSession, StreamEnd
from kvsp.registry import Codec
from moqt.api import Publisher

log = logging.getLogger("kvsp.instance.sessions")

START: Final = "start"
RESUME: Final = "resume"
# layerwise "auto" overlaps loading with the prefill only when at least this many blocks' worth of tokens
# are computed: below that the compute is too short to hide any transfer, and the per-layer path costs
# more than importing whole blocks (docs/instance.md, "Layer-wise loading": measured)
AUTO_MIN_TAIL_BLOCKS: Final = 4


class SessionFailed(KvspError):
    """The session cannot go on here (a prompt block of a resume cannot be loaded, the PC never acks)."""


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """What to compute: the gate's base checkpoint, the context whose KV must be in the cache before the
    next sample (placeholders stand for the tokens of ``required`` leading blocks, which cannot be
    recomputed and must be loaded), the Block Keys of its complete blocks, and the output budget."""

    kind: str
    base: SessionCheckpoint
    context: tuple[int, ...]
    keys: tuple[bytes, ...]
    required: int
    max_tokens: int

    @property
    def session(self) -> str:
        return self.base.session

    @property
    def epoch(self) -> int:
        return self.base.epoch


def spec_for_start(body: StartSession, key: ScopeKey, block_tokens: int) -> SessionSpec:
    keys = tuple(BlockKeyChain(key, body.compat_id, block_tokens).extend(body.prompt))
    whole = len(keys) * block_tokens
    base = SessionCheckpoint(body.session, body.epoch, body.compat_id, body.scope_id, keys, body.prompt[whole:],
                             (), 0, body.sampler)
    return SessionSpec(START, base, body.prompt, keys, 0, body.max_tokens)


def spec_for_resume(body: ResumeRequest, key: ScopeKey, block_tokens: int, default_max_tokens: int) -> SessionSpec:
    cp = body.checkpoint
    chain = BlockKeyChain(key, cp.compat_id, block_tokens, last_key=cp.prompt_blocks[-1] if cp.prompt_blocks
                          else ZERO_KEY, blocks=len(cp.prompt_blocks))
    known = (*cp.prompt_tail, *cp.generated)
    keys = (*cp.prompt_blocks, *chain.extend(known))
    context = (0,) * (len(cp.prompt_blocks) * block_tokens) + known
    max_tokens = body.max_tokens if body.max_tokens is not None else max(default_max_tokens, cp.output_offset)
    return SessionSpec(RESUME, cp, context, keys, len(cp.prompt_blocks), max_tokens)


@dataclass(frozen=True, slots=True)
class SessionDeps:
    """What every session of this instance shares."""

    loader: ContextLoader
    tiers: Tiers
    pc: PcClient
    batch: asyncio.Semaphore
    prefill: RateMeter
    decode: RateMeter
    metrics: InstanceMetrics
    limits: Limits
    geometry: Geometry
    block_tokens: int
    # The prefetch directive sent for a session (request_ref), once it has ended; None: there was none.
    prefetched: Callable[[str], Awaitable[PrefetchStatus | None]] | None = None
    layerwise: Layerwise = Layerwise.AUTO  # a start loads its prefix layer-wise, overlapped with prefill (if the
    # engine can): ON always, AUTO when blocks are fetched and at least AUTO_MIN_TAIL_BLOCKS are computed
    live: LiveSource | None = None  # publish_live: the holder's MOQT publisher


@dataclass(frozen=True, slots=True)
class LiveSource:
    """Where computed blocks are published live: the holder's MOQT publisher and its holder-id."""

    publisher: Publisher
    holder_id: str


class SessionRun:
    """One session at one epoch on this instance."""

    def __init__(self, spec: SessionSpec, engine: Engine, key: ScopeKey, deps: SessionDeps,
                 on_end: Callable[[SessionRun, str], None]) -> None:
        self.spec = spec
        self.engine = engine
        self.deps = deps
        self.on_end = on_end
        limits = deps.limits
        self.gate = OutputGate(spec.base, block_tokens=deps.block_tokens, checkpoint_every=limits.checkpoint_every,
                               release_batch=limits.release_batch)
        self.log = TokenLog(spec.epoch, spec.base.generated)
        self.sender = CheckpointSender(deps.pc.checkpoint, self._acked, self._fenced,
                                       lambda result: deps.metrics.checkpoints.labels(result).inc())
        self.keys = list(spec.keys)
        self.chain = BlockKeyChain(key, spec.base.compat_id, deps.block_tokens,
                                   last_key=self.keys[-1] if self.keys else ZERO_KEY, blocks=len(self.keys))
        self.chain.extend(spec.context[len(self.keys) * deps.block_tokens :])  # the partial block, if any
        self.prefix: LoadedPrefix | None = None
        self.running = False
        self.fenced = False
        self.ended_at: float | None = None
        self.task: asyncio.Task[None] | None = None
        self._acks = asyncio.Event()

    @property
    def epoch(self) -> int:
        return self.spec.epoch

    @property
    def session(self) -> str:
        return self.spec.session

    @property
    def live(self) -> bool:
        return self.ended_at is None

    # -- loading (before the batch slot) -------------------------------------------------------
    async def load(self) -> LoadedPrefix:
        """Load the cached prefix; a resume without its prompt blocks cannot go on (SessionFailed).

        A start the PC sent a prefetch directive for waits for that directive to end, then takes the
        prefix it placed in the own tiers and recomputes the rest (section 6.5: past the deadline the
        remaining tokens are recomputed), instead of fetching the same blocks a second time."""
        limit_s = self.deps.limits.load_timeout_ms / 1000
        fetch = await self._fetch_wanted()
        prefix = await self.deps.loader.load(self.spec.base.scope_id, self.keys, deadline_s=limit_s, fetch=fetch)
        if len(prefix.blocks) < self.spec.required:
            raise SessionFailed(f"session {self.session}: prompt block {len(prefix.blocks)} of "
                                f"{self.spec.required} has no loadable replica and cannot be recomputed")
        self.prefix = prefix
        return prefix

    async def _fetch_wanted(self) -> bool:
        """False for a start whose prefetch directive already loaded what was worth loading."""
        if self.spec.kind != START or self.deps.prefetched is None:
            return True
        try:
            async with asyncio.timeout(self.deps.limits.load_timeout_ms / 1000):
                return await self.deps.prefetched(self.session) is None
        except TimeoutError:
            return False

    async def _begin(self) -> StreamingLoad | None:
        """A start with a layer-wise engine: begin loading its prefix layer by layer (None: load first)."""
        mode = self.deps.layerwise
        if self.spec.kind != START or mode is Layerwise.OFF or layerwise(self.engine) is None:
            return None
        if not await self._fetch_wanted():
            return None
        b = self.deps.block_tokens
        blocks = len(self.spec.context) // b
        partial = len(self.spec.context) - blocks * b  # computed in any case, on top of uncached blocks
        auto_tail = max(0, AUTO_MIN_TAIL_BLOCKS * b - partial) if mode is Layerwise.AUTO else None
        return await self.deps.loader.begin(self.spec.base.scope_id, self.keys[:blocks], self.engine,
                                            layers=self.engine.geometry.layers,
                                            deadline_s=self.deps.limits.load_timeout_ms / 1000, auto_tail=auto_tail)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        reason = "failed"
        streaming: StreamingLoad | None = None
        try:
            prefix = self.prefix
            if prefix is None:
                streaming = await self._begin()
                if streaming is None:
                    prefix = await self.load()
                elif not streaming.overlap:  # "auto": nothing to overlap; load whole blocks, then prefill
                    prefix = self.prefix = await streaming.result()
            async with self.deps.batch:
                self.running = True
                step = await (self._prefill(prefix) if prefix is not None else self._prefill_streaming(streaming))
                if step is not None:
                    await self._generate(step)
                self.running = False
            reason = await self._finish()
        except asyncio.CancelledError:
            reason = "fenced" if self.fenced else "cancelled"
            raise
        except Exception as exc:  # one broken session must not take others down
            log.error("session %s epoch %d failed: %s", self.session, self.epoch, exc,
                      exc_info=not isinstance(exc, SessionFailed))
        finally:
            if streaming is not None:
                await streaming.close(cancel=reason != "max_tokens")
            self.running = False
            self.log.close(self.log.end)
            await self.sender.close()
            self.on_end(self, reason)

    # -- prefill ---------------------------------------------------------------------------------
    async def _prefill(self, prefix: LoadedPrefix) -> Step | None:
        """Import the loaded blocks, recompute the rest of the context, store what was computed."""
        if self.gate.output_offset >= self.spec.max_tokens:
            return None
        context, engine, b = self.spec.context, self.engine, self.deps.block_tokens
        blocks = prefix.blocks[: len(context) // b]
        if self.spec.kind == RESUME:
            engine.restore_sampler(self.spec.base.sampler)
        await asyncio.to_thread(import_prefix, engine, blocks)
        step, seconds = await self._compute(len(blocks), None)
        return await self._prefilled(step, seconds, len(blocks), prefix.local)

    async def _prefill_streaming(self, load: StreamingLoad | None) -> Step | None:
        """Compute while the prefix arrives; a block that cannot be loaded: recompute from it."""
        if load is None or self.gate.output_offset >= self.spec.max_tokens:
            return None
        metrics = self.deps.metrics
        try:
            step, seconds = await self._compute(load.blocks, load.gate.wait_layer)
        except LoadAborted as exc:
            prefix = await load.result()
            log.info("session %s: %s; recomputing from block %d", self.session, exc, len(prefix.blocks))
            metrics.layerwise_prefills.labels("fallback").inc()
            return await self._prefill(prefix)
        metrics.layerwise_prefills.labels("overlapped").inc()
        return await self._prefilled(step, seconds, load.blocks, len(load.local))

    async def _compute(self, prefix_blocks: int, wait_layer: WaitLayer | None) -> tuple[Step, float]:
        """Prefill the context over ``prefix_blocks`` imported (or arriving) blocks, in a worker thread;
        layer-wise when the prefix is still arriving or computed blocks are published live."""
        context, engine = self.spec.context, self.engine
        by_layer = layerwise(engine)
        live = self._live(prefix_blocks) if by_layer is not None else None
        if by_layer is None or (wait_layer is None and live is None):
            return await asyncio.to_thread(timed, lambda: engine.prefill(context))
        waited = [0.0]  # seconds spent waiting for the prefix: not compute, so not in the prefill rate

        def wait(layer: int) -> None:
            if wait_layer is not None:
                _, seconds = timed(lambda: wait_layer(layer))
                waited[0] += seconds

        on_layer = live.on_layer if live is not None else None
        try:
            step, seconds = await asyncio.to_thread(
                timed, lambda: by_layer.prefill_layerwise(context, prefix_blocks, wait, on_layer))
        except BaseException:
            if live is not None:
                live.abort()
            raise
        if live is not None:
            self.deps.metrics.live_layers.inc(len(live.producers) * engine.geometry.layers)
        return step, max(seconds - waited[0], 1e-9)

    def _live(self, prefix_blocks: int) -> LiveBlocks | None:
        """Live tracks for the complete blocks this prefill computes (``publish_live``), or None."""
        source, b = self.deps.live, self.deps.block_tokens
        computed = range(prefix_blocks, len(self.spec.context) // b)
        if source is None or not computed:
            return None
        scope, compat = self.spec.base.scope_id, self.spec.base.compat_id
        names = [TrackNamespace(compat, scope, source.holder_id, self.keys[i]) for i in computed]
        return LiveBlocks(source.publisher, names, first_block=prefix_blocks, engine=self.engine,
                          loop=asyncio.get_running_loop(), layers=self.engine.geometry.layers)

    async def _prefilled(self, step: Step, seconds: float, loaded_blocks: int, local_blocks: int) -> Step:
        """Count what was loaded and computed, store the computed blocks."""
        context, b = self.spec.context, self.deps.block_tokens
        loaded = loaded_blocks * b
        metrics = self.deps.metrics
        metrics.tokens_fetched.labels("local").inc(min(local_blocks, loaded_blocks) * b)
        metrics.tokens_fetched.labels("remote").inc(max(0, loaded_blocks - local_blocks) * b)
        metrics.tokens_recomputed.inc(len(context) - loaded)
        self.deps.prefill.observe(len(context) - loaded, seconds)
        await self._store(range(loaded_blocks, len(self.keys)))
        if self.spec.kind == START:
            self.sender.hold_until(self._prompt_replicated(len(context) // b))
        return step

    async def _prompt_replicated(self, blocks: int) -> None:
        """Until the prompt blocks computed here reached ``replicate_to`` (bounded by load_timeout_ms).

        A checkpoint names the prompt blocks by key only and the PC then drops the prompt: if this
        instance died before its copies landed, no instance could resume the session.  Checkpoints
        wait for the copies instead (a non-deterministic sampler thus releases its first tokens only
        once the prompt survives this process; a deterministic one releases at once anyway)."""
        scope, compat = self.spec.base.scope_id, self.spec.base.compat_id
        ids = [BlockId(compat, scope, key) for key in self.keys[:blocks]]
        try:
            async with asyncio.timeout(self.deps.limits.load_timeout_ms / 1000):
                await self.deps.tiers.replicator.settled(ids)
        except TimeoutError:
            log.warning("session %s: prompt blocks not replicated in time; checkpointing anyway", self.session)

    # -- generation ------------------------------------------------------------------------------
    async def _generate(self, step: Step) -> None:
        gate, metrics = self.gate, self.deps.metrics
        while True:
            self.log.extend(gate.push(step.token))
            metrics.tokens_generated.inc()
            last = gate.output_offset >= self.spec.max_tokens
            if gate.checkpoint_due(final=last):
                self.sender.submit(gate.checkpoint(self.engine.sampler_state()))
            if last:
                return
            await self._room_to_release()
            pending = step.token
            step, seconds = await asyncio.to_thread(timed, self.engine.decode_step)
            self.deps.decode.observe(1, seconds)
            new = self.chain.extend([pending])  # the pending token entered the cache with this step
            if new:
                first = len(self.keys)
                self.keys.extend(new)
                await self._store(range(first, len(self.keys)))

    async def _room_to_release(self) -> None:
        """Non-deterministic sampler: do not run more than ``max_unreleased`` tokens ahead of the acks."""
        limits = self.deps.limits
        while self.gate.output_offset - self.gate.released >= limits.max_unreleased:
            try:
                async with asyncio.timeout(limits.final_ack_timeout_ms / 1000):
                    await self._acks.wait()
            except TimeoutError:
                raise SessionFailed(f"session {self.session}: the PC acknowledged no checkpoint in time") from None
            self._acks.clear()

    async def _store(self, blocks: Sequence[int]) -> None:
        """Export complete computed blocks and place them in the own tiers (published as replicas)."""
        engine, geometry, b = self.engine, self.deps.geometry, self.deps.block_tokens
        last = (geometry.layers or 1) - 1
        scope, compat = self.spec.base.scope_id, self.spec.base.compat_id
        whole = block_exporter(engine)
        for index in blocks:
            block = BlockId(compat, scope, self.keys[index])
            if self.deps.tiers.local.held(block):
                continue

            def export(i: int = index) -> bytes | bytearray:
                if whole is not None:  # the container written from the cache in one strided copy
                    return whole.export_block(i)
                layers = engine.export_kv(i, (0, last))
                return encode_container(Codec.RAW, 0, b, [(lk.k, lk.v) for lk in layers], geometry=geometry)

            await self.deps.tiers.place(block, await asyncio.to_thread(export), computed=True)

    # -- the end ---------------------------------------------------------------------------------
    async def _finish(self) -> str:
        """Flush the last checkpoint; the end line only when every token was released."""
        gate = self.gate
        if gate.checkpoint_due(final=True):
            self.sender.submit(gate.checkpoint(self.engine.sampler_state()))
        await self.sender.flush(self.deps.limits.final_ack_timeout_ms / 1000)
        if self.fenced:
            return "fenced"
        if gate.released < gate.output_offset:
            log.warning("session %s: %d tokens never acknowledged; ending without an end line",
                        self.session, gate.output_offset - gate.released)
            return "failed"
        self.log.close(StreamEnd("max_tokens", self.epoch))
        return "max_tokens"

    # -- from the checkpoint sender -------------------------------------------------------------
    def _acked(self, ack: CheckpointAck) -> None:
        try:
            released = self.gate.ack(ack.output_offset, epoch=ack.epoch)
        except ValueError as exc:
            log.warning("session %s: ignoring an acknowledgement: %s", self.session, exc)
            return
        self.log.extend(released)
        self._acks.set()

    def _fenced(self, exc: Fenced) -> None:
        log.warning("session %s epoch %d fenced by the PC: %s", self.session, self.epoch, exc)
        self.fence()

    def fence(self) -> None:
        """Stop now: a newer epoch owns the session.  Unreleased tokens are dropped, the stream ends."""
        self.fenced = True
        self.log.close(None)
        task = self.task
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()

