"""Engines behind the instance (decision D6) and the measurements the status record reports.

``engine = "test"`` is `kvsp.engine.DeterministicTestEngine` with the geometry of the configured
Compatibility Descriptor.  ``engine = "hf:DIR"`` is `kvsp.hf.engine.HfEngine` over the model in DIR
(decision D6): the descriptor derived from DIR's files must have the configured descriptor's compat_id,
else the instance refuses to start (its blocks would be labelled with another model's identity); the
files are hashed before the weights are loaded, so a mismatch costs no model load.  One `Engine`
object is one generation context, so the instance makes one per session through an `EngineFactory`.
The test engine computes in microseconds; `Pacing` gives it an artificial cost per prefilled and per
decoded token (``[instance] test_prefill_us_per_token`` / ``test_decode_us_per_token``), spent in the
worker thread the engine runs in, so that tests and benchmarks see the timing of a real model.

`RateMeter` turns the engine's actual timings into the status record's ``prefill_tokens_per_s`` and
``decode_tokens_per_s`` (an exponentially weighted mean of measured rates, section 6.3/6.4 inputs).
`calibrate` measures both once at start-up: a rate of 0 would make every recompute infinitely slow
to the PC's cost model (section 6.4), so an instance that reported 0 until its first session would
never be given one.

The prefill rate falls with the prompt's length (attention is quadratic, and a short prompt does not
fill the machine), while section 6.4 prices a recompute as tokens / rate.  A rate taken on a short
prompt therefore predicted 251 ms for a 2064-token recompute that took 372 ms (benchmarks/bench_engine.py,
crossover).  So `calibrate` doubles its prompt from 4 blocks towards `CALIBRATION_TOKENS` (a typical
prompt whose prefix is worth caching) while a time budget allows, and reports the rate of the longest
prompt it ran; and the prefill meter weighs each real prefill by its tokens (`RateMeter.reference_tokens`),
so that the many short recomputes behind a mostly cached prefix (a handful of tokens, dominated by fixed
per-call costs) do not drag the reported rate down to what a long recompute never sees.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final, TypeVar

from control.instance.settings import HF_PREFIX
from kvsp.container import Container
from kvsp.descriptor import CompatDescriptor
from kvsp.engine import (
    BlockKv,
    Bytes,
    DeterministicTestEngine,
    Engine,
    EngineGeometry,
    LayerKv,
    OnLayer,
    Step,
    WaitLayer,
    block_exporter,
    block_importer,
    greedy_sampler,
)
from kvsp.errors import ValidationError
from kvsp.records import Sampler

EngineFactory = Callable[[Sampler], Engine]
EWMA_WEIGHT: Final = 0.2
CALIBRATION_BLOCKS: Final = 4  # the first prompt `calibrate` prefills, in blocks
CALIBRATION_TOKENS: Final = 2048  # ... doubled up to this length (a typical prompt with a cached prefix)
CALIBRATION_BUDGET_S: Final = 1.0  # ... while the prefills so far and the next (~2x the last) fit in this
CALIBRATION_STEPS: Final = 4  # decode steps timed by `calibrate`
PREFILL_REFERENCE_TOKENS: Final = 512  # a prefill of this many tokens or more moves the rate by EWMA_WEIGHT
T = TypeVar("T")


def check_geometry(geometry: EngineGeometry, descriptor: CompatDescriptor) -> None:
    """The engine's cache must be exactly the descriptor's, or its blocks would be wrongly labelled."""
    theirs = (descriptor.layers, descriptor.kv_heads, descriptor.head_dim, descriptor.block_tokens,
              descriptor.kv_dtype)
    ours = (geometry.layers, geometry.kv_heads, geometry.head_dim, geometry.block_tokens, geometry.kv_dtype)
    if ours != theirs:
        raise ValidationError("instance.engine", f"geometry (layers, kv_heads, head_dim, block_tokens, kv_dtype) "
                                                 f"{ours} disagrees with the descriptor's {theirs}")


@dataclass(frozen=True, slots=True)
class Pacing:
    """Artificial compute cost of the test engine, per token (0: as fast as numpy goes)."""

    prefill_us_per_token: int = 0
    decode_us_per_token: int = 0


class PacedEngine:
    """An engine that takes at least ``pacing`` per token: it sleeps in the calling (worker) thread."""

    __slots__ = ("_engine", "_pacing")

    def __init__(self, engine: Engine, pacing: Pacing) -> None:
        self._engine = engine
        self._pacing = pacing

    @property
    def geometry(self) -> EngineGeometry:
        return self._engine.geometry

    @property
    def context_length(self) -> int:
        return self._engine.context_length

    def prefill(self, tokens: Sequence[int], loaded_prefix_kv: Sequence[BlockKv] = ()) -> Step:
        step = self._engine.prefill(tokens, loaded_prefix_kv)
        loaded = getattr(self._engine, "loaded_tokens", 0)
        time.sleep(self._pacing.prefill_us_per_token * max(0, len(tokens) - loaded) / 1e6)
        return step

    def prefill_layerwise(self, tokens: Sequence[int], prefix_blocks: int, wait_layer: WaitLayer,
                          on_layer: OnLayer | None = None) -> Step:
        """The inner engine's layer-wise prefill, each layer taking its share of the paced cost."""
        inner = getattr(self._engine, "prefill_layerwise", None)
        if inner is None:
            raise TypeError("the paced engine does not prefill layer by layer")
        g = self._engine.geometry
        computed_tokens = len(tokens) - prefix_blocks * g.block_tokens
        per_layer_s = self._pacing.prefill_us_per_token * computed_tokens / g.layers / 1e6

        def computed(layer: int) -> None:
            time.sleep(per_layer_s)  # layer l "takes" this long: layer l+1 starts later
            if on_layer is not None:
                on_layer(layer)

        step: Step = inner(tokens, prefix_blocks, wait_layer, computed)
        return step

    def decode_step(self) -> Step:
        step = self._engine.decode_step()
        time.sleep(self._pacing.decode_us_per_token / 1e6)
        return step

    def export_kv(self, block: int, layers: tuple[int, int]) -> list[LayerKv]:
        return self._engine.export_kv(block, layers)

    def import_kv(self, block: int, layer: int, k: Bytes, v: Bytes) -> None:
        self._engine.import_kv(block, layer, k, v)

    def export_block(self, block: int) -> bytes | bytearray:
        inner = block_exporter(self._engine)
        if inner is None:
            raise ValueError("the engine has no export_block")  # callers check `block_exporter(inner)` first
        return inner.export_block(block)

    @property
    def exports_blocks(self) -> bool:
        return block_exporter(self._engine) is not None

    def import_block(self, block: int, container: Container) -> None:
        inner = block_importer(self._engine)
        if inner is None:
            for view in container.layers:
                self._engine.import_kv(block, view.layer, view.k, view.v)
            return
        inner.import_block(block, container)

    def sampler_state(self) -> Sampler:
        return self._engine.sampler_state()

    def restore_sampler(self, state: Sampler) -> None:
        self._engine.restore_sampler(state)


