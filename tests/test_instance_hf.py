"""The instance on the reference Hugging Face model (``engine = "hf:DIR"``), as real processes.

Two ``kvsp serve instance,holder`` processes run the same tiny seeded Llama (fp32, CPU, prompts computed
in chunks of one block so that a loaded prefix runs the very kernels a full recompute runs).  Instance A
prefills a prompt and publishes its blocks (HTTPS and MOQT records of its holder); instance B loads them
(over MOQT, or over HTTPS) while it computes, and continues greedily token by token exactly like a full
recompute in this process.  The test process also fetches A's blocks over both transports and checks
that the next-token logits over the loaded prefix equal a full recompute's, bit for bit.  A changed
weight file gives another compat_id: the cache misses, and an instance configured with the old
descriptor refuses to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from control.deploy import configs
from control.deploy.pki import DevPki
from control.deploy.ports import free_udp_port
from control.deploy.processes import role_processes, serve
from kvsp.client.fetch import BlockFetcher, FetchOptions
from kvsp.client.moqt import MoqtBlockClient
from kvsp.container import encode_container, replica_digest
from kvsp.descriptor import CompatDescriptor
from kvsp.engine import LayerKv, greedy_sampler
from kvsp.hf.descriptor import descriptor_from_model_dir
from kvsp.hf.engine import HfEngine, HfModel
from kvsp.hf.refmodel import ModelShape, init_model
from kvsp.keys import BlockKeyChain
from kvsp.records import Link, LookupRequest
from kvsp.registry import Codec
from tests.support.instance import SCOPE, SCOPE_KEY, pc_double
from tests.support.instance_moqt import (
    SlowBlocks,
    gate_engines,
    moqt_world,
    slow_https_holder,
    slow_moqt_holder,
)

B = 4
SHAPE = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, vocab=300, max_positions=1024)
NAMES = ["pc", "is", "ii1", "ii2", "fe"]  # (the in-process test adds h1 and the slow source)
PROMPT_A = tuple(range(5, 19))  # three blocks and a tail of two
PROMPT_B = tuple(range(40, 57))  # four blocks and a tail of one
MAX_TOKENS = 8
T = 60.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("model") / "tiny", SHAPE)


@pytest.fixture(scope="module")
def changed_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference model with one bit of one weight flipped."""
    changed = tmp_path_factory.mktemp("model") / "changed"
    shutil.copytree(model_dir, changed)
    weights = changed / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    return changed


def keys_of(descriptor: CompatDescriptor, tokens: Sequence[int]) -> list[bytes]:
    return list(BlockKeyChain(SCOPE_KEY, descriptor.compat_id, B).extend(tokens))


def reference(model: HfModel, prompt: Sequence[int], n: int) -> list[int]:
    """Greedy tokens of a full recompute in this process."""
    return run(model, prompt, n)[0]


def run(model: HfModel, prompt: Sequence[int], n: int) -> tuple[list[int], HfEngine]:
    engine = model.engine(greedy_sampler())
    out = [engine.prefill(prompt).token]
    while len(out) < n:
        out.append(engine.decode_step().token)
    return out, engine


def block_digest(engine: HfEngine, block: int) -> bytes:
    """The replica digest of a block of the engine's cache (as a holder would publish it)."""
    layers = engine.export_kv(block, (0, engine.geometry.layers - 1))
    return replica_digest([hashlib.sha256(b"".join((lk.k, lk.v))).digest() for lk in layers])


