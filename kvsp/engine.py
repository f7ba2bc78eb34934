"""The engine interface an inference instance drives, and a deterministic engine for tests.

`Engine` is what the instance needs from a model, whatever runs it (decision D6: the reference
adapter wraps Hugging Face ``transformers``): prefill a context with a loaded KV prefix, decode one
token at a time, move KV in and out by block and layer in layout "kvsp-layout-1" (spec section 4.3),
and get and restore the sampler state that a Session Checkpoint carries (section 6.8).  One `Engine`
object is one generation context; a batching engine hands out one per sequence.

`DeterministicTestEngine` is a TEST engine, not a model.  It needs only numpy and makes every value a
documented function, so that tests can check what migration and cache loading promise (same tokens ->
same KV -> same continuation on another instance) without weights:

- KV value of (kind K=0 / V=1, token, position, layer, head, dim): chain the 64-bit SplitMix64
  finaliser ``mix`` over the inputs, ``h = mix(mix(mix(mix(mix(KIND[kind] ^ token) ^ position) ^ layer)
  ^ head) ^ dim)`` with ``KIND = (0x4B5653502D4B0000, 0x4B5653502D560000)`` ("KVSP-K", "KVSP-V"), and
  take ``float16((h >> 40) / 2**24 * 2 - 1)``, a value in [-1, 1).  Unlike a real
  model, it does not depend on earlier tokens; the Block Key chain still binds a block to its prefix.
- Context fingerprint: BLAKE2b (8 octets, person ``kvsp-test-ctx``) over the cache in position order:
  for each position, for each layer 0..L-1 in turn, its K row then its V row (float16, little-endian).
  It is computed from the cache contents, not from the token ids, so loading wrong KV changes the
  output, as it would in a model.
- Logits: with ``s`` the fingerprint as a little-endian integer, ``logits[v] = ((mix(mix(s) ^ v) >> 11)
  * 2**-53 * 2 - 1) * LOGIT_SCALE`` (float32).
- Sampling: "greedy" takes the first argmax (deterministic: true).  "top-p" (params ``p``, optional
  ``temperature``) keeps the smallest set of most probable tokens whose probability reaches p and draws
  one with ``random.Random(seed).random()``; each top-p token consumes exactly one draw.  ``step``
  counts sampled tokens, so restoring (seed, step) is ``Random(seed)`` advanced by ``step`` draws.

`BlockImporter.import_block` (optional) stages a whole loaded block from its container at once, which an
engine can copy into its cache in one operation instead of two per layer (`block_importer` finds it).

`BlockExporter.export_block` (optional) is the reverse for a computed block: its raw container written
in one operation (`block_exporter` finds it).

`LayerwiseEngine.prefill_layerwise` is the same prefill run layer by layer: the prefix's layer l is
waited for (``wait_layer``), copied into the cache, the rest of the context's layer l is computed and
announced (``on_layer``), so that loading, computing and publishing overlap; the result is identical to
`Engine.prefill` with the same prefix.

The next token is thus a function of the cached KV and the sampler state alone: an instance that
resumes from a checkpoint (loading or recomputing the same KV, restoring the same sampler) continues
exactly where the failed one would have.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

import numpy as np
import numpy.typing as npt

from kvsp.records import Sampler
from kvsp.registry import ELEMENT_TYPES

if TYPE_CHECKING:
    from kvsp.container import Container

LAYOUT: Final = "kvsp-layout-1"
LOGIT_SCALE: Final = 8.0
GREEDY: Final = "greedy"
TOP_P: Final = "top-p"
_KIND: Final = (np.uint64(0x4B5653502D4B0000), np.uint64(0x4B5653502D560000))  # "KVSP-K", "KVSP-V"
_U64 = npt.NDArray[np.uint64]
_F16 = npt.NDArray[np.float16]
Bytes = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class EngineGeometry:
    """Cache geometry (as in the Compatibility Descriptor) plus the vocabulary size."""

    layers: int
    kv_heads: int
    head_dim: int
    block_tokens: int
    vocab_size: int
    kv_dtype: str = "fp16"

    def __post_init__(self) -> None:
        if min(self.layers, self.kv_heads, self.head_dim, self.block_tokens, self.vocab_size) < 1:
            raise ValueError("every geometry member must be positive")
        if self.kv_dtype not in ELEMENT_TYPES:
            raise ValueError(f"kv_dtype {self.kv_dtype!r} is not in the KVSP Element Types registry")

    @property
    def element_octets(self) -> int:
        """Octets of one cache element (the registry size of ``kv_dtype``)."""
        return ELEMENT_TYPES[self.kv_dtype].size

    @property
    def section_octets(self) -> int:
        """Octets of one K (or V) section of one block and one layer."""
        return self.block_tokens * self.kv_heads * self.head_dim * self.element_octets


@dataclass(frozen=True, slots=True, eq=False)
class LayerKv:
    """K and V sections of one layer of one block, in kvsp-layout-1 (token slowest, dim fastest, LE)."""

    layer: int
    k: memoryview
    v: memoryview


BlockKv = Sequence[LayerKv]  # all layers of one block, ascending


@dataclass(frozen=True, slots=True, eq=False)
class Step:
    """The token sampled after the current context, and the logits it was sampled from."""

    token: int
    logits: npt.NDArray[np.float32]


class Engine(Protocol):
    """One generation context of a model, as the inference instance drives it."""

    @property
    def geometry(self) -> EngineGeometry: ...

    @property
    def context_length(self) -> int:
        """Tokens whose KV is in the cache."""
        ...

    def prefill(self, tokens: Sequence[int], loaded_prefix_kv: Sequence[BlockKv] = ()) -> Step:
        """Start a context of ``tokens``: take the KV of the leading blocks from ``loaded_prefix_kv``
        (and from complete blocks given to `import_kv`), compute the rest, and sample the next token."""
        ...

    def decode_step(self) -> Step:
        """Append the last sampled token to the context and sample the next one."""
        ...

    def export_kv(self, block: int, layers: tuple[int, int]) -> list[LayerKv]:
        """K and V of a complete cached block for the inclusive layer range, ascending."""
        ...

    def import_kv(self, block: int, layer: int, k: Bytes, v: Bytes) -> None:
        """Stage one layer of a loaded block for the next `prefill` (layers may arrive one by one)."""
        ...

    def sampler_state(self) -> Sampler:
        """What a Session Checkpoint records: method, params, seed, step, deterministic."""
        ...

    def restore_sampler(self, state: Sampler) -> None:
        """Continue sampling exactly as the engine that reported ``state`` would have."""
        ...


WaitLayer = Callable[[int], None]
OnLayer = Callable[[int], None]


class LayerwiseEngine(Engine, Protocol):
    """An engine whose prefill overlaps with loading the prefix and with publishing, layer by layer."""

    def prefill_layerwise(self, tokens: Sequence[int], prefix_blocks: int, wait_layer: WaitLayer,
                          on_layer: OnLayer | None = None) -> Step:
        """Prefill ``tokens`` whose leading ``prefix_blocks`` blocks' KV arrives through `import_kv` while this
        runs (in a worker thread): before computing layer l the engine calls ``wait_layer(l)``, which returns once
        every prefix block's layer l has been given to `import_kv` (it raises to abort). After layer l of the whole
        context is in the cache it calls ``on_layer(l)``, after which `export_kv(block, (l, l))` works for every
        complete block, so the caller can publish layer l while l+1 is computed. Returns the sampled next token."""
        ...


class BlockImporter(Protocol):
    """An engine that stages a whole loaded block at once (optional: `import_kv` per layer always works)."""

    def import_block(self, block: int, container: Container) -> None:
        """Stage every layer of a loaded block from its container for the next prefill, like `import_kv` for
        each of its layers.  Worth it when the block is already whole (own tiers, a finished fetch): an engine
        can view a raw container's data as one tensor and copy it into its cache in one operation, where
        `import_kv` costs a dispatch per (small) section.  Raises ValueError for a container that does not
        fit the geometry."""
        ...


class BlockExporter(Protocol):
    """An engine that writes a whole computed block as a raw container at once (optional)."""

    def export_block(self, block: int) -> bytes | bytearray:
        """The raw container (layers 0..L-1, one block of tokens) of a complete computed block, octet for octet
        what `encode_container` of `export_kv` gives, written in one operation (one strided copy from the
        cache) instead of one per section.  Raises ValueError for a block that is not complete."""
        ...


def block_exporter(engine: object) -> BlockExporter | None:
    """The engine as a `BlockExporter` when it implements ``export_block``, else None.  A wrapper engine
    whose inner engine lacks it says so with ``exports_blocks = False``."""
    if callable(getattr(engine, "export_block", None)) and getattr(engine, "exports_blocks", True):
        return engine  # type: ignore[return-value]  # structural: the method exists
    return None


def block_importer(engine: object) -> BlockImporter | None:
    """The engine as a `BlockImporter` when it implements ``import_block``, else None."""
    if callable(getattr(engine, "import_block", None)):
        return engine  # type: ignore[return-value]  # structural: the method exists
    return None


def check_block(geometry: EngineGeometry, container: Container) -> None:
    """A whole block's container must have every layer of the geometry and one block of tokens."""
    if container.layer_count != geometry.layers or container.token_count != geometry.block_tokens:
        raise ValueError(f"a block is {geometry.layers} layers of {geometry.block_tokens} tokens, not "
                         f"{container.layer_count} layers of {container.token_count}")


