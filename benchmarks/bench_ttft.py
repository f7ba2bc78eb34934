"""Time to first token through the inference instance on the reference Hugging Face model.

Real processes on loopback with mutual TLS: ``kvsp serve is``, a cache holder ``kvsp serve holder``
(HTTPS and MOQT listeners, host memory) and four ``kvsp serve instance`` processes with ``engine =
"hf:DIR"`` (the seeded reference Llama of `kvsp.hf.refmodel`, fp32 on CPU), one per way of loading:

- ``https_overlap`` / ``https_serial``: cached blocks read over HTTPS (lease, streaming GET, every digest);
- ``moqt_overlap`` / ``moqt_serial``: over MOQT (FETCH, layer digests per object; the instance reports a
  fast link to the MOQT listener so its replicas rank first, ``moqt_fetch = true``);
- ``*_overlap``: ``layerwise = true``: the engine computes layer l as soon as layer l of every prefix block
  has arrived (`control.instance.layerwise`); ``*_serial``: the whole prefix is loaded, then computed.

The instances have no own tier (``memory_blocks_octets = 0``), so every cached run loads from the cache
holder, 32 blocks at once (``fetch_concurrency``: the engine needs layer l of every block before it
computes layer l, so blocks fetched whole a few at a time leave little to overlap).  More is not safe over
MOQT yet: with ~64 FETCHes in flight the session runs out of request IDs for a moment (the publisher's
window is 100) and `MoqtBlockClient.subscriber` then replaces the session, failing the FETCHes in flight
(they fall back to HTTPS).

Each repetition takes a fresh prompt (128 blocks of 16 tokens and a tail of 5): the ``recompute`` case
prefills it on the HTTPS-overlap instance (nothing cached), then the front end computes
its blocks, PUTs them to the cache holder, and each loading case starts the same prompt.  TTFT is from the
start POST to the first token line of the stream at the front end; every loading run is checked to have
loaded all prompt blocks from the holder (the instance's metrics), so no figure is a silent recompute.
The baseline of the loading cases is ``recompute``: loading pays when the ratio is above 1.  The
``half_*`` cases cache only the first half of another prompt, so that the engine has as much to compute
as to load: that is where overlap can pay (``overlap_gain_*``: overlap vs serial, same transport); with
the whole prompt cached only the 5-token tail is computed and there is next to nothing to overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from benchmarks.timing import Sample, case
from control.deploy import configs
from control.deploy.doubles import pc_double
from control.deploy.fixtures import SCOPE, SCOPE_KEY
from control.deploy.pki import DevPki
from control.deploy.ports import free_udp_port
from control.deploy.processes import role_processes
from kvsp.client.holder import HolderClient
from kvsp.client.index import IndexClient
from kvsp.container import Geometry, encode_container
from kvsp.engine import greedy_sampler
from kvsp.hf.descriptor import descriptor_from_model_dir
from kvsp.hf.engine import HfModel
from kvsp.hf.refmodel import ModelShape, init_model
from kvsp.keys import BlockKeyChain
from kvsp.records import LookupRequest
from kvsp.registry import Codec

B = 16
PROMPT_TAIL = 5
LOADERS = {"https_overlap": (False, True), "https_serial": (False, False),
           "moqt_overlap": (True, True), "moqt_serial": (True, False)}  # name -> (moqt_fetch, layerwise)
ROLE = {name: "ii" + name.replace("_", "") for name in LOADERS}  # PKI names: letters only
TIMEOUT_S = 300.0
MAX_FETCHES = 32  # blocks in flight (see the module docstring on MOQT's request window)


@dataclass(frozen=True, slots=True)
class Setup:
    shape: ModelShape
    prompt_blocks: int
    reps: int


QUICK = Setup(ModelShape(layers=4, hidden=256, heads=8, kv_heads=2, vocab=2048), prompt_blocks=128, reps=3)
FULL = Setup(ModelShape(layers=8, hidden=1024, heads=16, kv_heads=4, vocab=2048), prompt_blocks=128, reps=3)


def _write_configs(pki: DevPki, tmp: Path, model: Path, moqt_port: int, blocks: int) -> None:
    descriptor = descriptor_from_model_dir(model, block_tokens=B)
    (tmp / "model.json").write_text(json.dumps(descriptor.to_json()))
    (tmp / "scope.key").write_text(SCOPE_KEY.secret().hex())
    everyone = configs.ScopeEntry.open_to(SCOPE, list(pki.uris.values()))
    configs.PolicyFile(pki.uri("pc"), scopes=[everyone]).write(tmp / "policy.toml")

    def role_file(name: str, roles: str, *sections: configs.Section) -> configs.RoleFile:
        return configs.RoleFile([roles], pki.uri(name), configs.Tls.of(name), "policy.toml", sections=sections)

    role_file("is", "is", configs.IndexSection(descriptors=["model.json"])).write(tmp / "is.toml")
    moqt = f"moqt://127.0.0.1:{moqt_port}/h1"
    role_file("h1", "holder", configs.HolderSection(
        index=pki.uri("is"), descriptors=["model.json"], replica_ttl_ms=600_000, host_capacity_octets=4 << 30,
        moqt_listen=f"127.0.0.1:{moqt_port}", moqt_uri=moqt)).write(tmp / "h1.toml")
    for name, (over_moqt, overlap) in LOADERS.items():
        role = ROLE[name]
        role_file(role, "instance", configs.InstanceSection(
            pc=pki.uri("pc"), index=pki.uri("is"), engine=f"hf:{model}", descriptors=["model.json"],
            scope_keys={SCOPE.hex(): "scope.key"}, memory_blocks_octets=0, load_timeout_ms=120_000,
            fetch_concurrency=min(blocks, MAX_FETCHES), moqt_fetch=over_moqt, layerwise=overlap,
            links=[configs.HolderLink(moqt, 100_000.0, 10)] if over_moqt else None)).write(tmp / f"{role}.toml")


@contextlib.asynccontextmanager
async def _processes(pki: DevPki, tmp: Path) -> AsyncIterator[None]:
    names = {"is": "is", "h1": "holder", **{role: "instance" for role in ROLE.values()}}
    async with role_processes(names, tmp, {n: pki.port(n) for n in names}, timeout=TIMEOUT_S):
        yield


@dataclass
class Bench:
    pki: DevPki
    as_pc: aiohttp.ClientSession
    as_fe: aiohttp.ClientSession
    compat_id: bytes
    moqt_uri: str
    geometry: Geometry

    async def ttft(self, role: str, prompt: Sequence[int]) -> float:
        """Seconds from the start POST to the first token line at the front end."""
        session, uri = str(uuid.uuid4()), self.pki.uri(role)
        body = {"session": session, "epoch": 1, "scope_id": SCOPE.hex(), "compat_id": self.compat_id.hex(),
                "prompt": list(prompt), "max_tokens": 1, "sampler": greedy_sampler().to_json()}
        start = time.perf_counter()
        async with self.as_pc.post(uri + f"sessions/{session}/start", json=body) as resp:
            assert resp.status == 202, await resp.text()
        async with asyncio.timeout(TIMEOUT_S), self.as_fe.get(uri + f"sessions/{session}/tokens") as resp:
            line = await resp.content.readline()
            first = time.perf_counter()
            assert "token" in json.loads(line), line
            await resp.read()
        return first - start

    async def loaded_ttft(self, role: str, prompt: Sequence[int], blocks: int) -> float:
        """`ttft`, checking that the instance loaded ``blocks`` blocks from the cache holder."""
        line = 'kvsp_instance_tokens_fetched_total{source="remote"}'
        before = await self.metric(role, line)
        seconds = await self.ttft(role, prompt)
        fetched = await self.metric(role, line) - before
        assert fetched == blocks * B, f"{role} loaded {fetched} tokens, not {blocks * B}"
        return seconds

    async def metric(self, name: str, line: str) -> float:
        async with self.as_pc.get(self.pki.uri(name) + "metrics") as resp:
            text = await resp.text()
        return next((float(t.split()[-1]) for t in text.splitlines() if t.startswith(line + " ")), 0.0)

    async def cache(self, model: HfModel, prompt: Sequence[int], blocks: int) -> None:
        """The front end computes the prompt's first ``blocks`` blocks, PUTs them to the cache holder and
        waits until the IS lists its replicas of each (HTTPS and MOQT)."""
        engine = model.engine()
        await asyncio.to_thread(engine.prefill, prompt[: blocks * B])
        keys = tuple(BlockKeyChain(SCOPE_KEY, self.compat_id, B).extend(prompt[: blocks * B]))
        want = {self.pki.uri("h1"), self.moqt_uri}
        deadline = time.monotonic() + TIMEOUT_S
        layers = engine.geometry.layers
        async with self.pki.session("fe") as session:
            holder = HolderClient(session)
            for i, key in enumerate(keys):
                kv = engine.export_kv(i, (0, layers - 1))
                body = encode_container(Codec.RAW, 0, B, [(lk.k, lk.v) for lk in kv], geometry=self.geometry)
                await holder.put_block(self.pki.uri("h1"), self.compat_id, SCOPE, key, body)
            index = IndexClient(session, self.pki.uri("is"))
            while time.monotonic() < deadline:
                groups = (await index.lookup(LookupRequest(SCOPE, self.compat_id, keys))).replicas
                if len(groups) == len(keys) and all(want <= {r.holder for r in g} for g in groups):
                    return
                await asyncio.sleep(0.05)
        raise AssertionError("the prompt blocks did not reach the cache holder")


def _prompt(seed: int, blocks: int, vocab: int) -> tuple[int, ...]:
    return tuple(3 + (seed * 7919 + i * 31) % (vocab - 3) for i in range(blocks * B + PROMPT_TAIL))


async def _measure(setup: Setup, tmp: Path) -> tuple[dict[str, list[float]], dict[str, object]]:
    model = init_model(tmp / "model", setup.shape)
    pki = DevPki.make(tmp, ["pc", "is", "h1", "fe", *ROLE.values()])
    moqt_port = free_udp_port()
    _write_configs(pki, tmp, model, moqt_port, setup.prompt_blocks)
    descriptor = descriptor_from_model_dir(model, block_tokens=B)
    reference = HfModel.load(model, block_tokens=B)
    half = setup.prompt_blocks // 2
    timings: dict[str, list[float]] = {"recompute": [], **{name: [] for name in LOADERS},
                                       **{f"half_{name}": [] for name in LOADERS}}
    connectors = {who: aiohttp.TCPConnector(ssl=pki.client_ssl(who)) for who in ("pc", "fe")}
    async with pc_double(pki), _processes(pki, tmp), aiohttp.ClientSession(connector=connectors["pc"]) as as_pc, \
            aiohttp.ClientSession(connector=connectors["fe"]) as as_fe:
        bench = Bench(pki, as_pc, as_fe, descriptor.compat_id, f"moqt://127.0.0.1:{moqt_port}/h1",
                      descriptor.geometry())
        for role in ROLE.values():  # warm-up: first-call costs of torch and of the connections
            await bench.ttft(role, _prompt(1, 2, setup.shape.vocab))
        for rep in range(setup.reps):
            prompt = _prompt(100 + rep, setup.prompt_blocks, setup.shape.vocab)
            timings["recompute"].append(await bench.ttft(ROLE["https_overlap"], prompt))
            await bench.cache(reference, prompt, setup.prompt_blocks)
            for name in LOADERS:
                timings[name].append(await bench.loaded_ttft(ROLE[name], prompt, setup.prompt_blocks))
            prompt = _prompt(500 + rep, setup.prompt_blocks, setup.shape.vocab)  # its first half cached
            await bench.cache(reference, prompt, half)
            for name in LOADERS:
                timings[f"half_{name}"].append(await bench.loaded_ttft(ROLE[name], prompt, half))
        over_moqt = await bench.metric("h1", 'kvsp_holder_blocks_served_total{part="moqt-full"}')
        assert over_moqt == 2 * setup.reps * (setup.prompt_blocks + half), over_moqt
    g = setup.shape
    params: dict[str, object] = {
        "model": {"layers": g.layers, "hidden": g.hidden, "heads": g.heads, "kv_heads": g.kv_heads,
                  "vocab": g.vocab, "dtype": "fp32", "device": "cpu"},
        "prompt_tokens": setup.prompt_blocks * B + PROMPT_TAIL, "block_tokens": B, "reps": setup.reps,
        "block_octets": g.layers * 2 * B * g.kv_heads * (g.hidden // g.heads) * 4}
    return timings, params


def run(quick: bool = False) -> dict[str, object]:
    setup = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="kvsp-bench-ttft-") as tmp:
        timings, params = asyncio.run(_measure(setup, Path(tmp)))
    base = Sample.of(timings["recompute"])
    rows = [case("ttft_recompute", base, None, "time to first token, nothing cached (the baseline)")]
    for name in LOADERS:
        rows.append(case(f"ttft_{name}", Sample.of(timings[name]), base,
                         "time to first token with the prefix cached; ratio > 1: loading beats recomputing",
                         higher_is_better=True))
    for name in LOADERS:
        rows.append(case(f"half_{name}", Sample.of(timings[f"half_{name}"]), base,
                         "first half of the prompt cached, second half computed", higher_is_better=True))
    for over in ("https", "moqt"):
        for prefix in ("", "half_"):
            rows.append(case(f"overlap_gain_{prefix}{over}", Sample.of(timings[f"{prefix}{over}_overlap"]),
                             Sample.of(timings[f"{prefix}{over}_serial"]),
                             "layer-wise overlap vs load-then-compute over the same transport (ratio >= 1)",
                             higher_is_better=True))
    return {"name": "ttft", "params": params, "cases": rows}


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
