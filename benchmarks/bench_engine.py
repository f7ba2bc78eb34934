"""Time to first token with a cached prefix vs recompute, on the transformers engine (kvsp.hf.engine).

Models (seeded random weights, built in memory; see kvsp.hf.refmodel):

* ``small``: the reference model's default shape (4 layers, hidden 256, 8 heads, 2 KV heads), fp32;
* ``1b``: shaped like a 1B-class Llama (hidden 2048, 16 layers, 32 heads, 8 KV heads, head_dim 64,
  intermediate 8192; vocabulary 32000, which only sizes the last token's lm_head), bf16.  ``--quick``
  keeps 4 of its 16 layers: the ratio cached/recompute is per layer, so it barely depends on the count.

Cases (B = 16 tokens per block; a 2048-token prompt whose first 1920 tokens are cached, 128 new):

* ``ttft recompute``: prefill of the whole prompt (the baseline of the rows below);
* ``ttft cached, host``: the prefix's containers are already in host memory: import (views) + prefill;
* ``ttft cached, link, serial``: the containers arrive over a simulated link (RTT 100 us, 25 Gbit/s,
  layers in ascending order as section 4.3 sends them); the prefill starts when everything has arrived;
* ``ttft cached, link, overlap``: the same link, `prefill_layerwise`: layer l is computed as soon as it
  has arrived, while later layers are still on the wire.
  Goal on the 1b shape: cached <= 0.3x recompute.  The four runs are timed in turn, one repetition each
  per round, so that load from elsewhere on the machine hits them alike.  The link is simulated by
  sleeping until each layer's arrival time (RTT + its octets at the link rate); the imports, copies and
  compute are real.

* ``crossover`` (small model): recompute(n + 16) against loading n cached tokens (link, serial) and
  computing 16, measured, and as the section 6.4 cost model (kvsp.placement.estimate) predicts it with
  the same link and the prefill rate the instance reports after control/instance/engines.calibrate
  (prompts doubled from 4 blocks towards 2048 tokens within 1 s; the rate of the longest).  The rows also
  give the rate of a 4-block prompt (what calibrate used before) and the 2064-token recompute it would
  predict, against the measured one.  Two sweeps: n = 16..2048 over the 25 Gbit/s link above, and, for n = 512, the link
  rate from 3 Mbit/s to 1 Gbit/s with a 1 ms RTT.  Each row gives the measured and the predicted
  crossover (the first swept value from which loading wins) and every point's times.
* ``import``: a 2048-token cached prefix (128 blocks of the 1b shape's cache: 16 layers, 8 KV heads of 64,
  bf16, 512 KiB per block) staged into an `HfEngine` and prefilled with one more token, per layer
  (`import_kv`, 4096 sections of 16 KiB: what the instance did for whole blocks) against whole blocks
  (`import_block`: one view and one ``copy_`` per block), both against one memcpy of the octets.
* ``tensors``: a 2048-token span of 1b-shaped KV (bf16, 128 blocks of 512 KiB): containers encoded from
  cache tensors into a preallocated buffer (block path: `encode_cache_block_into`, one strided copy per
  block; per-section paths: `encode_into` of `section_octets`/`CacheOctets` views), and decoded into a
  cache (block path: `container_tensor` and one ``copy_``; per layer: `section_view`, `copy_section`),
  each against one memcpy of the same octets (``numpy.copyto`` between preallocated arrays).  Goal
  <= 1.5x for the block paths; the per-section paths (each section viewed and copied on its own, as
  `import_kv` receives them) are reported.  These cases run with one torch thread, like the memcpy: on
  a busy machine a thread pool woken for each 512 KiB copy costs milliseconds.

Everything runs with one torch thread: on a CPU shared with other work, a thread pool that is woken for
every operation stalls on its barriers and turns timings into noise; one thread keeps the cached/recompute
ratios comparable (a GPU run would be the real measurement of the 1b shape).
Run: ``python -m benchmarks --only bench_engine [--quick]`` or ``python -m benchmarks.bench_engine [--quick]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from benchmarks.timing import Sample, case, measure, paired
from control.instance.engines import calibrate
from kvsp.container import Container, Geometry, decode_container, encode_container, encode_into
from kvsp.hf.engine import HfEngine, HfModel
from kvsp.hf.refmodel import ModelShape, build_model
from kvsp.placement import estimate
from kvsp.records import InstanceStatus, Link, ReplicaRecord, Residency
from kvsp.registry import Codec, InstanceState, Tier
from kvsp.tensors import (
    CacheOctets,
    container_tensor,
    copy_section,
    encode_cache_block_into,
    encode_sections,
    layer_tensors,
)

B = 16
PROMPT = 2048
NEW_TOKENS = 128
RTT_US = 100
LINK_MBIT = 25_000.0
HOLDER = "https://holder.example/kvsp/"
SMALL = ModelShape()
ONE_B = ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, vocab=32000, intermediate=8192)
CROSSOVER_NS = (16, 32, 64, 128, 256, 512, 1024, 2048)
CROSSOVER_PREFIX = 512
CROSSOVER_RTT_US = 1_000
CROSSOVER_MBITS = (3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)
TTFT_GOAL = "cached <= 0.3x recompute on the 1b shape"


@dataclass(frozen=True, slots=True)
class SimulatedLink:
    """The simulated link: arrival time of the end of layer l of every block, after the start."""

    rtt_us: float
    mbit_per_s: float

    def arrival_s(self, layer_octets: int, layer: int) -> float:
        return (self.rtt_us + 8 * layer_octets * (layer + 1) / self.mbit_per_s) / 1e6


LINK = SimulatedLink(RTT_US, LINK_MBIT)


def prompt(n: int, vocab: int, seed: int = 0) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def wire(model: HfModel, tokens: Sequence[int], blocks: int) -> list[bytes]:
    """The prefix's containers (all layers of one block each), as a holder would serve them."""
    engine = model.engine()
    engine.prefill(tokens[: blocks * B])
    g = model.geometry
    geometry = Geometry.for_dtype(g.kv_heads, g.head_dim, g.kv_dtype, g.layers)
    return [encode_container(Codec.RAW, 0, B, [(lk.k, lk.v) for lk in engine.export_kv(b, (0, g.layers - 1))],
                             geometry=geometry) for b in range(blocks)]