def write_configs(pki: DevPki, tmp: Path, model: Path, ports: dict[str, int]) -> None:
    descriptor = descriptor_from_model_dir(model, block_tokens=B)
    (tmp / "model.json").write_text(json.dumps(descriptor.to_json()))
    (tmp / "scope.key").write_text(SCOPE_KEY.secret().hex())
    everyone = configs.ScopeEntry.open_to(SCOPE, [pki.uri(n) for n in ("pc", "ii1", "ii2", "fe")])
    configs.PolicyFile(pki.uri("pc"), scopes=[everyone]).write(tmp / "policy.toml")
    index = configs.IndexSection(descriptors=["model.json"])
    is_file = configs.RoleFile(["is"], pki.uri("is"), configs.Tls.of("is"), "policy.toml", sections=[index])
    is_file.write(tmp / "is.toml")
    for name in ("ii1", "ii2"):
        holder = configs.HolderSection(index=pki.uri("is"), descriptors=["model.json"], replica_ttl_ms=60_000,
                                       moqt_listen=f"127.0.0.1:{ports[name]}",
                                       moqt_uri=f"moqt://127.0.0.1:{ports[name]}/{name}")
        instance = configs.InstanceSection(pc=pki.uri("pc"), index=pki.uri("is"), engine=f"hf:{model}",
                                           scope_keys={SCOPE.hex(): "scope.key"}, hf_chunk_tokens=B, layerwise=True)
        if name == "ii2":
            link = configs.HolderLink(f"moqt://127.0.0.1:{ports['ii1']}/ii1", 100_000.0, 10)
            instance = dataclasses.replace(instance, moqt_fetch=True, links=[link])
        configs.RoleFile(["instance", "holder"], pki.uri(name), configs.Tls.of(name), "policy.toml",
                         sections=[holder, instance]).write(tmp / f"{name}.toml")


@contextlib.asynccontextmanager
async def processes(pki: DevPki, tmp: Path) -> AsyncIterator[None]:
    roles = {"is": "is", "ii1": "instance,holder", "ii2": "instance,holder"}
    async with role_processes(roles, tmp, {n: pki.port(n) for n in roles}, timeout=T):
        yield


async def generate(http: aiohttp.ClientSession, fe: aiohttp.ClientSession, uri: str, prompt: Sequence[int],
                   descriptor: CompatDescriptor) -> list[int]:
    session = str(uuid.uuid4())
    body = {"session": session, "epoch": 1, "scope_id": SCOPE.hex(), "compat_id": descriptor.compat_id.hex(),
            "prompt": list(prompt), "max_tokens": MAX_TOKENS, "sampler": greedy_sampler().to_json()}
    async with http.post(uri + f"sessions/{session}/start", json=body) as resp:
        assert resp.status == 202, await resp.text()
    tokens: list[int] = []
    async with asyncio.timeout(T), fe.get(uri + f"sessions/{session}/tokens") as resp:
        while line := await resp.content.readline():
            event = json.loads(line)
            if event.get("end"):
                return tokens
            tokens.append(event["token"])
    raise AssertionError("the token stream ended without an end line")


async def metric(http: aiohttp.ClientSession, uri: str, line: str) -> float:
    async with http.get(uri + "metrics") as resp:
        text = await resp.text()
    return next((float(t.split()[-1]) for t in text.splitlines() if t.startswith(line + " ")), 0.0)


async def wait_published(fetcher: BlockFetcher, descriptor: CompatDescriptor, keys: list[bytes],
                         holders: set[str]) -> None:
    deadline = time.monotonic() + T
    while time.monotonic() < deadline:
        groups = (await fetcher.index.lookup(LookupRequest(SCOPE, descriptor.compat_id, tuple(keys)))).replicas
        if len(groups) == len(keys) and all(holders <= {r.holder for r in g} for g in groups):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{holders} did not publish {len(keys)} blocks")


