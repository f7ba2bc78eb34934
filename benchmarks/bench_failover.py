"""Failover and prefetch overlap, measured between real processes on loopback.

Each system is ``kvsp serve pc,is``, two ``kvsp serve instance,holder`` processes and a cache holder
(``kvsp serve holder``) with mutual TLS, started from TOML files written here, plus a front end that
follows its session across instances (the harness of the system tests, control/deploy/system.py).
The engine is the DeterministicTestEngine; it computes in microseconds, so it is given an artificial
cost per token (``[instance] test_prefill_us_per_token`` / ``test_decode_us_per_token``).

Cases:

- ``failover_ttl_{N}ms``: SIGKILL of the instance generating a greedy session (20 ms per decoded
  token) to the first token of the resumed session at the front end, for status ttl N.  The baseline
  is the ttl itself: the PC notices a failure only when the status expires, i.e. between 2/3 ttl
  (statuses go every ttl/3) and 1 ttl after the kill, then resumes (lookup and loading of the prompt
  blocks from the cache holder, recompute of the rest, the first decode).  Goal: ratio <= 1.2.
- ``ttft_*``: time from ``POST requests`` to the first token at the front end for a 1029-token prompt
  (16 blocks of 64 tokens, 256 KiB each, and a tail) at 500 us per prefilled token:
  ``recompute`` (nothing cached), ``on_demand`` (blocks at the cache holder; the instances report no
  links, so the PC sends no directive and the instance fetches them itself when the session starts),
  ``directive`` (the instances report their links: the PC sends a prefetch directive with the start,
  and the start waits for it), ``prefetched`` (the blocks were loaded into the chosen instance
  before the request: it only reads its own tiers).  The baseline is ``recompute``.  Goal: loading
  beats recomputing (ratio >= 1 with higher-is-better).
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.timing import Sample, case
from control.deploy.fixtures import SCOPE, SCOPE_KEY
from control.deploy.system import FrontEnd, Output, Settings, System, running_system
from kvsp.client.holder import HolderClient
from kvsp.client.index import IndexClient
from kvsp.container import encode_container
from kvsp.descriptor import CompatDescriptor
from kvsp.engine import DeterministicTestEngine, greedy_sampler
from kvsp.keys import block_keys
from kvsp.records import LookupRequest
from kvsp.registry import Codec

KILL_AT = 20  # tokens delivered before the SIGKILL
DECODE_US = 20_000
PREFILL_US = 500
MODEL = CompatDescriptor(model="bench-failover", model_digest=bytes(range(32)), tokenizer_digest=bytes(32), layers=4,
                         kv_heads=4, head_dim=64, kv_dtype="fp16", positional="rope", block_tokens=64)
PROMPT_BLOCKS = 16
PROMPT_TAIL = 5
LINK_MBIT_PER_S = 200.0


def _sample(values: Sequence[float]) -> Sample:
    return Sample.of(values)


# -- failover time vs status ttl --------------------------------------------------------------------
async def _one_failover(system: System, prompt: Sequence[int]) -> float:
    """Seconds from SIGKILL of the session's instance to the first resumed token at the front end."""
    fe = FrontEnd(system, stall_s=0.2, poll_s=0.02)
    info = await fe.generate(prompt, KILL_AT * 2, greedy_sampler())
    owner = system.name_of(info.instance)
    assert owner is not None
    killed: list[float] = []

    async def kill(out: Output) -> None:
        if len(out.delivered) == KILL_AT and not killed:
            killed.append(system.signal(owner, signal.SIGKILL))

    out = await fe.receive(info, timeout_s=60, on_token=kill)
    first = out.first_delivery_after(killed[0])
    assert first is not None and out.end is not None and out.end.epoch == 2
    await system.restart(owner)  # a new incarnation, for the next repetition
    return first - killed[0]


