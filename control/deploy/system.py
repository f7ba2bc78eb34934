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

With ``Settings.redis_url`` the PC runs on Redis, active/standby (decision D7): two ``kvsp serve pc``
processes (``pc`` and ``pc2``, one identity: both present the ``pc`` certificate, each listens at its
own base URI), a separate ``kvsp serve is``, and instances and the front end configured with both PCs,
following the leader (`System.leader` says which one leads).

Used by tests/test_system_*.py, tests/test_pc_redis.py, benchmarks/bench_failover.py and benchmarks/bench_pc_redis.py.
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
PAIR_NAMES = ("pc2", "is")  # the standby PC and the IS of its own, with a PC on Redis
INSTANCES = ("ii1", "ii2")
ROLES = {"pc": "pc,is", "h1": "holder", "ii1": "instance,holder", "ii2": "instance,holder", "ii3": "instance,holder"}
PAIR_ROLES = {**ROLES, "pc": "pc", "pc2": "pc", "is": "is"}
PCS = ("pc", "pc2")
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
    redis_url: str | None = None  # set: two PCs on this Redis, active/standby, and a separate IS
    lease_ttl_ms: int = 1000  # with redis_url: the PCs' leader lease

    @property
    def pair(self) -> bool:
        return self.redis_url is not None

    @property
    def roles(self) -> dict[str, str]:
        return PAIR_ROLES if self.pair else ROLES

    @property
    def names(self) -> tuple[str, ...]:
        return (*NAMES, *PAIR_NAMES) if self.pair else NAMES


