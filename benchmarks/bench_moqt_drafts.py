"""The MOQT rows of ``bench_moqt`` once per draft, in one run, against one holder (issue 18).

The holder's one MOQT listener accepts every draft (``moqt.profiles.PROFILES``); the client side has
one ``MoqtBlockClient`` per draft, pinned to it (``QuicSettings(drafts=(n,))``), so the same blocks
from the same process are fetched over each draft and over HTTPS. Rows:

* ``fetch-{2,16}MiB-c{1,8}-d{N}``: whole-block fetch throughput over draft N against HTTPS GET
  (ratio = HTTPS time / MOQT time), CPU per block of both processes.
* ``draft-{N}-vs-14-fetch-{2,16}MiB-c{1,8}``: draft N against draft-14, the two measured in
  alternation (ratio = draft-14 time / draft-N time; goal: within noise, >= 0.9 — the profile only
  changes a few octets per message and per object).
* ``first-layer-2MiB-c1-d{N}``: time to the first verified layer over draft N against HTTPS with
  per-layer writes, and its share of the whole-block time.

Run: ``python -m benchmarks.bench_moqt_drafts [--quick]``; prints JSON.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop

from benchmarks.bench_moqt import (
    DESCRIPTORS,
    Clients,
    Setup,
    _clients,
    _first_layer_row,
    _many,
    params,
    put_blocks,
    with_server,
)
from benchmarks.profiling import paired_cpu
from benchmarks.timing import case
from kvsp.client.moqt import BLOCK_CLIENT_QUIC, MoqtBlockClient
from moqt.profiles import PROFILES

NOISE_RATIO = 0.9  # a later draft may be slower than draft-14 by at most this (noise on a shared machine)


def _client_for(setup: Setup, draft: int) -> MoqtBlockClient:
    d = setup.dir
    settings = dataclasses.replace(BLOCK_CLIENT_QUIC, drafts=(draft,))
    return MoqtBlockClient.from_files(d / "client.pem", d / "client.key", d / "ca.pem", settings=settings)


def _batch(runner: asyncio.Runner, fetch: Callable[[int, int], Awaitable[None]], mib: int, requests: int,
           concurrency: int) -> Callable[[], object]:
    return lambda: runner.run(_many(functools.partial(lambda f, i: f(i, mib), fetch), requests, concurrency))


def _rows_for(runner: asyncio.Runner, by_draft: dict[int, Clients], mib: int, concurrency: int,
              quick: bool) -> list[dict[str, object]]:
    requests = max(concurrency, (16 if quick else 64) // mib)
    reps = 3 if quick else 9
    rows: list[dict[str, object]] = []
    base = by_draft[14]
    for draft, clients in by_draft.items():
        moqt, https, cpu = paired_cpu(_batch(runner, clients.via_moqt, mib, requests, concurrency),
                                      _batch(runner, clients.via_https, mib, requests, concurrency),
                                      reps, clients.server_cpu)
        row = case(f"fetch-{mib}MiB-c{concurrency}-d{draft}", moqt, https,
                   f"draft-{draft} MOQT throughput against HTTPS GET (informational; bench_moqt has the goal)",
                   unit="s per batch", higher_is_better=True)
        row["mib_per_s"] = {"moqt": round(requests * mib / moqt.median_s, 1),
                            "https": round(requests * mib / https.median_s, 1)}
        row["cpu_ms_per_block"] = {"moqt": round(cpu[0] / requests * 1e3, 2),
                                   "https": round(cpu[1] / requests * 1e3, 2)}
        rows.append(row)
        if draft != 14:
            newer, older, _ = paired_cpu(_batch(runner, clients.via_moqt, mib, requests, concurrency),
                                         _batch(runner, base.via_moqt, mib, requests, concurrency),
                                         reps, clients.server_cpu)
            rows.append(case(f"draft-{draft}-vs-14-fetch-{mib}MiB-c{concurrency}", newer, older,
                             f"draft-{draft} no slower than draft-14 beyond noise (ratio >= {NOISE_RATIO})",
                             unit="s per batch", higher_is_better=True, goal_min_ratio=NOISE_RATIO))
    return rows


def _measure(setup: Setup, pipe: Any, quick: bool) -> list[dict[str, object]]:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        clients = runner.run(_clients(setup, pipe))
        by_draft = {p.draft: dataclasses.replace(clients, moqt=_client_for(setup, p.draft))
                    for p in sorted(PROFILES, key=lambda p: p.draft)}
        try:
            put_blocks(runner, clients)
            rows: list[dict[str, object]] = []
            for mib in DESCRIPTORS:
                for concurrency in (1, 8):
                    rows.extend(_rows_for(runner, by_draft, mib, concurrency, quick))
            for draft, per_draft in by_draft.items():
                row = _first_layer_row(runner, per_draft, 2, 1, quick)
                row["case"] = f"{row['case']}-d{draft}"
                rows.append(row)
            for draft, per_draft in by_draft.items():
                negotiated = {c.profile.draft for c in _connections(per_draft)}
                if negotiated != {draft}:
                    raise RuntimeError(f"the draft-{draft} client negotiated {sorted(negotiated)}")
        finally:
            for per_draft in by_draft.values():
                runner.run(per_draft.moqt.close())
            runner.run(clients.moqt.close())
            runner.run(clients.session.close())
    return rows


def _connections(clients: Clients) -> list[Any]:
    return [s.endpoint.link for s in clients.moqt._subscribers.values()]


def run(quick: bool = False) -> dict[str, object]:
    cases = with_server(_measure, quick)
    return {"name": "moqt_drafts", "params": {**params(), "drafts": sorted(p.draft for p in PROFILES)},
            "cases": cases}


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
