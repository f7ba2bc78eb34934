"""vLLM's paged KV cache, one layer, as K and V views ``[num_blocks, kv_heads, block_size, head_dim]``.

A KVSP section is ``[tokens, kv_heads, head_dim]`` (kvsp-layout-1).  A vLLM block of the CPU backend is
head-major, ``[kv_heads, block_size, 2 * head_dim]`` as vLLM declares it, but the interior of each head is
the attention kernel's: for the ``vec`` kernel (x86 without AMX, the fp32 path) the head's K half is
dim-major (``[head_dim, block_size]``) and its V half token-major (``[block_size, head_dim]``), measured
against the HF engine's KV (tests/test_vllm.py, cross-engine test).  Kernels whose interior is not
verified (``amx``, ``neon``, ...) are refused: a wrong interior would give blocks that only vLLM can read
under a compat_id the HF engine shares.  Copies go block by block, each one strided copy (the one copy
of decision D5), never through a temporary.  On the host they are numpy ``copyto`` over views of the
same memory, as integers of the element's width (numpy has no bf16; a copy moves octets): a small
strided ``Tensor.copy_`` costs about twice as much (measured: K 12 against 6.7 us, V 5.5 against 2.4 us
for a 32-token block of 4 heads of 64 fp32), most of it per-call overhead, and K's dim-major interior
makes every K copy a transpose.
Layouts: vLLM's CPU backend ``[B, H, N, 2D]`` and the flash layout ``[2, B, N, H, D]``.
"""

from __future__ import annotations

import numpy as np
import torch

# numpy integer dtypes of each element width: copies move octets, whatever the float format
_AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY_NATIVE = frozenset({torch.float32, torch.float16, torch.float64})  # .numpy() directly: cheaper


def host_array(t: torch.Tensor) -> np.ndarray | None:
    """``t``'s memory as a numpy array of same-width integers (a view, no copy), or None off the host."""
    if t.device.type != "cpu":
        return None
    if t.dtype in _NUMPY_NATIVE:
        return t.numpy()
    if t.element_size() not in _AS_INT:
        return None
    return t.view(_AS_INT[t.element_size()]).numpy()


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
        # numpy views of the same K and V (host caches): the fast copies; None on a device
        nk, nv = host_array(self.k.transpose(-1, -2)), host_array(self.v)
        self._np = None if nk is None or nv is None else (np.swapaxes(nk, -1, -2), nv)

    def write(self, block_ids: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Copy ``[len(block_ids) * block_size, H, D]`` K and V rows into those vLLM blocks."""
        n = self.block_size
        sk, sv = (host_array(k), host_array(v)) if self._np is not None else (None, None)
        if self._np is not None and sk is not None and sv is not None and k.dtype == v.dtype == self.k.dtype:
            dk, dv = self._np
            for i, block in enumerate(block_ids):
                np.copyto(dk[block], sk[i * n:(i + 1) * n].swapaxes(0, 1))
                np.copyto(dv[block], sv[i * n:(i + 1) * n].swapaxes(0, 1))
            return
        for i, block in enumerate(block_ids):
            self.k[block].copy_(k[i * n:(i + 1) * n].transpose(0, 1), non_blocking=True)
            self.v[block].copy_(v[i * n:(i + 1) * n].transpose(0, 1), non_blocking=True)

    def read(self, block_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V rows of those vLLM blocks as contiguous host tensors ``[tokens, H, D]``."""
        n = self.block_size
        heads, dim = self.k.shape[1], self.k.shape[3]
        k = torch.empty((len(block_ids) * n, heads, dim), dtype=self.k.dtype)
        v = torch.empty_like(k)
        dk, dv = host_array(k), host_array(v)
        if self._np is not None and dk is not None and dv is not None:
            sk, sv = self._np
            for i, block in enumerate(block_ids):
                np.copyto(dk[i * n:(i + 1) * n], sk[block].swapaxes(0, 1))
                np.copyto(dv[i * n:(i + 1) * n], sv[block].swapaxes(0, 1))
            return k, v
        for i, block in enumerate(block_ids):
            k[i * n:(i + 1) * n].copy_(self.k[block].transpose(0, 1))
            v[i * n:(i + 1) * n].copy_(self.v[block].transpose(0, 1))
        return k, v
