"""Run every benchmark beside its baseline; write results.json, results.md and PNG plots.

    python -m benchmarks [--quick] [--out DIR] [--only NAME ...] [--timeout S] [--no-plots] [--list]
    kvsp bench [the same options]

Suites are the modules ``benchmarks/bench_*.py`` that define ``run(quick: bool) -> dict`` (found
without importing them), run in name order.  Each suite runs in its own child process, in its own
process group: a suite that raises, dies or runs past ``--timeout`` is recorded as failed (its error
in results.json and the table, its output in ``DIR/logs/``) and the others still run.  Exit status 1
when a suite failed, 0 otherwise (goals that are not met are in the reports, not in the status).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.report import machine_facts, write_reports

PACKAGE = "benchmarks"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = "benchmarks/results"
DEFAULT_TIMEOUT_S = {True: 300.0, False: 1200.0}  # per suite, --quick / full


HERE = Path(__file__).resolve().parent


def discover(directory: Path = HERE) -> list[str]:
    """Module names ``bench_*`` in ``directory`` whose source defines a top-level ``run``, sorted."""
    found = []
    for path in sorted(directory.glob("bench_*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except (OSError, SyntaxError, ValueError):
            found.append(path.stem)  # let the run report why it cannot be loaded
            continue
        if any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "run" for node in tree.body):
            found.append(path.stem)
    return found


def select(available: list[str], only: list[str] | None) -> list[str]:
    """``--only`` names, with or without the ``bench_`` prefix, in the order given."""
    if not only:
        return available
    chosen = []
    for name in only:
        module = name if name.startswith("bench_") else f"bench_{name}"
        if module not in available:
            raise SystemExit(f"python -m benchmarks: no suite {name!r} (suites: {', '.join(available)})")
        chosen.append(module)
    return chosen


# -- one suite in a child process ----------------------------------------------------------------------
def run_worker(package: str, module: str, result_path: Path, quick: bool) -> int:
    """In the child: run the suite, write ``{"result": ...}`` or ``{"error": ..., "traceback": ...}``."""
    try:
        result = importlib.import_module(f"{package}.{module}").run(quick=quick)
        if not isinstance(result, dict) or not isinstance(result.get("cases"), list):
            raise TypeError(f"{module}.run() must return a dict with a 'cases' list, not {type(result).__name__}")
        doc: dict[str, Any] = {"result": result}
    except BaseException as exc:
        doc = {"error": f"{type(exc).__name__}: {exc}".strip(), "traceback": traceback.format_exc()}
    result_path.write_text(json.dumps(doc, default=str))
    return 0 if "result" in doc else 1


def run_suite(module: str, *, quick: bool, timeout_s: float, logs: Path, package: str = PACKAGE,
              pythonpath: list[str] | None = None) -> dict[str, Any]:
    """Run one suite in a child process; its result, or a suite entry with ``error``."""
    logs.mkdir(parents=True, exist_ok=True)
    result_path, log_path = logs / f"{module}.result.json", logs / f"{module}.log"
    result_path.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*(pythonpath or []), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = [sys.executable, "-m", "benchmarks", "--suite-worker", package, module, str(result_path)]
    start = time.perf_counter()
    error: str | None = None
    with log_path.open("wb") as log:
        proc = subprocess.Popen([*command, *(["--quick"] if quick else [])], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=ROOT, start_new_session=True)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            error = f"timed out after {timeout_s:g} s"
        finally:
            _end_group(proc)
    entry: dict[str, Any] = {"name": module.removeprefix("bench_"), "cases": []}
    if error is None:
        entry, error = _read_result(result_path, proc.returncode, entry)
    entry.update(module=module, elapsed_s=round(time.perf_counter() - start, 2))
    if error is not None:
        entry["error"] = error
        entry["log"] = str(log_path)
        entry["log_tail"] = _tail(log_path)
    return entry


def _read_result(path: Path, returncode: int, entry: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return entry, f"the suite's process ended (status {returncode}) without a result"
    if "result" in doc:
        return {**doc["result"], "cases": doc["result"]["cases"]}, None
    entry["traceback"] = doc.get("traceback")
    return entry, str(doc.get("error") or "failed")


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop the suite's process group (the child and any server it left behind), nothing else:
    SIGTERM, up to 5 s for all of them to end, then SIGKILL."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:  # the group is empty: the suite ended and cleaned up after itself
        proc.wait()
        return
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _group_alive(proc.pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# -- the run ----------------------------------------------------------------------------------------------
def run_all(modules: list[str], *, quick: bool, out: Path, timeout_s: float, plots: bool = True,
            package: str = PACKAGE, pythonpath: list[str] | None = None) -> dict[str, Any]:
    """Run ``modules`` one after the other and write the reports into ``out``; the run document."""
    started = datetime.now(UTC)
    doc: dict[str, Any] = {"machine": machine_facts(ROOT), "quick": quick,
                           "started": started.isoformat(timespec="seconds"), "timeout_s": timeout_s, "suites": []}
    for module in modules:
        print(f"== {module}", flush=True)
        suite = run_suite(module, quick=quick, timeout_s=timeout_s, logs=out / "logs", package=package,
                          pythonpath=pythonpath)
        doc["suites"].append(suite)
        _print_suite(suite)
        write_reports(doc, out, plots=False)  # what has run so far survives an interrupted run
    doc["elapsed_s"] = round((datetime.now(UTC) - started).total_seconds(), 1)
    for path in write_reports(doc, out, plots=plots):
        print(f"wrote {path}")
    return doc


def _print_suite(suite: dict[str, Any]) -> None:
    if suite.get("error"):
        print(f"   FAILED after {suite['elapsed_s']} s: {suite['error']} (log: {suite.get('log')})", flush=True)
    for row in suite.get("cases", []):
        print(f"   {row.get('case', '?')!s:<44} ratio={row.get('ratio', '-')!s:<8} goal: {row.get('goal')}", flush=True)
    if not suite.get("error"):
        print(f"   {len(suite.get('cases', []))} cases in {suite['elapsed_s']} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--suite-worker"]:  # internal: python -m benchmarks --suite-worker PKG MODULE RESULT
        return run_worker(args[1], args[2], Path(args[3]), "--quick" in args[4:])
    available = discover()
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized runs: smaller inputs, fewer repetitions")
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help=f"folder for results.json, results.md, plots/ and logs/ (default {DEFAULT_OUT})")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="suites to run, e.g. keys client (default all)")
    parser.add_argument("--timeout", type=float, help="seconds per suite (default 300 with --quick, else 1200)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--list", action="store_true", help="print the suites and exit")
    parsed = parser.parse_args(args)
    if parsed.list:
        print("\n".join(available))
        return 0
    out = Path(parsed.out)
    if out.suffix == ".json":  # the former --out FILE.json: its folder
        out = out.parent
    timeout_s = parsed.timeout if parsed.timeout is not None else DEFAULT_TIMEOUT_S[parsed.quick]
    doc = run_all(select(available, parsed.only), quick=parsed.quick, out=out, timeout_s=timeout_s,
                  plots=not parsed.no_plots)
    return 1 if any(s.get("error") for s in doc["suites"]) else 0


if __name__ == "__main__":
    sys.exit(main())
