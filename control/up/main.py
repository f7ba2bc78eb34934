"""``kvsp up`` and ``kvsp workload``: the commands.

``kvsp up`` writes a run directory (PKI, policy, configs), runs the workload once on the roles without
any cache (the baseline: the same requests, every prompt recomputed, no failure), then starts the
whole system, runs the workload again while one instance is killed with SIGKILL and restarted, and
prints the report.  ``--keep-running`` leaves the system up afterwards until Ctrl-C.

``--backend redis`` (decision D7) first starts a local ``redis-server`` (``RUN/redis/``, with AOF, on a
loopback port: `control.deploy.redis`), and the main phase runs two PCs on it, leader and standby;
the Redis server is stopped after every role process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from control.deploy.environment import child_env
from control.deploy.redis import RedisServer, RedisUnavailable, start_redis
from control.deploy.supervisor import StartError, Supervisor
from control.frontend.tokenizer import load_tokenizer
from control.up import report
from control.up.layout import INSTANCES, SCRAPER, Deployment, UpOptions, prepare
from control.up.runner import Killer, Progress, Runner, RunResult
from control.up.scrape import Samples, Scraper, labelled, parse_exposition
from control.up.workload import WorkloadSpec, build
from kvsp.errors import KvspError
from kvsp.service.tls import TlsFiles, client_context

READY_TIMEOUT_S = 60.0
RESTART_WAIT_S = 20.0


class UpError(KvspError):
    """kvsp up could not run (a role did not start, the run directory is unusable)."""


@dataclass(frozen=True, slots=True)
class UpArgs:
    run_dir: Path
    options: UpOptions
    spec: WorkloadSpec
    baseline: bool = True
    keep_running: bool = False
    restart_delay_s: float = 2.0
    progress: bool = True


def say(text: str) -> None:
    print(text, flush=True)


def _tls(deployment: Deployment) -> TlsFiles:
    pki = Path(deployment.run_dir) / "pki"
    return TlsFiles(pki / f"{SCRAPER}.pem", pki / f"{SCRAPER}.key", pki / "ca.pem")


def _api_keys(deployment: Deployment) -> dict[str, str]:
    return {t: (Path(deployment.run_dir) / f).read_text().strip() for t, f in deployment.api_keys.items()}


async def _active_at_leader(http: aiohttp.ClientSession, pcs: list[str]) -> float:
    """The active instances the leading PC counts (a standby counts none: its registry is empty)."""
    best = 0.0
    for pc in pcs:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with http.get(pc + "metrics", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                samples = parse_exposition(await resp.text())
            best = max(best, labelled(samples, "kvsp_pc_instances", "state", "active"))
    return best


async def wait_ready(deployment: Deployment, phase: str = "main", sup: Supervisor | None = None,
                     timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until the phase's (leading) PC counts every instance as active and its front end answers its health
    check."""
    deadline = time.monotonic() + timeout_s
    pcs, fe = deployment.pcs(phase), deployment.frontend_urls[phase]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(_tls(deployment)))) as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                active = await _active_at_leader(http, pcs)
                async with http.get(fe + "/health", timeout=aiohttp.ClientTimeout(total=2)) as h:
                    fe_ok = h.status == 200
                if fe_ok and active >= len(INSTANCES):
                    return
            if sup is not None:
                for name, child in sup.children.items():
                    if child.popen is not None and child.popen.poll() is not None:
                        raise UpError(f"{name} exited during start-up; log tail:\n{sup.log_tail(name)}")
            await asyncio.sleep(0.2)
    raise UpError(f"the {phase} system was not ready within {timeout_s:.0f} s (logs in {deployment.run_dir}/{phase})")


def _runner(deployment: Deployment, phase: str, spec: WorkloadSpec, killer: Killer | None, progress: bool) -> Runner:
    tokenizer = load_tokenizer(deployment.tokenizer)
    return Runner(deployment.frontend_urls.get(phase, deployment.frontend_url), deployment.model_name, build(spec),
                  tokenizer.encode, api_keys=_api_keys(deployment), killer=killer,
                  progress=Progress(spec.requests, phase, enabled=progress))


