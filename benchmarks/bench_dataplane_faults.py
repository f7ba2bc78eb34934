"""Dead peers on the data plane (issue 17 item 3): real ``kvsp serve`` relays and holders, killed or frozen.

Every role is a ``kvsp serve`` process run from a source tree (``--tree``), and so is the client side:
the measurement runs in a child interpreter with that tree first on ``PYTHONPATH`` (this file is run
by path and uses only APIs both trees have), so ``--compare DIR`` measures the tree before a change
and this one in the same run, on the same machine. Blocks are 32 layers of 1 MiB (32 MiB).

* ``fallback_after_stall`` / ``fallback_total``: a block client FETCHes a block through its rack relay
  (``kvsp.client.fetch.BlockFetcher``, the relay's record ranked first, the holder's HTTPS replica
  second); the moment its first layer has arrived the relay is frozen and SIGKILLed. ``after_stall``
  is the longest pause in layer delivery after the kill (the stall until the HTTPS replica's first new
  layer); ``total`` runs from the kill to the whole block, whose octets must equal those stored.
  Goal: fallback at most 1 s after the stall (loopback).
* ``subscribe_to_stopped_publisher`` / ``subscribe_to_killed_publisher``: a SUBSCRIBE at the relay for a
  namespace a holder announced there, after that holder was SIGSTOPped or SIGKILLed (it never closed
  its session): seconds until the subscriber has an answer (an error). The baseline is the same
  request while the holder was alive (TRACK_DOES_NOT_EXIST at once). The wait is capped (``cap_s``);
  a capped figure means "no answer within the cap". Goal: an error within a few seconds.
* ``holder_relay_reconnects_when_idle``: a holder connected to a relay whose QUIC idle timeout is 2 s,
  with no traffic for ``idle_s``; reconnects counted in the holder's log ("connected to relay").
  Goal: 0 (the session is kept up by keepalive PINGs).

Run: ``python -m benchmarks.bench_dataplane_faults [--quick] [--tree DIR] [--compare DIR]``; prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp

from control.deploy import configs
from control.deploy.pki import DevPki
from control.deploy.ports import free_udp_port
from control.deploy.processes import kill, wait_listening
from kvsp.client.fetch import BlockFetcher, FetchOptions
from kvsp.client.holder import HolderClient
from kvsp.client.moqt import MoqtBlockClient
from kvsp.container import encode_container
from kvsp.descriptor import CompatDescriptor
from kvsp.identifiers import role_id
from kvsp.records import LookupRequest
from kvsp.registry import Codec
from moqt.api import Subscriber, SubscribeRefused
from moqt.errors import MoqtError
from moqt.quic import EndpointConfig
from moqt.wire import Namespace

# The client side runs as a child on the measured tree's path, whose benchmarks package may predate
# benchmarks.trees: this module imports only what every tree has, and trees.py in the parent alone.
ROOT: Final = Path(__file__).resolve().parent.parent
SCOPE: Final = bytes(range(16))
# 32 layers of 256 tokens x 8 heads x 128 dims in bf16: 512 KiB per K or V section, 32 MiB per block
DESCRIPTOR: Final = CompatDescriptor(model="dataplane-faults", model_digest=bytes(32), tokenizer_digest=bytes(32),
                                     layers=32, kv_heads=8, head_dim=128, kv_dtype="bf16", positional="rope",
                                     block_tokens=256)
COMPAT: Final = DESCRIPTOR.compat_id
SECTION: Final = DESCRIPTOR.block_tokens * DESCRIPTOR.kv_heads * DESCRIPTOR.head_dim * 2
TRACK: Final = b"raw"
KEEPALIVE_RELAY_IDLE_S: Final = 2.0
CONNECTED: Final = "connected to relay"  # the holder's UpstreamLink logs this on every new session


@dataclass
class World:
    """Role processes of one source tree on loopback, with a dev PKI; `close` kills every one."""

    folder: Path
    tree: Path
    names: Sequence[str]
    pki: DevPki = field(init=False)
    moqt: dict[str, str] = field(default_factory=dict)  # relays' and holders' moqt:// URIs
    roles: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pki = DevPki.make(self.folder / "pki", ["is", "client", *self.names])
        (self.folder / "model.json").write_text(json.dumps(DESCRIPTOR.to_json()))
        members = [self.pki.uri(n) for n in ["is", "client", *self.names]]
        configs.PolicyFile(scopes=[configs.ScopeEntry.open_to(SCOPE, members)]).write(self.folder / "policy.toml")
        self._write("is", configs.IndexSection(descriptors=["model.json"]))

    def _write(self, name: str, section: Any) -> None:
        self.roles[name] = str(section.ROLE)
        configs.RoleFile([section.ROLE], self.pki.uri(name), configs.Tls.of(name, "pki"), "policy.toml",
                         sections=[section]).write(self.folder / f"{name}.toml")

    def relay(self, name: str, **options: Any) -> str:
        """Configure relay ``name`` (``options``: `configs.RelaySection` fields); returns its moqt:// URI."""
        port = free_udp_port()
        uri = self.moqt[name] = f"moqt://127.0.0.1:{port}/relay"
        self._write(name, configs.RelaySection(listen=f"127.0.0.1:{port}", uri=uri, drain_s=0.5, **options))
        return uri

    def holder(self, name: str, relay: str, *, index: bool = True) -> None:
        """Configure holder ``name``, publishing through ``relay`` (and to the IS with ``index``)."""
        port = free_udp_port()
        uri = self.moqt[name] = f"moqt://127.0.0.1:{port}/holder"
        self._write(name, configs.HolderSection(
            index=self.pki.uri("is") if index else None, descriptors=["model.json"], host_capacity_octets=1 << 28,
            moqt_listen=f"127.0.0.1:{port}", moqt_uri=uri, moqt_relay=self.moqt[relay]))

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")

    async def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(self.tree), "PYTHONUNBUFFERED": "1"}
        for name, role in self.roles.items():
            with (self.folder / f"{name}.log").open("wb") as out:
                self.procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "control.cli", "serve", role, "--config", str(self.folder / f"{name}.toml")],
                    cwd=self.folder, env=env, stdout=subprocess.DEVNULL, stderr=out)
        deadline = time.monotonic() + 90
        for name, proc in self.procs.items():
            await wait_listening(name, self.pki.port(name), proc, log=self.folder / f"{name}.log", deadline=deadline)

    def signal(self, name: str, sig: int) -> None:
        proc = self.procs[name]
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait(10)

    def freeze_and_kill(self, name: str) -> None:
        """SIGSTOP first: the relay sends nothing more from this instant, then dies without a goodbye."""
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGSTOP)
        os.kill(proc.pid, signal.SIGKILL)

    def close(self) -> None:
        for proc in self.procs.values():
            kill(proc)

    def config(self, name: str) -> EndpointConfig:
        files = self.pki.files(name)
        return EndpointConfig.from_files(files.cert, files.key, files.ca)

    def namespace(self, holder: str, key: bytes) -> Namespace:
        """The namespace of block ``key`` produced by ``holder`` (D3), under the prefix it announces."""
        return (b"kvsp", COMPAT.hex().encode(), SCOPE.hex().encode(), role_id(self.pki.uri(holder)).encode(),
                key.hex().encode())

    async def relay_stats(self, name: str) -> dict[str, float]:
        ssl = self.pki.client_ssl("client")
        async with aiohttp.ClientSession() as http, \
                http.get(self.pki.uri(name) + "relay/stats", ssl=ssl) as resp:
            resp.raise_for_status()
            body: dict[str, float] = await resp.json()
            return body

    async def wait_namespaces(self, relay: str, count: int, timeout_s: float = 60.0) -> None:
        """Until ``count`` holders have announced their prefixes at ``relay`` (their sessions are up)."""
        async with asyncio.timeout(timeout_s):
            while True:
                with contextlib.suppress(OSError, aiohttp.ClientError):
                    if (await self.relay_stats(relay))["namespaces"] >= count:
                        return
                await asyncio.sleep(0.1)


