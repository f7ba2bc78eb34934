"""Run the fuzz targets: ``python3 -m fuzz [TARGET ...] (--runs N | --seconds T)``.

Each target runs in its own process (``python3 fuzz/fuzz_<target>.py`` with libFuzzer options), one
after another, so a crash or a timeout in one is reported and the next still runs.  The committed
seeds (``fuzz/corpus/<target>/``) are read but never written: libFuzzer adds what it finds to the
first corpus directory it is given, which here is a scratch directory (``--workdir``, a temporary one
by default).  Crash, timeout and out-of-memory inputs are written to ``--artifacts`` (a folder that
outlives the run, since the input is what a fix starts from).

Prints one line per target (executions, exec/s, libFuzzer's ``cov:`` and ``ft:`` at the end, the wall
time, and the crash input if any) and exits non-zero when any target crashed.  ``--write-seeds``
rewrites the committed seed corpora from each harness's ``seeds()`` instead.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from fuzz.common import CORPUS, ROOT

HERE: Final = Path(__file__).resolve().parent
# libFuzzer's status lines: "#4096 pulse  cov: 312 ft: 640 corp: 41/2Kb ... exec/s: 2048 rss: 61Mb".
_STATUS: Final = re.compile(r"^#(\d+)\s+(\w+)\s+cov: (\d+) ft: (\d+)(?:.*?exec/s: (\d+))?", re.MULTILINE)
_DONE: Final = re.compile(r"Done (\d+) runs in (\d+) second")
_ARTIFACT: Final = re.compile(r"Test unit written to (\S+)")
_RSS: Final = re.compile(r"stat::peak_rss_mb:\s*(\d+)")
_AVERAGE: Final = re.compile(r"stat::average_exec_per_sec:\s*(\d+)")
# A generous per-input bound: the slowest target (the MOQT session) takes milliseconds per input, so an
# input that runs for seconds is a hang, not a slow machine.
DEFAULT_TIMEOUT_S: Final = 10
DEFAULT_ARTIFACTS: Final = Path(tempfile.gettempdir()) / "kvsp-fuzz-artifacts"


@dataclass
class Result:
    """One target's run."""

    target: str
    executions: int = 0
    exec_per_s: int = 0
    cov: int = 0
    ft: int = 0
    wall_s: float = 0.0
    peak_rss_mb: int = 0
    returncode: int = 0
    crash: str | None = None  # the artifact (crash-, timeout-, oom- input) libFuzzer wrote

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.crash is None


def targets() -> list[str]:
    """Every harness, by the name after ``fuzz_``."""
    return sorted(p.stem.removeprefix("fuzz_") for p in HERE.glob("fuzz_*.py"))


def parse_output(target: str, text: str, returncode: int, wall_s: float) -> Result:
    result = Result(target, wall_s=round(wall_s, 1), returncode=returncode)
    statuses = _STATUS.findall(text)
    if statuses:
        count, _, cov, ft, rate = statuses[-1]
        result.executions, result.cov, result.ft = int(count), int(cov), int(ft)
        result.exec_per_s = int(rate) if rate else 0
    done = _DONE.search(text)
    if done:
        result.executions = int(done[1])
    average = _AVERAGE.search(text)
    if average:
        result.exec_per_s = int(average[1])
    if not result.exec_per_s and wall_s > 0:  # libFuzzer says 0 for a run shorter than a second
        result.exec_per_s = int(result.executions / wall_s)
    rss = _RSS.search(text)
    if rss:
        result.peak_rss_mb = int(rss[1])
    artifact = _ARTIFACT.search(text)
    if artifact:
        result.crash = artifact[1]
    return result


