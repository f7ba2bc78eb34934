"""A whole system for the system tests and benchmarks: the PC, the instances and a cache holder as REAL processes.

``kvsp serve pc,is`` (the PC combined with the IS), two ``kvsp serve instance,holder`` processes and one
``kvsp serve holder`` (the cache holder the instances replicate computed blocks to, so that a session's
prompt blocks survive the instance that computed them) run on loopback with mutual TLS, each from a
TOML file written by the test, with certificates of a dev PKI made at test time.  The engine is
``DeterministicTestEngine``, so the output of any run can be compared with the engine run directly.

`FrontEnd` is what a front end does with the kvsp extension resources: ``POST requests`` at the PC,
then ``GET sessions/{s}/tokens`` at the owner; when the stream breaks or stalls it asks the PC
``GET sessions/{s}`` for the current owner and epoch and reconnects there with ``from = next index``,
feeding every line to `control.instance.core.OutputAssembler`.

Used by tests/test_system_*.py and benchmarks/bench_failover.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from control.deploy import configs
from control.deploy.fixtures import DESCRIPTOR, SCOPE, SCOPE_KEY, VOCAB, geometry_of, reference_tokens
from control.deploy.pki import DevPki
from control.deploy.processes import kill, serve, wait_listening
from kvsp.descriptor import CompatDescriptor
from kvsp.engine import EngineGeometry
from kvsp.output import OutputAssembler
from kvsp.records import Sampler
from kvsp.records.generation import SessionInfo, StreamEnd, TokenEvent, parse_stream_line

__all__ = ["JSON", "FrontEnd", "Output", "Settings", "System", "reference_tokens", "running_system"]

NAMES = ("pc", "h1", "ii1", "ii2", "ii3", "fe")
INSTANCES = ("ii1", "ii2")
ROLES = {"pc": "pc,is", "h1": "holder", "ii1": "instance,holder", "ii2": "instance,holder", "ii3": "instance,holder"}
JSON = "application/kvsp+json"
LINK_MBIT_PER_S = 10_000.0  # the paths every instance reports (loopback): to the cache holder and its peer
LINK_RTT_US = 100


def generate_body(prompt: Sequence[int], max_tokens: int, sampler: Sampler,
                  model: CompatDescriptor = DESCRIPTOR) -> dict[str, object]:
    return {"scope_id": SCOPE.hex(), "compat_id": model.compat_id.hex(), "prompt": list(prompt),
            "max_tokens": max_tokens,
            "sampler": {"method": sampler.method, "params": dict(sampler.params), "seed": sampler.seed}}


# -- configuration files -------------------------------------------------------------------------------


@dataclass
class Settings:
    """Per-test overrides of the ``[pc]``, ``[instance]`` (both instances, or one by name) and ``[holder]``
    tables (keys of `configs.PcSection`, `configs.InstanceSection`, `configs.HolderSection`); the defaults
    give fast failure detection on loopback."""

    pc: dict[str, Any] = field(default_factory=dict)  # checked by dataclasses.replace, then the role's loader
    instance: dict[str, Any] = field(default_factory=dict)
    per_instance: dict[str, dict[str, Any]] = field(default_factory=dict)
    holder: dict[str, Any] = field(default_factory=dict)
    link_mbit_per_s: float = LINK_MBIT_PER_S  # what the instances report for their paths (section 6.4)
    operators: tuple[str, ...] = ()  # names that may POST maps/{map} at the PC besides the PC
    model: CompatDescriptor = DESCRIPTOR  # the one model every role serves
    shard_writers: tuple[str, ...] = ()  # names that may GET and PUT shards/{map} besides the instances


def write_configs(pki: DevPki, tmp: Path, settings: Settings, instances: Sequence[str] = INSTANCES) -> None:
    model, key = str(tmp / "model.json"), str(tmp / "scope.key")
    (tmp / "model.json").write_text(json.dumps(settings.model.to_json()))
    (tmp / "scope.key").write_text(SCOPE_KEY.secret().hex())
    configs.PolicyFile(pki.uri("pc"), [pki.uri(n) for n in instances],
               [configs.ScopeEntry.open_to(SCOPE, [pki.uri(n) for n in NAMES])]).write(tmp / "policy.toml")

    def role_file(name: str, *sections: configs.Section) -> configs.RoleFile:
        return configs.RoleFile(ROLES[name].split(","), pki.uri(name), configs.Tls.of(name), "policy.toml",
                                sections=sections)

    holder = replace(configs.HolderSection(index=pki.uri("pc"), descriptors=[model], replica_ttl_ms=60_000),
                     **settings.holder)
    pc = replace(configs.PcSection(scope_keys={SCOPE.hex(): key}, descriptors=[model], status_check_interval_ms=50,
                           call_timeout_ms=3000, operators=[pki.uri(n) for n in settings.operators]), **settings.pc)
    role_file("pc", configs.IndexSection(descriptors=[model]), pc).write(tmp / "pc.toml")
    role_file("h1", holder).write(tmp / "h1.toml")
    for name in instances:
        instance = configs.InstanceSection(
            pc=pki.uri("pc"), index=pki.uri("pc"), engine="test", vocab_size=VOCAB,
            scope_keys={SCOPE.hex(): key}, replicate_to=[pki.uri("h1")], status_ttl_ms=1500,
            peers=[pki.uri(n) for n in (*instances, *settings.shard_writers)],
            load_timeout_ms=5000, final_ack_timeout_ms=10_000,
            links=[configs.HolderLink(pki.uri(h), settings.link_mbit_per_s, LINK_RTT_US)
                   for h in ("h1", *instances) if h != name])
        instance = replace(instance, **settings.instance, **settings.per_instance.get(name, {}))
        role_file(name, holder, instance).write(tmp / f"{name}.toml")


# -- processes ---------------------------------------------------------------------------------------
@dataclass
class System:
    """The running processes, the PKI, and HTTPS clients by identity."""

    pki: DevPki
    tmp: Path
    procs: dict[str, subprocess.Popen[bytes]]
    model: CompatDescriptor = DESCRIPTOR
    http: dict[str, aiohttp.ClientSession] = field(default_factory=dict)

    @property
    def geometry(self) -> EngineGeometry:
        return geometry_of(self.model)

    def spawn(self, name: str) -> None:
        """Start (or start again, as a new incarnation) the role process ``name``."""
        with (self.tmp / f"{name}.log").open("ab") as log:
            self.procs[name] = serve(ROLES[name], self.tmp / f"{name}.toml", cwd=self.tmp, stderr=log)

    async def restart(self, name: str) -> None:
        """Start a killed instance again and wait until the PC counts every instance as active."""
        kill(self.procs[name])
        self.spawn(name)
        await wait_listening(name, self.pki.port(name), self.procs[name], timeout=30.0, log=self.tmp / f"{name}.log")
        await self.wait_active([n for n in self.procs if n in ROLES and ROLES[n].startswith("instance")])

    def uri(self, name: str) -> str:
        return self.pki.uri(name)

    def name_of(self, uri: str | None) -> str | None:
        return next((n for n, u in self.pki.uris.items() if u == uri), None)

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def signal(self, name: str, sig: signal.Signals) -> float:
        """Send ``sig`` to a role process; the monotonic time it was sent."""
        when = time.monotonic()
        self.procs[name].send_signal(sig)
        return when

    async def metrics(self, name: str, who: str = "fe") -> dict[str, float]:
        """The role's Prometheus samples, ``{'name{labels}': value}``."""
        async with self.http[who].get(self.uri(name) + "metrics") as resp:
            assert resp.status == 200, await resp.text()
            text = await resp.text()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    async def metric(self, name: str, sample: str, who: str = "fe") -> float:
        return (await self.metrics(name, who)).get(sample, 0.0)

    async def wait_for(self, check: Callable[[], Awaitable[bool]], what: str, timeout: float = 20.0,
                       every: float = 0.05) -> None:
        """Poll ``check`` until true."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await check():
                return
            await asyncio.sleep(every)
        raise AssertionError(f"timed out waiting for {what}")

    async def wait_active(self, names: Sequence[str] = INSTANCES, timeout: float = 30.0) -> None:
        """Until the PC counts ``names`` as active instances (their first status reached it)."""
        async def ready() -> bool:
            return await self.metric("pc", 'kvsp_pc_instances{state="active"}') >= len(names)
        await self.wait_for(ready, f"{names} active at the PC", timeout)


@contextlib.asynccontextmanager
async def running_system(tmp: Path, settings: Settings | None = None, *,
                         instances: Sequence[str] = INSTANCES) -> AsyncIterator[System]:
    """Start the role processes (all at once), wait until they listen and the PC sees the instances."""
    settings = settings or Settings()
    pki = DevPki.make(tmp, list(NAMES))
    write_configs(pki, tmp, settings, instances)
    system = System(pki, tmp, {}, settings.model)
    try:
        for name in ("pc", "h1", *instances):
            system.spawn(name)
        for name, proc in system.procs.items():
            await wait_listening(name, pki.port(name), proc, timeout=30.0, log=tmp / f"{name}.log")
        for who in ("fe", "pc"):
            connector = aiohttp.TCPConnector(ssl=pki.client_ssl(who))
            system.http[who] = aiohttp.ClientSession(connector=connector)
        await system.wait_active(instances)
        yield system
    except BaseException:
        for name in system.procs:  # pytest shows this for a failed test
            print(f"--- {name}.log (tail) ---\n{system.log(name)[-4000:]}")
        raise
    finally:
        for session in system.http.values():
            await session.close()
        for proc in system.procs.values():
            kill(proc)
        assert all(proc.returncode is not None for proc in system.procs.values()), "a role process outlived its test"


# -- the front end -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Seen:
    """One line as the front end read it: when, from which instance."""

    at: float
    instance: str
    line: TokenEvent | StreamEnd


@dataclass
class Output:
    """What the front end received for one session."""

    delivered: list[TokenEvent] = field(default_factory=list)  # what the assembler delivered, in order
    delivered_at: list[float] = field(default_factory=list)
    lines: list[Seen] = field(default_factory=list)  # every line read, duplicates included
    end: StreamEnd | None = None
    reconnects: list[tuple[float, SessionInfo]] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return [t.token for t in self.delivered]

    def first_delivery_after(self, when: float) -> float | None:
        return next((at for at in self.delivered_at if at > when), None)


OnToken = Callable[[Output], Awaitable[None]]


class FrontEnd:
    """A front end with its own identity ("fe"): requests at the PC, token streams at the owners."""

    def __init__(self, system: System, *, stall_s: float = 0.5, poll_s: float = 0.05) -> None:
        self.system = system
        self.http = system.http["fe"]
        self.stall_s = stall_s
        self.poll_s = poll_s

    async def generate(self, prompt: Sequence[int], max_tokens: int, sampler: Sampler) -> SessionInfo:
        request = generate_body(prompt, max_tokens, sampler, self.system.model)
        url = self.system.uri("pc") + "requests"
        async with self.http.post(url, json=request, headers={"Content-Type": JSON}) as resp:
            body = await resp.read()
            assert resp.status == 200, body
        return SessionInfo.from_bytes(body)

    async def info(self, session: str) -> SessionInfo:
        async with self.http.get(self.system.uri("pc") + f"sessions/{session}") as resp:
            body = await resp.read()
            assert resp.status == 200, body
        return SessionInfo.from_bytes(body)

    async def receive(self, info: SessionInfo, *, timeout_s: float = 40.0, on_token: OnToken | None = None) -> Output:
        """Follow the session to its end line, across failovers; ``on_token(output)`` after each delivery."""
        out, assembler = Output(), OutputAssembler()
        async with asyncio.timeout(timeout_s):
            while out.end is None:
                if info.instance is not None:
                    await self._stream(info, assembler, out, on_token)
                if out.end is not None:
                    break
                info = await self._next_owner(info, out)
        return out

    async def _next_owner(self, was: SessionInfo, out: Output) -> SessionInfo:
        """Ask the PC until the session has an owner; a new (instance, epoch), or the same one again
        after a while (the stream may have broken without a failover)."""
        started = time.monotonic()
        while True:
            info = await self.info(was.session)
            moved = (info.instance, info.epoch) != (was.instance, was.epoch)
            if info.instance is not None and (moved or time.monotonic() - started > 1.0):
                out.reconnects.append((time.monotonic(), info))
                return info
            await asyncio.sleep(self.poll_s)

    async def _stream(self, info: SessionInfo, assembler: OutputAssembler, out: Output,
                      on_token: OnToken | None) -> None:
        """Read one stream until it ends, breaks, or stalls while the PC names another owner."""
        assert info.instance is not None
        url = info.instance + f"sessions/{info.session}/tokens?from={assembler.next_index}"
        name = self.system.name_of(info.instance) or info.instance
        with contextlib.suppress(aiohttp.ClientError, ConnectionError):
            async with self.http.get(url, timeout=aiohttp.ClientTimeout(total=None, connect=2.0)) as resp:
                if resp.status != 200:
                    await asyncio.sleep(self.poll_s)
                    return
                while True:
                    try:
                        raw = await asyncio.wait_for(resp.content.readline(), self.stall_s)
                    except TimeoutError:
                        now = await self.info(info.session)
                        if (now.instance, now.epoch) != (info.instance, info.epoch):
                            return  # this owner is gone or fenced: abandon its stream
                        continue
                    if not raw:
                        return
                    line = parse_stream_line(raw)
                    now_t = time.monotonic()
                    out.lines.append(Seen(now_t, name, line))
                    if isinstance(line, StreamEnd):
                        if line.epoch >= assembler.epoch:
                            out.end = line
                        return
                    for token in assembler.receive(line):
                        out.delivered.append(token)
                        out.delivered_at.append(now_t)
                    if on_token is not None:
                        await on_token(out)
