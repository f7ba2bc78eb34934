"""The instance loading its cached prefix over HTTPS and MOQT, layer by layer while it computes, and
publishing the blocks it computes layer by layer as live MOQT tracks (decision D3).

Real IS, holder (HTTPS + MOQT), instance+holder in one event loop over mutual TLS; the engine is the
test engine (its output is a function of the cached KV, so wrong or missing KV changes the tokens), wrapped
so that a test can hold the prefill before a layer and see when each layer was computed.  Slow sources
send a block's first layer and hold the rest until the test lets it go: the engine computing layer 0
meanwhile is what "overlapped" means.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from control.deploy.pki import DevPki
from control.holder.app import HOLDER
from control.instance.engines import engine_factory
from control.instance.settings import InstanceSettings, Layerwise
from kvsp.client.fetch import BlockFetcher, FetchOptions, Outcome
from kvsp.client.holder import HolderClient
from kvsp.client.moqt import MoqtBlockClient
from kvsp.container import decode_container, replica_digest
from kvsp.engine import greedy_sampler
from kvsp.errors import ValidationError
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.records import Link
from kvsp.registry import Codec
from kvsp.service.config import RoleConfig
from tests.support.instance import (
    COMPAT,
    DESCRIPTOR,
    NAMES,
    PROMPT,
    SCOPE,
    B,
    instance_section,
    keys_of,
    policy,
    reference_block,
    reference_tokens,
    start_body,
    write_files,
)
from tests.support.instance_moqt import (
    SlowBlocks,
    T,
    gate_engines,
    moqt_world,
    slow_https_holder,
    slow_moqt_holder,
)
from tests.support.servers import role_config, running

LAYERS = DESCRIPTOR.layers
FAST_MOQT_LINK = {"holder": "h1-moqt", "mbit_per_s": 100_000.0, "rtt_us": 10}  # cheaper than the https default
OVERLAPPED = 'kvsp_instance_layerwise_prefills_total{result="overlapped"}'
FALLBACK = 'kvsp_instance_layerwise_prefills_total{result="fallback"}'
REMOTE = 'kvsp_instance_tokens_fetched_total{source="remote"}'
RECOMPUTED = "kvsp_instance_tokens_recomputed_total"


@pytest.mark.parametrize("over", ["https", "moqt"])
async def test_start_loads_the_cached_prefix_over_https_or_moqt(tmp_path: Path, over: str) -> None:
    pki = DevPki.make(tmp_path, NAMES)
    settings: dict[str, Any] = {"moqt_fetch": True, "links": [FAST_MOQT_LINK]} if over == "moqt" else {}
    async with moqt_world(pki, tmp_path, **settings) as world:
        keys = keys_of(PROMPT)
        client = HolderClient(world.session)
        for i, key in enumerate(keys):
            await client.put_block(pki.uri("h1"), COMPAT, SCOPE, key, reference_block(PROMPT, i))
        await world.wait_records(keys, {pki.uri("h1"), world.moqt_uris["h1"]})
        session = str(uuid.uuid4())
        await world.start(session, start_body(session, greedy_sampler(), max_tokens=6))
        assert await world.tokens(session) == reference_tokens(PROMPT, 6, greedy_sampler())
        over_https = await world.metric("h1", 'kvsp_holder_blocks_served_total{part="full"}')
        over_moqt = await world.metric("h1", 'kvsp_holder_blocks_served_total{part="moqt-full"}')
        assert (over_https, over_moqt) == ((0, 2) if over == "moqt" else (2, 0))
        assert await world.metric("ii1", OVERLAPPED) == 1
        assert await world.metric("ii1", REMOTE) == 8 and await world.metric("ii1", RECOMPUTED) == 2


async def test_auto_overlaps_only_when_blocks_are_fetched_and_enough_is_computed(tmp_path: Path) -> None:
    pki = DevPki.make(tmp_path, NAMES)
    long = tuple(range(3, 3 + 6 * B + 2))  # 2 cached blocks, 4 computed blocks and a tail of 2: worth overlapping
    async with moqt_world(pki, tmp_path, layerwise="auto") as world:
        client = HolderClient(world.session)
        for prompt in (PROMPT, long):
            keys = keys_of(prompt)[:2]
            for i, key in enumerate(keys):
                await client.put_block(pki.uri("h1"), COMPAT, SCOPE, key, reference_block(prompt, i))
            await world.wait_records(keys, {pki.uri("h1")})
        session = str(uuid.uuid4())
        await world.start(session, start_body(session, greedy_sampler(), max_tokens=3))  # a tail of 2 tokens
        assert await world.tokens(session) == reference_tokens(PROMPT, 3, greedy_sampler())
        assert await world.metric("ii1", OVERLAPPED) == 0 and await world.metric("ii1", REMOTE) == 8
        session = str(uuid.uuid4())
        await world.start(session, start_body(session, greedy_sampler(), prompt=long, max_tokens=3))
        assert await world.tokens(session) == reference_tokens(long, 3, greedy_sampler())
        assert await world.metric("ii1", OVERLAPPED) == 1 and await world.metric("ii1", REMOTE) == 16
        assert await world.metric("ii1", RECOMPUTED) == 2 + 4 * B + 2


@pytest.mark.parametrize("over", ["https", "moqt"])
async def test_layer_0_is_computed_while_later_layers_are_on_the_wire(tmp_path: Path, over: str) -> None:
    pki = DevPki.make(tmp_path, NAMES)
    keys = keys_of(PROMPT)
    blocks = SlowBlocks({key: reference_block(PROMPT, i) for i, key in enumerate(keys)})
    source = slow_moqt_holder if over == "moqt" else slow_https_holder
    async with moqt_world(pki, tmp_path, moqt_fetch=True) as world, source(pki, blocks):
        log = gate_engines(world, LAYERS)
        session = str(uuid.uuid4())
        await world.start(session, start_body(session, greedy_sampler(), max_tokens=5))
        async with asyncio.timeout(T):
            await log.computed[0].wait()  # layer 0 of the whole context, over layer 0 of both prefix blocks
        assert not blocks.go.is_set() and not log.computed[1].is_set()
        assert log.layerwise_calls == [2] and sorted(blocks.served) == sorted(keys)
        blocks.go.set()  # now layer 1 of the blocks travels, and the engine goes on
        assert await world.tokens(session) == reference_tokens(PROMPT, 5, greedy_sampler())
        assert await world.metric("ii1", OVERLAPPED) == 1 and await world.metric("ii1", FALLBACK) == 0
        assert await world.metric("ii1", REMOTE) == 8


@pytest.mark.parametrize("over", ["https", "moqt"])
async def test_a_block_lost_mid_load_is_recomputed(tmp_path: Path, over: str) -> None:
    pki = DevPki.make(tmp_path, NAMES)
    keys = keys_of(PROMPT)
    blocks = SlowBlocks({key: reference_block(PROMPT, i) for i, key in enumerate(keys)}, broken={keys[1]})
    source = slow_moqt_holder if over == "moqt" else slow_https_holder
    async with moqt_world(pki, tmp_path, moqt_fetch=True) as world, source(pki, blocks):
        log = gate_engines(world, LAYERS)
        session = str(uuid.uuid4())
        await world.start(session, start_body(session, greedy_sampler(), max_tokens=5))
        async with asyncio.timeout(T):
            await log.computed[0].wait()  # the engine used layer 0 of block 1 already
        blocks.go.set()  # block 0 completes; block 1 breaks after its layer 0
        assert await world.tokens(session) == reference_tokens(PROMPT, 5, greedy_sampler())
        assert await world.metric("ii1", FALLBACK) == 1 and await world.metric("ii1", OVERLAPPED) == 0
        assert await world.metric("ii1", REMOTE) == 4 and await world.metric("ii1", RECOMPUTED) == 6
        # the recomputed block 1 and the loaded block 0 are now replicas of ii1's holder
        groups = await world.wait_records(keys, {pki.uri("ii1")})
        mine = [next(r for r in g if r.holder == pki.uri("ii1")) for g in groups]
        assert [r.digest for r in mine] == [replica_digest(decode_container(reference_block(PROMPT, i)).layer_digests())
                                           for i in range(2)]


async def test_computed_blocks_are_published_live_layer_by_layer(tmp_path: Path) -> None:
    pki = DevPki.make(tmp_path, NAMES)
    async with moqt_world(pki, tmp_path, publish_live=True) as world:
        log = gate_engines(world, LAYERS)
        log.hold(0, 1)  # the prefill waits before each layer until the test lets it compute
        keys = keys_of(PROMPT)
        session = str(uuid.uuid4())
        await world.start(session, start_body(session, greedy_sampler(), max_tokens=3))
        async with asyncio.timeout(T):
            await log.waiting[0].wait()  # the live tracks exist; nothing is computed yet
        namespace = TrackNamespace(COMPAT, SCOPE, role_id(pki.uri("ii1")), keys[1])
        d = pki.dir
        client = MoqtBlockClient.from_files(d / "fe.pem", d / "fe.key", d / "ca.pem")
        expected = decode_container(reference_block(PROMPT, 1))
        try:
            async with asyncio.timeout(T), client.subscribe_block(
                    world.moqt_uris["ii1"], namespace, Codec.RAW, layer_count=LAYERS,
                    layer_digests=expected.layer_digests(), geometry=DESCRIPTOR.geometry()) as stream:
                log.release(0)
                received = []
                async for view in stream.layers():
                    assert not log.computed[view.layer + 1].is_set() if view.layer + 1 < LAYERS else True
                    received.append((view.layer, bytes(view.k), bytes(view.v)))
                    if view.layer + 1 < LAYERS:
                        log.release(view.layer + 1)  # layer l+1 is computed only after layer l arrived
            assert stream.complete
        finally:
            await client.close()
        assert received == [(v.layer, bytes(v.k), bytes(v.v)) for v in expected.layers]
        assert await world.tokens(session) == reference_tokens(PROMPT, 3, greedy_sampler())
        assert await world.metric("ii1", "kvsp_instance_live_layers_total") == 2 * LAYERS
        # once complete, the block is stored and published like any other: the same digests
        groups = await world.wait_records(keys, {pki.uri("ii1")})
        assert next(r for r in groups[1] if r.holder == pki.uri("ii1")).layer_digests == expected.layer_digests()
        assert HOLDER in world.apps["ii1"]


# -- settings and refusals -----------------------------------------------------------------------------
def _settings(tmp: Path, **instance: object) -> InstanceSettings:
    model, key = write_files(tmp)
    doc: dict[str, object] = {"roles": ["instance"], "server": {"base_uri": "https://127.0.0.1:1/ii/"},
                              "instance": {"pc": "https://127.0.0.1:7401/pc/", "index": "https://127.0.0.1:7401/pc/",
                                           "descriptors": [model], "scope_keys": {SCOPE.hex(): key}, **instance}}
    return InstanceSettings.from_config(RoleConfig.from_mapping(doc, tmp))


def test_the_loading_settings(tmp_path: Path) -> None:
    plain = _settings(tmp_path)
    assert (plain.layerwise, plain.moqt_fetch, plain.publish_live, plain.engine) == ("auto", False, False, "test")
    assert _settings(tmp_path, layerwise=True).layerwise is Layerwise.ON
    assert _settings(tmp_path, layerwise="auto").layerwise is Layerwise.AUTO
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    chosen = _settings(tmp_path, layerwise=False, moqt_fetch=True, publish_live=True, engine="hf:m",
                       fetch_concurrency=32, moqt_object_timeout_ms=500)
    assert (chosen.layerwise, chosen.moqt_fetch, chosen.publish_live) == (Layerwise.OFF, True, True)
    assert chosen.engine == f"hf:{tmp_path / 'm'}" and chosen.limits.fetch_concurrency == 32
    assert chosen.moqt_relay is None
    assert _settings(tmp_path, moqt_fetch=True, moqt_relay="moqt://r:1/relay").moqt_relay == "moqt://r:1/relay"
    assert chosen.moqt_drafts is None  # every draft, newest first
    assert _settings(tmp_path, moqt_fetch=True, moqt_drafts=[14, 16]).moqt_drafts == (16, 14)
    for bad, member in (({"layerwise": "yes"}, "instance.layerwise"), ({"layerwise": 1}, "instance.layerwise"),
                         ({"engine": "hf:"}, "instance.engine"),
                        ({"engine": "hf:nowhere"}, "instance.engine"), ({"engine": "vllm"}, "instance.engine"),
                        ({"fetch_concurrency": 0}, "instance.fetch_concurrency"),
                        ({"moqt_relay": "moqt://127.0.0.1:4443/relay"}, "instance.moqt_relay"),  # no moqt_fetch
                        ({"moqt_fetch": True, "moqt_relay": "https://r/"}, "instance.moqt_relay"),
                        ({"moqt_drafts": [14]}, "instance.moqt_drafts"),  # no moqt_fetch
                        ({"moqt_fetch": True, "moqt_drafts": [15]}, "instance.moqt_drafts")):
        with pytest.raises(ValidationError) as caught:
            _settings(tmp_path, **bad)
        assert caught.value.member == member


async def test_publish_live_needs_the_holders_moqt_listener(tmp_path: Path) -> None:
    pki = DevPki.make(tmp_path, NAMES)
    model, key = write_files(tmp_path)
    section = instance_section(pki, model, key, publish_live=True)
    config = role_config(pki, "ii1", ("instance", "holder"), policy(pki),
                         {"holder": {"index": pki.uri("is"), "descriptors": [model]}, "instance": section}, tmp_path)
    with pytest.raises(ValidationError) as caught:
        async with running(config):
            pass
    assert caught.value.member == "instance.publish_live"


async def test_the_hf_engine_refuses_another_models_descriptor(tmp_path: Path) -> None:
    """The configured descriptor (the test model's) is not the one of the files: refused before loading."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 2,
                                                            "num_key_value_heads": 2, "hidden_size": 8,
                                                            "rope_theta": 10000, "model_type": "llama"}))
    (tmp_path / "m" / "model.safetensors").write_bytes(b"not loaded: the descriptor check comes first")
    (tmp_path / "m" / "tokenizer.json").write_text("{}")
    with pytest.raises(ValidationError) as caught:
        engine_factory(f"hf:{tmp_path / 'm'}", DESCRIPTOR, vocab_size=97)
    assert caught.value.member == "instance.engine" and COMPAT.hex() in str(caught.value)


