"""Real processes: ``kvsp serve`` for the IS, a holder and two instance+holder processes, mutual TLS; the PC
is the in-test double (the PC role is built separately), playing the PC's part of a failover by hand.

An instance is killed with SIGKILL in the middle of a generation with a non-deterministic sampler; the
session is resumed on the other instance from the latest checkpoint at the next epoch, with prompt and
generated blocks loaded from the holder they were replicated to (the dead instance's own tier died
with it).  The front end receives every index exactly once and the same output as an uninterrupted run.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from control.deploy.configs import HolderSection, IndexSection, InstanceSection, PolicyFile, RoleFile, ScopeEntry, Tls
from control.deploy.pki import DevPki
from control.deploy.processes import serve, wait_listening
from control.instance.core import OutputToken
from control.instance.records import EndLine, TokenLine, parse_token_line
from kvsp.client.index import IndexClient
from kvsp.engine import top_p_sampler
from kvsp.output import OutputAssembler
from kvsp.records import LookupRequest
from tests.support.instance import (
    COMPAT,
    NAMES,
    PROMPT,
    SCOPE,
    keys_of,
    reference_tokens,
    start_body,
    write_files,
)
from tests.support.instance import pc_double as make_pc_double

REPO = Path(__file__).resolve().parent.parent
ROLES = {"is": "is", "h1": "holder", "ii1": "instance,holder", "ii2": "instance,holder"}


def write_configs(pki: DevPki, tmp: Path) -> None:
    model, key = write_files(tmp)
    PolicyFile(pki.uri("pc"), scopes=[ScopeEntry.open_to(SCOPE, [pki.uri(n) for n in ("pc", "ii1", "ii2", "fe", "h1")])]
               ).write(tmp / "policy.toml")
    holder = HolderSection(index=pki.uri("is"), descriptors=[model], replica_ttl_ms=60_000)
    RoleFile(["is"], pki.uri("is"), Tls.of("is"), "policy.toml", sections=[IndexSection(descriptors=[model])]).write(
        tmp / "is.toml")
    RoleFile(["holder"], pki.uri("h1"), Tls.of("h1"), "policy.toml", sections=[holder]).write(tmp / "h1.toml")
    instance = InstanceSection(pc=pki.uri("pc"), index=pki.uri("is"), engine="test", vocab_size=97,
                               scope_keys={SCOPE.hex(): key}, replicate_to=[pki.uri("h1")], max_unreleased=8,
                               load_timeout_ms=10_000)
    for name in ("ii1", "ii2"):
        RoleFile(["instance", "holder"], pki.uri(name), Tls.of(name), "policy.toml", sections=[holder, instance]
                 ).write(tmp / f"{name}.toml")


@contextlib.asynccontextmanager
async def processes(pki: DevPki, tmp: Path) -> AsyncIterator[dict[str, subprocess.Popen[bytes]]]:
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, roles in ROLES.items():
            procs[name] = serve(roles, tmp / f"{name}.toml")
        for name, proc in procs.items():
            await wait_listening(name, pki.port(name), proc)
        yield procs
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(10)


async def wait_replicated(pki: DevPki, keys: list[bytes], timeout: float = 20.0) -> None:
    """Until h1 (ii1's replicate_to) has published every one of ``keys``."""
    async with pki.session("fe") as session:
        index = IndexClient(session, pki.uri("is"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            groups = (await index.lookup(LookupRequest(SCOPE, COMPAT, tuple(keys)))).replicas
            if len(groups) == len(keys) and all(any(r.holder == pki.uri("h1") for r in g) for g in groups):
                return
            await asyncio.sleep(0.05)
    raise AssertionError("the prompt blocks were not replicated to h1")


async def follow(http: aiohttp.ClientSession, url: str, into: list[TokenLine]) -> None:
    """Read a token stream into ``into`` until it ends or breaks (the instance died)."""
    with contextlib.suppress(aiohttp.ClientError):
        async with http.get(url) as resp:
            assert resp.status == 200
            while line := await resp.content.readline():
                into.append(parse_token_line(line))


async def test_sigkill_mid_generation_then_resume_on_another_instance(tmp_path: Path) -> None:
    pki = DevPki.make(tmp_path, NAMES)
    write_configs(pki, tmp_path)
    sampler = top_p_sampler(0.9, 21)
    session, max_tokens = str(uuid.uuid4()), 60
    async with make_pc_double(pki) as pc, processes(pki, tmp_path) as procs, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("pc"))) as as_pc, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("fe"))) as as_fe:
        pc.hold_above = 20  # the PC stops acknowledging after offset 20: ii1 runs 8 tokens ahead and waits
        async with as_pc.post(pki.uri("ii1") + f"sessions/{session}/start",
                              json=start_body(session, sampler, max_tokens=max_tokens)) as resp:
            assert resp.status == 202, await resp.text()
        first: list[TokenLine] = []
        reader = asyncio.ensure_future(follow(as_fe, pki.uri("ii1") + f"sessions/{session}/tokens", first))
        deadline = time.monotonic() + 30
        while not any(c.output_offset > 20 for c in pc.checkpoints) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await wait_replicated(pki, keys_of(PROMPT))  # the prompt blocks must survive ii1
        await asyncio.sleep(0.3)  # ii1 is now blocked on max_unreleased
        procs["ii1"].send_signal(signal.SIGKILL)
        procs["ii1"].wait(10)
        await asyncio.wait_for(reader, 10)
        assert [t.index for t in first if isinstance(t, OutputToken)] == list(range(20))  # only acknowledged ones
        # the PC's part of the failover: raise the epoch, resume from the latest checkpoint elsewhere
        latest = max((c for c in pc.checkpoints if c.session == session), key=lambda c: c.output_offset)
        pc.epochs[session] = 2
        pc.hold_above = None
        body = {**latest.to_json(), "epoch": 2, "max_tokens": max_tokens}
        async with as_pc.post(pki.uri("ii2") + f"sessions/{session}/resume", json=body) as resp:
            assert resp.status == 202, await resp.text()
        rest: list[TokenLine] = []
        await asyncio.wait_for(follow(as_fe, pki.uri("ii2") + f"sessions/{session}/tokens?from=20", rest), 30)
        assert rest[-1] == EndLine("max_tokens", 2)
        assembler = OutputAssembler()
        delivered: list[OutputToken] = []
        for line in [*first, *rest]:
            if isinstance(line, OutputToken):
                delivered += assembler.receive(line)
        assert [t.index for t in delivered] == list(range(max_tokens))
        assert [t.token for t in delivered] == reference_tokens(PROMPT, max_tokens, sampler)
        async with as_pc.get(pki.uri("ii2") + "metrics") as resp:
            metrics = await resp.text()
        fetched = next(float(line.split()[-1]) for line in metrics.splitlines()
                       if line.startswith('kvsp_instance_tokens_fetched_total{source="remote"}'))
        assert fetched >= 8  # at least the prompt blocks, which only a cache can supply, came from h1