def write_configs(pki: DevPki, tmp: Path, settings: Settings, instances: Sequence[str] = INSTANCES) -> None:
    model, key = str(tmp / "model.json"), str(tmp / "scope.key")
    (tmp / "model.json").write_text(json.dumps(settings.model.to_json()))
    (tmp / "scope.key").write_text(SCOPE_KEY.secret().hex())
    configs.PolicyFile(pki.uri("pc"), [pki.uri(n) for n in instances],
               [configs.ScopeEntry.open_to(SCOPE, [pki.uri(n) for n in settings.names])]).write(tmp / "policy.toml")
    roles = settings.roles

    def role_file(name: str, *sections: configs.Section, cert: str | None = None) -> configs.RoleFile:
        return configs.RoleFile(roles[name].split(","), pki.uri(name), configs.Tls.of(cert or name), "policy.toml",
                                sections=sections)

    index = pki.uri("is") if settings.pair else pki.uri("pc")
    pcs: str | list[str] = [pki.uri(n) for n in PCS] if settings.pair else pki.uri("pc")
    holder = replace(configs.HolderSection(index=index, descriptors=[model], replica_ttl_ms=60_000),
                     **settings.holder)
    pc = replace(configs.PcSection(scope_keys={SCOPE.hex(): key}, descriptors=[model], status_check_interval_ms=50,
                           call_timeout_ms=3000, operators=[pki.uri(n) for n in settings.operators]), **settings.pc)
    if settings.redis_url is not None:
        pc = replace(pc, index=index, backend="redis", lease_ttl_ms=settings.lease_ttl_ms,
                     redis=configs.RedisTable(settings.redis_url, timeout_ms=300))
        for name in PCS:  # one PC identity (the policy's): both present its certificate
            role_file(name, pc, cert="pc").write(tmp / f"{name}.toml")
        role_file("is", configs.IndexSection(descriptors=[model])).write(tmp / "is.toml")
    else:
        role_file("pc", configs.IndexSection(descriptors=[model]), pc).write(tmp / "pc.toml")
    role_file("h1", holder).write(tmp / "h1.toml")
    for name in instances:
        instance = configs.InstanceSection(
            pc=pcs, index=index, engine="test", vocab_size=VOCAB,
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
    roles: dict[str, str] = field(default_factory=lambda: dict(ROLES))

    @property
    def pcs(self) -> tuple[str, ...]:
        """The names of the PC processes: ("pc",), or ("pc", "pc2") on Redis."""
        return tuple(n for n in PCS if n in self.roles)

    @property
    def geometry(self) -> EngineGeometry:
        return geometry_of(self.model)

    def spawn(self, name: str) -> None:
        """Start (or start again, as a new incarnation) the role process ``name``."""
        with (self.tmp / f"{name}.log").open("ab") as log:
            self.procs[name] = serve(self.roles[name], self.tmp / f"{name}.toml", cwd=self.tmp, stderr=log)

    async def restart(self, name: str) -> None:
        """Start a killed instance again and wait until the PC counts every instance as active."""
        kill(self.procs[name])
        self.spawn(name)
        await wait_listening(name, self.pki.port(name), self.procs[name], timeout=30.0, log=self.tmp / f"{name}.log")
        await self.wait_active([n for n in self.procs if self.roles.get(n, "").startswith("instance")])

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

    async def health(self, name: str, who: str = "fe") -> dict[str, Any] | None:
        """GET {base}health of a role process; None when it does not answer."""
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
            async with self.http[who].get(self.uri(name) + "health", timeout=aiohttp.ClientTimeout(total=1.0)) as r:
                if r.status == 200:
                    doc: dict[str, Any] = await r.json()
                    return doc
        return None

    async def leader(self) -> str | None:
        """The name of the PC process that leads now, or None (an election, or every PC down)."""
        for name in self.pcs:
            if self.procs[name].poll() is not None:
                continue
            doc = await self.health(name)
            if doc is not None and doc.get("pc", {}).get("role") == "leader":
                return name
        return None

    async def wait_leader(self, timeout: float = 20.0, *, other_than: str | None = None) -> str:
        found: list[str] = []

        async def elected() -> bool:
            name = await self.leader()
            if name is not None and name != other_than:
                found.append(name)
                return True
            return False
        await self.wait_for(elected, "a PC to lead" + (f" other than {other_than}" if other_than else ""), timeout)
        return found[-1]

    async def wait_active(self, names: Sequence[str] = INSTANCES, timeout: float = 30.0) -> None:
        """Until the leading PC counts ``names`` as active instances (their first status reached it)."""
        async def ready() -> bool:
            pc = await self.leader() if len(self.pcs) > 1 else "pc"
            return pc is not None and await self.metric(pc, 'kvsp_pc_instances{state="active"}') >= len(names)
        await self.wait_for(ready, f"{names} active at the PC", timeout)


@contextlib.asynccontextmanager
async def running_system(tmp: Path, settings: Settings | None = None, *,
                         instances: Sequence[str] = INSTANCES) -> AsyncIterator[System]:
    """Start the role processes (all at once), wait until they listen and the PC sees the instances."""
    settings = settings or Settings()
    pki = DevPki.make(tmp, list(settings.names))
    write_configs(pki, tmp, settings, instances)
    system = System(pki, tmp, {}, settings.model, roles=dict(settings.roles))
    try:
        control_plane = ("is", *PCS) if settings.pair else ("pc",)
        for name in (*control_plane, "h1", *instances):
            system.spawn(name)
        for name, proc in system.procs.items():
            await wait_listening(name, pki.port(name), proc, timeout=30.0, log=tmp / f"{name}.log")
        for who in ("fe", "pc"):
            connector = aiohttp.TCPConnector(ssl=pki.client_ssl(who))
            system.http[who] = aiohttp.ClientSession(connector=connector)
        if settings.pair:
            await system.wait_leader(30.0)
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

    def __init__(self, system: System, *, stall_s: float = 0.5, poll_s: float = 0.05,
                 leader_wait_s: float = 20.0) -> None:
        self.system = system
        self.http = system.http["fe"]
        self.stall_s = stall_s
        self.poll_s = poll_s
        self.leader_wait_s = leader_wait_s
        self._leader = system.pcs[0]

    async def generate(self, prompt: Sequence[int], max_tokens: int, sampler: Sampler) -> SessionInfo:
        request = generate_body(prompt, max_tokens, sampler, self.system.model)
        return SessionInfo.from_bytes(await self.pc_call("POST", "requests", request))

    async def info(self, session: str) -> SessionInfo:
        return SessionInfo.from_bytes(await self.pc_call("GET", f"sessions/{session}"))

    async def pc_call(self, method: str, path: str, body: dict[str, object] | None = None) -> bytes:
        """At the leading PC: a standby's 421 names it, a 503 with ``"leader"`` or a PC that does not answer
        means the next one; waits (bounded) while the PCs elect.  Any other answer must be 200."""
        deadline = time.monotonic() + self.leader_wait_s
        while True:
            for name in (self._leader, *(n for n in self.system.pcs if n != self._leader)):
                raw, status, leader = await self._attempt(name, method, path, body)
                if status == 200:
                    self._leader = name
                    return raw
                if status == 421 and leader is not None:
                    self._leader = leader
                    break  # ask the named leader next
                assert status in (0, 503) and leader != "", raw
            if time.monotonic() > deadline:
                raise AssertionError(f"{method} {path}: no PC answered as the leader in {self.leader_wait_s} s")
            await asyncio.sleep(self.poll_s)

    async def _attempt(self, name: str, method: str, path: str,
                       body: dict[str, object] | None) -> tuple[bytes, int, str | None]:
        """(body, status, the leader a 421 names); status 0 when the PC did not answer, and leader ""
        for a 503 that is the leader's own answer (no ``"leader"`` member)."""
        headers = {"Content-Type": JSON} if body is not None else {}
        try:
            async with self.http.request(method, self.system.uri(name) + path, json=body, headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
                raw, status = await resp.read(), resp.status
        except (aiohttp.ClientError, OSError, TimeoutError):
            return b"", 0, None
        if status not in (421, 503):
            return raw, status, None
        doc = json.loads(raw)
        if "leader" not in doc:
            return raw, status, ""
        return raw, status, self.system.name_of(doc["leader"]) if doc["leader"] else None

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
