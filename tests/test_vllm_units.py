"""The parts of kvsp.vllm that need no vLLM: the paged-cache copies and the counters shared across processes.

(The connector itself runs against real vLLM in tests/test_vllm.py.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from control.deploy.pki import DevPki
from kvsp.container import Geometry
from kvsp.vllm import runtime as rt
from kvsp.vllm.config import load_config
from kvsp.vllm.paged import LayoutError, PagedLayer

H, D, N = 4, 64, 32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_the_host_copies_move_the_same_octets_as_torch(dtype: torch.dtype) -> None:
    """numpy copyto over integer views (the fast path) writes exactly what strided Tensor.copy_ writes."""
    fast_cache = torch.randn(8, H, N, 2 * D).to(dtype)
    slow_cache = fast_cache.clone()
    fast = PagedLayer(fast_cache, H, D, N, cpu_kernel="vec")
    slow = PagedLayer(slow_cache, H, D, N, cpu_kernel="vec")
    slow._np = None  # the torch path
    k, v = torch.randn(2 * N, H, D).to(dtype), torch.randn(2 * N, H, D).to(dtype)
    fast.write([5, 2], k, v)
    slow.write([5, 2], k, v)
    assert torch.equal(fast_cache, slow_cache)
    back_k, back_v = fast.read([5, 2])
    assert torch.equal(back_k, k) and torch.equal(back_v, v)
    # the vec kernel's interior: K dim-major, V token-major, per head
    halves = fast_cache.view(8, H, 2, N * D)
    assert torch.equal(halves[5, 1, 0].view(D, N), k[:N, 1].T)
    assert torch.equal(halves[2, 3, 1].view(N, D), v[N:, 3])


def test_an_unknown_cpu_kernel_is_refused() -> None:
    with pytest.raises(LayoutError, match="amx"):
        PagedLayer(torch.zeros(2, H, N, 2 * D), H, D, N, cpu_kernel="amx")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    pki = DevPki.make(tmp_path, ["va"])
    (tmp_path / "a.key").write_text("11" * 32)
    path = tmp_path / "va.toml"
    path.write_text('index = "https://127.0.0.1:1/is/"\nblock_tokens = 32\nmetrics_listen = "127.0.0.1:1"\n'
                    f'[tls]\ncert = "{pki.dir}/va.pem"\nkey = "{pki.dir}/va.key"\nca = "{pki.dir}/ca.pem"\n'
                    '[scopes.a]\nkey_file = "a.key"\n')
    return path


def test_a_worker_process_hands_its_counters_to_the_scheduler_endpoint(config: Path) -> None:
    """Under `vllm serve` the worker's runtime is another process: its counters reach the scheduler's
    endpoint through a file written on every change, not with vLLM's next step."""
    cfg = load_config(config)
    folder = rt.shared_counters_dir(cfg)
    assert folder is not None and folder == rt.shared_counters_dir(load_config(config))  # same for both sides
    geometry = Geometry.for_dtype(2, 32, "fp32", 4)
    worker, scheduler = rt.Runtime(cfg, geometry), rt.Runtime(cfg, geometry)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for f in folder.glob("*.json"):
            f.unlink()
        (folder / "999999999.json").write_text(json.dumps({"stored_blocks": 50}))  # a dead earlier server
        rt._forget_dead(folder)
        assert not (folder / "999999999.json").exists()
        worker.roles.add("worker")
        scheduler.roles.add("scheduler")
        scheduler.add(lookups=1, hit_tokens=64)
        worker.add(loaded_tokens=64, stored_blocks=2)
        assert json.loads((folder / f"{os.getpid()}.json").read_text())["stored_blocks"] == 2
        total = scheduler.counters()
        assert (total["lookups"], total["hit_tokens"], total["loaded_tokens"], total["stored_blocks"]) == (1, 64, 64, 2)
        text = "\n".join(f"{m.name} {m.samples[0].value}" for m in scheduler.registry.collect())
        assert "kvsp_vllm_stored_blocks 2" in text
        both = rt.Runtime(cfg, geometry)  # both sides in one process share one runtime: no file
        both.roles.update({"worker", "scheduler"})
        (folder / f"{os.getpid()}.json").unlink()
        both.add(stored_blocks=1)
        assert not list(folder.glob("*.json"))
        both.close()
    finally:
        worker.close()
        scheduler.close()