async def test_two_instances_share_a_prefix_over_moqt_and_https(tmp_path: Path, model_dir: Path,
                                                                changed_dir: Path) -> None:
    pki = DevPki.make(tmp_path, NAMES)
    ports = {"ii1": free_udp_port(), "ii2": free_udp_port()}
    moqt = {name: f"moqt://127.0.0.1:{port}/{name}" for name, port in ports.items()}
    write_configs(pki, tmp_path, model_dir, ports)
    descriptor = descriptor_from_model_dir(model_dir, block_tokens=B)
    model = HfModel.load(model_dir, block_tokens=B, chunk_tokens=B)
    ssl = {who: aiohttp.TCPConnector(ssl=pki.client_ssl(who)) for who in ("pc", "fe")}
    async with pc_double(pki), processes(pki, tmp_path), aiohttp.ClientSession(connector=ssl["pc"]) as as_pc, \
            aiohttp.ClientSession(connector=ssl["fe"]) as as_fe, pki.session("fe") as session:
        d = pki.dir
        client = MoqtBlockClient.from_files(d / "fe.pem", d / "fe.key", d / "ca.pem")
        fetcher = BlockFetcher(session, pki.uri("is"), options=FetchOptions(lease_ms=None))
        try:
            # A computes PROMPT_A and publishes its blocks; B loads them over MOQT while it computes
            tokens, engine = run(model, PROMPT_A, MAX_TOKENS)
            assert await generate(as_pc, as_fe, pki.uri("ii1"), PROMPT_A, descriptor) == tokens
            keys_a = keys_of(descriptor, PROMPT_A)
            await wait_published(fetcher, descriptor, keys_a, {pki.uri("ii1"), moqt["ii1"]})
            # the blocks completed by generated tokens are published too, with the KV of a decode here
            context = keys_of(descriptor, (*PROMPT_A, *tokens[:-1]))  # the last token is sampled, not cached
            await wait_published(fetcher, descriptor, context, {pki.uri("ii1")})
            groups = (await fetcher.index.lookup(LookupRequest(SCOPE, descriptor.compat_id, tuple(context)))).replicas
            assert [next(r.digest for r in g if r.holder == pki.uri("ii1")) for g in groups] == [
                block_digest(engine, i) for i in range(len(context))]
            changed = descriptor_from_model_dir(changed_dir, block_tokens=B)  # another model: A's blocks miss
            miss = await fetcher.fetch(SCOPE, changed.compat_id, keys_of(changed, PROMPT_A), block_tokens=B)
            assert miss.lookup_error is None and miss.matched == 0 and miss.loaded_blocks == 0
            assert await generate(as_pc, as_fe, pki.uri("ii2"), PROMPT_A, descriptor) == reference(
                model, PROMPT_A, MAX_TOKENS)
            assert await metric(as_pc, pki.uri("ii1"), 'kvsp_holder_blocks_served_total{part="moqt-full"}') == 3
            assert await metric(as_pc, pki.uri("ii2"), 'kvsp_instance_tokens_fetched_total{source="remote"}') == 12
            assert await metric(as_pc, pki.uri("ii2"),
                                'kvsp_instance_layerwise_prefills_total{result="overlapped"}') == 1
            # the other way: B computes PROMPT_B; A (no moqt_fetch) loads it over HTTPS
            assert await generate(as_pc, as_fe, pki.uri("ii2"), PROMPT_B, descriptor) == reference(
                model, PROMPT_B, MAX_TOKENS)
            keys_b = keys_of(descriptor, PROMPT_B)
            await wait_published(fetcher, descriptor, keys_b, {pki.uri("ii2")})
            assert await generate(as_pc, as_fe, pki.uri("ii1"), PROMPT_B, descriptor) == reference(
                model, PROMPT_B, MAX_TOKENS)
            assert await metric(as_pc, pki.uri("ii2"), 'kvsp_holder_blocks_served_total{part="full"}') == 4
            assert await metric(as_pc, pki.uri("ii1"), 'kvsp_instance_tokens_fetched_total{source="remote"}') == 16
            # next-token logits over A's blocks, fetched over HTTPS and over MOQT, equal a full recompute's
            full = model.engine().prefill(PROMPT_A).logits
            over_moqt = BlockFetcher(session, pki.uri("is"), moqt=client, options=FetchOptions(
                lease_ms=None, links=(Link(moqt["ii1"], 100_000.0, 10),)))
            for through, want in ((fetcher, "https"), (over_moqt, "moqt")):
                result = await through.fetch(SCOPE, descriptor.compat_id, keys_a, block_tokens=B)
                assert result.loaded_blocks == 3
                assert {r.replica.holder.split(":")[0] for r in result.blocks} == {want}
                prefix = [[LayerKv(v.layer, v.k, v.v) for v in b.layers] for b in result.blocks]
                loaded = model.engine().prefill(PROMPT_A, prefix)
                assert np.array_equal(loaded.logits, full), want
        finally:
            await client.close()


