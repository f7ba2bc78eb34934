"""``kvsp up --backend redis`` (decision D7): kvsp up starts a local redis-server (with AOF) and the main
phase's two PCs on it (leader and standby) with their own IS, runs the same workload (an instance killed
with SIGKILL mid-stream included) and prints the report.  Then, on the kept system, the leading PC is
killed with SIGKILL in the middle of a streamed completion: the real front end and instances follow
the standby, the stream completes with every index once, and a greedy completion streamed across the
kill is identical to the same completion run undisturbed.  Ctrl-C leaves no process, Redis included.
The test engine and a small workload keep it to well under a minute on two cores.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from control.deploy.environment import child_env
from control.up.layout import Deployment
from kvsp.service.tls import TlsFiles, client_context
from tests.test_up_e2e import processes_mentioning, read_until

START_TIMEOUT_S = 150.0
STREAM_TOKENS = 300  # about 1.2 s of decoding at kvsp up's 4 ms per token: the kill lands mid-stream


def stream(url: str, body: dict[str, object], on_event: Callable[[int], None] | None = None) -> list[dict[str, object]]:
    """The ``kvsp`` labels of a streamed completion's token events, in the order received."""
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    labels: list[dict[str, object]] = []
    with urllib.request.urlopen(request, timeout=90) as resp:
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            if event["choices"][0].get("finish_reason") is None:
                labels.append(event["kvsp"])
                if on_event is not None:
                    on_event(len(labels))
    return labels


def roles_of(deployment: Deployment, context: ssl.SSLContext) -> dict[str, str]:
    """PC name -> its role, for the PCs that answer their health check."""
    out = {}
    for name in ("pc", "pc2"):
        try:
            with urllib.request.urlopen(deployment.uris[name] + "health", timeout=2, context=context) as resp:
                out[name] = json.loads(resp.read())["pc"]["role"]
        except OSError:
            continue
    return out


def leader_of(deployment: Deployment, context: ssl.SSLContext) -> str | None:
    return next((name for name, role in roles_of(deployment, context).items() if role == "leader"), None)


def kill_leader_mid_stream(deployment: Deployment, context: ssl.SSLContext,
                           body: dict[str, object]) -> list[dict[str, object]]:
    deadline = time.monotonic() + 30
    while sorted(roles_of(deployment, context).values()) != ["leader", "standby"]:  # both up, one leading
        assert time.monotonic() < deadline, roles_of(deployment, context)
        time.sleep(0.2)
    leader = leader_of(deployment, context)
    assert leader is not None
    state = Path(deployment.run_dir) / "main" / "state.json"
    killed: list[str] = []
    elected = acquisitions(deployment)

    def at_20(n: int) -> None:
        if n == 20 and not killed:
            pid = json.loads(state.read_text())["processes"][leader]["pid"]
            os.kill(int(pid), signal.SIGKILL)
            killed.append(leader)

    labels = stream(deployment.frontend_url, body, at_20)
    assert killed, "the completion ended before the leader was killed"
    deadline = time.monotonic() + 20
    while (leader_of(deployment, context) is None or acquisitions(deployment) == elected) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    # A PC leads again: the standby, or the killed one restarted by kvsp up, whichever took the lease first.
    assert leader_of(deployment, context) is not None and acquisitions(deployment) == elected + 1
    return labels


def acquisitions(deployment: Deployment) -> int:
    """Leader elections so far, from the PCs' logs (kept across a PC's restarts)."""
    logs = Path(deployment.run_dir) / "main" / "logs"
    return sum((logs / f"{name}.log").read_text().count("acquired the leader lease") for name in ("pc", "pc2"))


def test_kvsp_up_with_the_redis_backend_runs_the_workload_and_survives_the_leader(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    up = subprocess.Popen(
        [sys.executable, "-m", "control.cli", "up", "--backend", "redis", "--run-dir", str(run_dir), "--model", "test",
         "--no-baseline", "--chats", "3", "--turns", "2", "--max-tokens", "12", "--concurrency", "2",
         "--kill-after", "0.3", "--quiet", "--restart-delay", "0.5", "--keep-running"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=child_env(), cwd=tmp_path)
    try:
        output = read_until(up, "The system is up", START_TIMEOUT_S)
        assert "The system is up" in output, output[-6000:]
        deployment = Deployment.load(run_dir)
        assert deployment.redis_port is not None and f"redis: {deployment.redis_url}" in output
        roles = {p.name: p.roles for p in deployment.phases["main"]}
        assert (roles["pc"], roles["pc2"]) == ("pc,is", "pc,is") and "is" not in roles  # an IS on Redis in each
        fig = json.loads((run_dir / "report.json").read_text())
        assert fig["requests"]["completed"] == fig["requests"]["planned"] == 6, fig["requests"]
        assert fig["requests"]["in_order"] is True
        kill = fig["kill"]
        assert kill is not None and kill["completed"] == len(kill["sessions"]) > 0  # moved by the leading PC
        assert all(fig["checks"].values()), fig["checks"]
        logs = [(run_dir / "main" / "logs" / f"{name}.log").read_text() for name in ("pc", "pc2")]
        assert sum(log.count("acquired the leader lease") for log in logs) == 1  # one leader, one standby
        assert (run_dir / "redis" / "appendonlydir").is_dir()  # the AOF kvsp up asked for

        pki = run_dir / "pki"
        context = client_context(TlsFiles(pki / "up.pem", pki / "up.key", pki / "ca.pem"))
        greedy = {"model": deployment.model_name, "prompt": "The leader", "max_tokens": STREAM_TOKENS,
                  "temperature": 0}
        undisturbed = [label["token"] for label in stream(deployment.frontend_url, greedy)]
        for body in (greedy, {**greedy, "temperature": 1.0, "top_p": 0.9, "seed": 5}):
            labels = kill_leader_mid_stream(deployment, context, body)
            assert [label["index"] for label in labels] == list(range(STREAM_TOKENS))  # once each, in order
            if body is greedy:
                assert [label["token"] for label in labels] == undisturbed
            # the supervisor restarts the killed PC: it rejoins as the standby before the next kill
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
    assert processes_mentioning(str(run_dir)) == [], "a role process or redis-server outlived kvsp up"
