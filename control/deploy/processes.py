"""``kvsp serve`` child processes: start one, wait until it listens, stop a group of them cleanly.

`control.deploy.supervisor` builds a supervised, restarting group on these; tests and benchmarks that
start role processes directly use them as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import IO

from control.deploy.environment import child_env


class StartError(Exception):
    """A role process did not come up; the message carries the tail of its log."""


def serve_argv(roles: str, config: Path | str) -> list[str]:
    """The command line of ``kvsp serve ROLES --config FILE`` run by this interpreter from this tree."""
    return [sys.executable, "-m", "control.cli", "serve", roles, "--config", str(config)]


def serve(roles: str, config: Path, *, cwd: Path | None = None, stdout: IO[bytes] | int | None = subprocess.DEVNULL,
          stderr: IO[bytes] | int | None = subprocess.PIPE) -> subprocess.Popen[bytes]:
    """Start ``kvsp serve ROLES --config CONFIG`` (in ``cwd``, by default the config's folder)."""
    return subprocess.Popen(serve_argv(roles, config), stdout=stdout, stderr=stderr, cwd=cwd or config.parent,
                            env=child_env())


def output_tail(proc: subprocess.Popen[bytes], log: Path | None = None, limit: int = 3000) -> str:
    """The end of what a (dead) process wrote: its log file, else its piped stderr."""
    if log is not None:
        return log.read_text(errors="replace")[-limit:] if log.exists() else ""
    return proc.stderr.read()[-limit:].decode(errors="replace") if proc.stderr else ""


async def wait_listening(name: str, port: int, proc: subprocess.Popen[bytes] | None, *, timeout: float = 60.0,
                         log: Path | None = None, deadline: float | None = None) -> None:
    """Until ``port`` on loopback accepts a TCP connection; `StartError` if ``proc`` exits first or time runs out."""
    deadline = time.monotonic() + timeout if deadline is None else deadline
    while time.monotonic() < deadline:
        if proc is None or proc.poll() is not None:
            code = None if proc is None else proc.returncode
            tail = "" if proc is None else output_tail(proc, log)
            raise StartError(f"{name} exited with status {code}; log tail:\n{tail}")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.05)
    tail = output_tail(proc, log) if log is not None and proc is not None else ""
    raise StartError(f"{name} did not listen on port {port} in time; log tail:\n{tail}")


def stop_all(procs: Iterable[subprocess.Popen[bytes]], *, grace_s: float = 10.0) -> None:
    """SIGTERM every process (a clean shutdown: withdrawals, drains), then SIGKILL what is left after ``grace_s``."""
    procs = list(procs)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace_s)


@contextlib.asynccontextmanager
async def role_processes(roles: Mapping[str, str], folder: Path, ports: Mapping[str, int], *, timeout: float = 60.0,
                         grace_s: float = 10.0) -> AsyncIterator[dict[str, subprocess.Popen[bytes]]]:
    """A group of ``kvsp serve`` processes (name -> roles, each with ``folder/NAME.toml``), all listening on
    their ``ports`` for the block, then stopped with `stop_all`.  `control.deploy.supervisor` is the
    restarting, logging group ``kvsp up`` runs."""
    procs = {name: serve(r, folder / f"{name}.toml", cwd=folder) for name, r in roles.items()}
    try:
        for name, proc in procs.items():
            await wait_listening(name, ports[name], proc, timeout=timeout)
        yield procs
    finally:
        stop_all(procs.values(), grace_s=grace_s)


def kill(proc: subprocess.Popen[bytes], *, timeout_s: float = 10.0) -> None:
    """SIGKILL a role process, frozen or not, and reap it: no orphan outlives its caller."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGCONT)
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout_s)