def _receive(containers: Sequence[bytes]) -> list[Container]:
    """Each received container parsed once (a header parse; its layers are views of the octets)."""
    return [decode_container(data) for data in containers]


def _import_layer(engine: HfEngine, received: Sequence[Container], layer: int) -> None:
    for block, container in enumerate(received):
        view = container.layer(layer)
        engine.import_kv(block, layer, view.k, view.v)


def cached_host(model: HfModel, tokens: Sequence[int], containers: Sequence[bytes]) -> None:
    engine, received = model.engine(), _receive(containers)
    for layer in range(model.geometry.layers):
        _import_layer(engine, received, layer)
    engine.prefill(tokens)


def cached_serial(model: HfModel, tokens: Sequence[int], containers: Sequence[bytes],
                  link: SimulatedLink = LINK) -> None:
    start, engine, received = time.perf_counter(), model.engine(), _receive(containers)
    octets = sum(container.layer(0).nbytes for container in received)
    _sleep_until(start + link.arrival_s(octets, model.geometry.layers - 1))
    for layer in range(model.geometry.layers):
        _import_layer(engine, received, layer)
    engine.prefill(tokens)


def cached_overlap(model: HfModel, tokens: Sequence[int], containers: Sequence[bytes]) -> None:
    start, engine, received = time.perf_counter(), model.engine(), _receive(containers)
    octets = sum(container.layer(0).nbytes for container in received)
    arrived = [threading.Event() for _ in range(model.geometry.layers)]

    def receiver() -> None:
        for layer, event in enumerate(arrived):
            _sleep_until(start + LINK.arrival_s(octets, layer))
            _import_layer(engine, received, layer)
            event.set()

    thread = threading.Thread(target=receiver)
    thread.start()
    try:
        engine.prefill_layerwise(tokens, len(received), lambda layer: _wait(arrived[layer]))
    finally:
        thread.join()


def _wait(event: threading.Event) -> None:
    if not event.wait(60):
        raise TimeoutError("a layer did not arrive")


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


