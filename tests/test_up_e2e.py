"""``kvsp up`` end to end, as a user runs it: the reference model, every role a process, a short
workload with shared prefixes, one instance killed with SIGKILL mid-stream, the report, then the
system kept running for the user's own requests (bad ones included) until Ctrl-C, with no process
left.  (``kvsp workload`` against a kept system: tests/test_up_workload.py, on the test engine.)

One run of about a minute on two cores: the baseline and the main system start side by side (two
instances each load torch), then the workload runs twice (the baseline without cache, then the main
run).  Every assertion reads the figures of report.json or what the front end answers.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from control.deploy.environment import child_env
from control.up.layout import Deployment

START_TIMEOUT_S = 240.0  # the whole run until "The system is up" (about a minute; generous for loaded CI)


def read_until(proc: subprocess.Popen[bytes], marker: str, timeout_s: float) -> str:
    """kvsp up's output until a line with ``marker`` (or its exit, or the timeout)."""
    assert proc.stdout is not None
    out = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while marker.encode() not in out and time.monotonic() < deadline:
            if sel.select(timeout=1.0):
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
    return out.decode(errors="replace")


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions ``text`` (the run directory: every role's config)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (entry / "stat").read_text().split(") ", 1)[1][:1]
            except OSError:
                continue
            if text in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


def test_kvsp_up_runs_reports_serves_and_shuts_down_without_orphans(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "control.cli", "up", "--run-dir", str(run_dir), "--chats", "4", "--turns", "2",
         "--max-tokens", "32", "--concurrency", "2", "--kill-after", "0.25", "--keep-running", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=child_env(), cwd=tmp_path)
    try:
        output = read_until(proc, "The system is up", START_TIMEOUT_S)
        assert "The system is up" in output, output[-6000:]
        fig = json.loads((run_dir / "report.json").read_text())
        check_report(fig)
        for plot in ("ttft_cdf.png", "tokens.png", "timeline.png"):
            assert (run_dir / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        check_front_end(Deployment.load(run_dir))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # what Ctrl-C does
        try:
            rest = proc.communicate(timeout=60)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            proc.kill()
            rest = proc.communicate()[0].decode(errors="replace")
    assert proc.returncode == 130, rest[-3000:]
    assert "every process is shut down" in rest
    time.sleep(0.5)
    assert processes_mentioning(str(run_dir)) == [], "a role process outlived kvsp up"
    state = json.loads((run_dir / "main" / "state.json").read_text())["processes"]
    assert all(entry["pid"] is None for entry in state.values())


def check_report(fig: dict[str, object]) -> None:
    requests, lookup, kill, outputs = fig["requests"], fig["lookup"], fig["kill"], fig["outputs_vs_baseline"]
    assert isinstance(requests, dict) and isinstance(lookup, dict)
    assert requests["sent"] == requests["planned"] == 8
    assert requests["completed"] == 8 and requests["failed"] == 0, requests["errors"]
    assert requests["in_order"] is True
    assert lookup["hit_ratio"] is not None and lookup["hit_ratio"] > 0  # shared system prompts and documents
    tokens = fig["tokens"]
    assert isinstance(tokens, dict) and tokens["fetched_local"] + tokens["fetched_remote"] > 0
    # The killed instance's sessions moved and finished with exactly the no-failure run's tokens.
    assert isinstance(kill, dict), "no instance was killed"
    assert kill["sessions"] and kill["completed"] == len(kill["sessions"])
    assert kill["moved"] == len(kill["sessions"])
    assert kill["identical_to_baseline"] == len(kill["sessions"])
    assert isinstance(outputs, dict) and outputs["compared"] == 8 and outputs["differing"] == []
    migrations = fig["migrations"]
    assert isinstance(migrations, dict) and migrations["pc_migrations"] >= 1
    assert migrations["resume_ms_max"] is not None
    assert fig["digest_failures"] == 0
    ttft = fig["ttft"]
    assert isinstance(ttft, dict) and ttft["without_cache"]["requests"] == 8
    assert all(fig["checks"].values()), fig["checks"]  # type: ignore[attr-defined]
    processes = fig["processes"]
    assert isinstance(processes, dict) and processes[kill["instance"]]["restarts"] == 1  # restarted after the kill


def check_front_end(deployment: Deployment) -> None:
    url = deployment.frontend_url + "/v1/completions"
    model = deployment.model_name
    bad = [
        (b'{"model": ', 400),
        (json.dumps({"model": "no-such-model", "prompt": "hi"}).encode(), 404),
        (json.dumps({"model": model, "prompt": "word " * 20_000}).encode(), 413),
        (json.dumps({"model": model, "prompt": "hi", "max_tokens": -3}).encode(), 400),
    ]
    for body, status in bad:
        got, doc = post(url, body)
        assert got == status, doc
        assert doc["status"] == status and isinstance(doc["error"], dict)
    got, doc = post(url, json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0}).encode())
    assert got == 200, doc
    choices = doc["choices"]
    assert isinstance(choices, list) and choices[0]["finish_reason"] in ("length", "stop")
    assert doc["usage"]["completion_tokens"] == len(doc["kvsp"]["tokens"]) <= 4  # type: ignore[index]

