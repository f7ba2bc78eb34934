"""``kvsp workload`` against a system ``kvsp up --keep-running`` keeps: the same chats reuse the blocks
of the first run, the workload kills an instance with SIGKILL mid-stream (the pid from state.json),
``kvsp up``'s supervisor restarts it, and Ctrl-C still leaves no process.  The test engine keeps this
to seconds (the reference model's run is tests/test_up_e2e.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from control.deploy.environment import child_env
from tests.test_up_e2e import processes_mentioning, read_until


def test_kvsp_workload_on_a_kept_system_kills_and_the_supervisor_restarts(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    up = subprocess.Popen(
        [sys.executable, "-m", "control.cli", "up", "--run-dir", str(run_dir), "--model", "test", "--no-baseline",
         "--chats", "2", "--turns", "1", "--no-kill", "--keep-running", "--quiet", "--restart-delay", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=child_env(), cwd=tmp_path)
    try:
        output = read_until(up, "The system is up", 120)
        assert "The system is up" in output, output[-4000:]
        done = subprocess.run([sys.executable, "-m", "control.cli", "workload", "--run-dir", str(run_dir),
                               "--chats", "4",
                               "--turns", "2", "--kill-after", "0.25", "--quiet"], env=child_env(),
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        (folder,) = run_dir.glob("workload-*")
        fig = json.loads((folder / "report.json").read_text())
        assert fig["requests"]["completed"] == 8 and fig["requests"]["in_order"] is True
        kill = fig["kill"]
        assert kill is not None and kill["sessions"] and kill["completed"] == len(kill["sessions"])
        tokens = fig["tokens"]
        assert tokens["fetched_local"] + tokens["fetched_remote"] > 0
        state = json.loads((run_dir / "main" / "state.json").read_text())["processes"]
        deadline = time.monotonic() + 20
        while state[kill["instance"]]["incarnation"] < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            state = json.loads((run_dir / "main" / "state.json").read_text())["processes"]
        assert state[kill["instance"]]["incarnation"] == 2 and state[kill["instance"]]["pid"] is not None
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
        try:
            rest = up.communicate(timeout=60)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            up.kill()
            rest = up.communicate()[0].decode(errors="replace")
    assert up.returncode == 130, rest[-3000:]
    time.sleep(0.5)
    assert processes_mentioning(str(run_dir)) == []
