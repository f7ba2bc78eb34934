"""`KvspConnector`: kvsp behind vLLM's KV connector API (``KVConnectorBase_V1``, decision D8).

Scheduler side (vLLM's scheduler loop): Block Keys of the prompt from its scope's key, an IS lookup on
the connector's own loop (the scheduler is answered "not yet" meanwhile), the hit as vLLM's external
tokens, and per step the metadata of loads and stores.  Worker side (the model runner): a verified fetch
per loading request (`kvsp.client.fetch.BlockFetcher`: lease, GET or MOQT FETCH, every layer digest
checked), layers copied into the paged cache as they arrive (`wait_for_layer_load`), and the complete
prompt blocks vLLM computed encoded in kvsp-layout-1 and PUT at the holders (``If-None-Match: *``).

Any failure — lookup error or timeout, holder gone, digest mismatch, a load past its deadline — only
means recompute: failed blocks are reported through ``get_block_ids_with_load_errors`` and vLLM (with
``kv_load_failure_policy = "recompute"``, which the connector sets) computes them again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore[import-not-found]
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats  # type: ignore[import-not-found]
from vllm.model_executor.models.utils import extract_layer_index  # type: ignore[import-not-found]

from kvsp.client.fetch import FetchResult, Outcome
from kvsp.container import Geometry, LayerView, encode_parts
from kvsp.descriptor import CompatDescriptor
from kvsp.hf.descriptor import descriptor_from_model_dir
from kvsp.keys import BlockKeyChain
from kvsp.records import LookupRequest, ReplicaRecord
from kvsp.records.base import uri_scheme
from kvsp.registry import Codec
from kvsp.tensors import kv_dtype_of, section_octets, section_view
from kvsp.vllm.config import CONFIG_KEY, ConnectorConfig, load_config
from kvsp.vllm.paged import PagedLayer
from kvsp.vllm.plan import LoadSpec, RequestState, StepPlan, StoreSpec, external_tokens, loadable_blocks
from kvsp.vllm.runtime import Runtime

log = logging.getLogger("kvsp.vllm")

_RUNTIMES: dict[str, tuple[Runtime, int]] = {}
_RUNTIMES_LOCK = threading.Lock()


def _runtime(path: str, config: ConnectorConfig, geometry: Geometry) -> Runtime:
    """One runtime per process and config: scheduler and worker sides share loop, session and counters."""
    with _RUNTIMES_LOCK:
        runtime, users = _RUNTIMES.get(path, (None, 0))
        if runtime is None:
            runtime = Runtime(config, geometry)
        _RUNTIMES[path] = (runtime, users + 1)
        return runtime


def _release(path: str) -> None:
    with _RUNTIMES_LOCK:
        runtime, users = _RUNTIMES.pop(path, (None, 0))
        if runtime is not None and users > 1:
            _RUNTIMES[path] = (runtime, users - 1)
        elif runtime is not None:
            runtime.close()


def model_descriptor(config: ConnectorConfig, vllm_config: Any) -> CompatDescriptor:
    """The descriptor of vLLM's model files with vLLM's KV dtype and B; a configured one must equal it."""
    model_config = vllm_config.model_config
    cache_dtype = str(vllm_config.cache_config.cache_dtype)
    kv_dtype = config.kv_dtype or (kv_dtype_of(model_config.dtype) if cache_dtype == "auto" else
                                   {"fp8": "fp8-e4m3", "fp8_e4m3": "fp8-e4m3", "fp8_e5m2": "fp8-e5m2",
                                    "bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[cache_dtype])
    directory = config.model_dir or Path(model_config.model)
    found = descriptor_from_model_dir(directory, block_tokens=config.block_tokens, kv_dtype=kv_dtype,
                                      model=config.model)
    if config.descriptor is not None and config.descriptor.compat_id != found.compat_id:
        raise ValueError(f"kvsp: the model in {directory} (KV {kv_dtype}, B={config.block_tokens}) has compat_id "
                         f"{found.compat_id.hex()}, the configured descriptor {config.descriptor.compat_id.hex()}: "
                         "refusing to start")
    return config.descriptor or found


@dataclass(frozen=True, slots=True)
class KvspMetadata(KVConnectorMetadata):  # type: ignore[misc]
    plan: StepPlan = field(default_factory=StepPlan)


class KvspConnectorStats(KVConnectorStats):  # type: ignore[misc]
    """Deltas of `ConnectorStats` for vLLM's stats logger (plain integers: serializable)."""

    def reset(self) -> None:
        self.data = dict[str, Any]()

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name, value in other.data.items():
            self.data[name] = self.data.get(name, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


@dataclass(slots=True)
class _Load:
    """One request's fetch as the worker side follows it; layers land from the runtime's thread."""

    spec: LoadSpec
    deadline: float
    future: concurrent.futures.Future[FetchResult] | None = None
    layers: dict[tuple[int, int], LayerView] = field(default_factory=dict)
    failed_from: int | None = None  # first KVSP block (index in the spec) that is not usable
    cond: threading.Condition = field(default_factory=threading.Condition)

    def on_layer(self, index: int, view: LayerView) -> None:
        with self.cond:
            self.layers[(index, view.layer)] = view
            self.cond.notify_all()

    def done(self, _: object) -> None:
        with self.cond:
            self.cond.notify_all()

    def wait_layer(self, layer: int) -> None:
        n = len(self.spec.replicas)
        with self.cond:
            self.cond.wait_for(lambda: all((j, layer) in self.layers for j in range(n)) or self.finished(),
                               timeout=max(0.0, self.deadline - time.monotonic()))

    def finished(self) -> bool:
        return self.future is None or self.future.done()

    def fail_from(self, index: int) -> None:
        self.failed_from = index if self.failed_from is None else min(self.failed_from, index)


class KvspConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """kvsp as a vLLM KV connector; see the module docstring and docs/vllm.md."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        path = transfer.get_from_extra_config(CONFIG_KEY, None)
        if not path:
            raise ValueError(f"kvsp: kv_connector_extra_config needs {CONFIG_KEY!r} (the connector's TOML file)")
        self._config_path = str(Path(path).resolve())
        self.config = load_config(path)
        self.block_size = int(vllm_config.cache_config.block_size)
        if self.config.block_tokens % self.block_size:
            raise ValueError(f"kvsp: block_tokens {self.config.block_tokens} is not a multiple of vLLM's "
                             f"block size {self.block_size}")
        self.descriptor = model_descriptor(self.config, vllm_config)
        self.compat_id = self.descriptor.compat_id
        d = self.descriptor
        self.geometry = Geometry.for_dtype(d.kv_heads, d.head_dim, d.kv_dtype, d.layers)
        policy = getattr(transfer, "kv_load_failure_policy", "recompute")
        if role == KVConnectorRole.SCHEDULER and policy != "recompute":
            log.warning("kvsp: setting kv_load_failure_policy = 'recompute' (a failed load is recomputed)")
            transfer.kv_load_failure_policy = "recompute"
        self.runtime = _runtime(self._config_path, self.config, self.geometry)
        self._side = "scheduler" if role == KVConnectorRole.SCHEDULER else "worker"
        self.runtime.roles.add(self._side)
        if self._side == "scheduler":
            self.runtime.serve_metrics()
        self._requests: dict[str, RequestState] = {}
        self._lookups: dict[str, concurrent.futures.Future[tuple[tuple[bytes, ...], ...]]] = {}
        self._paged: dict[str, PagedLayer] = {}
        self._layer_of: dict[str, int] = {}
        self._loads: list[_Load] = []
        self._saving: dict[str, tuple[StoreSpec, dict[int, tuple[torch.Tensor, torch.Tensor]]]] = {}
        self._failed_blocks: set[int] = set()
        self._reported: dict[str, int] = {}
        log.info("kvsp connector (%s): compat_id %s, B=%d, IS %s", role, self.compat_id.hex(),
                 self.config.block_tokens, self.config.index)

    # -- scheduler side ----------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        rid = request.request_id
        state = self._requests.get(rid) or self._start(request)
        if state.matched is None:
            future = self._lookups[rid]
            if not future.done():
                return None, False
            self._lookups.pop(rid)
            state.replicas = future.result()
            state.matched = len(state.replicas)
        state.local_tokens = num_computed_tokens
        state.load_sent = False
        state.external = external_tokens(state.matched, state.prompt_tokens, num_computed_tokens,
                                         self.config.block_tokens)
        return state.external, False

    def _start(self, request: Any) -> RequestState:
        rid = request.request_id
        tokens = list(request.prompt_token_ids or ())
        params = getattr(request, "kv_transfer_params", None)
        salt = getattr(request, "cache_salt", None)
        scope = self.config.scope_for(salt, params if isinstance(params, dict) else None)
        state = RequestState(rid, len(tokens), None if scope is None else scope.scope_id)
        self._requests[rid] = state
        if scope is None:
            state.matched = 0
            return state
        state.block_keys = tuple(BlockKeyChain(scope.key, self.compat_id, self.config.block_tokens).extend(tokens))
        wanted = state.block_keys[:loadable_blocks(len(tokens), self.config.block_tokens)]
        if not self.config.load or not wanted:
            state.matched = 0
            return state
        self._lookups[rid] = self.runtime.submit(self._lookup(scope.scope_id, wanted))
        return state

    async def _lookup(self, scope_id: bytes, keys: tuple[bytes, ...]) -> tuple[tuple[bytes, ...], ...]:
        self.runtime.add(lookups=1)
        try:
            async with asyncio.timeout(self.config.lookup_timeout_s):
                answer = await self.runtime.fetcher.index.lookup(LookupRequest(scope_id, self.compat_id, keys))
        except Exception as exc:
            self.runtime.add(lookup_failures=1)
            log.warning("kvsp: lookup failed, recomputing: %r", exc)
            return ()
        return tuple(tuple(r.to_bytes() for r in group) for group in answer.replicas)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        state = self._requests.get(request.request_id)
        if state is not None:
            state.external = num_external_tokens

    def build_connector_meta(self, scheduler_output: Any) -> KvspMetadata:
        loads: list[LoadSpec] = []
        stores: list[StoreSpec] = []
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            state = self._requests.get(new.req_id)
            if state is None:
                continue
            state.block_ids = list(new.block_ids[0])
            state.computed = new.num_computed_tokens
            if (load := state.plan_load(self.compat_id, self.config.block_tokens)) is not None:
                loads.append(load)
                self.runtime.add(hit_tokens=state.external)
            if self.config.store and (store := state.plan_store(self.compat_id, scheduled.get(new.req_id, 0))):
                stores.append(store)
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            state = self._requests.get(rid)
            if state is None:
                continue
            new_ids = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids:
                state.block_ids = list(new_ids[0]) if new_ids else []
                state.computed = cached.num_computed_tokens[i]
            elif new_ids:
                state.block_ids.extend(new_ids[0])
            if self.config.store and (store := state.plan_store(self.compat_id, scheduled.get(rid, 0))):
                stores.append(store)
        return KvspMetadata(StepPlan(tuple(loads), tuple(stores)))

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        state = self._requests.pop(request.request_id, None)
        self._lookups.pop(request.request_id, None)
        if state is None or state.scope_id is None:
            return False, None
        return False, {"kvsp": {"scope_id": state.scope_id.hex(), "matched_blocks": state.matched or 0,
                                "hit_tokens": state.external}}

    # -- worker side -------------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        d = self.descriptor
        kernel = self._cpu_kernel(kv_caches)
        for name, cache in kv_caches.items():
            if kv_dtype_of(cache.dtype) != d.kv_dtype:
                raise ValueError(f"kvsp: vLLM's KV cache is {cache.dtype}, the descriptor says {d.kv_dtype}")
            self._paged[name] = PagedLayer(cache, d.kv_heads, d.head_dim, self.block_size, cpu_kernel=kernel)
            self._layer_of[name] = extract_layer_index(name)
        if sorted(self._layer_of.values()) != list(range(d.layers)):
            raise ValueError(f"kvsp: vLLM has attention layers {sorted(self._layer_of.values())}, "
                             f"the descriptor {d.layers}")

    def _cpu_kernel(self, kv_caches: dict[str, torch.Tensor]) -> str | None:
        """vLLM's CPU attention kernel (it decides a block's interior), None off the CPU backend."""
        if not any(cache.device.type == "cpu" for cache in kv_caches.values()):
            return None
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa  # type: ignore[import-not-found]  # noqa: PLC0415 - CPU only
        config = self._vllm_config
        kernel: str = _get_attn_isa(config.model_config.dtype, self.block_size, self.descriptor.head_dim,
                                    config.cache_config.cache_dtype)
        return kernel

    def _plan(self) -> StepPlan:
        if not self.has_connector_metadata():
            return StepPlan()
        meta = self._get_connector_metadata()
        return meta.plan if isinstance(meta, KvspMetadata) else StepPlan()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._loads = []
        for spec in self._plan().loads:
            load = _Load(spec, time.monotonic() + self.config.load_timeout_s)
            replicas = [[ReplicaRecord.from_bytes(r) for r in group] for group in spec.replicas]
            load.future = self.runtime.submit(self.runtime.fetcher.load(
                spec.scope_id, spec.compat_id, replicas, block_tokens=self.config.block_tokens,
                on_layer=load.on_layer))
            load.future.add_done_callback(load.done)
            self._loads.append(load)

    def wait_for_layer_load(self, layer_name: str) -> None:
        layer = self._layer_of.get(layer_name)
        if layer is None or not self._loads:
            return
        paged = self._paged[layer_name]
        for load in self._loads:
            load.wait_layer(layer)
            self._copy_layer(load, layer, paged)
            if layer == self.descriptor.layers - 1:
                self._finish(load)
        if layer == self.descriptor.layers - 1:
            self._loads = []  # a later step that loads nothing may skip start_load_kv

    def _copy_layer(self, load: _Load, layer: int, paged: PagedLayer) -> None:
        spec, b, d = load.spec, self.config.block_tokens, self.descriptor
        per = b // self.block_size
        with load.cond:
            for j in range(len(spec.replicas)):
                if load.failed_from is not None and j >= load.failed_from:
                    return
                view = load.layers.get((j, layer))
                if view is None:
                    load.fail_from(j)
                    return
                block = spec.first_block + j
                skip = max(0, spec.skip_tokens - block * b) // self.block_size  # vLLM's own blocks stay
                ids = list(spec.block_ids[block * per + skip:(block + 1) * per])
                k = section_view(view.k, d.kv_dtype, d.kv_heads, d.head_dim, b)[skip * self.block_size:]
                v = section_view(view.v, d.kv_dtype, d.kv_heads, d.head_dim, b)[skip * self.block_size:]
                paged.write(ids, k, v)

    def _finish(self, load: _Load) -> None:
        """After the last layer: the fetch's verdict (Repr-Digest and replica digest come at the end)."""
        spec, b = load.spec, self.config.block_tokens
        result: FetchResult | None = None
        try:
            assert load.future is not None
            result = load.future.result(timeout=max(0.0, load.deadline - time.monotonic()))
        except Exception as exc:
            log.warning("kvsp: load of %s failed, recomputing: %r", spec.req_id, exc)
            load.future.cancel() if load.future is not None else None
        n = len(spec.replicas)
        load.fail_from(result.loaded_blocks if result is not None else 0)
        good = min(load.failed_from if load.failed_from is not None else n, n)
        if good < n:
            per = b // self.block_size
            first_token = max(spec.skip_tokens, (spec.first_block + good) * b)
            end_block = (spec.first_block + n) * per
            self._failed_blocks.update(spec.block_ids[first_token // self.block_size:end_block])
            self.runtime.add(load_errors=1)
        start = spec.first_block * b
        loaded = max(0, (spec.first_block + good) * b - max(start, spec.skip_tokens))
        planned = (spec.first_block + n) * b - max(start, spec.skip_tokens)
        used = result.blocks[:good] if result is not None else ()
        self.runtime.add(loaded_tokens=loaded, recomputed_tokens=planned - loaded,
                         bytes_in=sum(blk.block.size for blk in used),
                         blocks_https=sum(uri_scheme(blk.replica.holder) == "https" for blk in used),
                         blocks_moqt=sum(uri_scheme(blk.replica.holder) == "moqt" for blk in used),
                         # from this fetch's own attempts: a mismatch is noted while the layers stream,
                         # before this method runs, so a snapshot of the shared counter here missed it
                         digest_failures=sum(a.outcome is Outcome.DIGEST_MISMATCH for a in result.attempts)
                         if result else 0)

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        layer = self._layer_of.get(layer_name)
        if layer is None:
            return
        per = self.config.block_tokens // self.block_size
        for spec in self._plan().stores:
            _, layers = self._saving.setdefault(spec.req_id, (spec, {}))
            ids = list(spec.block_ids[spec.first_block * per:(spec.first_block + len(spec.block_keys)) * per])
            if len(ids) == len(spec.block_keys) * per:
                layers[layer] = self._paged[layer_name].read(ids)

    def wait_for_save(self) -> None:
        for rid, (spec, layers) in list(self._saving.items()):
            self._saving.pop(rid)
            if len(layers) == self.descriptor.layers:
                future = self.runtime.submit(self._store(spec, [layers[i] for i in range(len(layers))]))
                self.runtime.track(future)

    async def _store(self, spec: StoreSpec, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        b = self.config.block_tokens
        for i, key in enumerate(spec.block_keys):
            sections = [(section_octets(k[i * b:(i + 1) * b]), section_octets(v[i * b:(i + 1) * b]))
                        for k, v in layers]
            parts = encode_parts(Codec.RAW, 0, b, sections, geometry=self.geometry)
            for holder in self.config.store_to:
                try:
                    async with asyncio.timeout(self.config.store_timeout_s):
                        outcome = await self.runtime.holder.put_block(holder, spec.compat_id, spec.scope_id, key,
                                                                      parts)
                except Exception as exc:
                    self.runtime.add(store_errors=1)
                    log.warning("kvsp: storing block %d at %s failed: %r", spec.first_block + i, holder, exc)
                    continue
                if outcome.name == "STORED":
                    self.runtime.add(stored_blocks=1, bytes_out=sum(p.nbytes if isinstance(p, memoryview)
                                                                    else len(p) for p in parts))
                else:
                    self.runtime.add(store_conflicts=1)

    # -- counters ----------------------------------------------------------------------------------
    def get_kv_connector_stats(self) -> KvspConnectorStats | None:
        """This side's counter deltas since the last call.  With both sides in one process the runtime (and
        so its counters) is shared: the worker side reports for both, or vLLM would count everything twice."""
        if self._side == "scheduler" and "worker" in self.runtime.roles:
            return None
        now = self.runtime.stats.as_dict()
        delta = {k: v - self._reported.get(k, 0) for k, v in now.items()}
        self._reported = now
        return KvspConnectorStats(data=delta) if any(delta.values()) else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KvspConnectorStats:
        return KvspConnectorStats(data=dict(data or {}))

    def shutdown(self) -> None:
        self.runtime.drain(timeout=self.config.store_timeout_s)
        _release(self._config_path)
