"""vLLM's paged KV cache, one layer, as K and V views ``[num_blocks, kv_heads, block_size, head_dim]``.

A KVSP section is ``[tokens, kv_heads, head_dim]`` (kvsp-layout-1).  A vLLM block of the CPU backend is
head-major, ``[kv_heads, block_size, 2 * head_dim]`` as vLLM declares it, but the interior of each head is
the attention kernel's: for the ``vec`` kernel (x86 without AMX, the fp32 path) the head's K half is
dim-major (``[head_dim, block_size]``) and its V half token-major (``[block_size, head_dim]``), measured
against the HF engine's KV (tests/test_vllm.py, cross-engine test).  Kernels whose interior is not
verified (``amx``, ``neon``, ...) are refused: a wrong interior would give blocks that only vLLM can read
under a compat_id the HF engine shares.  Copies go block by block, each one strided ``copy_`` (the one
copy of decision D5), never through a temporary.
Layouts: vLLM's CPU backend ``[B, H, N, 2D]`` and the flash layout ``[2, B, N, H, D]``.
"""

from __future__ import annotations

import torch


class LayoutError(ValueError):
    """The paged cache has a layout this connector does not know."""


CPU_KERNELS = frozenset({"vec"})  # CPU attention kernels whose block interior is known (see above)


class PagedLayer:
    """K and V views ``[num_blocks, kv_heads, block_size, head_dim]`` of one layer's paged cache.

    ``cpu_kernel``: the CPU attention kernel (vLLM's ``_get_attn_isa``), needed for the CPU layout.
    """

    def __init__(self, cache: torch.Tensor, kv_heads: int, head_dim: int, block_size: int,
                 cpu_kernel: str | None = None) -> None:
        shape = tuple(cache.shape)
        if len(shape) == 4 and shape[1:] == (kv_heads, block_size, 2 * head_dim):
            if cpu_kernel not in CPU_KERNELS:
                raise LayoutError(f"vLLM's CPU attention kernel {cpu_kernel!r} keeps a block interior this "
                                  f"connector does not know (known: {sorted(CPU_KERNELS)})")
            halves = cache.view(shape[0], kv_heads, 2, block_size * head_dim)
            self.k = halves[:, :, 0].view(shape[0], kv_heads, head_dim, block_size).transpose(-1, -2)
            self.v = halves[:, :, 1].view(shape[0], kv_heads, block_size, head_dim)
        elif len(shape) == 5 and shape[0] == 2 and shape[2:] == (block_size, kv_heads, head_dim):
            self.k, self.v = cache[0].permute(0, 2, 1, 3), cache[1].permute(0, 2, 1, 3)
        else:
            raise LayoutError(f"paged KV cache of shape {list(shape)} is neither [B, {kv_heads}, {block_size}, "
                              f"{2 * head_dim}] nor [2, B, {block_size}, {kv_heads}, {head_dim}]")
        self.block_size = block_size
        self.cache = cache

    def write(self, block_ids: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Copy ``[len(block_ids) * block_size, H, D]`` K and V rows into those vLLM blocks."""
        n = self.block_size
        for i, block in enumerate(block_ids):
            self.k[block].copy_(k[i * n:(i + 1) * n].transpose(0, 1), non_blocking=True)
            self.v[block].copy_(v[i * n:(i + 1) * n].transpose(0, 1), non_blocking=True)

    def read(self, block_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V rows of those vLLM blocks as contiguous host tensors ``[tokens, H, D]``."""
        n = self.block_size
        heads, dim = self.k.shape[1], self.k.shape[3]
        k = torch.empty((len(block_ids) * n, heads, dim), dtype=self.k.dtype)
        v = torch.empty_like(k)
        for i, block in enumerate(block_ids):
            k[i * n:(i + 1) * n].copy_(self.k[block].transpose(0, 1))
            v[i * n:(i + 1) * n].copy_(self.v[block].transpose(0, 1))
        return k, v