def greedy_sampler(seed: int = 0) -> Sampler:
    return Sampler(GREEDY, (), seed, 0, True)


def top_p_sampler(p: float, seed: int, *, temperature: float = 1.0) -> Sampler:
    return Sampler(TOP_P, (("p", p), ("temperature", temperature)), seed, 0, False)


def mix64(x: _U64) -> _U64:
    """SplitMix64's finaliser on uint64 arrays (wrapping arithmetic): the test engine's hash."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def kv_values(geometry: EngineGeometry, kind: int, tokens: Sequence[int], start: int, layer: int) -> _F16:
    """The documented KV of ``tokens`` at positions start.. for one layer: shape (tokens, heads, dim)."""
    tok = np.asarray(tokens, dtype=np.uint64).reshape(-1, 1, 1)
    pos = np.arange(start, start + len(tokens), dtype=np.uint64).reshape(-1, 1, 1)
    heads = np.arange(geometry.kv_heads, dtype=np.uint64).reshape(1, -1, 1)
    dims = np.arange(geometry.head_dim, dtype=np.uint64).reshape(1, 1, -1)
    h = mix64(mix64(mix64(_KIND[kind] ^ tok) ^ pos) ^ np.uint64(layer))
    h = mix64(mix64(h ^ heads) ^ dims)
    return ((h >> np.uint64(40)).astype(np.float64) / 2**24 * 2 - 1).astype("<f2")


def _octets(array: _F16) -> memoryview:
    """The array's octets as a view (no copy); cache slices along the token axis are contiguous."""
    if not array.flags.c_contiguous:
        raise ValueError("KV sections must be contiguous")
    return array.data.cast("B")


