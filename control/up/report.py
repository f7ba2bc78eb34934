"""The report of a ``kvsp up`` run: figures from the workload's results and the roles' metrics, as a
terminal table, ``report.json`` and PNG plots.

Figures that no role measures yet are ``null`` in the JSON and "n/a" in the table (never invented).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from control.up.runner import RequestResult, RunResult
from control.up.scrape import Samples, by_label, labelled, total
from control.up.workload import WorkloadSpec, percentile

Figures = dict[str, object]
_MOQT_BYTES = re.compile(r"^kvsp_\w*moqt\w*bytes\w*_total\b")
_RELAY_HITS = re.compile(r"^kvsp_relay\w*(hit)\w*_total\b")
_RELAY_OUT = re.compile(r"^kvsp_relay_bytes_out_total\b")


def _sum_matching(metrics: Mapping[str, Samples], pattern: re.Pattern[str]) -> float | None:
    found = [v for samples in metrics.values() for k, v in samples.items() if pattern.match(k)]
    return sum(found) if found else None


def _over(metrics: Mapping[str, Samples], name: str) -> float:
    return sum(total(samples, name) for samples in metrics.values())


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def ttft_figures(run: RunResult | None, *, undisturbed: bool = False) -> Figures | None:
    """TTFT percentiles of the completed requests (``undisturbed``: only those no failover touched)."""
    if run is None:
        return None
    ttfts = [r.ttft_s for r in run.requests if r.ttft_s is not None and r.ok and not (undisturbed and r.moves)]
    return {"requests": len(ttfts), "p50_ms": _ms(percentile(ttfts, 0.5)), "p95_ms": _ms(percentile(ttfts, 0.95)),
            "mean_ms": _ms(sum(ttfts) / len(ttfts)) if ttfts else None}


def compare_outputs(main: RunResult, baseline: RunResult | None) -> Figures | None:
    """Greedy outputs of the same request in both runs must be the same tokens."""
    if baseline is None:
        return None
    reference = {r.id: r.tokens for r in baseline.requests if r.ok}
    both = [r for r in main.requests if r.ok and r.id in reference]
    differing = [r.id for r in both if r.tokens != reference[r.id]]
    return {"compared": len(both), "identical": len(both) - len(differing), "differing": differing}


def kill_figures(main: RunResult, baseline: RunResult | None) -> Figures | None:
    kill = main.kill
    if kill is None:
        return None
    by_id = {r.id: r for r in main.requests}
    reference = {r.id: r.tokens for r in baseline.requests if r.ok} if baseline else {}
    affected = [by_id[i] for i in kill.sessions if i in by_id]
    gaps = [g for r in affected for g in r.resume_ms]
    return {"instance": kill.name, "at_s": round(kill.at_s, 3), "sessions": kill.sessions,
            "completed": sum(1 for r in affected if r.ok),
            "moved": sum(1 for r in affected if r.moves > 0),
            "identical_to_baseline": (sum(1 for r in affected if r.ok and reference.get(r.id) == r.tokens)
                                      if baseline else None),
            "resume_ms_p50": round(percentile(gaps, 0.5) or 0.0, 1) if gaps else None,
            "resume_ms_max": round(max(gaps), 1) if gaps else None}


def build(spec: WorkloadSpec, main: RunResult, baseline: RunResult | None, metrics: Mapping[str, Samples],
          processes: Mapping[str, object]) -> Figures:
    ok = [r for r in main.requests if r.ok]
    requested = _over(metrics, "kvsp_is_lookup_keys_requested_total")
    matched = _over(metrics, "kvsp_is_lookup_keys_matched_total")
    fetched_local = sum(labelled(s, "kvsp_instance_tokens_fetched_total", "source", "local") for s in metrics.values())
    fetched_remote = sum(labelled(s, "kvsp_instance_tokens_fetched_total", "source", "remote")
                         for s in metrics.values())
    recomputed = _over(metrics, "kvsp_instance_tokens_recomputed_total")
    context = fetched_local + fetched_remote + recomputed
    resume_gaps = [g for r in main.requests for g in r.resume_ms]
    cached, uncached = ttft_figures(main, undisturbed=True), ttft_figures(baseline)
    return {
        "workload": {"chats": spec.chats, "turns": spec.turns, "tenants": list(spec.tenants),
                     "max_tokens": spec.max_tokens, "concurrency": spec.concurrency, "seed": spec.seed},
        "requests": {"planned": spec.requests, "sent": len(main.requests), "completed": len(ok),
                     "failed": len(main.requests) - len(ok), "duration_s": round(main.duration_s, 2),
                     "in_order": all(r.indices_in_order for r in main.requests),
                     "errors": [f"{r.id}: {r.status} {r.error}" for r in main.requests if not r.ok][:20]},
        "lookup": {"keys_requested": requested, "keys_matched": matched,
                   "hit_ratio": round(matched / requested, 4) if requested else None},
        "tokens": {"fetched_local": fetched_local, "fetched_remote": fetched_remote, "recomputed": recomputed,
                   "fetched_ratio": round((fetched_local + fetched_remote) / context, 4) if context else None},
        "ttft": {"with_cache": cached, "with_cache_all": ttft_figures(main), "without_cache": uncached,
                 "speedup_p50": _ratio(uncached, cached)},
        "bytes": _transport_figures(metrics),
        "relay": {"running": any(n.startswith("relay") for n in processes),
                  "cache_hits": _sum_matching(metrics, _RELAY_HITS)},
        "lease_rejections": _over(metrics, "kvsp_holder_lease_rejections_total"),
        "digest_failures": _over(metrics, "kvsp_instance_digest_failures_total")
        + _over(metrics, "kvsp_holder_digest_failures_total"),
        "migrations": {"pc_migrations": _over(metrics, "kvsp_pc_migrations_total"),
                       "instance_resumes": _over(metrics, "kvsp_instance_resumes_total"),
                       "requests_moved": sum(1 for r in main.requests if r.moves > 0),
                       "resume_ms_p50": round(percentile(resume_gaps, 0.5) or 0.0, 1) if resume_gaps else None,
                       "resume_ms_max": round(max(resume_gaps), 1) if resume_gaps else None},
        "kill": kill_figures(main, baseline),
        "outputs_vs_baseline": compare_outputs(main, baseline),
        "processes": dict(processes),
    }


def _transport_figures(metrics: Mapping[str, Samples]) -> Figures:
    """Blocks and octets served by holders per transport (``part`` moqt-* and ``transport`` labels),
    their octets in all, and the octets relays sent.  A holder without the ``transport`` label counts
    in ``holder_octets`` only."""
    served = {k: v for s in metrics.values() for k, v in s.items() if k.startswith("kvsp_holder_blocks_served_total{")}
    moqt_blocks = sum(v for k, v in served.items() if 'part="moqt' in k)
    octets: dict[str, float] = {}
    for samples in metrics.values():
        for transport, value in by_label(samples, "kvsp_holder_bytes_served_total", "transport").items():
            octets[transport] = octets.get(transport, 0.0) + value
    return {"holder_octets": _over(metrics, "kvsp_holder_bytes_served_total"),
            "holder_https_octets": octets.get("https", 0.0), "holder_moqt_octets": octets.get("moqt", 0.0),
            "http_blocks": sum(served.values()) - moqt_blocks, "moqt_blocks": moqt_blocks,
            "moqt_octets": _sum_matching(metrics, _MOQT_BYTES),
            "relay_octets_out": _sum_matching(metrics, _RELAY_OUT)}


def _ratio(uncached: Figures | None, cached: Figures | None) -> float | None:
    if not uncached or not cached:
        return None
    a, b = uncached.get("p50_ms"), cached.get("p50_ms")
    return round(a / b, 2) if isinstance(a, float) and isinstance(b, float) and b > 0 else None


# -- output -------------------------------------------------------------------------------------------
def _fmt(value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() else f"{value:,.3g}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)


def table(fig: Figures, title: str = "kvsp up: report") -> str:
    """The terminal table, with the checks when the figures have them."""
    def g(*path: str) -> object:
        node: object = fig
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        return node

    rows: list[tuple[str, object]] = [
        ("requests completed / sent", f"{_fmt(g('requests', 'completed'))} / {_fmt(g('requests', 'sent'))}"),
        ("lookup hit ratio (keys)", g("lookup", "hit_ratio")),
        ("tokens fetched local / remote", f"{_fmt(g('tokens', 'fetched_local'))} / "
                                          f"{_fmt(g('tokens', 'fetched_remote'))}"),
        ("tokens recomputed", g("tokens", "recomputed")),
        ("TTFT p50 / p95 with cache (ms)", f"{_fmt(g('ttft', 'with_cache', 'p50_ms'))} / "
                                           f"{_fmt(g('ttft', 'with_cache', 'p95_ms'))}  (requests not moved)"),
        ("TTFT p50 / p95 without cache (ms)", f"{_fmt(g('ttft', 'without_cache', 'p50_ms'))} / "
                                              f"{_fmt(g('ttft', 'without_cache', 'p95_ms'))}"),
        ("blocks served over HTTPS / MOQT", f"{_fmt(g('bytes', 'http_blocks'))} / {_fmt(g('bytes', 'moqt_blocks'))}"),
        ("octets served by holders (both)", g("bytes", "holder_octets")),
        ("octets over HTTPS / MOQT (holders)", f"{_fmt(g('bytes', 'holder_https_octets'))} / "
                                               f"{_fmt(g('bytes', 'holder_moqt_octets'))}"),
        ("octets out of relays (MOQT)", g("bytes", "relay_octets_out")),
        ("relay cache hits", g("relay", "cache_hits")),
        ("lease rejections", g("lease_rejections")),
        ("digest failures", g("digest_failures")),
        ("migrations (PC) / requests moved", f"{_fmt(g('migrations', 'pc_migrations'))} / "
                                             f"{_fmt(g('migrations', 'requests_moved'))}"),
        ("time to resume p50 / max (ms)", f"{_fmt(g('migrations', 'resume_ms_p50'))} / "
                                          f"{_fmt(g('migrations', 'resume_ms_max'))}"),
    ]
    kill = g("kill")
    if isinstance(kill, dict):
        rows.append(("killed instance", f"{kill['instance']} at {kill['at_s']} s; {kill['completed']}/"
                                        f"{len(kill['sessions'])} of its requests completed"))
    outputs = g("outputs_vs_baseline")
    if isinstance(outputs, dict):
        rows.append(("greedy outputs identical to baseline", f"{outputs['identical']}/{outputs['compared']}"))
    width = max(len(k) for k, _ in rows)
    lines = ["", title, "-" * (width + 30)]
    lines += [f"{k:<{width}}  {v if isinstance(v, str) else _fmt(v)}" for k, v in rows]
    verdicts = fig.get("checks")
    if isinstance(verdicts, dict):
        lines += [""] + [f"  [{'ok' if passed else 'FAILED'}] {name}" for name, passed in verdicts.items()]
    return "\n".join(lines) + "\n"


def write(run_dir: Path, fig: Figures, main: RunResult, baseline: RunResult | None) -> list[Path]:
    """report.json, requests.json and the plots; the paths written."""
    (run_dir / "report.json").write_text(json.dumps(fig, indent=2) + "\n")
    runs = {"main": main.to_json(), "baseline": baseline.to_json() if baseline else None}
    (run_dir / "requests.json").write_text(json.dumps(runs) + "\n")
    (run_dir / "report.txt").write_text(table(fig))
    try:
        pictures = plots(run_dir, fig, main, baseline)
    except ImportError:  # matplotlib comes with the engine extra; the figures stand without the plots
        pictures = []
    return [run_dir / "report.json", run_dir / "requests.json", *pictures]


def plots(run_dir: Path, fig: Figures, main: RunResult, baseline: RunResult | None) -> list[Path]:
    import matplotlib  # noqa: PLC0415 - only the report needs it, and it is slow to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    out: list[Path] = []
    fig1, ax = plt.subplots(figsize=(6, 4))
    for run, label in ((main, "with cache reuse"), (baseline, "without cache (baseline)")):
        if run is None:
            continue
        values = sorted(r.ttft_s * 1000 for r in run.requests if r.ttft_s is not None and r.ok)
        if values:
            ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=label)
    ax.set_xlabel("time to first token (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT distribution")
    ax.legend()
    out.append(_save(fig1, run_dir / "ttft_cdf.png"))

    fig2, ax = plt.subplots(figsize=(6, 4))
    tokens = fig["tokens"] if isinstance(fig["tokens"], dict) else {}
    names = ["fetched (local)", "fetched (remote)", "recomputed"]
    ax.bar(names, [float(tokens.get(k) or 0.0) for k in ("fetched_local", "fetched_remote", "recomputed")],
           color=["tab:green", "tab:olive", "tab:red"])
    ax.set_ylabel("context tokens")
    ax.set_title("KV of context tokens: loaded vs recomputed")
    out.append(_save(fig2, run_dir / "tokens.png"))

    fig3, ax = plt.subplots(figsize=(7, 4))
    _timeline(ax, main.requests, "with cache")
    if main.kill is not None:
        ax.axvline(main.kill.at_s, color="black", linestyle="--", label=f"SIGKILL {main.kill.name}")
    ax.set_xlabel("request start (s since the run began)")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("Requests over time")
    ax.legend()
    out.append(_save(fig3, run_dir / "timeline.png"))
    return out


def _timeline(ax: object, requests: Sequence[RequestResult], label: str) -> None:
    moved = [r for r in requests if r.moves > 0 and r.ttft_s is not None]
    still = [r for r in requests if r.moves == 0 and r.ttft_s is not None]
    ax.scatter([r.started_s for r in still], [r.ttft_s * 1000 for r in still if r.ttft_s is not None],  # type: ignore[attr-defined]
               s=12, label=label)
    if moved:
        ax.scatter([r.started_s for r in moved], [r.ttft_s * 1000 for r in moved if r.ttft_s is not None],  # type: ignore[attr-defined]
                   s=30, marker="x", color="red", label="moved to another instance")


def _save(figure: object, path: Path) -> Path:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure.tight_layout()  # type: ignore[attr-defined]
    figure.savefig(path, dpi=100)  # type: ignore[attr-defined]
    plt.close(figure)  # type: ignore[arg-type]
    return path