async def _failover_cases(ttls: Sequence[int], reps: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for ttl in ttls:
        settings = Settings(instance={"status_ttl_ms": ttl, "test_decode_us_per_token": DECODE_US,
                                      "test_prefill_us_per_token": PREFILL_US // 10})
        with tempfile.TemporaryDirectory(prefix="kvsp-bench-failover-") as tmp:
            async with running_system(Path(tmp), settings) as system:
                times = [await _one_failover(system, tuple(range(1000 + 100 * r, 1010 + 100 * r)))
                         for r in range(reps)]
        rows.append(case(f"failover_ttl_{ttl}ms", _sample(times), Sample(ttl / 1000, ttl / 1000, ttl / 1000, 1),
                         "SIGKILL to first resumed token <= 1.2 x status ttl (ratio <= 1.2)", goal_max_ratio=1.2))
    return rows


# -- time to first token: cached blocks vs recompute -----------------------------------------------
def _prompt(seed: int) -> tuple[int, ...]:
    n = PROMPT_BLOCKS * MODEL.block_tokens + PROMPT_TAIL
    return tuple((seed * 7919 + i * 31) % 50_000 for i in range(n))


async def _cache_at_holder(system: System, prompt: Sequence[int]) -> None:
    """The front end stores the prompt's blocks at the cache holder and waits until they are published."""
    geometry = system.geometry
    engine = DeterministicTestEngine(geometry)
    keys = block_keys(SCOPE_KEY, MODEL.compat_id, MODEL.block_tokens, prompt)
    async with system.pki.session("fe") as session:
        holder = HolderClient(session)
        for i, key in enumerate(keys):
            kv = engine.reference_kv(prompt, i)
            body = encode_container(Codec.RAW, 0, MODEL.block_tokens, [(lk.k, lk.v) for lk in kv],
                                    geometry=MODEL.geometry())
            await holder.put_block(system.uri("h1"), MODEL.compat_id, SCOPE, key, body)
        index = IndexClient(session, system.uri("pc"))
        request = LookupRequest(SCOPE, MODEL.compat_id, tuple(keys))

        async def published() -> bool:
            return len((await index.lookup(request)).replicas) == len(keys)
        await system.wait_for(published, "the blocks in the index")


async def _ttft(system: System, prompt: Sequence[int]) -> float:
    fe = FrontEnd(system)
    start = time.monotonic()  # the clock FrontEnd stamps deliveries with
    info = await fe.generate(prompt, 1, greedy_sampler())
    out = await fe.receive(info, timeout_s=60)
    assert out.tokens, "no token"
    return out.delivered_at[0] - start


async def _ttft_cases(reps: int) -> tuple[list[dict[str, object]], dict[str, object]]:
    timings: dict[str, list[float]] = {"recompute": [], "on_demand": [], "directive": [], "prefetched": []}
    states: list[str] = []
    common = {"test_prefill_us_per_token": PREFILL_US, "prefetch_concurrency": 4}
    with tempfile.TemporaryDirectory(prefix="kvsp-bench-ttft-") as tmp:
        # Instances that report links: the PC prices loading and sends directives.
        async with running_system(Path(tmp) / "links", Settings(instance=dict(common), model=MODEL,
                                                                link_mbit_per_s=LINK_MBIT_PER_S)) as system:
            for r in range(reps):
                timings["recompute"].append(await _ttft(system, _prompt(100 + r)))
                prompt = _prompt(200 + r)
                await _cache_at_holder(system, prompt)
                timings["directive"].append(await _ttft(system, prompt))
                timings["prefetched"].append(await _ttft(system, prompt))  # now resident where it ran
            metrics = await system.metrics("ii1"), await system.metrics("ii2")
            for state in ("complete", "partial", "failed"):
                n = sum(m.get(f'kvsp_instance_prefetches_total{{state="{state}"}}', 0.0) for m in metrics)
                states += [state] * int(n)
        # Instances that report no links: no directive; the start fetches what the IS lists.
        async with running_system(Path(tmp) / "nolinks", Settings(instance={**common, "links": []}, model=MODEL)) \
                as system:
            for r in range(reps):
                prompt = _prompt(300 + r)
                await _cache_at_holder(system, prompt)
                timings["on_demand"].append(await _ttft(system, prompt))
    base = _sample(timings["recompute"])
    rows = [case(f"ttft_{name}", _sample(values), None if name == "recompute" else base,
                 "time to first token; loading beats recomputing (ratio >= 1)", higher_is_better=True,
                 goal_min_ratio=None if name == "recompute" else 1.0)
            for name, values in timings.items()]
    return rows, {"directive_states": states}


def run(quick: bool = False) -> dict[str, object]:
    ttls = (1000,) if quick else (1000, 2000, 4000)
    reps = 1 if quick else 3

    async def main() -> tuple[list[dict[str, object]], dict[str, object]]:
        failover = await _failover_cases(ttls, reps)
        ttft, extra = await _ttft_cases(reps)
        return failover + ttft, extra

    rows, extra = asyncio.run(main())
    block_octets = MODEL.layers * 2 * MODEL.block_tokens * MODEL.kv_heads * MODEL.head_dim * 2
    params: dict[str, object] = {
        "status_ttls_ms": list(ttls), "reps": reps, "decode_us_per_token": DECODE_US,
        "prefill_us_per_token": PREFILL_US, "prompt_tokens": PROMPT_BLOCKS * MODEL.block_tokens + PROMPT_TAIL,
        "block_tokens": MODEL.block_tokens, "block_octets": block_octets, "link_mbit_per_s": LINK_MBIT_PER_S,
        "status_check_interval_ms": 50, **extra}
    assert all(math.isfinite(float(r["value"]["median_s"])) for r in rows)  # type: ignore[index]
    return {"name": "failover", "params": params, "cases": rows}


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
