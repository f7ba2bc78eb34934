"""MOQT over both QUIC back-ends (aioquic, picoquic via aiopquic) beside HTTPS, in one run, on loopback.

aiopquic exists for Python >= 3.12 only, so every party runs as a child process of the picoquic venv's
interpreter (``.ci/pico-env``, or ``$KVSP_PICO_PYTHON``): aioquic, picoquic and HTTPS are compared on one
interpreter, uvloop everywhere, each party in its own process (benchmarks/pico_parties.py); this process
(any Python) only orchestrates. Per back-end: a publisher of stored blocks (32 layers, one MOQT object
per layer, as bench_moqt and bench_relay lay them out: 2 MiB = 64 KiB objects, 16 MiB = 512 KiB), a relay
(``relay.server.Relay``, whose upstream leg dials the publisher: both legs on the same back-end, from one
``EndpointConfig``) and a subscriber process (``BLOCK_CLIENT_QUIC`` settings, one session direct and one
through the relay); for HTTPS an aiohttp server and client over mutual TLS 1.3 (a keep-alive pool). aioquic
peers authenticate by certificate, picoquic clients by D3 token (a picoquic server sees no certificate).
Nothing verifies digests on either path: the rows compare transports, not kvsp's checks.

* ``fetch-{2,16}MiB-c{1,8}-{picoquic,aioquic}``: whole-block FETCH throughput against HTTPS GET (ratio =
  HTTPS time / MOQT time; median batch of ``requests`` blocks, ``c`` in flight). Goal: picoquic >= 1.5x
  HTTPS at 2 MiB. ``mib_per_s`` has all three; ``cpu_ms_per_block`` every process's user+sys CPU per block
  (``loop_ms_per_block``: the event-loop thread's part; the rest is picoquic's network thread).
* ``first-layer-2MiB-c1-{picoquic,aioquic}``: time to the first object over time to the last, one FETCH at a
  time (ratio = first / whole). Goal: <= 0.125. ``ms`` also has HTTPS's first layer (layer-by-layer writes).
* ``relay-hop-block-{q}`` / ``relay-hop-first-object-{q}``: FETCH through the relay on a cache miss (every
  block fetched through it once) against FETCH from the publisher directly, alternated. Goals: throughput
  >= 0.8x direct (ratio = direct time / relay time), first object <= 1.3x direct.
* ``cpu-per-block-2MiB``: CPU per 2 MiB block of every process (publisher, relay, subscriber; HTTPS server
  and client), picoquic's total against HTTPS's (informational).

``goals`` lists each goal with its figure; ``profile`` is a cProfile (CPU time, event-loop thread) of the
picoquic parties over a few direct and relayed fetches, with each party's thread split.
Run: ``python -m benchmarks.bench_picoquic [--quick] [--out FILE]``; prints JSON (and writes FILE).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from benchmarks.pico_parties import BLOCKS, ETHERNET, LAYERS, PREFIX
from benchmarks.timing import Sample, case
from interop.pico import ensure_pico_python as pico_python  # the venv: $KVSP_PICO_PYTHON or .ci/pico-env
from kvsp.pki import RoleSpec, make_dev_pki
from moqt.auth import issue_token

ROOT: Final = Path(__file__).resolve().parents[1]
QUICS: Final = ("picoquic", "aioquic")
TRANSPORTS: Final = (*QUICS, "https")
ROLE_URIS: Final = {"publisher": "https://127.0.0.1/bench-publisher/", "relay": "https://127.0.0.1/bench-relay/",
                    "https": "https://127.0.0.1/bench-https/", "subscriber": "https://bench-subscriber.test/"}
PICO_OVER_HTTPS: Final = 1.5
FIRST_OVER_WHOLE: Final = 0.125
RELAY_THROUGHPUT: Final = 0.8
RELAY_FIRST: Final = 1.3
REPLY_TIMEOUT_S: Final = 180.0


@dataclass(frozen=True, slots=True)
class Options:
    reps: int = 7  # timed repetitions per figure (after one untimed round)
    batch_mib: int = 64  # octets per throughput batch
    first_reps: int = 31
    relay_reps: int = 15
    profile_fetches: int = 16  # 0: no profile
    ethernet_reps: int = 3  # batches of BLOCKS 2 MiB blocks at Ethernet's MTU (aioquic takes ~0.1 s per block)
    sizes: tuple[int, ...] = (2, 16)
    concurrency: tuple[int, ...] = (1, 8)

    @classmethod
    def quick(cls) -> Options:
        return cls(reps=3, batch_mib=16, first_reps=9, relay_reps=5, profile_fetches=8, ethernet_reps=1)

    @classmethod
    def tiny(cls) -> Options:
        """Every row once, as fast as it goes: the smoke test's configuration."""
        return cls(reps=1, batch_mib=2, first_reps=1, relay_reps=1, profile_fetches=1, sizes=(2,), concurrency=(1, 2),
                   ethernet_reps=1)

    @property
    def relay_blocks(self) -> int:
        return self.relay_reps + 1 + self.profile_fetches


