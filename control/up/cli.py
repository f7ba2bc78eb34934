"""The ``up`` and ``workload`` subcommands of ``kvsp`` (parsers only: the network code loads on use)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from control.up.workload import WorkloadSpec


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    d = WorkloadSpec()
    p.add_argument("--chats", type=int, default=d.chats, help=f"multi-turn chats (default {d.chats})")
    p.add_argument("--turns", type=int, default=d.turns, help=f"turns per chat (default {d.turns})")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help=f"tokens per answer (default {d.max_tokens})")
    p.add_argument("--concurrency", type=int, default=d.concurrency, help=f"chats at once (default {d.concurrency})")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--kill-after", type=float, default=d.kill_after,
                   help="SIGKILL an instance mid-stream after this fraction of the requests (default 0.3)")
    p.add_argument("--no-kill", action="store_true", help="no failure injection")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _up(args: argparse.Namespace) -> None:
    from control.up.main import cmd_up  # noqa: PLC0415

    code = cmd_up(args)
    if code:
        sys.exit(code)


def _workload(args: argparse.Namespace) -> None:
    from control.up.main import cmd_workload  # noqa: PLC0415

    code = cmd_workload(args)
    if code:
        sys.exit(code)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("up", help="run the whole system on loopback, a workload, and print the report")
    p.add_argument("--run-dir", help="where configs, logs and the report go (default kvsp-runs/TIMESTAMP)")
    p.add_argument("--model", default="reference",
                   help="'reference' (kvsp model init into the run directory, the default), 'test' (the "
                        "deterministic test engine: fast, no torch) or a Hugging Face model folder")
    p.add_argument("--relay", action=argparse.BooleanOptionalAction, default=None,
                   help="start the MOQT relay (default: when the relay role is available)")
    p.add_argument("--moqt", action=argparse.BooleanOptionalAction, default=True,
                   help="instances fetch the cache holder's blocks over MOQT (default; --no-moqt: HTTPS)")
    p.add_argument("--port", type=int, default=0, help="the front end's port (default: a free one)")
    p.add_argument("--backend", choices=("memory", "redis"), default="memory",
                   help="where the PC keeps its state: 'memory' (one PC, the default) or 'redis' (a local "
                        "redis-server that kvsp up starts, and two PCs on it: leader and standby)")
    p.add_argument("--keep-running", action="store_true", help="leave the system up after the report")
    p.add_argument("--no-baseline", action="store_true", help="skip the run without cache")
    p.add_argument("--restart-delay", type=float, default=2.0, help="seconds before a dead process is restarted")
    add_workload_arguments(p)
    p.set_defaults(func=_up)

    w = sub.add_parser("workload", help="run the workload against a system started by kvsp up --keep-running")
    w.add_argument("--run-dir", required=True)
    add_workload_arguments(w)
    w.set_defaults(func=_workload)