def engine_factory(name: str, descriptor: CompatDescriptor, *, vocab_size: int,
                   pacing: Pacing = Pacing(), chunk_tokens: int = 0) -> tuple[EngineFactory, EngineGeometry]:
    """The factory for ``name`` and its geometry, checked against ``descriptor``."""
    if name.startswith(HF_PREFIX):
        if pacing != Pacing():
            raise ValidationError("instance.engine", "test_*_us_per_token pace the test engine only")
        return hf_engine_factory(Path(name[len(HF_PREFIX) :]), descriptor, chunk_tokens=chunk_tokens)
    if name != "test":
        raise ValidationError("instance.engine", f"unknown engine {name!r}")
    if descriptor.element.size != 2:
        raise ValidationError("instance.engine", f"the test engine stores 2-octet elements, not {descriptor.kv_dtype}")
    geometry = EngineGeometry(layers=descriptor.layers, kv_heads=descriptor.kv_heads, head_dim=descriptor.head_dim,
                              block_tokens=descriptor.block_tokens, vocab_size=vocab_size,
                              kv_dtype=descriptor.kv_dtype)
    check_geometry(geometry, descriptor)
    paced = pacing != Pacing()

    def make(sampler: Sampler) -> Engine:
        engine = DeterministicTestEngine(geometry, sampler)
        return PacedEngine(engine, pacing) if paced else engine

    return make, geometry