# -- the parties -----------------------------------------------------------------------------------------
class Party:
    """One child process: commands in on stdin, answers (lines starting with PREFIX) read by a thread."""

    def __init__(self, name: str, python: Path, argv: Sequence[str], logs: Path) -> None:
        self.name = name
        self.log = logs / f"{name}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([str(python), "-m", "benchmarks.pico_parties", *argv], cwd=ROOT, env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            if line.startswith(PREFIX):
                self._answers.put(json.loads(line[len(PREFIX):]))
        self._answers.put(None)  # the child ended

    def answer(self, timeout_s: float = REPLY_TIMEOUT_S) -> dict[str, Any]:
        try:
            reply = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            raise RuntimeError(f"{self.name}: no answer within {timeout_s:g} s; {self._tail()}") from None
        if reply is None:
            raise RuntimeError(f"{self.name} ended (status {self.proc.wait()}); {self._tail()}")
        if "error" in reply:
            raise RuntimeError(f"{self.name}: {reply['error']}")
        return reply

    def ask(self, op: str, **args: object) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def cpu(self) -> tuple[float, float]:
        reply = self.ask("cpu")
        return float(reply["cpu"]), float(reply["loop"])

    def stop_soon(self) -> None:
        """Ask the child to close its sessions and end (all at once: each close may wait for its peers)."""
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "stop"}) + "\n")
            self.proc.stdin.close()

    def wait_stopped(self) -> None:
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # our own child, by its handle
            self.proc.wait()

    def _tail(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "log tail: " + " | ".join(text.splitlines()[-8:])


@dataclass
class World:
    """Every party of the run, by role and transport."""

    publishers: dict[str, Party] = field(default_factory=dict)  # by transport, "https" included
    relays: dict[str, Party] = field(default_factory=dict)
    subscribers: dict[str, Party] = field(default_factory=dict)
    drafts: dict[str, int] = field(default_factory=dict)  # the MOQT draft each back-end's sessions agreed

    def all(self) -> list[Party]:
        return [*self.subscribers.values(), *self.relays.values(), *self.publishers.values()]


def _pki(directory: Path) -> None:
    """Certificates for every role, the token issuer's public key, and the tokens picoquic clients present."""
    make_dev_pki(directory, [RoleSpec(name, uri) for name, uri in ROLE_URIS.items()])
    issuer = ec.generate_private_key(ec.SECP256R1())
    (directory / "issuer.pub.pem").write_bytes(issuer.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    now = int(time.time())
    for name in ("subscriber", "relay"):
        minted = issue_token(issuer, ROLE_URIS[name], namespaces=[(b"bench",)], expires_at=now + 3600, now=now)
        (directory / f"{name}.token").write_bytes(minted)


def _start(python: Path, directory: Path, options: Options, world: World) -> None:
    """Every party at once (their imports overlap on the cores), then told where its peers are: publishers
    first, then the relays (they dial the publishers), then the subscribers."""
    logs, d = directory / "logs", str(directory)
    logs.mkdir()
    sizes = ",".join(map(str, options.sizes))
    for quic in QUICS:
        world.publishers[quic] = Party(f"publisher-{quic}", python, [
            "publisher", d, "--quic", quic, "--sizes", sizes, "--relay-blocks", str(options.relay_blocks)], logs)
        world.relays[quic] = Party(f"relay-{quic}", python, ["relay", d, "--quic", quic], logs)
        world.subscribers[quic] = Party(f"subscriber-{quic}", python, ["moqt-sub", d, "--quic", quic], logs)
    world.publishers[ETHERNET] = Party(f"publisher-{ETHERNET}", python, [
        "publisher", d, "--quic", ETHERNET, "--sizes", "2"], logs)
    world.subscribers[ETHERNET] = Party(f"subscriber-{ETHERNET}", python, ["moqt-sub", d, "--quic", ETHERNET], logs)
    world.publishers["https"] = Party("https-server", python, ["https", d, "--sizes", sizes], logs)
    world.subscribers["https"] = Party("https-client", python, ["https-sub", d], logs)
    ports = {name: party.ask("start")["port"] for name, party in world.publishers.items()}
    relays = {quic: party.ask("start", upstream=f"moqt://127.0.0.1:{ports[quic]}/")["port"]
              for quic, party in world.relays.items()}
    for quic in QUICS:
        ready = world.subscribers[quic].ask("start", direct=f"moqt://127.0.0.1:{ports[quic]}/",
                                            relay=f"moqt://127.0.0.1:{relays[quic]}/relay")
        world.drafts[quic] = ready["draft"]
    world.subscribers[ETHERNET].ask("start", direct=f"moqt://127.0.0.1:{ports[ETHERNET]}/")
    world.subscribers["https"].ask("start", direct=f"https://127.0.0.1:{ports['https']}")


@contextlib.contextmanager
def running(options: Options) -> Iterator[World]:
    python = pico_python()
    with tempfile.TemporaryDirectory(prefix="kvsp-bench-pico-") as tmp:
        directory = Path(tmp)
        _pki(directory)
        world = World()
        try:
            _start(python, directory, options, world)
            yield world
        finally:
            for party in world.all():
                party.stop_soon()
            for party in world.all():
                party.wait_stopped()


# -- CPU accounting ---------------------------------------------------------------------------------------
class CpuMeter:
    """User+sys CPU of some parties summed over the measured rounds (all threads, and the loop thread's)."""

    def __init__(self, parties: dict[str, Party]) -> None:
        self.parties = parties
        self.total = dict.fromkeys(parties, 0.0)
        self.loop = dict.fromkeys(parties, 0.0)

    @contextlib.contextmanager
    def counting(self, counted: bool = True) -> Iterator[None]:
        before = {name: party.cpu() for name, party in self.parties.items()}
        yield
        if counted:
            for name, party in self.parties.items():
                cpu, loop = party.cpu()
                self.total[name] += cpu - before[name][0]
                self.loop[name] += loop - before[name][1]

    def per_block_ms(self, blocks: int) -> tuple[dict[str, float], dict[str, float]]:
        return ({k: round(v / blocks * 1e3, 2) for k, v in self.total.items()},
                {k: round(v / blocks * 1e3, 2) for k, v in self.loop.items()})


def _meter(world: World, transport: str, relay: bool = False) -> CpuMeter:
    names = {"publisher": world.publishers[transport], "subscriber": world.subscribers[transport]}
    if relay:
        names["relay"] = world.relays[transport]
    return CpuMeter(names)


# -- throughput ----------------------------------------------------------------------------------------------
def _throughput_rows(world: World, mib: int, concurrency: int, options: Options) -> list[dict[str, object]]:
    """Batches of each transport in alternation (one round each in turn, so load from elsewhere hits all
    alike); the first round is not counted."""
    requests = max(concurrency, options.batch_mib // mib)
    blocks = [n % BLOCKS for n in range(requests)]
    times: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    meters = {t: _meter(world, t) for t in TRANSPORTS}
    for rep in range(options.reps + 1):
        for transport in TRANSPORTS:
            with meters[transport].counting(rep > 0):
                reply = world.subscribers[transport].ask("batch", target="direct", pool="b", mib=mib, blocks=blocks,
                                                         concurrency=concurrency)
            if rep:
                times[transport].append(reply["elapsed"])
    samples = {t: Sample.of(v) for t, v in times.items()}
    mib_per_s = {t: round(requests * mib / s.median_s, 1) for t, s in samples.items()}
    counted = requests * options.reps
    cpu = {t: meters[t].per_block_ms(counted) for t in TRANSPORTS}
    rows = []
    for quic in QUICS:
        goal = mib == 2 and quic == "picoquic"
        text = (f"MOQT over picoquic >= {PICO_OVER_HTTPS}x HTTPS GET at 2 MiB (ratio = HTTPS time / MOQT time)" if goal
                else f"informational: MOQT over {quic} against HTTPS GET (ratio = HTTPS time / MOQT time)")
        row = case(f"fetch-{mib}MiB-c{concurrency}-{quic}", samples[quic], samples["https"], text,
                   unit="s per batch", higher_is_better=True, goal_min_ratio=PICO_OVER_HTTPS if goal else None)
        row.update(requests=requests, mib_per_s=mib_per_s,
                   cpu_ms_per_block={t: cpu[t][0] for t in TRANSPORTS},
                   loop_ms_per_block={t: cpu[t][1] for t in TRANSPORTS})
        rows.append(row)
    return rows


# -- at Ethernet's MTU --------------------------------------------------------------------------------------------
def _ethernet_rows(world: World, options: Options) -> list[dict[str, object]]:
    """2 MiB blocks one at a time over picoquic (about 1440-octet packets on any path) and over aioquic at the
    1452-octet datagrams it sends to every peer off loopback (a rack's neighbour): what the loopback rows,
    where aioquic sends 64 KiB datagrams no real network carries, do not show. Small batches: aioquic is
    slow there."""
    transports = ("picoquic", ETHERNET, "https")
    times: dict[str, list[float]] = {t: [] for t in transports}
    meters = {t: _meter(world, t) for t in transports}
    for rep in range(options.ethernet_reps + 1):
        for transport in transports:
            with meters[transport].counting(rep > 0):
                reply = world.subscribers[transport].ask("batch", target="direct", pool="b", mib=2,
                                                         blocks=list(range(BLOCKS)), concurrency=1)
            if rep:
                times[transport].append(reply["elapsed"])
    samples = {t: Sample.of(v) for t, v in times.items()}
    row = case("fetch-2MiB-c1-ethernet-mtu", samples["picoquic"], samples[ETHERNET],
               "informational: picoquic against aioquic at 1452-octet datagrams (as between racks), one 2 MiB "
               "block at a time (ratio = aioquic time / picoquic time)", unit="s per batch", higher_is_better=True)
    row["mib_per_s"] = {t: round(BLOCKS * 2 / s.median_s, 1) for t, s in samples.items()}
    row["cpu_ms_per_block"] = {t: meters[t].per_block_ms(BLOCKS * options.ethernet_reps)[0] for t in transports}
    return [row]


# -- first layer ----------------------------------------------------------------------------------------------
def _first_layer_rows(world: World, options: Options) -> list[dict[str, object]]:
    """One 2 MiB FETCH (GET from the layer-by-layer handler) at a time, transports in alternation."""
    got: dict[str, list[tuple[float, float]]] = {t: [] for t in TRANSPORTS}
    for rep in range(options.first_reps + 1):
        for transport in TRANSPORTS:
            reply = world.subscribers[transport].ask("batch", target="direct", pool="b", mib=2,
                                                     blocks=[rep % BLOCKS], concurrency=1, layered=True)
            if rep:
                got[transport].extend((first, whole) for first, whole in reply["fetches"])
    first = {t: Sample.of([f for f, _ in v]) for t, v in got.items()}
    whole = {t: Sample.of([w for _, w in v]) for t, v in got.items()}
    ms = {f"{t}_{kind}": round(sample[t].median_s * 1e3, 2) for t in TRANSPORTS
          for kind, sample in (("first", first), ("whole", whole))}
    rows = []
    for quic in QUICS:
        row = case(f"first-layer-2MiB-c1-{quic}", first[quic], whole[quic],
                   f"first object <= {FIRST_OVER_WHOLE} of the whole 2 MiB block over {quic} (ratio = first / whole)",
                   goal_max_ratio=FIRST_OVER_WHOLE)
        row["first_over_whole"] = row["ratio"]
        row["ms"] = ms
        rows.append(row)
    return rows


# -- the relay's miss hop -----------------------------------------------------------------------------------------
def _relay_rows(world: World, quic: str, options: Options, first_block: int) -> list[dict[str, object]]:
    """Direct and through-the-relay (a block never fetched there before) FETCHes in alternation."""
    sub = world.subscribers[quic]
    timings: dict[str, list[tuple[float, float]]] = {"direct": [], "relay": []}
    meters = {"direct": _meter(world, quic, relay=True), "relay": _meter(world, quic, relay=True)}
    before = world.relays[quic].ask("stats")["stats"]
    for rep in range(options.relay_reps + 1):
        for target, pool, index in (("direct", "b", rep % BLOCKS), ("relay", "r", first_block + rep)):
            with meters[target].counting(rep > 0):
                reply = sub.ask("batch", target=target, pool=pool, mib=2, blocks=[index], concurrency=1)
            if rep:
                timings[target].extend((f, w) for f, w in reply["fetches"])
    after = world.relays[quic].ask("stats")["stats"]
    first = {k: Sample.of([f for f, _ in v]) for k, v in timings.items()}
    whole = {k: Sample.of([w for _, w in v]) for k, v in timings.items()}
    block = case(f"relay-hop-block-{quic}", whole["relay"], whole["direct"],
                 f"via relay (miss) >= {RELAY_THROUGHPUT}x direct throughput over {quic} "
                 "(ratio = direct time / relay time)", higher_is_better=True, goal_min_ratio=RELAY_THROUGHPUT)
    block["mib_per_s"] = {k: round(2 / s.median_s, 1) for k, s in whole.items()}
    block["cpu_ms_per_block"] = {k: m.per_block_ms(options.relay_reps)[0] for k, m in meters.items()}
    block["loop_ms_per_block"] = {k: m.per_block_ms(options.relay_reps)[1] for k, m in meters.items()}
    block["relay_stats"] = {k: after[k] - before[k] for k in ("cache_misses", "cache_hits", "upstream_fetches",
                                                              "cut_through")}
    first_row = case(f"relay-hop-first-object-{quic}", first["relay"], first["direct"],
                     f"via relay (miss) first object <= {RELAY_FIRST}x direct first object over {quic}",
                     goal_max_ratio=RELAY_FIRST)
    first_row["ms"] = {k: round(s.median_s * 1e3, 2) for k, s in first.items()}
    return [block, first_row]


# -- CPU summary and profile ----------------------------------------------------------------------------------------
def _cpu_row(rows: list[dict[str, object]]) -> dict[str, object]:
    """Every process's CPU per 2 MiB block, from the c1 throughput row and the relay rows."""
    fetch = next(r for r in rows if r["case"] == "fetch-2MiB-c1-picoquic")
    direct = fetch["cpu_ms_per_block"]
    assert isinstance(direct, dict)
    per_process: dict[str, object] = {t: direct[t] for t in TRANSPORTS}
    for quic in QUICS:
        relay = next(r for r in rows if r["case"] == f"relay-hop-block-{quic}")["cpu_ms_per_block"]
        assert isinstance(relay, dict)
        per_process[f"{quic}-via-relay"] = relay["relay"]
    total = {t: sum(direct[t].values()) for t in TRANSPORTS}
    row = case("cpu-per-block-2MiB", total["picoquic"] / 1e3, total["https"] / 1e3 or None,
               "informational: CPU of all processes per 2 MiB block, picoquic against HTTPS (c1)", unit="cpu_s")
    row["cpu_ms_per_block"] = per_process
    row["total_ms_per_block"] = {k: round(v, 2) for k, v in total.items()}
    return row


def _profile(world: World, options: Options, first_block: int) -> dict[str, object]:
    """cProfile (CPU time, loop thread) of the picoquic publisher, relay and subscriber over direct and relayed
    2 MiB fetches, with each party's CPU split between its loop thread and the others."""
    parties = {"publisher": world.publishers["picoquic"], "relay": world.relays["picoquic"],
               "subscriber": world.subscribers["picoquic"]}
    out: dict[str, object] = {"fetches": options.profile_fetches}
    for target, pool, blocks in (("direct", "b", [n % BLOCKS for n in range(options.profile_fetches)]),
                                 ("relay", "r", list(range(first_block, first_block + options.profile_fetches)))):
        meter = CpuMeter(parties)
        for party in parties.values():
            party.ask("profile_on")
        with meter.counting():
            world.subscribers["picoquic"].ask("batch", target=target, pool=pool, mib=2, blocks=blocks, concurrency=1)
        summaries = {name: party.ask("profile_off")["profile"] for name, party in parties.items()}
        total, loop = meter.per_block_ms(options.profile_fetches)
        out[target] = {"cpu_ms_per_block": total, "loop_ms_per_block": loop, "parties": summaries}
    return out


def _goals(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{"case": r["case"], "goal": r["goal"], "ratio": r.get("ratio"), "met": r["met"]}
            for r in rows if "met" in r]


def measure(world: World, options: Options) -> tuple[list[dict[str, object]], dict[str, object]]:
    rows: list[dict[str, object]] = []
    for mib in options.sizes:
        for concurrency in options.concurrency:
            rows += _throughput_rows(world, mib, concurrency, options)
    rows += _first_layer_rows(world, options)
    rows += _ethernet_rows(world, options)
    for quic in QUICS:
        rows += _relay_rows(world, quic, options, 0)
    if any(r["case"] == "fetch-2MiB-c1-picoquic" for r in rows):
        rows.append(_cpu_row(rows))
    profile = _profile(world, options, options.relay_reps + 1) if options.profile_fetches else {}
    return rows, profile


def run(quick: bool = False, options: Options | None = None) -> dict[str, object]:
    options = options or (Options.quick() if quick else Options())
    started = time.perf_counter()
    with running(options) as world:
        rows, profile = measure(world, options)
        drafts = dict(world.drafts)
    params = {"block_octets": {f"{mib}MiB": mib << 20 for mib in options.sizes}, "layers": LAYERS,
              "objects_per_block": LAYERS, "drafts": drafts, "reps": options.reps, "batch_mib": options.batch_mib,
              "first_reps": options.first_reps, "relay_reps": options.relay_reps, "python": str(pico_python()),
              "processes": "one per party and transport (publisher, relay, subscriber; HTTPS server, client), "
                           "children of the picoquic venv's Python, uvloop",
              "auth": "aioquic: certificates both ways; picoquic: server certificate, client D3 token; "
                      "HTTPS: TLS 1.3 with client certificates",
              "elapsed_s": round(time.perf_counter() - started, 1)}
    return {"name": "picoquic", "params": params, "cases": rows, "goals": _goals(rows), "profile": profile}


def main(argv: Sequence[str]) -> None:
    """``[--quick] [--out FILE]``."""
    result = run(quick="--quick" in argv)
    text = json.dumps(result, indent=2)
    if "--out" in argv:
        Path(argv[list(argv).index("--out") + 1]).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