def run_target(target: str, workdir: Path, artifacts: Path, *, runs: int | None, seconds: int | None,
               timeout_s: int, max_len: int | None, extra: Sequence[str], log: Path | None) -> Result:
    corpus = workdir / "corpus" / target
    corpus.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, str(HERE / f"fuzz_{target}.py"), f"-timeout={timeout_s}", "-print_final_stats=1",
            f"-artifact_prefix={artifacts}/{target}-"]
    if max_len is not None:
        args.append(f"-max_len={max_len}")
    if runs is not None:
        args.append(f"-runs={runs}")
    if seconds is not None:
        args.append(f"-max_total_time={seconds}")
    args += [*extra, str(corpus)]
    seeds = CORPUS / target
    if seeds.is_dir():
        args.append(str(seeds))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    start = time.monotonic()
    done = subprocess.run(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", check=False)
    wall = time.monotonic() - start
    if log is not None:
        log.mkdir(parents=True, exist_ok=True)
        (log / f"{target}.log").write_text(done.stdout)
    result = parse_output(target, done.stdout, done.returncode, wall)
    if not result.ok:
        tail = "\n".join(done.stdout.splitlines()[-40:])
        print(f"--- {target} failed (rc {done.returncode}); last lines:\n{tail}", file=sys.stderr)
    return result


def write_seeds(names: Sequence[str]) -> None:
    """Rewrite ``fuzz/corpus/<target>/`` from the harness's ``seeds()``, one file per seed named by its SHA-1."""
    for name in names:
        module = importlib.import_module(f"fuzz.fuzz_{name}")
        folder = CORPUS / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        seeds: list[bytes] = module.seeds()
        for seed in seeds:
            module.test_one_input(seed)  # a seed that breaks the contract is a bug to fix first
            (folder / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
        print(f"{name}: {len(seeds)} seeds, {sum(map(len, seeds))} octets")


def report(results: Sequence[Result]) -> str:
    lines = [f"{'target':<22} {'execs':>9} {'exec/s':>7} {'cov':>6} {'ft':>7} {'wall s':>8} {'rss MB':>7}  result"]
    for r in results:
        outcome = "ok" if r.ok else f"CRASH {r.crash or f'rc {r.returncode}'}"
        lines.append(f"{r.target:<22} {r.executions:>9} {r.exec_per_s:>7} {r.cov:>6} {r.ft:>7} {r.wall_s:>8} "
                     f"{r.peak_rss_mb:>7}  {outcome}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m fuzz", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("targets", nargs="*", help=f"targets to run (default: all of {', '.join(targets())})")
    limit = parser.add_mutually_exclusive_group()
    limit.add_argument("--runs", type=int, help="executions per target (libFuzzer -runs)")
    limit.add_argument("--seconds", type=int, help="seconds per target (libFuzzer -max_total_time)")
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S, help="seconds one input may take")
    parser.add_argument("--max-len", type=int, help="longest input (libFuzzer -max_len; default: the target's own)")
    parser.add_argument("--workdir", type=Path, help="scratch corpus and artifacts (default: a temporary directory)")
    parser.add_argument("--artifacts", type=Path, default=DEFAULT_ARTIFACTS,
                        help=f"where crash, timeout and out-of-memory inputs go (default {DEFAULT_ARTIFACTS})")
    parser.add_argument("--logs", type=Path, help="write each target's libFuzzer output to LOGS/<target>.log")
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    parser.add_argument("--write-seeds", action="store_true", help="rewrite the committed seed corpora and exit")
    parser.add_argument("--list", action="store_true", help="list the targets and exit")
    parser.add_argument("--libfuzzer", action="append", default=[], metavar="OPTION",
                        help="pass an option to libFuzzer (repeatable), e.g. --libfuzzer=-dict=fuzz/x.dict")
    args = parser.parse_args(argv)
    names = args.targets or targets()
    unknown = sorted(set(names) - set(targets()))
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {targets()}")
    if args.list:
        print("\n".join(targets()))
        return 0
    if args.write_seeds:
        write_seeds(names)
        return 0
    if args.runs is None and args.seconds is None:
        parser.error("give --runs N or --seconds T")
    with tempfile.TemporaryDirectory(prefix="kvsp-fuzz-") as scratch:
        workdir = args.workdir or Path(scratch)
        results = []
        for name in names:
            result = run_target(name, workdir, args.artifacts, runs=args.runs, seconds=args.seconds,
                                timeout_s=args.timeout, max_len=args.max_len, extra=args.libfuzzer, log=args.logs)
            print(report([result]).splitlines()[1], flush=True)
            results.append(result)
    print(report(results))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    crashed = [r.target for r in results if not r.ok]
    if crashed:
        print(f"crashed: {', '.join(crashed)}", file=sys.stderr)
        return 1
    return 0