async def start_phase(deployment: Deployment, phase: str, restart_delay_s: float) -> Supervisor:
    """Start a phase's processes and wait until the system is ready (stopping them if it never is)."""
    sup = Supervisor(Path(deployment.run_dir), deployment.phases[phase], restart_delay_s=restart_delay_s,
                     state_file=f"{phase}/state.json", on_event=lambda text: say(f"\n  [{phase}] {text}"))
    began = time.monotonic()
    try:
        await sup.start(READY_TIMEOUT_S)
        await wait_ready(deployment, phase, sup)
    except StartError as exc:
        await sup.stop()
        raise UpError(str(exc)) from exc
    except BaseException:
        await sup.stop()
        raise
    say(f"  {phase}: {len(sup.children)} processes ready in {time.monotonic() - began:.1f} s")
    return sup


async def run_workload(deployment: Deployment, phase: str, sup: Supervisor, spec: WorkloadSpec, *,
                       progress: bool, kill: bool) -> tuple[RunResult, dict[str, Samples]]:
    """The workload on a started phase, with its metrics scraped across restarts."""
    stop = asyncio.Event()
    scraper = Scraper({p.name: p.uri for p in deployment.phases[phase]}, client_context(_tls(deployment)),
                      lambda name: sup.children[name].incarnation)
    scraping = asyncio.create_task(scraper.run(stop))

    def killer(uri: str) -> str | None:
        name = next((p.name for p in deployment.phases[phase] if p.uri == uri and p.instance), None)
        if name is not None:
            sup.kill(name, signal.SIGKILL)
        return name

    try:
        runner = _runner(deployment, phase, replace(spec, kill_after=spec.kill_after if kill else None),
                         killer if kill else None, progress)
        result = await runner.run(phase)
        if result.kill is not None:  # the supervisor restarts it after its delay
            deadline = time.monotonic() + sup.restart_delay_s + 2.0
            while sup.children[result.kill.name].incarnation < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
    finally:
        stop.set()
        await scraping
    return result, scraper.totals()


def _processes(sup: Supervisor) -> dict[str, object]:
    return {n: {"roles": c.proc.roles, "uri": c.proc.uri, "restarts": c.restarts, "log": c.proc.log}
            for n, c in sup.children.items()}


def checks(fig: report.Figures, kill_planned: bool) -> dict[str, bool]:
    """What a healthy run shows; ``kvsp up`` exits with status 1 when one fails."""
    def get(*path: str) -> Any:
        node: Any = fig
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        return node

    out = {"every request completed": get("requests", "failed") == 0,
           "lookup hit ratio > 0": (get("lookup", "hit_ratio") or 0) > 0,
           "tokens in index order, none repeated": bool(get("requests", "in_order"))}
    outputs = get("outputs_vs_baseline")
    if outputs is not None:
        out["greedy outputs identical to the no-failure baseline"] = outputs["identical"] == outputs["compared"]
    if kill_planned:
        kill = get("kill")
        out["an instance was killed mid-stream"] = kill is not None
        if kill is not None:
            out["its sessions resumed and completed"] = kill["completed"] == len(kill["sessions"]) > 0
    return out


def start_local_redis(deployment: Deployment) -> RedisServer | None:
    """``--backend redis``: the main phase's Redis, with AOF (a restart keeps the PC's state)."""
    if deployment.redis_port is None:
        return None
    try:
        server = start_redis(Path(deployment.run_dir) / "redis", port=deployment.redis_port, appendonly=True)
    except RedisUnavailable as exc:
        raise UpError(f"--backend redis: {exc}") from exc
    say(f"  redis: {server.url} (AOF in {server.directory})")
    return server


async def up(args: UpArgs) -> int:
    if args.options.model == "reference":
        args = replace(args, options=replace(args.options, model=str(await make_reference_model(args.run_dir))))
    deployment = prepare(args.run_dir, args.options)
    redis = start_local_redis(deployment)
    try:
        return await _up(args, deployment)
    finally:
        if redis is not None:
            redis.stop()