def _logits(fingerprint: bytes, vocab_size: int) -> npt.NDArray[np.float32]:
    seed = mix64(np.array([int.from_bytes(fingerprint, "little")], dtype=np.uint64))
    h = mix64(seed ^ np.arange(vocab_size, dtype=np.uint64))
    return (((h >> np.uint64(11)).astype(np.float64) * 2.0**-53 * 2 - 1) * LOGIT_SCALE).astype(np.float32)


class SamplerState:
    """Sampler method, parameters and a `random.Random` whose position is (seed, step).

    Shared by every kvsp engine, so a session checkpointed on one engine kind samples the same way on
    another given the same logits.  Top-p works on the float32 logits in float64 numpy arithmetic.
    """

    __slots__ = ("rng", "state")

    def __init__(self, state: Sampler) -> None:
        if state.method not in (GREEDY, TOP_P):
            raise ValueError(f"kvsp engines sample {GREEDY!r} or {TOP_P!r}, not {state.method!r}")
        self.state = state
        self.rng = random.Random(state.seed)
        if state.method == TOP_P:
            for _ in range(state.step):
                self.rng.random()

    def sample(self, logits: npt.NDArray[np.float32]) -> int:
        state = self.state
        if state.method == GREEDY:
            token = int(np.argmax(logits))
        else:
            token = self._top_p(logits, float(_number(state, "p", 1.0)), float(_number(state, "temperature", 1.0)))
        self.state = Sampler(state.method, state.params, state.seed, state.step + 1, state.deterministic)
        return token

    def _top_p(self, logits: npt.NDArray[np.float32], p: float, temperature: float) -> int:
        scaled = logits.astype(np.float64) / temperature
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        keep = order[: min(len(order), int(np.searchsorted(cumulative, p)) + 1)]
        kept = probs[keep] / probs[keep].sum()
        draw = self.rng.random()
        index = min(int(np.searchsorted(np.cumsum(kept), draw, side="right")), len(keep) - 1)
        return int(keep[index])


def _number(state: Sampler, name: str, default: float) -> float:
    try:
        value = state.param(name)
    except KeyError:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"sampler parameter {name} must be a number")
    return float(value)


