"""examples/vllm end to end: ``python3 -m examples.vllm`` as a user runs it, real processes, nothing mocked.

Two ``vllm serve`` servers from .venv-vllm, an IS, a relay and a holder as ``kvsp serve`` processes: B
must load the blocks A stored (MOQT through the relay) and answer exactly as without kvsp, and no process
of the example may outlive it, after a full run or after Ctrl-C.  The first test builds .venv-vllm with
.ci/vllm-env when it is absent (about 4 minutes); a machine where it cannot be built skips, saying why,
and ``KVSP_REQUIRE_VLLM=1`` turns that skip into a failure.  About 2 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from control.deploy.environment import child_env
from interop.vllm import VllmUnavailable, ensure_vllm_python

REPO = Path(__file__).resolve().parent.parent
RUN_S = 900  # two vLLM starts (30-60 s each on 2 idle cores) and the kvsp roles, with room for a busy machine


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    try:
        return ensure_vllm_python()
    except VllmUnavailable as exc:
        if os.environ.get("KVSP_REQUIRE_VLLM") == "1":
            pytest.fail(f"KVSP_REQUIRE_VLLM=1 and {exc}")
        pytest.skip(str(exc))


def _as_in_a_terminal() -> None:  # pragma: no cover - runs in the child between fork and exec
    # a test runner started in the background may hold SIGINT ignored, and Python keeps an ignored
    # SIGINT ignored; in a terminal it is not, and Ctrl-C raises KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def example(work: Path, python: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "examples.vllm", "--work-dir", str(work), *args], cwd=REPO,
                            env=child_env(KVSP_VLLM_PYTHON=str(python)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=_as_in_a_terminal)  # noqa: PLW1509


def survivors(work: Path, *, within_s: float = 0.0) -> list[str]:
    """Processes still in the example children's process groups (vLLM's engine core is in its server's),
    after at most ``within_s`` for a SIGKILLed grandchild to be gone (the example cannot reap those)."""
    deadline = time.monotonic() + within_s
    while (left := _in_groups(work)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _in_groups(work: Path) -> list[str]:
    groups = set(json.loads((work / "pids.json").read_text()).values())
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, session
        if int(fields[2]) in groups and fields[0] != "Z":
            left.append(stat[:80])
    return left


def test_the_example_shows_b_loading_what_a_stored(vllm_python: Path, tmp_path: Path) -> None:
    work = tmp_path / "run"
    proc = example(work, vllm_python)
    out, _ = proc.communicate(timeout=RUN_S)
    assert proc.returncode == 0, out[-6000:]
    r: dict[str, Any] = json.loads((work / "result.json").read_text())
    assert r["moqt"] and r["hit"], r
    blocks = r["a"]["prompt_tokens"] // r["block_tokens"]
    assert r["a"]["counters"]["stored_blocks"] == blocks >= 2  # every complete block of A's prompt
    assert all("moqt" in schemes for schemes in r["published_schemes"])  # the holder published via the relay
    assert r["reference_loaded_tokens"] == 0  # scope none: the connector did nothing
    hit = r["b"]["hit_request"]
    assert r["loaded_tokens"] == r["expected_loaded_tokens"] == blocks * r["block_tokens"] > 0, hit
    assert hit["hit_tokens"] == r["loaded_tokens"] and hit["recomputed_tokens"] == 0
    assert hit["digest_failures"] == 0 and hit["load_errors"] == 0
    assert r["outputs_equal"] and r["b"]["hit_output"] == r["b"]["reference_output"]
    assert len(r["b"]["hit_output"]) > 0
    assert hit["blocks_moqt"] == blocks and hit["blocks_https"] == 0  # every block by MOQT FETCH ...
    assert r["relay"]["objects_out"] >= blocks  # ... through the relay (one object per layer)
    assert "HIT:" in out and "loaded_tokens" in out
    assert survivors(work, within_s=10.0) == []


def test_ctrl_c_stops_every_process(vllm_python: Path, tmp_path: Path) -> None:
    work = tmp_path / "interrupted"
    proc = example(work, vllm_python)
    assert proc.stdout is not None
    for line in proc.stdout:  # until vLLM A has been started (its start-up takes far longer than this)
        if "vllm serve A starting" in line:
            break
    else:
        pytest.fail(f"the example ended before starting vLLM (status {proc.wait()})")
    deadline = time.monotonic() + 30
    while "vllm-a" not in json.loads((work / "pids.json").read_text()):  # written right after the fork
        assert time.monotonic() < deadline, "vLLM A was announced but not started"
        time.sleep(0.05)
    assert survivors(work), "the example's processes should be running now"
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-4000:]
    assert time.monotonic() - started < 60  # bounded: SIGTERM, 10 s, SIGKILL per process group
    assert "interrupted" in out
    assert survivors(work, within_s=10.0) == []
