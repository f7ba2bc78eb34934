"""The Hugging Face transformers engine (decision D6): a causal LM behind `kvsp.engine.LayerwiseEngine`.

`HfModel` holds the weights once (loaded from a model directory, or built in memory); each `HfEngine`
is one generation context over it, as the instance makes one per session.

The engine runs the decoder itself instead of calling the model's ``forward``, the way
``LlamaModel.forward`` (transformers 5) does it: embed the tokens to compute, rotary position embeddings
for their positions, then for each decoder layer l: wait for the prefix's layer l, copy it into the cache,
run layer l on the uncached tokens (they attend to the prefix KV and to their own), announce layer l;
then the final norm and ``lm_head`` on the last position.  That is what makes layer-wise loading and
publishing possible, and it works for every model whose module tree is Llama's (``model.embed_tokens``,
``model.layers``, ``model.norm``, ``model.rotary_emb``, ``lm_head``: Llama, Mistral, Qwen2 and others).

The cache is one tensor ``[K/V, layer, token, kv_head, dim]`` in the descriptor's ``kv_dtype``: the slice of
one block and one layer is a C-contiguous ``[tokens, kv_heads, head_dim]`` tensor, i.e. already in layout
kvsp-layout-1, so `export_kv` returns views of the cache (no copy on CPU) and `import_kv` keeps a view of
the received octets until the prefill copies it into the cache (the one copy, `kvsp.tensors.copy_section`).
The decoder layers see the cache through `_CacheView`, which implements the one method of transformers'
``Cache`` that attention uses (``update``): it writes the new K/V into the cache and returns the whole
context's K/V.  Prefill with a loaded prefix and full recompute therefore run the same kernels on the same
values; with an fp32 model on CPU the logits agree to the last bit or within a few ulp (see docs/engine.md).

A context whose every token is covered by loaded blocks still computes its last token (its logits need
its hidden state); that token's KV is recomputed over the loaded copy.  Sampling is
`kvsp.engine.SamplerState`, shared with the test engine: greedy, or top-p drawing from
``random.Random(seed)`` advanced by ``step``, so a checkpoint's (seed, step) restores it exactly.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import torch

from kvsp.container import FIXED_HEADER_LENGTH, TABLE_ENTRY_LENGTH, Container
from kvsp.descriptor import CompatDescriptor
from kvsp.engine import (
    BlockExporter,
    BlockImporter,
    BlockKv,
    Bytes,
    EngineGeometry,
    LayerKv,
    LayerwiseEngine,
    OnLayer,
    SamplerState,
    Step,
    WaitLayer,
    check_block,
    greedy_sampler,
)
from kvsp.errors import ValidationError
from kvsp.hf.descriptor import descriptor_from_model_dir, geometry_of, kv_dtype_of_config
from kvsp.records import Sampler
from kvsp.tensors import (
    CacheOctets,
    container_tensor,
    copy_section,
    encode_cache_block_into,
    section_octets,
    section_view,
    torch_dtype,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

if TYPE_CHECKING:
    from torch import nn

SUPPORTED_ATTENTION: Final = ("sdpa", "eager")
_PrefixSource = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where a forward pass takes the prefix KV from, and whom it tells about each layer.

    ``bulk``: prefix blocks already copied into the cache whole (`HfEngine.import_block`), skipped per layer."""

    prefix_blocks: int
    prefix: _PrefixSource
    wait_layer: WaitLayer | None
    on_layer: OnLayer | None
    bulk: frozenset[int] = frozenset()