# -- the scenarios (each usable on its own, by the tests too) -------------------------------------------
def block_bytes(seed: int) -> bytes:
    sections = [(bytes([(seed + 2 * i) % 251]) * SECTION, bytes([(seed + 2 * i + 1) % 251]) * SECTION)
                for i in range(DESCRIPTOR.layers)]
    return bytes(encode_container(Codec.RAW, 0, DESCRIPTOR.block_tokens, sections))


async def fallback(world: World, relay: str, holder: str, *, seed: int = 1,
                   timeout_s: float = 60.0) -> dict[str, object]:
    """The relay is frozen and killed one layer into a FETCH through it (see the module docstring)."""
    session = world.pki.session("client")
    files = world.pki.files("client")
    moqt = MoqtBlockClient.from_files(files.cert, files.key, files.ca)
    block, key = block_bytes(seed), os.urandom(32)
    try:
        await HolderClient(session).put_block(world.pki.uri(holder), COMPAT, SCOPE, key, block)
        fetcher = BlockFetcher(session, world.pki.uri("is"), moqt=moqt,
                               options=FetchOptions(local_relay=world.moqt[relay]))
        await _wait_records(fetcher, key)
        marks: list[float] = []

        def on_layer(_: int, __: object) -> None:
            marks.append(time.monotonic())
            if len(marks) == 1:
                world.freeze_and_kill(relay)

        result = await asyncio.wait_for(fetcher.fetch(SCOPE, COMPAT, [key], block_tokens=DESCRIPTOR.block_tokens,
                                                      on_layer=on_layer), timeout_s)
        done = time.monotonic()
    finally:
        await moqt.close()
        await session.close()
    world.procs[relay].wait(10)
    loaded = result.blocks[0] if result.blocks else None
    octets = bytes(loaded.container.header.encode()) + bytes(loaded.container.data) if loaded else b""
    gaps = [b - a for a, b in itertools.pairwise(marks)]
    return {"total_s": round(done - marks[0], 4) if marks else None,
            "after_stall_s": round(max(gaps), 4) if gaps else None, "layers_delivered": len(marks),
            "identical": octets == block,
            "attempts": [[a.holder.split(":")[0], a.outcome.value, a.detail[:120]] for a in result.attempts]}


