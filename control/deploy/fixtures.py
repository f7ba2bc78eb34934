"""The small test model every process test and benchmark deploys: DeterministicTestEngine on a 2-layer
descriptor, one scope, and what the engine produces run directly (to compare any deployment's output with).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsp.descriptor import CompatDescriptor
from kvsp.engine import DeterministicTestEngine, EngineGeometry
from kvsp.keys import ScopeKey
from kvsp.records import Sampler

SCOPE_KEY = ScopeKey(bytes(range(32)))
SCOPE = SCOPE_KEY.scope_id
DESCRIPTOR = CompatDescriptor(model="ii-test", model_digest=bytes(range(32)), tokenizer_digest=bytes(32), layers=2,
                              kv_heads=2, head_dim=4, kv_dtype="fp16", positional="rope", block_tokens=4)
VOCAB = 97  # the instances' ``vocab_size``
GEOMETRY = EngineGeometry(layers=2, kv_heads=2, head_dim=4, block_tokens=4, vocab_size=VOCAB, kv_dtype="fp16")


def geometry_of(model: CompatDescriptor) -> EngineGeometry:
    """The test engine's geometry for ``model`` (the instances' ``vocab_size`` is VOCAB)."""
    return EngineGeometry(layers=model.layers, kv_heads=model.kv_heads, head_dim=model.head_dim,
                          block_tokens=model.block_tokens, vocab_size=VOCAB, kv_dtype=model.kv_dtype)


def reference_tokens(prompt: Sequence[int], n: int, sampler: Sampler, geometry: EngineGeometry = GEOMETRY) -> list[int]:
    """What DeterministicTestEngine produces run directly, without any instance or failure."""
    engine = DeterministicTestEngine(geometry, sampler)
    out = [engine.prefill(prompt).token]
    while len(out) < n:
        out.append(engine.decode_step().token)
    return out