async def _up(args: UpArgs, deployment: Deployment) -> int:
    names = ", ".join(f"{p.name} ({p.roles})" for p in deployment.phases["main"])
    say(f"kvsp up: run directory {deployment.run_dir}\n  processes: {names}")
    say(f"  model: {deployment.model_name} ({deployment.model}); front end: {deployment.frontend_url}/v1/completions")
    phases = ["main", "baseline"] if args.baseline else ["main"]
    say("starting the system" + (" and the baseline (the same roles without any cache, on other ports)"
                                 if args.baseline else ""))
    started = await asyncio.gather(*(start_phase(deployment, p, args.restart_delay_s) for p in phases),
                                   return_exceptions=True)
    sups = [s for s in started if isinstance(s, Supervisor)]
    try:
        for failure in started:
            if isinstance(failure, BaseException):
                raise failure
        baseline = None
        if args.baseline:
            say("baseline run: no cache, no failure (the reference for TTFT and for the outputs)")
            baseline, _ = await run_workload(deployment, "baseline", sups[1], args.spec, progress=args.progress,
                                             kill=False)
            await sups[1].stop()
        say("main run: KV cache reuse" + ("; one instance is killed mid-stream, then restarted"
                                          if args.spec.kill_after is not None else ""))
        main, metrics = await run_workload(deployment, "main", sups[0], args.spec, progress=args.progress,
                                           kill=args.spec.kill_after is not None)
        fig = report.build(args.spec, main, baseline, metrics, _processes(sups[0]))
        fig["checks"] = checks(fig, args.spec.kill_after is not None)
        written = report.write(Path(deployment.run_dir), fig, main, baseline)
        say(report.table(fig))
        say(f"\nwritten in {deployment.run_dir}: {', '.join(p.name for p in written)}; logs in main/logs/")
        if args.keep_running:
            _print_usage(deployment)
            await asyncio.Event().wait()  # until Ctrl-C cancels this task
        return 0 if all(fig["checks"].values()) else 1  # type: ignore[attr-defined]
    finally:
        for sup in sups:
            await sup.stop()


async def make_reference_model(run_dir: Path) -> Path:
    """``kvsp model init RUN/model`` in a child process (torch loads there, not in the supervisor)."""
    folder = run_dir / "model"
    if (folder / "config.json").exists():
        return folder
    run_dir.mkdir(parents=True, exist_ok=True)
    say(f"kvsp up: writing the reference model into {folder} (kvsp model init)")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "control.cli", "model", "init", str(folder),
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                                                env=child_env())
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise UpError(f"kvsp model init failed: {err.decode(errors='replace')[-2000:]}")
    return folder


def _print_usage(deployment: Deployment) -> None:
    say(f"\nThe system is up (Ctrl-C stops it). Try:\n"
        f"  curl -s {deployment.frontend_url}/v1/completions -H 'Content-Type: application/json' \\\n"
        f"       -d '{{\"model\": \"{deployment.model_name}\", \"prompt\": \"Hello\", \"max_tokens\": 8, "
        f"\"temperature\": 0}}'\n"
        f"  kvsp workload --run-dir {deployment.run_dir}")


def run_cancellable(coro: Coroutine[Any, Any, int]) -> int:
    """Run ``coro``; SIGINT/SIGTERM cancel it, so its ``finally`` blocks stop every process."""
    async def main() -> int:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await coro
        except asyncio.CancelledError:
            say("\nkvsp up: stopped; every process is shut down")
            return 130
    return asyncio.run(main())


# -- kvsp workload --------------------------------------------------------------------------------------
def _state_killer(run_dir: Path, deployment: Deployment) -> Killer:
    """SIGKILL from state.json (the supervisor of ``kvsp up --keep-running`` restarts the process)."""
    def kill(uri: str) -> str | None:
        state = json.loads((run_dir / "main" / "state.json").read_text())["processes"]
        for name, entry in state.items():
            if entry.get("uri") == uri and entry.get("instance") and entry.get("pid"):
                os.kill(int(entry["pid"]), signal.SIGKILL)
                return str(name)
        return None
    return kill