async def _wait_records(fetcher: BlockFetcher, key: bytes) -> None:
    """Until the IS lists the block's HTTPS and MOQT replicas (the holder publishes both after the PUT)."""
    async with asyncio.timeout(30):
        while True:
            answer = await fetcher.index.lookup(LookupRequest(SCOPE, COMPAT, (key,)))
            schemes = {r.holder.split(":")[0] for r in answer.replicas[0]} if answer.matched else set()
            if {"https", "moqt"} <= schemes:
                return
            await asyncio.sleep(0.05)


async def answer_time(sub: Subscriber, namespace: Namespace, cap_s: float) -> tuple[float, str]:
    """Seconds until a SUBSCRIBE is answered, and the answer (``no answer`` at the cap)."""
    start = time.monotonic()
    try:
        async with sub.subscribe(namespace, TRACK, end_group=0, timeout_s=cap_s) as objects:
            await objects.answered()
        answer = "SUBSCRIBE_OK"
    except SubscribeRefused as exc:
        answer = f"SUBSCRIBE_ERROR {getattr(exc.error, 'name', exc.error)}: {exc.reason}"
    except TimeoutError:
        answer = "no answer"
    except (MoqtError, ConnectionError) as exc:
        answer = f"{type(exc).__name__}: {exc}"
    return time.monotonic() - start, answer[:160]