def hf_engine_factory(directory: Path, descriptor: CompatDescriptor, *,
                      chunk_tokens: int = 0) -> tuple[EngineFactory, EngineGeometry]:
    """`HfEngine` over the model in ``directory``, which must be the model ``descriptor`` names.

    ``chunk_tokens`` (a multiple of B, 0: none) computes prompts chunk by chunk, so that a prefill over
    a loaded prefix runs the very kernels a full recompute runs: bit-identical logits (docs/engine.md)."""
    if chunk_tokens % descriptor.block_tokens:
        raise ValidationError("instance.hf_chunk_tokens", f"must be a multiple of block_tokens "
                                                          f"({descriptor.block_tokens})")
    from kvsp.hf.descriptor import descriptor_from_model_dir  # noqa: PLC0415 - torch only for this engine

    try:
        found = descriptor_from_model_dir(directory, block_tokens=descriptor.block_tokens, kv_dtype=descriptor.kv_dtype)
    except OSError as exc:
        raise ValidationError("instance.engine", f"cannot read the model in {directory}: {exc}") from exc
    if found.compat_id != descriptor.compat_id:
        raise ValidationError("instance.engine", f"the model in {directory} has compat_id {found.compat_id.hex()}, "
                                                 f"the configured descriptor {descriptor.compat_id.hex()}")
    from kvsp.hf.engine import HfModel  # noqa: PLC0415

    model = HfModel.load(directory, block_tokens=descriptor.block_tokens, kv_dtype=descriptor.kv_dtype,
                         chunk_tokens=chunk_tokens or None)
    check_geometry(model.geometry, descriptor)
    return model.engine, model.geometry


def calibrate(make: EngineFactory, block_tokens: int, *, target_tokens: int = CALIBRATION_TOKENS,
              budget_s: float = CALIBRATION_BUDGET_S) -> tuple[float, float]:
    """(prefill, decode) tokens per second of fresh engines (worker thread; see the module).

    The prefill rate is that of the longest prompt run: 4 blocks, doubled while the next prompt (taken to
    cost 2.5x the last: longer prompts are slower per token) still fits in ``budget_s``, up to
    ``target_tokens``.  Decode is timed after that prompt, i.e. with a cache of typical length."""
    tokens = CALIBRATION_BLOCKS * block_tokens
    spent = 0.0
    while True:
        engine = make(greedy_sampler())
        _, prefill_s = timed(partial(engine.prefill, [1] * tokens))
        spent += prefill_s
        if tokens >= target_tokens or spent + 2.5 * prefill_s > budget_s:
            break
        tokens = min(2 * tokens, max(target_tokens, tokens))
    _, decode_s = timed(lambda: [engine.decode_step() for _ in range(CALIBRATION_STEPS)])
    return tokens / max(prefill_s, 1e-9), CALIBRATION_STEPS / max(decode_s, 1e-9)


@dataclass(slots=True)
class RateMeter:
    """Tokens per second of one kind of engine work, measured, smoothed; 0 until measured.

    A measurement of ``tokens`` moves the rate by ``EWMA_WEIGHT * min(1, tokens / reference_tokens)``:
    with the default 1 every measurement counts alike (decode steps); the prefill meter uses
    `PREFILL_REFERENCE_TOKENS`, so short prefills, whose per-token rate says little about a recompute
    of a long prompt, barely move it."""

    rate: float = 0.0
    reference_tokens: int = 1

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        sample = tokens / seconds
        if self.rate == 0:
            self.rate = sample
            return
        weight = EWMA_WEIGHT * min(1.0, tokens / self.reference_tokens)
        self.rate = (1 - weight) * self.rate + weight * sample


def timed(work: Callable[[], T]) -> tuple[T, float]:
    """Run ``work`` (in the calling thread) and return its result and the seconds it took."""
    start = time.perf_counter()
    result = work()
    return result, time.perf_counter() - start