def _no_prefix(block: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    raise AssertionError("a pass without prefix blocks asked for one")


_DECODE: Final = _Plan(0, _no_prefix, None, None)


class HfModel:
    """A loaded causal LM and the cache geometry its engines use."""

    __slots__ = ("_descriptor", "block_tokens", "chunk_tokens", "compute_dtype", "device", "directory", "geometry",
                 "kv_dtype", "module")

    def __init__(self, module: nn.Module, *, block_tokens: int, kv_dtype: str | None = None,
                 directory: Path | None = None, chunk_tokens: int | None = None) -> None:
        if chunk_tokens is not None and (chunk_tokens < 1 or chunk_tokens % block_tokens):
            raise ValueError("chunk_tokens must be a positive multiple of block_tokens")
        for path in ("model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb", "lm_head"):
            if module.get_submodule(path) is None:  # pragma: no cover - get_submodule raises first
                raise ValidationError("model", f"has no {path}")
        config: Any = module.config
        implementation = getattr(config, "_attn_implementation", None)
        if implementation not in SUPPORTED_ATTENTION:
            raise ValidationError("model", f"attention {implementation!r} is not one of {SUPPORTED_ATTENTION}")
        layers, kv_heads, head_dim = geometry_of(config.to_dict())
        parameter = next(module.parameters())
        self.module: Any = module.eval()  # a transformers causal LM; its submodules are untyped
        self.device, self.compute_dtype = parameter.device, parameter.dtype
        self.kv_dtype = kv_dtype or kv_dtype_of_config({"dtype": str(self.compute_dtype)})
        torch_dtype(self.kv_dtype)  # the cache type must exist in torch
        self.block_tokens = block_tokens
        self.chunk_tokens = chunk_tokens
        self.directory = directory
        self.geometry = EngineGeometry(layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                                       block_tokens=block_tokens, vocab_size=int(config.vocab_size),
                                       kv_dtype=self.kv_dtype)
        self._descriptor: CompatDescriptor | None = None

    @classmethod
    def load(cls, directory: str | Path, *, block_tokens: int, kv_dtype: str | None = None,
             device: str = "cpu", dtype: str | None = None, chunk_tokens: int | None = None) -> HfModel:
        """Load the model in ``directory`` (local files only) in ``dtype`` (registry name; default: the config's)."""
        from transformers import AutoModelForCausalLM  # noqa: PLC0415

        from kvsp.hf.descriptor import read_config  # noqa: PLC0415

        root = Path(directory)
        compute = torch_dtype(dtype or kv_dtype_of_config(read_config(root)))
        module: Any = AutoModelForCausalLM.from_pretrained(root, dtype=compute, attn_implementation="sdpa",
                                                      local_files_only=True)
        return cls(module.to(device), block_tokens=block_tokens, kv_dtype=kv_dtype, directory=root,
                   chunk_tokens=chunk_tokens)

    def descriptor(self) -> CompatDescriptor:
        """The Compatibility Descriptor from the model's files (computed once)."""
        if self._descriptor is None:
            if self.directory is None:
                raise ValidationError("model", "was built in memory and has no files to derive a descriptor from")
            self._descriptor = descriptor_from_model_dir(self.directory, block_tokens=self.block_tokens,
                                                         kv_dtype=self.kv_dtype)
        return self._descriptor

    def require(self, descriptor: CompatDescriptor) -> None:
        """Refuse to serve caches of ``descriptor`` unless it is exactly this model's (section 4.1: equal compat_ids).

        A changed weight or tokenizer file, another kv_dtype or block size all change the compat_id, so
        blocks made under the old one are never loaded into this model.
        """
        mine = self.descriptor()
        if mine.compat_id != descriptor.compat_id:
            raise ValidationError("compat_id", f"the model's files give {mine.compat_id_hex}, "
                                               f"not the configured {descriptor.compat_id_hex}")

    def engine(self, sampler: Sampler | None = None) -> HfEngine:
        return HfEngine(self, sampler)


class _CacheView:
    """What a transformers attention layer needs of a ``Cache``: ``update`` over the engine's cache rows."""

    __slots__ = ("_engine", "end", "start")

    def __init__(self, engine: HfEngine, start: int, end: int) -> None:
        self._engine, self.start, self.end = engine, start, end

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        kv, dtype = self._engine._kv, key_states.dtype
        # [batch 1, kv_heads, tokens, dim] -> the cache's [tokens, kv_heads, dim] rows (converted if needed)
        kv[0, layer_idx, self.start : self.end].copy_(key_states[0].transpose(0, 1))
        kv[1, layer_idx, self.start : self.end].copy_(value_states[0].transpose(0, 1))
        keys = kv[0, layer_idx, : self.end].transpose(0, 1).unsqueeze(0)
        values = kv[1, layer_idx, : self.end].transpose(0, 1).unsqueeze(0)
        return keys.to(dtype), values.to(dtype)


class HfEngine:
    """One generation context of an `HfModel`: the `LayerwiseEngine` protocol over a transformers model."""

    __slots__ = ("_kv", "_length", "_lock", "_model", "_octets", "_pending", "_ready_layers", "_sampler", "_staged",
                 "_whole", "loaded_tokens", "recomputed_tokens")

    def __init__(self, model: HfModel, sampler: Sampler | None = None) -> None:
        self._model = model
        self._sampler = SamplerState(sampler or greedy_sampler())
        self._kv, self._octets = self._allocate(model.block_tokens)
        self._length = 0
        self._ready_layers = model.geometry.layers
        self._pending: int | None = None
        self._lock = threading.Lock()  # import_kv (event loop thread) vs prefill (worker thread)
        self._staged: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._whole: dict[int, torch.Tensor] = {}  # import_block: [layers, K/V, tokens, kv_heads, dim] views
        self.loaded_tokens = 0
        self.recomputed_tokens = 0

    @property
    def geometry(self) -> EngineGeometry:
        return self._model.geometry

    @property
    def context_length(self) -> int:
        return self._length

    # -- the Engine protocol ---------------------------------------------------------------------
    def prefill(self, tokens: Sequence[int], loaded_prefix_kv: Sequence[BlockKv] = ()) -> Step:
        self._check_tokens(tokens)
        g = self.geometry
        given: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        for block, layers in enumerate(loaded_prefix_kv):
            for lk in layers:
                given[block, lk.layer] = self._sections(lk.k, lk.v)
        with self._lock:
            available = {**self._staged, **given}
            whole = {block: t for block, t in self._whole.items() if block >= len(loaded_prefix_kv)}
        blocks = 0
        while blocks < len(tokens) // g.block_tokens and (
                blocks in whole or all((blocks, n) in available for n in range(g.layers))):
            blocks += 1
        return self._run(tokens, blocks, lambda block, layer: available[block, layer], None, None, whole=whole)

    def prefill_layerwise(self, tokens: Sequence[int], prefix_blocks: int, wait_layer: WaitLayer,
                          on_layer: OnLayer | None = None) -> Step:
        self._check_tokens(tokens)
        if not 0 <= prefix_blocks <= len(tokens) // self.geometry.block_tokens:
            raise ValueError(f"{prefix_blocks} prefix blocks do not fit in {len(tokens)} tokens")
        with self._lock:
            whole = dict(self._whole)
        return self._run(tokens, prefix_blocks, self._take_staged, wait_layer, on_layer, whole=whole)

    def decode_step(self) -> Step:
        if self._pending is None:
            raise RuntimeError("decode_step needs a prefill first")
        if self._length == self._kv.shape[2]:
            grown, octets = self._allocate(2 * self._length)
            grown[:, :, : self._length] = self._kv[:, :, : self._length]
            self._kv, self._octets = grown, octets
        logits = self._forward([self._pending], self._length, _DECODE)
        self._length += 1
        return self._sample(logits)

    def export_kv(self, block: int, layers: tuple[int, int]) -> list[LayerKv]:
        g = self.geometry
        first, last = layers
        if not 0 <= first <= last < g.layers:
            raise ValueError(f"layers {first}-{last} outside 0-{g.layers - 1}")
        if last >= self._ready_layers:
            raise ValueError(f"layer {last} is not computed yet")
        if block < 0 or (block + 1) * g.block_tokens > self._length:
            raise ValueError(f"block {block} is not complete in a context of {self._length} tokens")
        start, octets = block * g.block_tokens, self._octets
        if octets is not None:  # views of the cache itself
            return [LayerKv(layer, octets.section(0, layer, start, g.block_tokens),
                            octets.section(1, layer, start, g.block_tokens)) for layer in range(first, last + 1)]
        rows, kv = slice(start, start + g.block_tokens), self._kv  # device memory: one copy to the host
        return [LayerKv(layer, section_octets(kv[0, layer, rows]), section_octets(kv[1, layer, rows]))
                for layer in range(first, last + 1)]

    def export_block(self, block: int) -> bytearray:
        """The block's raw container, written from the cache by one strided copy (`encode_cache_block_into`)."""
        g = self.geometry
        if self._ready_layers < g.layers:
            raise ValueError(f"layer {self._ready_layers} is not computed yet")
        if block < 0 or (block + 1) * g.block_tokens > self._length:
            raise ValueError(f"block {block} is not complete in a context of {self._length} tokens")
        data = 2 * g.layers * g.section_octets
        out = bytearray(FIXED_HEADER_LENGTH + TABLE_ENTRY_LENGTH * g.layers + data)
        length = encode_cache_block_into(out, self._kv, (0, g.layers - 1), block * g.block_tokens, g.block_tokens)
        del out[length:]
        return out

    def import_kv(self, block: int, layer: int, k: Bytes, v: Bytes) -> None:
        if block < 0 or not 0 <= layer < self.geometry.layers:
            raise ValueError(f"block {block} layer {layer} outside the geometry")
        sections = self._sections(k, v)
        with self._lock:
            self._staged[block, layer] = sections

    def import_block(self, block: int, container: Container) -> None:
        """A raw container's data viewed as one ``[layers, K/V, tokens, kv_heads, dim]`` tensor (no copy); the
        prefill copies it into the cache in one ``copy_`` instead of two per layer (docs/engine.md)."""
        g = self.geometry
        check_block(g, container)
        if block < 0:
            raise ValueError(f"block {block} outside the geometry")
        tensor = container_tensor(container, g.kv_dtype, g.kv_heads, g.head_dim)
        with self._lock:
            self._whole[block] = tensor

    def sampler_state(self) -> Sampler:
        return self._sampler.state

    def restore_sampler(self, state: Sampler) -> None:
        self._sampler = SamplerState(state)

    # -- internals -----------------------------------------------------------------------------
    def _check_tokens(self, tokens: Sequence[int]) -> None:
        if not tokens:
            raise ValueError("prefill needs at least one token")
        vocab = self.geometry.vocab_size
        if min(tokens) < 0 or max(tokens) >= vocab:
            raise ValueError(f"token ids must be in 0..{vocab - 1}")

    def _sections(self, k: Bytes, v: Bytes) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.geometry
        try:
            return (section_view(k, g.kv_dtype, g.kv_heads, g.head_dim, g.block_tokens),
                    section_view(v, g.kv_dtype, g.kv_heads, g.head_dim, g.block_tokens))
        except ValueError as exc:
            raise ValueError(f"a section of one block and layer is {g.section_octets} octets: {exc}") from exc

    def _take_staged(self, block: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        with self._lock:
            sections = self._staged.get((block, layer))
            whole = self._whole.get(block)
        if sections is None and whole is not None:
            sections = whole[layer, 0], whole[layer, 1]
        if sections is None:
            raise ValueError(f"block {block} layer {layer} was not imported before wait_layer({layer}) returned")
        return sections

    def _allocate(self, tokens: int) -> tuple[torch.Tensor, CacheOctets | None]:
        """An uninitialised cache, and the octet views of its sections when it is in host memory.

        Not zeroed: every row below the context length is written (copied prefix, computed or decoded
        tokens) before attention or `export_kv` reads it, and zeroing a long context's cache costs as much
        as copying the whole prefix into it (measured: benchmarks/bench_engine.py, import case)."""
        g = self._model.geometry
        cache = torch.empty((2, g.layers, max(tokens, 1), g.kv_heads, g.head_dim), dtype=torch_dtype(g.kv_dtype),
                            device=self._model.device)
        return cache, CacheOctets(cache) if cache.device.type == "cpu" else None

    def _run(self, tokens: Sequence[int], prefix_blocks: int, prefix: _PrefixSource,
             wait_layer: WaitLayer | None, on_layer: OnLayer | None, *, whole: dict[int, torch.Tensor]) -> Step:
        g, chunk = self.geometry, self._model.chunk_tokens
        # Room for a block of decoding before the first doubling.
        self._kv, self._octets = self._allocate(len(tokens) + g.block_tokens)
        self._length, self._ready_layers, self._pending = len(tokens), 0, None
        start = prefix_blocks * g.block_tokens
        if chunk is not None:  # computed chunks start where they would in a full recompute
            start -= start % chunk
        if start >= len(tokens):  # the last token's logits need its hidden state
            start = len(tokens) - 1 if chunk is None else (len(tokens) - 1) // chunk * chunk
        copied = min(prefix_blocks, -(-start // g.block_tokens))
        try:
            bulk = self._copy_whole({block: t for block, t in whole.items() if block < copied})
            logits = self._forward(tokens[start:], start, _Plan(copied, prefix, wait_layer, on_layer, bulk))
        except BaseException:
            self._length, self._ready_layers = 0, g.layers
            raise
        finally:
            with self._lock:
                self._staged.clear()
                self._whole.clear()
        self.loaded_tokens, self.recomputed_tokens = start, len(tokens) - start
        return self._sample(logits)

    def _forward(self, tokens: Sequence[int], start: int, plan: _Plan) -> np.ndarray[Any, np.dtype[np.float32]]:
        """Compute positions start.. of the context layer by layer (chunk by chunk); the last one's logits."""
        model, wait_layer, on_layer = self._model, plan.wait_layer, plan.on_layer
        inner, end = model.module.model, start + len(tokens)
        with torch.inference_mode():
            ids = torch.tensor([list(tokens)], dtype=torch.long, device=model.device)
            positions = torch.arange(start, end, device=model.device).unsqueeze(0)
            hidden = inner.embed_tokens(ids)
            cos, sin = inner.rotary_emb(hidden, position_ids=positions)
            chunks = [(a, b, self._mask(a, b, hidden.dtype), _CacheView(self, a, b))
                      for a, b in self._chunks(start, end)]
            for layer, decoder in enumerate(inner.layers):
                if wait_layer is not None:
                    wait_layer(layer)
                self._load_layer(layer, plan)
                outputs = []
                for a, b, mask, cache in chunks:
                    i, j = a - start, b - start
                    out = decoder(hidden[:, i:j], attention_mask=mask, position_ids=positions[:, i:j], cache=cache,
                                  use_cache=True, position_embeddings=(cos[:, i:j], sin[:, i:j]))
                    outputs.append(out[0] if isinstance(out, tuple) else out)
                hidden = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
                self._ready_layers = max(self._ready_layers, layer + 1)
                if on_layer is not None:
                    if self._kv.device.type != "cpu":
                        torch.cuda.current_stream(self._kv.device).synchronize()  # exported views must be final
                    on_layer(layer)
            logits = model.module.lm_head(inner.norm(hidden[:, -1:]))
            result: np.ndarray[Any, np.dtype[np.float32]] = logits[0, -1].float().cpu().numpy()
        return result

    def _copy_whole(self, whole: dict[int, torch.Tensor]) -> frozenset[int]:
        """Copy whole staged blocks into the cache, every layer and K and V of a block in one ``copy_``."""
        b, kv = self.geometry.block_tokens, self._kv
        for block, tensor in whole.items():
            kv[:, :, block * b : (block + 1) * b].copy_(tensor.transpose(0, 1))
        return frozenset(whole)

    def _load_layer(self, layer: int, plan: _Plan) -> None:
        """Copy layer ``layer`` of the prefix blocks into the cache: the one copy of the received octets."""
        todo = [block for block in range(plan.prefix_blocks) if block not in plan.bulk]
        if not todo:
            return
        g, kv = self.geometry, self._kv
        sections = [plan.prefix(block, layer) for block in todo]
        first, end = todo[0] * g.block_tokens, (todo[-1] + 1) * g.block_tokens
        if kv.device.type == "cpu" and len(todo) == todo[-1] - todo[0] + 1:  # contiguous rows: one cat per K and V
            torch.cat([k for k, _ in sections], out=kv[0, layer, first:end])
            torch.cat([v for _, v in sections], out=kv[1, layer, first:end])
            return
        for block, (k, v) in zip(todo, sections, strict=True):  # host to device (or gaps), block by block
            rows = slice(block * g.block_tokens, (block + 1) * g.block_tokens)
            copy_section(kv[0, layer, rows], k, g.kv_dtype)
            copy_section(kv[1, layer, rows], v, g.kv_dtype)

    def _chunks(self, start: int, end: int) -> list[tuple[int, int]]:
        """[start, end) in one piece, or cut at the multiples of the model's chunk_tokens."""
        chunk = self._model.chunk_tokens
        if chunk is None:
            return [(start, end)]
        cuts = [start, *range(start - start % chunk + chunk, end, chunk), end]
        return list(itertools.pairwise(cuts))

    def _mask(self, start: int, end: int, dtype: torch.dtype) -> torch.Tensor | None:
        """Causal mask of positions start..end-1 over keys 0..end-1 (None: one query sees every key)."""
        if end - start == 1:
            return None
        device = self._model.device
        allowed = (torch.arange(start, end, device=device).unsqueeze(1)
                   >= torch.arange(end, device=device).unsqueeze(0))[None, None]
        if self._model.module.config._attn_implementation == "sdpa":
            return allowed
        return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)

    def _sample(self, logits: np.ndarray[Any, np.dtype[np.float32]]) -> Step:
        token = self._sampler.sample(logits)
        self._pending = token
        return Step(token, logits)


def _conforms(engine: HfEngine) -> LayerwiseEngine:
    """Static check (mypy): the engine implements the whole `LayerwiseEngine` protocol."""
    return engine


def _imports_blocks(engine: HfEngine) -> BlockImporter:
    """Static check (mypy): and `BlockImporter`."""
    return engine


def _exports_blocks(engine: HfEngine) -> BlockExporter:
    """Static check (mypy): and `BlockExporter`."""
    return engine