async def subscribe_to_vanished(world: World, relay: str, holder: str, sig: int, cap_s: float) -> dict[str, object]:
    """A SUBSCRIBE routed to ``holder`` while alive, then after ``sig`` (SIGSTOP or SIGKILL) froze or killed it."""
    sub = await Subscriber.connect(world.moqt[relay], world.config("client"), timeout_s=cap_s)
    try:
        alive_s, alive = await answer_time(sub, world.namespace(holder, bytes(32)), cap_s)
        world.signal(holder, sig)
        dead_s, dead = await answer_time(sub, world.namespace(holder, bytes([1]) * 32), cap_s)
    finally:
        await sub.close()
    return {"alive_s": round(alive_s, 4), "alive_answer": alive, "dead_s": round(dead_s, 4), "dead_answer": dead,
            "capped": dead == "no answer"}


def reconnects(world: World, holder: str) -> int:
    """New sessions the holder made to its relay after its first one."""
    return max(0, world.log(holder).count(CONNECTED) - 1)


async def reconnects_within(world: World, holder: str, period_s: float) -> int:
    """New sessions the holder makes to its relay in the next ``period_s`` (traffic elsewhere goes on)."""
    before = reconnects(world, holder)
    await asyncio.sleep(period_s)
    return reconnects(world, holder) - before


# -- one tree, in this interpreter -----------------------------------------------------------------------
def plan(world: World, reps: int) -> None:
    """Every node of a measurement: a relay with the subscribe victims, relay/holder pairs for the FETCH
    (each rep kills its relay), and the keepalive pair with a short relay idle timeout."""
    world.relay("relay-s")
    for i in range(reps):
        world.holder(f"hs{i}", "relay-s", index=False)
        world.holder(f"hx{i}", "relay-s", index=False)
        world.relay(f"relay-f{i}")
        world.holder(f"hf{i}", f"relay-f{i}")
    world.relay("relay-k", idle_timeout_s=KEEPALIVE_RELAY_IDLE_S)
    world.holder("hk", "relay-k", index=False)


def names(reps: int) -> list[str]:
    out = ["relay-s", "relay-k", "hk"]
    for i in range(reps):
        out += [f"hs{i}", f"hx{i}", f"relay-f{i}", f"hf{i}"]
    return out


async def measure(tree: Path, quick: bool) -> dict[str, object]:
    reps, cap_s = (1, 12.0) if quick else (3, 40.0)
    idle_s = 4 * KEEPALIVE_RELAY_IDLE_S if quick else 10 * KEEPALIVE_RELAY_IDLE_S
    with tempfile.TemporaryDirectory(prefix="kvsp-dpf-") as tmp:
        world = World(Path(tmp), tree, names(reps))
        plan(world, reps)
        idle: asyncio.Task[int] | None = None
        try:
            await world.start()
            await world.wait_namespaces("relay-s", 2 * reps)
            await world.wait_namespaces("relay-k", 1)
            idle = asyncio.create_task(reconnects_within(world, "hk", idle_s))  # idles while the rest is measured
            stopped = [await subscribe_to_vanished(world, "relay-s", f"hs{i}", signal.SIGSTOP, cap_s)
                       for i in range(reps)]
            killed = [await subscribe_to_vanished(world, "relay-s", f"hx{i}", signal.SIGKILL, cap_s)
                      for i in range(reps)]
            fetches = []
            for i in range(reps):
                await world.wait_namespaces(f"relay-f{i}", 1)
                fetches.append(await fallback(world, f"relay-f{i}", f"hf{i}", seed=i))
            keepalive = {"idle_s": idle_s, "relay_idle_timeout_s": KEEPALIVE_RELAY_IDLE_S, "reconnects": await idle}
        finally:
            if idle is not None:
                idle.cancel()
            world.close()
    return {"tree": str(tree), "reps": reps, "cap_s": cap_s, "fallback": fetches, "subscribe_stopped": stopped,
            "subscribe_killed": killed, "keepalive": keepalive}