async def test_a_changed_weight_file_is_another_model(tmp_path: Path, model_dir: Path, changed_dir: Path) -> None:
    changed = changed_dir
    old, new = (descriptor_from_model_dir(d, block_tokens=B) for d in (model_dir, changed))
    assert (old.layers, old.kv_heads, old.head_dim, old.tokenizer_digest) == (
        new.layers, new.kv_heads, new.head_dim, new.tokenizer_digest)
    assert new.model_digest != old.model_digest and new.compat_id != old.compat_id
    # the Block Keys of the same prompt differ, so blocks of the old model are never found for the new one
    assert set(keys_of(old, PROMPT_A)).isdisjoint(keys_of(new, PROMPT_A))
    # an instance configured with the old descriptor but the changed files refuses to start, in one line
    pki = DevPki.make(tmp_path, NAMES)
    write_configs(pki, tmp_path, model_dir, {"ii1": free_udp_port(), "ii2": free_udp_port()})
    config = (tmp_path / "ii1.toml").read_text().replace(f"hf:{model_dir}", f"hf:{changed}")
    (tmp_path / "ii1.toml").write_text(config)
    proc = serve("instance,holder", tmp_path / "ii1.toml")
    _, err = proc.communicate(timeout=T)
    lines = err.decode().strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, lines
    assert "instance.engine" in lines[0] and new.compat_id.hex() in lines[0] and old.compat_id.hex() in lines[0]


@pytest.mark.parametrize(("over", "broken"), [("moqt", False), ("https", True)])
async def test_hf_prefill_overlaps_the_load_and_recomputes_a_lost_block(tmp_path: Path, model_dir: Path,
                                                                        over: str, broken: bool) -> None:
    """In one process: the HF engine computes layer 0 over layer 0 of the prefix while layer 1 is withheld;
    a block whose transfer breaks after layer 0 is recomputed; either way the tokens are a full recompute's."""
    descriptor = descriptor_from_model_dir(model_dir, block_tokens=B)
    model = HfModel.load(model_dir, block_tokens=B, chunk_tokens=B)
    tokens, engine = run(model, PROMPT_A, MAX_TOKENS)
    keys = keys_of(descriptor, PROMPT_A)
    containers = {key: encode_container(Codec.RAW, 0, B, [(lk.k, lk.v) for lk in engine.export_kv(i, (0, 1))],
                                        geometry=descriptor.geometry()) for i, key in enumerate(keys)}
    blocks = SlowBlocks(containers, broken={keys[2]} if broken else set(), compat_id=descriptor.compat_id)
    pki = DevPki.make(tmp_path, [*NAMES, "h1", "slow"])
    source = slow_moqt_holder if over == "moqt" else slow_https_holder
    async with moqt_world(pki, tmp_path, descriptor=descriptor, engine=f"hf:{model_dir}", hf_chunk_tokens=B,
                          moqt_fetch=True) as world, source(pki, blocks):
        log = gate_engines(world, SHAPE.layers)
        session = str(uuid.uuid4())
        body = {"session": session, "epoch": 1, "scope_id": SCOPE.hex(), "compat_id": descriptor.compat_id.hex(),
                "prompt": list(PROMPT_A), "max_tokens": MAX_TOKENS, "sampler": greedy_sampler().to_json()}
        await world.start(session, body)
        async with asyncio.timeout(T):
            await log.computed[0].wait()
        assert not blocks.go.is_set() and log.layerwise_calls == [3]
        blocks.go.set()
        assert await world.tokens(session) == tokens
        result = "fallback" if broken else "overlapped"
        assert await world.metric("ii1", f'kvsp_instance_layerwise_prefills_total{{result="{result}"}}') == 1
        assert await world.metric("ii1", 'kvsp_instance_tokens_fetched_total{source="remote"}') == (8 if broken
                                                                                                    else 12)
