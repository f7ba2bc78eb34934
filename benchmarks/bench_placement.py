"""Placement decision latency: `Placer.place` (spec section 6.4) vs the lookup-free recompute-only choice.

The PC decides once per request, on the request path, so the decision must stay small next to the
prefill it saves.  Pure core, no HTTP: the inputs are what the PC has after its lookup at the IS.

* instances: 10, 100, 1000 active instances, each reporting a link to every one of 16 holders (rate
  10-400 Gbit/s, RTT 5-200 us: one cluster), a prefill rate of 5k-60k tokens/s and 0-8 queued requests;
* prompt: 4, 64, 512 blocks of B = 16 tokens (plus a tail of 8), every block matched at the IS with
  2 replicas at random holders, 2 MiB each, half in device and half in host memory, some with the
  host half in local storage read at 20 Gbit/s;
* case value: one decision (the candidates' costs, the choice and its directive);
  baseline: the choice a PC without lookup makes, min over instances of wait + recompute of the prompt.

* uniform cases: the same, but every instance idle with one prefill rate, so that no candidate can be
  skipped on its wait and tail recompute alone (the Placer's lower bound): every fetch plan is priced.

The ratio shows what the cache-aware decision costs over the cheapest possible one; each row also
gives ``us_per_decision``.  Goal: < 1 ms per decision at 100 instances x 64 blocks (a 1k-token prompt
at 64k tokens/s takes 16 ms to prefill).

Run: ``python -m benchmarks.bench_placement [--quick]``; prints JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections.abc import Sequence

from benchmarks.timing import Sample, add_check, case, measure
from control.pc.core import Assign, PlacementRequest, Placer, PlacerConfig
from kvsp.placement import recompute_us, wait_us
from kvsp.records import InstanceStatus, Link, LookupResponse, ReplicaRecord, Residency
from kvsp.registry import InstanceState, Tier

SCOPE = bytes.fromhex("6d1c6481cd428737da312c089db3832a")
COMPAT = bytes.fromhex("5ed5c2f238839655d7c4029e12b7f31caf9e7421f4edb4057feee6dab760ee0f")
B = 16
LAYERS = 32
HOLDERS = [f"https://h{i}.example/kvsp/" for i in range(16)]
MEAN_SERVICE_US = 2_000.0
GOAL = "< 1 ms per decision at 100 instances x 64 blocks"


def make_statuses(n: int, rng: random.Random, *, uniform: bool = False) -> list[InstanceStatus]:
    out = []
    for i in range(n):
        links = tuple(Link(h, rng.uniform(10_000, 400_000), rng.randrange(5, 200)) for h in HOLDERS)
        running, queued, kv, prefill = rng.randrange(32), rng.randrange(9), rng.random(), rng.uniform(5_000, 60_000)
        if uniform:
            queued, prefill = 0, 30_000.0
        out.append(InstanceStatus(f"https://ii{i}.example/kvsp/", 1, InstanceState.ACTIVE, running, queued, 32, kv,
                                  prefill, 3_000.0, links, 3_000))
    return out


def make_lookup(blocks: int, rng: random.Random) -> LookupResponse:
    groups = []
    for b in range(blocks):
        key = hashlib.sha256(b"block %d" % b).digest()
        group = []
        for holder in rng.sample(HOLDERS, 2):
            host_tier = Tier.LOCAL_STORAGE if rng.random() < 0.25 else Tier.HOST
            residency = (Residency(Tier.DEVICE, (0, 15)),
                         Residency(host_tier, (16, 31), 20_000.0 if host_tier is Tier.LOCAL_STORAGE else None))
            group.append(ReplicaRecord(key, COMPAT, SCOPE, holder, 1, 2 << 20, key, residency, 600_000))
        groups.append(tuple(group))
    return LookupResponse(tuple(groups))


def recompute_only(statuses: Sequence[InstanceStatus], tokens: int) -> str:
    """The baseline: a PC without lookup picks the lowest wait + recompute of the whole prompt."""
    best = min(statuses, key=lambda s: (wait_us(s, MEAN_SERVICE_US) + recompute_us(s, tokens), s.instance))
    return best.instance


def _us(sample: Sample) -> float:
    return round(sample.median_s * 1e6, 2)


def measure_case(placer: Placer, statuses: list[InstanceStatus], blocks: int, rng: random.Random,
                 quick: bool, label: str = "instances") -> dict[str, object]:
    lookup = make_lookup(blocks, rng)
    tokens = blocks * B + 8
    request = PlacementRequest(SCOPE, COMPAT, tokens, request_ref="r")
    decision = placer.place(request, lookup, statuses)
    if not isinstance(decision, Assign):
        raise AssertionError("the benchmark must place every request")
    work = len(statuses) * blocks
    reps = 3 if work >= 50_000 else (5 if quick else 9)
    ours = measure(lambda: placer.place(request, lookup, statuses), reps=reps, warmup=1, inner=max(1, 5_000 // work))
    base = measure(lambda: recompute_only(statuses, tokens), reps=reps, warmup=1,
                   inner=max(1, 200_000 // len(statuses)))
    at_goal_size = len(statuses) == 100 and blocks == 64
    row = case(f"place_{len(statuses)}_{label}_{blocks}_blocks", ours, base,
               GOAL if at_goal_size else f"informative (goal: {GOAL})")
    row.update(us_per_decision=_us(ours), baseline_us=_us(base), uses_cache=decision.prefetch is not None)
    if at_goal_size:
        add_check(row, "us_per_decision", "<", 1000.0)
    return row


def run(quick: bool = False) -> dict[str, object]:
    rng = random.Random(7)
    placer = Placer(PlacerConfig(block_tokens=B, layers=LAYERS, mean_service_us=MEAN_SERVICE_US),
                    new_id=lambda: "00000000-0000-4000-8000-000000000000")
    cases = []
    for n in [10, 100] if quick else [10, 100, 1000]:
        statuses = make_statuses(n, rng)
        for blocks in [4, 64] if quick else [4, 64, 512]:
            cases.append(measure_case(placer, statuses, blocks, rng, quick))
    for n in [100] if quick else [100, 1000]:
        cases.append(measure_case(placer, make_statuses(n, rng, uniform=True), 64, rng, quick, "uniform_instances"))
    return {"name": "placement", "params": {"block_tokens": B, "layers": LAYERS, "replicas_per_block": 2,
                                            "links_per_instance": len(HOLDERS)}, "cases": cases}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(run(quick=parser.parse_args().quick), indent=2))