# -- the suite: each tree measured in a child interpreter ---------------------------------------------------
def measure_tree(tree: Path, quick: bool, timeout_s: float = 600.0) -> dict[str, object]:
    """`measure` in a fresh interpreter importing kvsp from ``tree`` (this file, run by path)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--tree", str(tree), *(["--quick"] * quick)]
    done = subprocess.run(argv, env=env, cwd=tree, capture_output=True, timeout=timeout_s, check=False)
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.decode(errors="replace")[-2000:]
        raise RuntimeError(f"measuring {tree} failed ({done.returncode}): {tail}")
    result: dict[str, object] = json.loads(lines[-1])
    return result


def _sample(values: Sequence[object]) -> Any:
    from benchmarks.timing import Sample  # noqa: PLC0415  # the parent only: the child may run another tree

    return Sample.of([float(v) for v in values if isinstance(v, int | float)] or [float("nan")])


def rows(result: dict[str, Any], baseline: dict[str, Any] | None) -> list[dict[str, object]]:
    from benchmarks.timing import add_check, case  # noqa: PLC0415

    def pick(doc: dict[str, Any] | None, group: str, key: str) -> Any:
        return None if doc is None else _sample([r[key] for r in doc[group]])

    out = []
    stall = case("fallback_after_stall", pick(result, "fallback", "after_stall_s"),
                 pick(baseline, "fallback", "after_stall_s"), "HTTPS fallback <= 1 s after the stall (loopback)")
    stall["median_s"] = stall["value"]["median_s"]  # type: ignore[index]
    out.append(add_check(stall, "median_s", "<=", 1.0))
    total = case("fallback_total", pick(result, "fallback", "total_s"), pick(baseline, "fallback", "total_s"),
                 "relay killed one layer into a 32 MiB FETCH: whole block via HTTPS, identical octets")
    total["not_identical"] = sum(not r["identical"] for r in result["fallback"])
    out.append(add_check(total, "not_identical", "<=", 0))
    for group, name in (("subscribe_stopped", "stopped"), ("subscribe_killed", "killed")):
        row = case(f"subscribe_to_{name}_publisher", pick(result, group, "dead_s"),
                   pick(baseline, group, "dead_s") if baseline else pick(result, group, "alive_s"),
                   f"an error within a few seconds (baseline: {'the tree compared' if baseline else 'alive'})")
        row["answers"] = [r["dead_answer"] for r in result[group]]
        row["median_s"] = row["value"]["median_s"]  # type: ignore[index]
        out.append(add_check(row, "median_s", "<=", 5.0))
    before = baseline["keepalive"]["reconnects"] if baseline else None
    idle = case("holder_relay_reconnects_when_idle", result["keepalive"]["reconnects"], before,
                f"0 reconnects over {result['keepalive']['idle_s']} s idle (relay idle timeout "
                f"{KEEPALIVE_RELAY_IDLE_S} s)", unit="reconnects")
    out.append(add_check(idle, "value", "<=", 0))
    return out


def run(quick: bool = False, *, tree: Path = ROOT, compare: Path | None = None) -> dict[str, object]:
    baseline = measure_tree(compare, quick) if compare is not None else None
    result = measure_tree(tree, quick)
    params: dict[str, object] = {"tree": str(tree), "block_octets": DESCRIPTOR.layers * 2 * SECTION,
                                 "measured": result}
    if baseline is not None:
        params |= {"baseline_tree": str(compare), "baseline": baseline}
    return {"name": "dataplane_faults", "params": params, "cases": rows(result, baseline)}


def _main() -> None:
    if "--child" in sys.argv[1:]:
        child = argparse.ArgumentParser()
        child.add_argument("--child", action="store_true")
        child.add_argument("--quick", action="store_true")
        child.add_argument("--tree", type=Path, default=ROOT)
        args = child.parse_args()
        print(json.dumps(asyncio.run(measure(args.tree, args.quick))))
        return
    from benchmarks.trees import print_run, tree_parser  # noqa: PLC0415 (see ROOT)

    print_run(run, tree_parser(__doc__, "the checkout to measure (roles and client)").parse_args())


if __name__ == "__main__":
    _main()