async def workload(run_dir: Path, spec: WorkloadSpec, progress: bool) -> int:
    deployment = Deployment.load(run_dir)
    if not _supervisor_alive(run_dir):
        raise UpError(f"{run_dir} has no running system (start one with kvsp up --keep-running --run-dir DIR)")
    say("kvsp workload: waiting until every instance is active (a restarted one may still be loading)")
    await wait_ready(deployment, "main")
    incarnations = _incarnation_reader(run_dir)
    procs = deployment.phases["main"]
    scraper = Scraper({p.name: p.uri for p in procs}, client_context(_tls(deployment)), incarnations)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=scraper.ssl_context)) as http:
        await scraper.scrape_once(http)
    before = scraper.totals()
    stop = asyncio.Event()
    scraping = asyncio.create_task(scraper.run(stop))
    killer = _state_killer(run_dir, deployment) if spec.kill_after is not None else None
    result = await _runner(deployment, "main", spec, killer, progress).run("workload")
    stop.set()
    await scraping
    metrics = _delta(scraper.totals(), before)
    fig = report.build(spec, result, None, metrics, {p.name: {"roles": p.roles, "uri": p.uri} for p in procs})
    fig["checks"] = checks(fig, spec.kill_after is not None)
    out = run_dir / f"workload-{time.strftime('%Y%m%dT%H%M%S')}"
    out.mkdir()
    report.write(out, fig, result, None)
    say(report.table(fig, "kvsp workload: report") + f"\nwritten in {out}")
    return 0 if all(fig["checks"].values()) else 1  # type: ignore[attr-defined]


def _supervisor_alive(run_dir: Path) -> bool:
    try:
        os.kill(int(json.loads((run_dir / "main" / "state.json").read_text())["supervisor"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def _incarnation_reader(run_dir: Path) -> Callable[[str], int]:
    def read(name: str) -> int:
        with contextlib.suppress(OSError, ValueError, KeyError):
            return int(json.loads((run_dir / "main" / "state.json").read_text())["processes"][name]["incarnation"])
        return 0
    return read


def _delta(after: Mapping[str, Samples], before: Mapping[str, Samples]) -> dict[str, Samples]:
    return {name: {k: v - before.get(name, {}).get(k, 0.0) for k, v in samples.items()}
            for name, samples in after.items()}


# -- command line ----------------------------------------------------------------------------------------
def spec_of(args: argparse.Namespace) -> WorkloadSpec:
    for name in ("chats", "turns", "max_tokens", "concurrency"):
        if getattr(args, name) < 1:
            raise UpError(f"--{name.replace('_', '-')} must be at least 1")
    if not 0.0 <= args.kill_after < 1.0:
        raise UpError("--kill-after must lie in [0, 1)")
    return WorkloadSpec(chats=args.chats, turns=args.turns, max_tokens=args.max_tokens, concurrency=args.concurrency,
                        seed=args.seed, kill_after=None if args.no_kill else args.kill_after)


def cmd_up(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir) if args.run_dir else Path("kvsp-runs") / time.strftime("%Y%m%dT%H%M%S")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UpError(f"{run_dir} exists and is not empty; give another --run-dir")
    options = UpOptions(model=args.model, relay=args.relay, frontend_port=args.port, moqt_fetch=args.moqt,
                        backend=args.backend)
    up_args = UpArgs(run_dir.resolve(), options, spec_of(args), baseline=not args.no_baseline,
                     keep_running=args.keep_running, restart_delay_s=args.restart_delay, progress=not args.quiet)
    return run_cancellable(up(up_args))


def cmd_workload(args: argparse.Namespace) -> int:
    return run_cancellable(workload(Path(args.run_dir).resolve(), spec_of(args), not args.quiet))