# -- the fetcher's layer sink (kvsp.client.fetch, on_layer) --------------------------------------------------
@pytest.mark.parametrize("same_digests", [True, False])
async def test_a_block_broken_mid_transfer_continues_on_another_replica(tmp_path: Path, same_digests: bool) -> None:
    """Layer 0 is handed out on arrival; the transfer breaks; the next replica continues the block with
    layer 1 -- only if its layer digests for layer 0 are those of the layer already handed out."""
    pki = DevPki.make(tmp_path, NAMES)
    keys = keys_of(PROMPT)
    data = reference_block(PROMPT, 0)
    expected = decode_container(data)
    blocks = SlowBlocks({keys[0]: data}, broken={keys[0]})
    async with moqt_world(pki, tmp_path) as world, slow_https_holder(pki, blocks) as slow:
        await HolderClient(world.session).put_block(pki.uri("h1"), COMPAT, SCOPE, keys[0], data)
        (group,) = await world.wait_records(keys[:1], {slow, pki.uri("h1")})
        first = next(r for r in group if r.holder == slow)
        second = next(r for r in group if r.holder == pki.uri("h1"))
        if not same_digests:  # another producer's numerics: layer 0 differs
            second = dataclasses.replace(second, layer_digests=(bytes(32), *second.layer_digests[1:]))
        got: list[tuple[int, int, bytes]] = []
        fetcher = BlockFetcher(world.session, pki.uri("is"), options=FetchOptions(
            lease_ms=None, links=(Link(slow, 100_000.0, 10),)))  # the slow holder ranks first
        task = asyncio.create_task(fetcher.load(SCOPE, COMPAT, [[first, second]], block_tokens=DESCRIPTOR.block_tokens,
                                                on_layer=lambda i, v: got.append((i, v.layer, bytes(v.payload)))))
        async with asyncio.timeout(T):
            while not got:
                await asyncio.sleep(0.01)
        assert got == [(0, 0, bytes(expected.layers[0].payload))] and not task.done()
        blocks.go.set()
        result = await task
    outcomes = [(a.holder, a.outcome) for a in result.attempts]
    if same_digests:
        assert outcomes == [(slow, Outcome.TRANSPORT), (pki.uri("h1"), Outcome.LOADED)]
        assert got == [(0, v.layer, bytes(v.payload)) for v in expected.layers] and result.loaded_blocks == 1
    else:  # refused before any transfer (not a digest mismatch: nothing is withdrawn); the block is lost
        assert outcomes == [(slow, Outcome.TRANSPORT), (pki.uri("h1"), Outcome.BAD_RESPONSE)]
        assert len(got) == 1 and result.loaded_blocks == 0
