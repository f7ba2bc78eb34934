"""transformers ``DynamicCache`` <-> KVSP blocks, layer by layer (decision D6).

For code that runs a transformers model itself (``model(..., cache=...)``, ``generate``) rather than
through `kvsp.hf.engine.HfEngine`: `blocks_to_dynamic_cache` turns loaded blocks into the cache a model
continues from, and `dynamic_cache_to_blocks` turns a model's cache into blocks to publish.

A ``DynamicCache`` layer holds ``[batch, kv_heads, tokens, head_dim]``; a KVSP section is
``[tokens, kv_heads, head_dim]`` (kvsp-layout-1).  Converting one into the other is a transpose, so each
direction costs one copy per layer (the concatenation of the blocks, or the contiguous transposed copy),
with the dtype conversion folded into it.  Batch size is 1: a KVSP context is one sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvsp.engine import BlockKv, EngineGeometry, LayerKv
from kvsp.tensors import section_octets, section_view, torch_dtype


def blocks_to_dynamic_cache(blocks: Sequence[BlockKv], geometry: EngineGeometry, *, config: Any = None,
                            dtype: torch.dtype | None = None, device: str | torch.device = "cpu") -> Any:
    """A ``DynamicCache`` holding the leading ``blocks`` (every layer of each), in ``dtype`` (default: kv_dtype)."""
    from transformers import DynamicCache  # noqa: PLC0415

    g = geometry
    target = dtype or torch_dtype(g.kv_dtype)
    per_layer: list[tuple[torch.Tensor, torch.Tensor]] = []
    for layer in range(g.layers):
        ks, vs = [], []
        for block, layers in enumerate(blocks):
            lk = next((lk for lk in layers if lk.layer == layer), None)
            if lk is None:
                raise ValueError(f"block {block} lacks layer {layer}")
            ks.append(section_view(lk.k, g.kv_dtype, g.kv_heads, g.head_dim, g.block_tokens))
            vs.append(section_view(lk.v, g.kv_dtype, g.kv_heads, g.head_dim, g.block_tokens))
        per_layer.append((_to_hf(ks, target, device), _to_hf(vs, target, device)))
    return DynamicCache(per_layer, config=config)


def _to_hf(sections: list[torch.Tensor], dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """[tokens, heads, dim] sections -> one [1, heads, tokens, dim] tensor (one copy)."""
    return torch.cat(sections).to(device=device, dtype=dtype).transpose(0, 1).unsqueeze(0).contiguous()


def dynamic_cache_to_blocks(cache: Any, geometry: EngineGeometry) -> list[list[LayerKv]]:
    """The complete blocks of a ``DynamicCache`` (batch 1) as KVSP layer sections in the geometry's kv_dtype."""
    g = geometry
    layers = cache.layers
    if len(layers) != g.layers:
        raise ValueError(f"the cache has {len(layers)} layers, the geometry {g.layers}")
    dtype = torch_dtype(g.kv_dtype)
    sections: list[tuple[torch.Tensor, torch.Tensor]] = []
    for layer in layers:
        keys, values = layer.keys, layer.values
        if keys.dim() != 4 or keys.shape[0] != 1 or tuple(keys.shape[1::2]) != (g.kv_heads, g.head_dim):
            raise ValueError(f"a cache layer is [1, {g.kv_heads}, tokens, {g.head_dim}], not {list(keys.shape)}")
        sections.append((_from_hf(keys, dtype), _from_hf(values, dtype)))
    complete = sections[0][0].shape[0] // g.block_tokens
    out = []
    for block in range(complete):
        rows = slice(block * g.block_tokens, (block + 1) * g.block_tokens)
        out.append([LayerKv(layer, section_octets(k[rows]), section_octets(v[rows]))
                    for layer, (k, v) in enumerate(sections)])
    return out


def _from_hf(states: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[1, heads, tokens, dim] -> contiguous host [tokens, heads, dim] in ``dtype`` (one copy)."""
    return states[0].transpose(0, 1).to(device="cpu", dtype=dtype).contiguous()
