"""Engines behind the instance (decision D6) and the measurements the status record reports.

``engine = "test"`` is `kvsp.engine.DeterministicTestEngine` with the geometry of the configured
Compatibility Descriptor; the Hugging Face adapter ("hf:DIR") comes with the torch work.  One `Engine`
object is one generation context, so the instance makes one per session through an `EngineFactory`.

`RateMeter` turns the engine's actual timings into the status record's ``prefill_tokens_per_s`` and
``decode_tokens_per_s`` (an exponentially weighted mean of measured rates, section 6.3/6.4 inputs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

from kvsp.descriptor import CompatDescriptor
from kvsp.engine import DeterministicTestEngine, Engine, EngineGeometry
from kvsp.errors import ValidationError
from kvsp.records import Sampler

EngineFactory = Callable[[Sampler], Engine]
EWMA_WEIGHT: Final = 0.2
T = TypeVar("T")


def check_geometry(geometry: EngineGeometry, descriptor: CompatDescriptor) -> None:
    """The engine's cache must be exactly the descriptor's, or its blocks would be wrongly labelled."""
    theirs = (descriptor.layers, descriptor.kv_heads, descriptor.head_dim, descriptor.block_tokens,
              descriptor.kv_dtype)
    ours = (geometry.layers, geometry.kv_heads, geometry.head_dim, geometry.block_tokens, geometry.kv_dtype)
    if ours != theirs:
        raise ValidationError("instance.engine", f"geometry (layers, kv_heads, head_dim, block_tokens, kv_dtype) "
                                                 f"{ours} disagrees with the descriptor's {theirs}")


def engine_factory(name: str, descriptor: CompatDescriptor, *, vocab_size: int) -> tuple[EngineFactory,
                                                                                          EngineGeometry]:
    """The factory for ``name`` and its geometry, checked against ``descriptor``."""
    if name != "test":
        raise ValidationError("instance.engine", f"unknown engine {name!r}")
    if descriptor.element.size != 2:
        raise ValidationError("instance.engine", f"the test engine stores 2-octet elements, not {descriptor.kv_dtype}")
    geometry = EngineGeometry(layers=descriptor.layers, kv_heads=descriptor.kv_heads, head_dim=descriptor.head_dim,
                              block_tokens=descriptor.block_tokens, vocab_size=vocab_size,
                              kv_dtype=descriptor.kv_dtype)
    check_geometry(geometry, descriptor)

    def make(sampler: Sampler) -> Engine:
        return DeterministicTestEngine(geometry, sampler)

    return make, geometry


@dataclass(slots=True)
class RateMeter:
    """Tokens per second of one kind of engine work, measured, smoothed; 0 until measured."""

    rate: float = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        sample = tokens / seconds
        self.rate = sample if self.rate == 0 else (1 - EWMA_WEIGHT) * self.rate + EWMA_WEIGHT * sample


def timed(work: Callable[[], T]) -> tuple[T, float]:
    """Run ``work`` (in the calling thread) and return its result and the seconds it took."""
    start = time.perf_counter()
    result = work()
    return result, time.perf_counter() - start
