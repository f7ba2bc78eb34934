"""The deployment `bench_vllm` measures: the IS, relay and holder processes, the model directories,
the connector TOML files, and the benchmark's own client (`Bench`: role counters, lookups)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from control.deploy.configs import HolderSection, IndexSection, PolicyFile, RelaySection, RoleFile, ScopeEntry, Tls
from control.deploy.pki import DevPki
from control.deploy.ports import free_udp_port
from control.deploy.processes import serve, stop_all, wait_listening
from interop.vllm import VllmEngine
from kvsp.client.http import KvspSession
from kvsp.client.index import IndexClient
from kvsp.descriptor import CompatDescriptor
from kvsp.hf.descriptor import descriptor_from_model_dir
from kvsp.hf.refmodel import ModelShape, init_model
from kvsp.keys import BlockKeyChain, ScopeKey
from kvsp.records import LookupRequest, ReplicaRecord

B: Final = 32  # KVSP block tokens = vLLM's block size (the CPU backend needs a multiple of 32)
TAIL: Final = 16  # prompt tokens after the cached prefix: computed in every run
KV_DTYPE: Final = "fp32"
SHAPES: Final = {
    "reference": ModelShape(),
    "large": ModelShape(layers=12, hidden=768, heads=12, kv_heads=4, vocab=2048),
}
GOAL_SHAPE: Final = "large"
TRANSPORTS: Final = ("https", "moqt")
ROLE_START_S: Final = 60.0
PUBLISH_S: Final = 30.0  # stored blocks listed at the IS (both replicas) within this
RELAY_COUNTERS: Final = ("cache_hits", "cache_misses", "upstream_fetches", "objects_out", "cut_through")
TTFT_GOAL: Final = 0.3
COPY_GOAL: Final = 1.5


@dataclass(frozen=True, slots=True)
class Setup:
    prompt_blocks: int
    reps: int
    block_reps: int

    @property
    def prompt_tokens(self) -> int:
        return self.prompt_blocks * B + TAIL


QUICK: Final = Setup(prompt_blocks=16, reps=2, block_reps=3)
FULL: Final = Setup(prompt_blocks=64, reps=5, block_reps=7)


def random_prompt(seed: int, tokens: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(20, vocab) for _ in range(tokens)]


# -- the processes ------------------------------------------------------------------------------------------
class World:
    """The IS, relay and holder processes, the model directories and the connector TOML files."""

    def __init__(self, tmp: Path, python: Path, setup: Setup) -> None:
        self.tmp, self.python, self.setup = tmp, python, setup
        self.pki = DevPki.make(tmp, ["is", "h1", "relay1", "vllm", "bench"])
        self.key = ScopeKey.generate()
        (tmp / "a.key").write_text(self.key.secret().hex())
        self.models: dict[str, Path] = {}
        self.descriptors: dict[str, CompatDescriptor] = {}
        for name, shape in SHAPES.items():
            self.models[name] = init_model(tmp / f"model-{name}", shape)
            self.descriptors[name] = descriptor_from_model_dir(self.models[name], block_tokens=B, kv_dtype=KV_DTYPE)
            (tmp / f"{name}.json").write_text(json.dumps(self.descriptors[name].to_json()))
        self.h1_moqt, relay_port = free_udp_port(), free_udp_port()
        self.relay_uri = f"moqt://127.0.0.1:{relay_port}/relay1"
        members = [self.pki.uri(n) for n in ("is", "h1", "relay1", "vllm", "bench")]
        PolicyFile(scopes=[ScopeEntry.open_to(self.key.scope_id, members)]).write(tmp / "policy.toml")
        descriptors = [f"{name}.json" for name in SHAPES]
        self._role("is", IndexSection(descriptors=descriptors))
        self._role("relay1", RelaySection(listen=f"127.0.0.1:{relay_port}", uri=self.relay_uri,
                                          cache_octets=512 << 20))
        self._role("h1", HolderSection(
            index=self.pki.uri("is"), descriptors=descriptors, replica_ttl_ms=600_000,
            host_capacity_octets=4 << 30, moqt_listen=f"127.0.0.1:{self.h1_moqt}",
            moqt_uri=f"moqt://127.0.0.1:{self.h1_moqt}/h1", moqt_relay=self.relay_uri))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.engines: list[VllmEngine] = []

    def _role(self, name: str, section: IndexSection | HolderSection | RelaySection) -> None:
        RoleFile([section.ROLE], self.pki.uri(name), Tls.of(name), "policy.toml", sections=[section]).write(
            self.tmp / f"{name}.toml")

    async def start(self) -> None:
        for name, roles in (("is", "is"), ("relay1", "relay"), ("h1", "holder")):  # the holder dials the relay
            log = (self.tmp / f"{name}.log").open("wb")
            self.procs[name] = serve(roles, self.tmp / f"{name}.toml", cwd=self.tmp, stderr=log)
            log.close()  # the child has its own descriptor
            await wait_listening(name, self.pki.port(name), self.procs[name], timeout=ROLE_START_S,
                                 log=self.tmp / f"{name}.log")

    def config(self, shape: str, transport: str) -> Path:
        lines = [f'index = "{self.pki.uri("is")}"', f'store_to = ["{self.pki.uri("h1")}"]', f"block_tokens = {B}",
                 f'descriptor = "{shape}.json"', 'default_scope = "a"', "lookup_timeout_s = 5.0",
                 "load_timeout_s = 30.0", "store_timeout_s = 30.0",
                 '[tls]\ncert = "vllm.pem"\nkey = "vllm.key"\nca = "ca.pem"',
                 '[scopes.a]\nkey_file = "a.key"\ncache_salts = ["tenant-a"]']
        if transport == "moqt":
            lines.append(f'[moqt]\nfetch = true\nrelay = "{self.relay_uri}"')
        path = self.tmp / f"vllm-{shape}-{transport}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def engine(self, shape: str, transport: str) -> VllmEngine:
        max_len = str((self.setup.prompt_blocks + 1) * B)  # the prompt and its first token
        engine = VllmEngine(self.python, self.models[shape], self.config(shape, transport),
                            self.tmp / f"vllm-{shape}-{transport}.log", "--max-model-len", max_len,
                            "--max-num-batched-tokens", max_len, "--max-num-seqs", "2")
        self.engines.append(engine)
        return engine

    def close(self) -> None:
        try:
            for engine in self.engines:
                with contextlib.suppress(Exception):
                    engine.kill()
        finally:
            stop_all(self.procs.values())

    def log_tail(self, name: str, limit: int = 3000) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace")[-limit:] if path.exists() else ""


@contextlib.asynccontextmanager
async def world(setup: Setup, python: Path) -> AsyncIterator[World]:
    with tempfile.TemporaryDirectory(prefix="kvsp-bench-vllm-") as tmp:
        w = World(Path(tmp), python, setup)
        try:
            await w.start()
            yield w
        finally:
            w.close()


class Bench:
    """The benchmark's own client (identity ``bench``): counters of the roles, lookups at the IS."""

    def __init__(self, w: World, session: KvspSession) -> None:
        self.w, self.session = w, session
        self.index = IndexClient(session, w.pki.uri("is"))

    async def metrics(self, name: str) -> dict[str, float]:
        """The role's Prometheus samples, ``name{labels}`` -> value."""
        async with asyncio.timeout(10.0), self.session.http.get(self.w.pki.uri(name) + "metrics") as resp:
            text = await resp.text()
        samples = (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
        return {key: float(value) for key, value in samples}

    async def served(self) -> dict[str, float]:
        """Blocks the holder has served: over HTTPS, and over MOQT (to the relay)."""
        m = await self.metrics("h1")
        part = "kvsp_holder_blocks_served_total{{part=\"{}\"}}"
        return {"https": sum(m.get(part.format(p), 0.0) for p in ("full", "range")),
                "moqt": sum(m.get(part.format(p), 0.0) for p in ("moqt-full", "moqt-range"))}

    async def relay_stats(self) -> dict[str, float]:
        """The relay's counters (``GET {base}relay/stats``): cache hits and misses, upstream FETCHes, ..."""
        async with asyncio.timeout(10.0), self.session.http.get(self.w.pki.uri("relay1") + "relay/stats") as resp:
            doc = await resp.json()
        return {k: float(v) for k, v in doc.items() if k in RELAY_COUNTERS}

    def keys(self, shape: str, prompt: Sequence[int]) -> tuple[bytes, ...]:
        chain = BlockKeyChain(self.w.key, self.w.descriptors[shape].compat_id, B)
        return tuple(chain.extend(prompt))[: self.w.setup.prompt_blocks]

    async def published(self, shape: str, prompt: Sequence[int]) -> list[list[ReplicaRecord]]:
        """Until the IS lists the holder's HTTPS record and its MOQT record (naming the relay) of every
        prefix block; the replica groups."""
        keys = self.keys(shape, prompt)
        want = {self.w.pki.uri("h1"), self.w.relay_uri}
        deadline = time.monotonic() + PUBLISH_S
        groups: list[list[ReplicaRecord]] = []
        while time.monotonic() < deadline:
            answer = await self.index.lookup(LookupRequest(self.w.key.scope_id, self.w.descriptors[shape].compat_id,
                                                           keys))
            groups = [list(g) for g in answer.replicas]
            if len(groups) == len(keys) and all(want <= {r.holder for r in g} for g in groups):
                return groups
            await asyncio.sleep(0.05)
        listed = sorted({r.holder for g in groups for r in g})
        raise AssertionError(f"{shape}: the IS lists {len(groups)} of {len(keys)} blocks in {PUBLISH_S:g} s "
                             f"(holders {listed}, want {sorted(want)}); holder log:\n{self.w.log_tail('h1')}")
