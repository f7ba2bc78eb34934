"""Role processes of one phase, supervised: started, watched, restarted after a crash, stopped cleanly.

Each child runs ``python -m control.cli serve ROLES --config FILE`` in its own session (so a terminal's
Ctrl-C reaches only the supervisor, which then stops the children in order) and, on Linux, with a
parent-death signal, so that no child outlives a supervisor that was itself killed.  Output goes to
``logs/NAME.log`` in the run directory, appended across restarts.  ``kvsp up`` runs each phase of its
deployment under one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from control.deploy.environment import child_env
from control.deploy.ports import port_of
from control.deploy.processes import StartError, serve_argv, wait_listening

__all__ = ["Child", "Proc", "StartError", "Supervisor"]

log = logging.getLogger("control.up")

PR_SET_PDEATHSIG = 1
STOP_ORDER = ("fe", "ii", "relay", "h", "pc")  # front end first, the PC (and its IS) last


@dataclass(frozen=True, slots=True)
class Proc:
    """One supervised role process: ``kvsp serve ROLES --config CONFIG``, output appended to ``log``."""

    name: str
    roles: str  # comma-separated, as `kvsp serve` takes them
    uri: str
    config: str  # path relative to the run directory
    log: str
    instance: bool = False


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Child:
    proc: Proc
    popen: subprocess.Popen[bytes] | None = None
    incarnation: int = 0
    restart_at: float | None = None  # when a dead child is started again
    killed_at: list[float] = field(default_factory=list)
    restarts: int = 0


class Supervisor:
    """Starts ``procs`` (one phase), restarts any that die after ``restart_delay_s``, stops them all."""

    def __init__(self, run_dir: Path, procs: Sequence[Proc], *, restart_delay_s: float = 2.0,
                 state_file: str = "state.json", on_event: Callable[[str], None] | None = None) -> None:
        self.run_dir = run_dir
        self.state_file = run_dir / state_file
        self.children = {p.name: Child(p) for p in procs}
        self.restart_delay_s = restart_delay_s
        self.stopping = False
        self.on_event = on_event or (lambda text: log.info("%s", text))
        self._watch: asyncio.Task[None] | None = None

    # -- processes ---------------------------------------------------------------------------------
    def _spawn(self, child: Child) -> None:
        p = child.proc
        logfile: IO[bytes]
        with (self.run_dir / p.log).open("ab") as logfile:
            logfile.write(f"--- kvsp up: start {p.name} ({p.roles}) #{child.incarnation + 1} at "
                          f"{time.strftime('%H:%M:%S')} ---\n".encode())
            logfile.flush()
            child.popen = subprocess.Popen(
                serve_argv(p.roles, self.run_dir / p.config),
                stdin=subprocess.DEVNULL, stdout=logfile, stderr=subprocess.STDOUT, cwd=self.run_dir,
                env=child_env(), start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None)  # noqa: PLW1509
        child.incarnation += 1
        child.restart_at = None
        self._save_state()

    def log_tail(self, name: str, limit: int = 3000) -> str:
        path = self.run_dir / self.children[name].proc.log
        return path.read_text(errors="replace")[-limit:] if path.exists() else ""

    async def start(self, timeout_s: float = 60.0) -> None:
        """Start every process and wait until each listens; a process that exits first is an error."""
        for child in self.children.values():
            self._spawn(child)
        deadline = time.monotonic() + timeout_s
        for name in self.children:
            await self.wait_listening(name, deadline)
        self._watch = asyncio.create_task(self._watcher())

    async def wait_listening(self, name: str, deadline: float) -> None:
        child = self.children[name]
        await wait_listening(name, port_of(child.proc.uri), child.popen, deadline=deadline,
                             log=self.run_dir / child.proc.log)

    async def _watcher(self) -> None:
        while not self.stopping:
            now = time.monotonic()
            for name, child in self.children.items():
                if child.popen is None or self.stopping:
                    continue
                code = child.popen.poll()
                if code is not None and child.restart_at is None:
                    child.restart_at = now + self.restart_delay_s
                    self.on_event(f"{name} exited ({_describe(code)}); restarting in {self.restart_delay_s:g} s")
                elif code is not None and child.restart_at is not None and now >= child.restart_at:
                    child.restarts += 1
                    self._spawn(child)
                    self.on_event(f"{name} restarted (incarnation {child.incarnation})")
            await asyncio.sleep(0.1)

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> float:
        """Send ``sig`` to a child (the workload's failure injection); the monotonic time it was sent."""
        child = self.children[name]
        assert child.popen is not None
        when = time.monotonic()
        child.popen.send_signal(sig)
        child.killed_at.append(when)
        return when

    def pid(self, name: str) -> int | None:
        popen = self.children[name].popen
        return popen.pid if popen is not None and popen.poll() is None else None

    async def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM in order (front end first, PC last), SIGKILL after ``grace_s``, reap everything."""
        self.stopping = True
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        ordered = sorted(self.children.values(), key=lambda c: _stop_rank(c.proc.name))
        for child in ordered:
            popen = child.popen
            if popen is None or popen.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                popen.send_signal(signal.SIGCONT)
                popen.terminate()
            await _wait(popen, grace_s / 2)
        for child in ordered:
            popen = child.popen
            if popen is not None and popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    popen.kill()
                await _wait(popen, grace_s)
        self._save_state()

    def _save_state(self) -> None:
        state = {name: {"pid": c.popen.pid if c.popen is not None and c.popen.poll() is None else None,
                        "incarnation": c.incarnation, "uri": c.proc.uri, "instance": c.proc.instance}
                 for name, c in self.children.items()}
        self.state_file.write_text(json.dumps({"supervisor": os.getpid(), "processes": state}, indent=2))


def _stop_rank(name: str) -> int:
    return next((i for i, prefix in enumerate(STOP_ORDER) if name.startswith(prefix)), len(STOP_ORDER))


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"status {code}"


async def _wait(popen: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while popen.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