class DeterministicTestEngine:
    """A TEST engine (numpy only) whose KV, logits and samples are documented functions; see the module."""

    __slots__ = ("_fingerprint", "_geometry", "_kv", "_length", "_lock", "_pending", "_ready_layers", "_sampler",
                 "_staged", "loaded_tokens", "recomputed_tokens")

    def __init__(self, geometry: EngineGeometry, sampler: Sampler | None = None) -> None:
        if geometry.element_octets != 2:
            raise ValueError(f"the test engine stores 2-octet elements, not {geometry.kv_dtype}")
        self._geometry = geometry
        self._sampler = SamplerState(sampler or greedy_sampler())
        self._kv: _F16 = self._allocate(geometry.block_tokens)
        self._length = 0
        self._ready_layers = geometry.layers  # layers whose cache covers the whole context
        self._pending: int | None = None
        self._fingerprint = self._new_fingerprint()
        # import_kv runs in the event loop thread while prefill_layerwise runs in a worker thread.
        self._lock = threading.Lock()
        self._staged: dict[int, dict[int, tuple[_F16, _F16]]] = {}
        self.loaded_tokens = 0  # tokens of the last prefill whose KV was loaded rather than computed
        self.recomputed_tokens = 0

    @property
    def geometry(self) -> EngineGeometry:
        return self._geometry

    @property
    def context_length(self) -> int:
        return self._length

    # -- the Engine protocol ---------------------------------------------------------------------
    def prefill(self, tokens: Sequence[int], loaded_prefix_kv: Sequence[BlockKv] = ()) -> Step:
        if not tokens:
            raise ValueError("prefill needs at least one token")
        loaded = self._loaded_blocks(loaded_prefix_kv, len(tokens) // self._geometry.block_tokens)
        return self._run(tokens, len(loaded), lambda block, layer: loaded[block][layer], None, None)

    def prefill_layerwise(self, tokens: Sequence[int], prefix_blocks: int, wait_layer: WaitLayer,
                          on_layer: OnLayer | None = None) -> Step:
        if not tokens:
            raise ValueError("prefill needs at least one token")
        if not 0 <= prefix_blocks <= len(tokens) // self._geometry.block_tokens:
            raise ValueError(f"{prefix_blocks} prefix blocks do not fit in {len(tokens)} tokens")
        return self._run(tokens, prefix_blocks, self._take_staged, wait_layer, on_layer)

    def decode_step(self) -> Step:
        if self._pending is None:
            raise RuntimeError("decode_step needs a prefill first")
        if self._length == self._kv.shape[2]:
            grown = self._allocate(2 * self._length)
            grown[:, :, : self._length] = self._kv[:, :, : self._length]
            self._kv = grown
        for layer in range(self._geometry.layers):
            self._compute(layer, [self._pending], self._length)
        self._length += 1
        self._absorb(self._length - 1, self._length)
        return self._sample()

    def export_kv(self, block: int, layers: tuple[int, int]) -> list[LayerKv]:
        g = self._geometry
        first, last = layers
        if not 0 <= first <= last < g.layers:
            raise ValueError(f"layers {first}-{last} outside 0-{g.layers - 1}")
        if last >= self._ready_layers:
            raise ValueError(f"layer {last} is not computed yet")
        if block < 0 or (block + 1) * g.block_tokens > self._length:
            raise ValueError(f"block {block} is not complete in a context of {self._length} tokens")
        rows = slice(block * g.block_tokens, (block + 1) * g.block_tokens)
        kv = self._kv
        return [LayerKv(layer, _octets(kv[0, layer, rows]), _octets(kv[1, layer, rows]))
                for layer in range(first, last + 1)]

    def import_kv(self, block: int, layer: int, k: Bytes, v: Bytes) -> None:
        g = self._geometry
        if block < 0 or not 0 <= layer < g.layers:
            raise ValueError(f"block {block} layer {layer} outside the geometry")
        sections = (self._section(k), self._section(v))
        with self._lock:
            self._staged.setdefault(block, {})[layer] = sections

    def import_block(self, block: int, container: Container) -> None:
        """Every layer of a whole block (the test engine gains nothing from one view: numpy views are cheap)."""
        check_block(self._geometry, container)
        if block < 0:
            raise ValueError(f"block {block} outside the geometry")
        layers = {view.layer: (self._section(view.k), self._section(view.v)) for view in container.layers}
        with self._lock:
            self._staged[block] = layers

    def sampler_state(self) -> Sampler:
        return self._sampler.state

    def restore_sampler(self, state: Sampler) -> None:
        self._sampler = SamplerState(state)

    # -- for tests -----------------------------------------------------------------------------
    def reference_kv(self, tokens: Sequence[int], block: int) -> list[LayerKv]:
        """The KV that block ``block`` of ``tokens`` has under this engine (what a holder would serve)."""
        g = self._geometry
        chunk = tokens[block * g.block_tokens : (block + 1) * g.block_tokens]
        if len(chunk) != g.block_tokens:
            raise ValueError(f"block {block} is not complete in {len(tokens)} tokens")
        start = block * g.block_tokens
        return [LayerKv(layer, _octets(kv_values(g, 0, chunk, start, layer)),
                        _octets(kv_values(g, 1, chunk, start, layer))) for layer in range(g.layers)]

    # -- internals -----------------------------------------------------------------------------
    def _run(self, tokens: Sequence[int], prefix_blocks: int, prefix: Callable[[int, int], tuple[_F16, _F16]],
             wait_layer: WaitLayer | None, on_layer: OnLayer | None) -> Step:
        """Layer by layer: wait for the prefix's layer, copy it in, compute the rest, announce the layer."""
        g = self._geometry
        self._kv, self._length, self._ready_layers = self._allocate(len(tokens)), len(tokens), 0
        self._pending, self._fingerprint = None, self._new_fingerprint()
        start = prefix_blocks * g.block_tokens
        try:
            for layer in range(g.layers):
                if wait_layer is not None:
                    wait_layer(layer)
                for block in range(prefix_blocks):
                    rows = slice(block * g.block_tokens, (block + 1) * g.block_tokens)
                    self._kv[0, layer, rows], self._kv[1, layer, rows] = prefix(block, layer)
                self._compute(layer, tokens[start:], start)
                self._ready_layers = layer + 1
                if on_layer is not None:
                    on_layer(layer)
        except BaseException:
            self._length, self._ready_layers = 0, g.layers  # no context: export refuses every block
            raise
        finally:
            with self._lock:
                self._staged.clear()
        self._absorb(0, len(tokens))
        self.loaded_tokens, self.recomputed_tokens = start, len(tokens) - start
        return self._sample()

    def _take_staged(self, block: int, layer: int) -> tuple[_F16, _F16]:
        with self._lock:
            sections = self._staged.get(block, {}).get(layer)
        if sections is None:
            raise ValueError(f"block {block} layer {layer} was not imported before wait_layer({layer}) returned")
        return sections

    def _allocate(self, tokens: int) -> _F16:
        g = self._geometry
        return np.zeros((2, g.layers, max(tokens, 1), g.kv_heads, g.head_dim), dtype="<f2")

    @staticmethod
    def _new_fingerprint() -> hashlib.blake2b:
        return hashlib.blake2b(digest_size=8, person=b"kvsp-test-ctx")

    def _section(self, data: Bytes) -> _F16:
        g = self._geometry
        view = memoryview(data).cast("B")
        if view.nbytes != g.section_octets:
            raise ValueError(f"a section of one block and layer is {g.section_octets} octets, not {view.nbytes}")
        return np.frombuffer(view, dtype="<f2").reshape(g.block_tokens, g.kv_heads, g.head_dim)

    def _loaded_blocks(self, given: Sequence[BlockKv], complete: int) -> list[list[tuple[_F16, _F16]]]:
        """Leading blocks whose every layer is available, from ``given`` or from staged imports."""
        g = self._geometry
        out: list[list[tuple[_F16, _F16]]] = []
        for block in range(complete):
            if block < len(given):
                layers = {lk.layer: (self._section(lk.k), self._section(lk.v)) for lk in given[block]}
            else:
                with self._lock:
                    layers = dict(self._staged.get(block, {}))
            if len(layers) != g.layers or set(layers) != set(range(g.layers)):
                break
            out.append([layers[layer] for layer in range(g.layers)])
        return out

    def _compute(self, layer: int, tokens: Sequence[int], start: int) -> None:
        if not tokens:
            return
        for kind in (0, 1):
            self._kv[kind, layer, start : start + len(tokens)] = kv_values(self._geometry, kind, tokens, start, layer)

    def _absorb(self, start: int, end: int) -> None:
        """Feed positions [start, end) to the fingerprint, position by position (K then V per layer)."""
        rows = self._kv[:, :, start:end].transpose(2, 1, 0, 3, 4)  # position, layer, K/V, head, dim
        self._fingerprint.update(np.ascontiguousarray(rows).tobytes())

    def _sample(self) -> Step:
        logits = _logits(self._fingerprint.copy().digest(), self._geometry.vocab_size)
        token = self._sampler.sample(logits)
        self._pending = token
        return Step(token, logits)


def _conforms(engine: DeterministicTestEngine) -> LayerwiseEngine:
    """Static check (mypy): the test engine implements the whole `LayerwiseEngine` protocol."""
    return engine


def _imports_blocks(engine: DeterministicTestEngine) -> BlockImporter:
    """Static check (mypy): and `BlockImporter`."""
    return engine