def ttft_cases(name: str, model: HfModel, reps: int) -> list[dict[str, object]]:
    tokens = prompt(PROMPT, model.geometry.vocab_size)
    containers = wire(model, tokens, (PROMPT - NEW_TOKENS) // B)
    variants = {"host": cached_host, "link, serial": cached_serial, "link, overlap": cached_overlap}
    runs = [lambda: model.engine().prefill(tokens),
            *(lambda run=run: run(model, tokens, containers) for run in variants.values())]
    recompute, *cached = round_robin(runs, reps)
    goal = TTFT_GOAL if name.startswith("1b") else "report"
    rows = [case(f"{name} ttft recompute {PROMPT}", recompute, None, "baseline")]
    for label, sample in zip(variants, cached, strict=True):
        rows.append(case(f"{name} ttft cached {PROMPT - NEW_TOKENS}+{NEW_TOKENS}, {label}", sample, recompute, goal,
                         goal_max_ratio=0.3 if goal == TTFT_GOAL else None))
    return rows


def round_robin(runs: Sequence[Callable[[], object]], reps: int, warmup: int = 1) -> list[Sample]:
    """Each run timed once per round, in turn, so that load from elsewhere on the machine hits all alike."""
    times: list[list[float]] = [[] for _ in runs]
    for round_ in range(warmup + reps):
        for index, run in enumerate(runs):
            start = time.perf_counter()
            run()
            if round_ >= warmup:
                times[index].append(time.perf_counter() - start)
    return [Sample.of(t) for t in times]


def _status(prefill_tokens_per_s: float, link: SimulatedLink) -> InstanceStatus:
    return InstanceStatus("https://ii.example/kvsp/", 1, InstanceState.ACTIVE, 0, 0, 1, 0.0, prefill_tokens_per_s,
                          1.0, (Link(HOLDER, link.mbit_per_s, round(link.rtt_us)),), 3_000)


def _replicas(containers: Sequence[bytes], layers: int) -> list[list[ReplicaRecord]]:
    out = []
    for i, data in enumerate(containers):
        key = hashlib.sha256(b"block %d" % i).digest()
        out.append([ReplicaRecord(key, bytes(32), bytes(16), HOLDER, Codec.RAW, len(data), key,
                                  (Residency(Tier.HOST, (0, layers - 1)),), 600_000)])
    return out


def crossover(model: HfModel, reps: int) -> list[dict[str, object]]:
    """Measured vs predicted (section 6.4) crossovers: over the prefix length, and over the link rate."""
    vocab = model.geometry.vocab_size
    calibration = prompt(4 * B, vocab, 1)
    short_rate = 4 * B / measure(lambda: model.engine().prefill(calibration), reps=reps, warmup=1).median_s
    rate = statistics.median(calibrate(model.engine, B)[0] for _ in range(3))  # what the instance reports
    by_length = [_point(model, n, LINK, rate, reps) for n in CROSSOVER_NS]
    by_link = [_point(model, CROSSOVER_PREFIX, SimulatedLink(CROSSOVER_RTT_US, mbit), rate, reps)
               for mbit in CROSSOVER_MBITS]
    longest = by_length[-1]
    common = {"calibrated_prefill_tokens_per_s": round(rate), "four_block_prefill_tokens_per_s": round(short_rate),
              f"recompute_{CROSSOVER_NS[-1] + B}_us": {
                  "measured": longest["measured_recompute_us"], "predicted": longest["predicted_recompute_us"],
                  "predicted_with_four_block_rate": round((CROSSOVER_NS[-1] + B) / short_rate * 1e6)},
              "goal": "report: does the section 6.4 cost model predict the measured crossover?"}
    return [
        {"case": "small crossover over cached tokens (n cached + 16 new; loading wins from n =)", "unit": "tokens",
         "value": _first_win(by_length, "measured_loading_wins"),
         "predicted": _first_win(by_length, "predicted_loading_wins"),
         "link": {"rtt_us": LINK.rtt_us, "mbit_per_s": LINK.mbit_per_s}, "points": by_length, **common},
        {"case": f"small crossover over link rate ({CROSSOVER_PREFIX} cached + 16 new; loading wins from)",
         "unit": "Mbit/s", "value": _first_win(by_link, "measured_loading_wins"),
         "predicted": _first_win(by_link, "predicted_loading_wins"), "rtt_us": CROSSOVER_RTT_US,
         "points": by_link, **common},
    ]


def _point(model: HfModel, n: int, link: SimulatedLink, rate: float, reps: int) -> dict[str, object]:
    """Recompute of n + B tokens against loading n over ``link`` and computing B: measured and predicted."""
    tokens = prompt(n + B, model.geometry.vocab_size, n)
    containers = wire(model, tokens, n // B)
    cached, recompute = paired(lambda: cached_serial(model, tokens, containers, link),
                               lambda: model.engine().prefill(tokens), reps=reps)
    predicted = estimate(_status(rate, link), _replicas(containers, model.geometry.layers), prompt_tokens=n + B,
                         block_tokens=B, mean_service_us=0.0)
    return {"cached_tokens": n, "mbit_per_s": link.mbit_per_s,
            "measured_recompute_us": round(recompute.median_s * 1e6),
            "measured_cached_us": round(cached.median_s * 1e6),
            "predicted_recompute_us": round(predicted.recompute_us),
            "predicted_cached_us": round(predicted.fetch_us + predicted.residual_us),
            "measured_loading_wins": cached.median_s < recompute.median_s,
            "predicted_loading_wins": predicted.uses_cache}


def _first_win(points: list[dict[str, object]], key: str) -> object:
    """The first swept value (prefix length or link rate) from which loading wins at every later one (None: never)."""
    swept = "cached_tokens" if len({p["cached_tokens"] for p in points}) > 1 else "mbit_per_s"
    wins = [bool(p[key]) for p in points]
    for i in range(len(wins)):
        if all(wins[i:]):
            return points[i][swept]
    return None


def tensor_cases(reps: int) -> list[dict[str, object]]:
    """Container encode from / decode into a bf16 cache of the 1b shape, against one memcpy."""
    layers, heads, dim, blocks = ONE_B.layers, ONE_B.kv_heads, ONE_B.hidden // ONE_B.heads, PROMPT // B
    cache = torch.randn((2, layers, PROMPT, heads, dim), generator=torch.Generator().manual_seed(0)).bfloat16()
    target = torch.zeros_like(cache)
    geometry = Geometry.for_dtype(heads, dim, "bf16", layers)
    block_octets = 2 * layers * B * heads * dim * 2
    section = b"\0" * (block_octets // layers // 2)
    size = len(encode_container(Codec.RAW, 0, B, [(section, section)] * layers))  # one block's container
    out = bytearray(size * blocks)
    src, dst = np.random.default_rng(0).bytes(block_octets * blocks), np.empty(block_octets * blocks, np.uint8)
    source = np.frombuffer(src, np.uint8)

    def encode_views() -> None:  # a block of the cache in one strided copy (K and V of a layer are not adjacent)
        view = memoryview(out)
        for b in range(blocks):
            encode_cache_block_into(view[b * size :], cache, (0, layers - 1), b * B, B, geometry=geometry)

    def encode_sections_of_views() -> None:  # what HfEngine.export_kv gives on CPU: 2 x layers section views
        octets, view = CacheOctets(cache), memoryview(out)
        for b in range(blocks):
            sections = [(octets.section(0, layer, b * B, B), octets.section(1, layer, b * B, B))
                        for layer in range(layers)]
            encode_into(view[b * size :], Codec.RAW, 0, B, sections, geometry=geometry)

    def encode_tensors() -> None:  # any [tokens, kv_heads, head_dim] tensors, each viewed on its own
        view = memoryview(out)
        for b in range(blocks):
            rows = slice(b * B, (b + 1) * B)
            sections = encode_sections([(cache[0, layer, rows], cache[1, layer, rows]) for layer in range(layers)])
            encode_into(view[b * size :], Codec.RAW, 0, B, sections, geometry=geometry)

    def decode_blocks() -> None:  # one view and one copy per block, as HfEngine.import_block and the prefill do
        for b in range(blocks):
            container = decode_container(memoryview(out)[b * size : (b + 1) * size], geometry=geometry)
            target[:, :, b * B : (b + 1) * B].copy_(container_tensor(container, "bf16", heads, dim).transpose(0, 1))

    def decode_layers() -> None:  # per layer, as import_kv receives it: two views and two copies
        for b in range(blocks):
            rows = slice(b * B, (b + 1) * B)
            for view in decode_container(memoryview(out)[b * size : (b + 1) * size], geometry=geometry).layers:
                k, v = layer_tensors(view.k, view.v, "bf16", heads, dim)
                copy_section(target[0, view.layer, rows], k, "bf16")
                copy_section(target[1, view.layer, rows], v, "bf16")

    memcpy = measure(lambda: np.copyto(dst, source), reps=reps)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like the memcpy; a 512 KiB copy gains nothing from waking a thread pool
    try:
        encode_views()
        expected = bytes(out)  # the one-copy and the section-by-section encodes write the same containers
        out[:] = bytes(len(out))
        encode_sections_of_views()
        if bytes(out) != expected:
            raise AssertionError("the section-by-section and the one-copy encodes differ")
        encoded = _tensor_rows(memcpy, target, cache, blocks, (encode_views, encode_tensors, decode_blocks,
                                                                   decode_layers), reps)
        sections_row = case(f"tensors encode, cache section views (2 x layers copies): {blocks} blocks x 512 KiB",
                            measure(encode_sections_of_views, reps=reps), memcpy, "report")
        return [*encoded, sections_row]
    finally:
        torch.set_num_threads(threads)


IMPORT_SHAPE = ModelShape(layers=ONE_B.layers, hidden=512, heads=ONE_B.kv_heads, kv_heads=ONE_B.kv_heads, vocab=300,
                          intermediate=512)  # the 1b shape's cache (16 layers, 8 x 64, bf16), a small model around it


def import_cases(reps: int) -> list[dict[str, object]]:
    """A 2048-token cached prefix into an HfEngine: per-layer `import_kv` vs whole-block `import_block`."""
    model = HfModel(build_model(IMPORT_SHAPE, dtype=torch.bfloat16), block_tokens=B)
    g, blocks = model.geometry, PROMPT // B
    geometry = Geometry.for_dtype(g.kv_heads, g.head_dim, g.kv_dtype, g.layers)
    rng = np.random.default_rng(1)
    sections = [[(rng.integers(0, 0x3F00, g.section_octets // 2, dtype=np.uint16).tobytes(),
                  rng.integers(0, 0x3F00, g.section_octets // 2, dtype=np.uint16).tobytes())
                 for _ in range(g.layers)] for _ in range(blocks)]
    received = [decode_container(encode_container(Codec.RAW, 0, B, layers, geometry=geometry), geometry=geometry)
                for layers in sections]
    tokens = prompt(PROMPT + 1, g.vocab_size)
    octets = sum(len(c.data) for c in received)
    src, dst = np.random.default_rng(0).bytes(octets), np.empty(octets, np.uint8)
    source = np.frombuffer(src, np.uint8)

    def per_layer() -> HfEngine:
        engine = model.engine()
        for layer in range(g.layers):
            _import_layer(engine, received, layer)
        engine.prefill(tokens)
        return engine

    def whole() -> HfEngine:
        engine = model.engine()
        for block, container in enumerate(received):
            engine.import_block(block, container)
        engine.prefill(tokens)
        return engine

    for engine in (per_layer(), whole()):  # both put exactly the received octets in the cache
        exported = [(b, lk) for b in (0, blocks - 1) for lk in engine.export_kv(b, (0, g.layers - 1))]
        if engine.loaded_tokens != PROMPT or any(bytes(lk.k) != sections[b][lk.layer][0] for b, lk in exported):
            raise AssertionError("the imported cache differs from the containers")
    memcpy = measure(lambda: np.copyto(dst, source), reps=reps)
    layered, blocked = paired(per_layer, whole, reps=reps)
    name = f"import {blocks} blocks x {octets // blocks >> 10} KiB (1b cache shape) + prefill of 1 token"
    return [case(f"{name}, import_kv per layer", layered, memcpy, "report"),
            case(f"{name}, import_block", blocked, memcpy, "report"),
            case(f"{name}: import_block vs import_kv per layer", blocked, layered, "report: < 1 (faster)")]


def _tensor_rows(memcpy: Sample, target: torch.Tensor, cache: torch.Tensor, blocks: int,
                 fns: tuple[Callable[[], None], ...], reps: int) -> list[dict[str, object]]:
    labels = ("encode, cache views", "encode, tensor views", "decode+copy, per block", "decode+copy, per layer")
    rows = []
    for label, fn in zip(labels, fns, strict=True):
        target.zero_()
        goal = label.endswith(("cache views", "per block"))
        rows.append(case(f"tensors {label}: {blocks} blocks x 512 KiB", measure(fn, reps=reps), memcpy,
                         "<= 1.5x one memcpy" if goal else "report", goal_max_ratio=1.5 if goal else None))
        if label.startswith("decode") and not torch.equal(target, cache):
            raise AssertionError(f"{label}: the decoded cache differs from the encoded one")
    return rows


def run(quick: bool) -> dict[str, object]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see the module docstring
    try:
        return _run(quick)
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool) -> dict[str, object]:
    reps = 2 if quick else 5
    small = HfModel(build_model(SMALL), block_tokens=B)
    cases = ttft_cases("small", small, reps)
    cases += crossover(small, 3 if quick else 7)
    one_b_shape = dataclasses.replace(ONE_B, layers=4) if quick else ONE_B
    one_b = HfModel(build_model(one_b_shape, dtype=torch.bfloat16), block_tokens=B)
    cases += ttft_cases("1b" if not quick else "1b (4 of 16 layers)", one_b, 2 if quick else 3)
    del one_b
    cases += tensor_cases(reps)
    cases += import_cases(reps)
    return {"name": "engine", "cases": cases, "torch_threads": torch.get_num_threads()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_engine")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.quick), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
