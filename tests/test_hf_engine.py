"""The transformers engine (kvsp/hf/engine.py) on the reference model: cached prefix == full recompute.

Tolerances, and why:

* fp32 on CPU, ``chunk_tokens`` a multiple of the block size: bit-exact.  The prefill is cut at fixed
  absolute positions, so every chunk that a loaded prefix leaves to compute is computed by the same
  kernels on the same shapes and inputs as in a full recompute.
* fp32 on CPU, one pass (the default): within 1e-5.  GEMM libraries choose their blocking by matrix shape,
  so the same row in an 11-row and in a 203-row product may differ in the last bits (measured: ~3e-6 on
  logits of unit scale).  Greedy tokens then agree unless two logits are within that distance.
* bf16, one pass: within 0.0625, four bf16 ulps at the logits' magnitude (|logit| < 4; ulp 2^-6): each
  matmul rounds to 8 significant bits, so a one-ulp difference in any accumulation can surface; chunked
  bf16 is bit-exact like fp32.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from kvsp.container import Geometry, decode_container, encode_container
from kvsp.engine import (
    Engine,
    LayerKv,
    LayerwiseEngine,
    block_exporter,
    block_importer,
    greedy_sampler,
    top_p_sampler,
)
from kvsp.errors import ValidationError
from kvsp.hf.cache import blocks_to_dynamic_cache, dynamic_cache_to_blocks
from kvsp.hf.engine import HfEngine, HfModel
from kvsp.hf.refmodel import ModelShape, init_model
from kvsp.registry import Codec
from kvsp.tensors import TORCH_DTYPES

B = 16
SHAPE = ModelShape(layers=3, hidden=128, heads=4, kv_heads=2, vocab=512, seed=5)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("refmodel"), SHAPE)


@pytest.fixture(scope="module")
def exact(model_dir: Path) -> HfModel:
    return HfModel.load(model_dir, block_tokens=B, chunk_tokens=B)


@pytest.fixture(scope="module")
def one_pass(model_dir: Path) -> HfModel:
    return HfModel.load(model_dir, block_tokens=B)


def prompt(length: int, seed: int = 0) -> list[int]:
    return torch.randint(3, SHAPE.vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def blocks_of(engine: HfEngine, count: int) -> list[list[LayerKv]]:
    return [engine.export_kv(b, (0, engine.geometry.layers - 1)) for b in range(count)]


def continuation(engine: Engine, first: int, n: int) -> list[int]:
    return [first, *(engine.decode_step().token for _ in range(n - 1))]


def test_the_engine_is_a_layerwise_engine_with_the_model_geometry(exact: HfModel) -> None:
    engine: LayerwiseEngine = exact.engine()  # checked by mypy
    g = engine.geometry
    assert (g.layers, g.kv_heads, g.head_dim, g.block_tokens, g.vocab_size, g.kv_dtype) == (3, 2, 32, B, 512, "fp32")
    d = exact.descriptor()
    assert (d.layers, d.kv_heads, d.head_dim, d.block_tokens, d.kv_dtype) == (3, 2, 32, B, "fp32")


def test_logits_and_greedy_tokens_are_the_models_own(one_pass: HfModel) -> None:
    tokens = prompt(70)
    engine = one_pass.engine()
    step = engine.prefill(tokens)
    ours = continuation(engine, step.token, 12)
    with torch.inference_mode():
        reference = one_pass.module(torch.tensor([tokens])).logits[0, -1].numpy()
        generated = one_pass.module.generate(torch.tensor([tokens]), max_new_tokens=12, do_sample=False,
                                             eos_token_id=None, pad_token_id=0)
    np.testing.assert_allclose(step.logits, reference, atol=1e-5, rtol=0)
    assert ours == generated[0, len(tokens):].tolist()
    assert len(set(ours)) > 3  # the seeded weights do not collapse onto one token


@pytest.mark.parametrize(("length", "loaded"), [(100, 1), (100, 4), (100, 6), (96, 6), (17, 1)])
def test_loaded_prefix_gives_exactly_the_full_recompute_logits_fp32(exact: HfModel, length: int, loaded: int) -> None:
    tokens = prompt(length, length)
    source = exact.engine()
    full = source.prefill(tokens)
    engine = exact.engine()
    cached = engine.prefill(tokens, blocks_of(source, loaded))
    assert np.array_equal(cached.logits, full.logits)  # bit for bit
    assert engine.loaded_tokens == (loaded * B if loaded * B < length else (loaded - 1) * B)
    assert continuation(engine, cached.token, 16) == continuation(source, full.token, 16)
    for block in range(loaded):  # the cache holds what was loaded (or identical recomputed rows)
        for mine, theirs in zip(engine.export_kv(block, (0, 2)), source.export_kv(block, (0, 2)), strict=True):
            assert bytes(mine.k) == bytes(theirs.k) and bytes(mine.v) == bytes(theirs.v)


def test_loaded_prefix_matches_full_recompute_in_one_pass(one_pass: HfModel) -> None:
    tokens = prompt(203, 1)
    source = one_pass.engine()
    full = source.prefill(tokens)
    engine = one_pass.engine()
    cached = engine.prefill(tokens, blocks_of(source, 12))
    assert engine.loaded_tokens == 192 and engine.recomputed_tokens == 11
    np.testing.assert_allclose(cached.logits, full.logits, atol=1e-5, rtol=0)
    assert continuation(engine, cached.token, 16) == continuation(source, full.token, 16)


def test_bf16_cached_prefix_within_tolerance_and_exact_when_chunked(model_dir: Path) -> None:
    tokens = prompt(120, 2)
    for chunk, atol in ((None, 0.0625), (B, 0.0)):
        model = HfModel.load(model_dir, block_tokens=B, dtype="bf16", chunk_tokens=chunk)
        assert model.geometry.kv_dtype == "bf16"
        source = model.engine()
        full = source.prefill(tokens)
        cached = model.engine().prefill(tokens, blocks_of(source, 5))
        np.testing.assert_allclose(cached.logits, full.logits, atol=atol, rtol=0)


@pytest.mark.parametrize("kv_dtype", ["fp16", "bf16", "fp8-e4m3", "fp8-e5m2"])
def test_a_cache_in_another_dtype_than_the_model(model_dir: Path, kv_dtype: str) -> None:
    model = HfModel.load(model_dir, block_tokens=B, kv_dtype=kv_dtype, chunk_tokens=B)
    tokens = prompt(50, 3)
    source = model.engine()
    full = source.prefill(tokens)
    [layer0] = source.export_kv(0, (0, 0))
    assert layer0.k.nbytes == model.geometry.section_octets == B * 2 * 32 * TORCH_DTYPES[kv_dtype].itemsize
    engine = model.engine()
    assert np.array_equal(engine.prefill(tokens, blocks_of(source, 3)).logits, full.logits)
    assert model.descriptor().kv_dtype == kv_dtype


def test_blocks_travel_as_containers_and_are_imported_as_views(exact: HfModel) -> None:
    g = exact.geometry
    geometry = Geometry.for_dtype(g.kv_heads, g.head_dim, g.kv_dtype, g.layers)
    tokens = prompt(80, 4)
    source = exact.engine()
    full = source.prefill(tokens)
    wire = [encode_container(Codec.RAW, 0, B, [(lk.k, lk.v) for lk in source.export_kv(b, (0, 2))],
                             geometry=geometry) for b in range(4)]
    engine = exact.engine()
    for block, data in enumerate(wire):
        for view in decode_container(data, geometry=geometry).layers:
            engine.import_kv(block, view.layer, view.k, view.v)
    assert np.array_equal(engine.prefill(tokens).logits, full.logits)
    assert engine.loaded_tokens == 64


def _containers(source: HfEngine, blocks: int) -> list[bytes]:
    g = source.geometry
    geometry = Geometry.for_dtype(g.kv_heads, g.head_dim, g.kv_dtype, g.layers)
    return [encode_container(Codec.RAW, 0, B, [(lk.k, lk.v) for lk in source.export_kv(b, (0, g.layers - 1))],
                             geometry=geometry) for b in range(blocks)]


@pytest.mark.parametrize("kv_dtype", ["fp32", "bf16"])
def test_export_block_is_the_section_by_section_container(model_dir: Path, kv_dtype: str) -> None:
    model = HfModel.load(model_dir, block_tokens=B, kv_dtype=kv_dtype, chunk_tokens=B)
    source = model.engine()
    source.prefill(prompt(70, 5))  # 4 complete blocks and a partial one
    for block in range(4):
        assert bytes(source.export_block(block)) == _containers(source, block + 1)[block]
    with pytest.raises(ValueError, match="not complete"):
        source.export_block(4)
    assert block_exporter(source) is source


def test_whole_blocks_imported_at_once_give_the_full_recompute(exact: HfModel) -> None:
    tokens = prompt(90, 14)
    source = exact.engine()
    full = source.prefill(tokens)
    wire = _containers(source, 5)
    engine = exact.engine()
    assert block_importer(engine) is engine
    for block, data in enumerate(wire[:3]):  # blocks 0-2 whole, 3-4 layer by layer: both paths in one prefill
        engine.import_block(block, decode_container(data))
    for block, data in enumerate(wire[3:], start=3):
        for view in decode_container(data).layers:
            engine.import_kv(block, view.layer, view.k, view.v)
    assert np.array_equal(engine.prefill(tokens).logits, full.logits)
    assert engine.loaded_tokens == 80
    for block in range(5):
        assert [bytes(lk.k) + bytes(lk.v) for lk in engine.export_kv(block, (0, 2))] == \
               [bytes(lk.k) + bytes(lk.v) for lk in source.export_kv(block, (0, 2))]


def test_whole_blocks_and_layers_arriving_later_in_a_layerwise_prefill(exact: HfModel) -> None:
    tokens = prompt(70, 15)
    source = exact.engine()
    full = source.prefill(tokens)
    wire = [decode_container(data) for data in _containers(source, 4)]
    engine = exact.engine()
    engine.import_block(0, wire[0])  # an own-tier block, staged before the prefill starts
    engine.import_block(2, wire[2])  # a gap: block 1 arrives by layers

    def wait_layer(layer: int) -> None:
        for block in (1, 3):
            view = wire[block].layer(layer)
            engine.import_kv(block, layer, view.k, view.v)

    step = engine.prefill_layerwise(tokens, 4, wait_layer)
    assert np.array_equal(step.logits, full.logits) and engine.loaded_tokens == 64


def test_a_whole_block_that_does_not_fit_is_refused(exact: HfModel) -> None:
    g = exact.geometry
    source = exact.engine()
    source.prefill(prompt(40, 16))
    short = Geometry.for_dtype(g.kv_heads, g.head_dim, g.kv_dtype, 2)
    two_layers = encode_container(Codec.RAW, 0, B, [(lk.k, lk.v) for lk in source.export_kv(0, (0, 1))],
                                  geometry=short)
    engine = exact.engine()
    with pytest.raises(ValueError, match="3 layers"):
        engine.import_block(0, decode_container(two_layers))
    with pytest.raises(ValueError):
        engine.import_block(-1, decode_container(_containers(source, 1)[0]))
    assert engine.prefill(prompt(40, 16)).token is not None and engine.loaded_tokens == 0


def test_wrong_kv_changes_the_output(exact: HfModel) -> None:
    tokens = prompt(60, 5)
    source = exact.engine()
    full = source.prefill(tokens)
    blocks = blocks_of(source, 3)
    k = bytearray(blocks[1][2].k)
    k[1] ^= 0x40  # one exponent bit of one element of block 1, layer 2
    blocks[1][2] = LayerKv(2, memoryview(k), blocks[1][2].v)
    assert not np.array_equal(exact.engine().prefill(tokens, blocks).logits, full.logits)


def test_layerwise_prefill_overlaps_import_compute_and_export(exact: HfModel) -> None:
    tokens = prompt(100, 6)
    source = exact.engine()
    full = source.prefill(tokens)
    engine = exact.engine()
    arrived = [threading.Event() for _ in range(3)]
    published: list[tuple[int, bytes]] = []

    def loader() -> None:  # another thread, as the instance's event loop would
        for layer in range(3):
            for block in range(5):
                [lk] = source.export_kv(block, (layer, layer))
                engine.import_kv(block, layer, bytes(lk.k), bytes(lk.v))
            arrived[layer].set()

    def wait_layer(layer: int) -> None:
        if not arrived[layer].wait(10):
            raise TimeoutError(f"layer {layer}")

    def on_layer(layer: int) -> None:
        [lk] = engine.export_kv(5, (layer, layer))  # a computed block, while later layers are not
        published.append((layer, bytes(lk.k)))
        if layer < 2:
            with pytest.raises(ValueError):
                engine.export_kv(0, (0, layer + 1))

    thread = threading.Thread(target=loader)
    thread.start()
    try:
        step = engine.prefill_layerwise(tokens, 5, wait_layer, on_layer)
    finally:
        thread.join()
    assert np.array_equal(step.logits, full.logits) and engine.loaded_tokens == 80
    assert [layer for layer, _ in published] == [0, 1, 2]
    assert [k for _, k in published] == [bytes(lk.k) for lk in source.export_kv(5, (0, 2))]


def test_layerwise_prefill_aborts_without_leaving_a_context(exact: HfModel) -> None:
    engine = exact.engine()
    tokens = prompt(40, 7)

    def wait_layer(layer: int) -> None:
        if layer == 1:
            raise TimeoutError("layer 1 did not arrive")

    with pytest.raises(TimeoutError):
        engine.prefill_layerwise(tokens, 0, wait_layer)
    assert engine.context_length == 0
    with pytest.raises(ValueError):
        engine.export_kv(0, (0, 0))
    with pytest.raises(ValueError, match="not imported"):
        engine.prefill_layerwise(tokens, 1, lambda _: None)
    with pytest.raises(ValueError):
        engine.prefill_layerwise(tokens, 3, lambda _: None)
    assert np.array_equal(engine.prefill(tokens).logits, exact.engine().prefill(tokens).logits)


def test_restored_top_p_sampler_continues_exactly(exact: HfModel) -> None:
    sampler = top_p_sampler(0.9, 11, temperature=1.5)
    tokens = prompt(40, 8)
    engine = exact.engine(sampler)
    out = continuation(engine, engine.prefill(tokens).token, 12)
    assert engine.sampler_state() == dataclasses.replace(sampler, step=12)
    for cut in (1, 7):
        resumed = exact.engine()
        resumed.restore_sampler(dataclasses.replace(sampler, step=cut))
        assert continuation(resumed, resumed.prefill(tokens + out[:cut]).token, 12 - cut) == out[cut:]
    other = exact.engine(top_p_sampler(0.9, 12, temperature=1.5))
    assert continuation(other, other.prefill(tokens).token, 12) != out


def test_decoding_past_the_first_allocation_keeps_the_cache(exact: HfModel) -> None:
    engine = exact.engine(greedy_sampler())
    tokens = prompt(20, 9)
    out = continuation(engine, engine.prefill(tokens).token, 3 * B)
    context = tokens + out[:-1]
    assert engine.context_length == len(context)
    recomputed = exact.engine()
    recomputed.prefill(context)
    for block in range(len(context) // B):  # decoded rows (one-row products) agree with prefilled ones closely
        for mine, theirs in zip(engine.export_kv(block, (0, 2)), recomputed.export_kv(block, (0, 2)), strict=True):
            np.testing.assert_allclose(np.frombuffer(mine.v, "<f4"), np.frombuffer(theirs.v, "<f4"), atol=1e-5)


def test_misuse_is_refused(exact: HfModel) -> None:
    engine = exact.engine()
    with pytest.raises(RuntimeError):
        engine.decode_step()
    with pytest.raises(ValueError):
        engine.prefill([])
    with pytest.raises(ValueError):
        engine.prefill([SHAPE.vocab])
    engine.prefill(prompt(20))
    with pytest.raises(ValueError):
        engine.export_kv(1, (0, 0))  # the tail is incomplete
    with pytest.raises(ValueError):
        engine.export_kv(0, (0, 3))
    with pytest.raises(ValueError):
        engine.import_kv(0, 0, b"\x00" * 3, b"\x00" * 3)
    with pytest.raises(ValueError):
        engine.import_kv(0, 3, b"", b"")
    with pytest.raises(ValueError):
        HfModel(exact.module, block_tokens=B, chunk_tokens=24)


def test_dynamic_cache_round_trip_with_the_models_own_forward(one_pass: HfModel) -> None:
    g = one_pass.geometry
    tokens = prompt(72, 10)
    source = one_pass.engine()
    full = source.prefill(tokens)
    with torch.inference_mode():
        # the model's own cache, filled by its own forward, exported as blocks: the engine's KV
        out = one_pass.module(torch.tensor([tokens[:64]]), use_cache=True)
        exported = dynamic_cache_to_blocks(out.cache, g)
        assert len(exported) == 4
        for mine, theirs in zip(exported[3], source.export_kv(3, (0, g.layers - 1)), strict=True):
            np.testing.assert_allclose(np.frombuffer(mine.k, "<f4"), np.frombuffer(theirs.k, "<f4"), atol=1e-5)
        # the engine's blocks as a DynamicCache that the model continues from
        cache = blocks_to_dynamic_cache(blocks_of(source, 4), g, config=one_pass.module.config)
        assert cache.get_seq_length() == 64
        logits = one_pass.module(torch.tensor([tokens[64:]]), cache=cache, use_cache=True).logits[0, -1].numpy()
    np.testing.assert_allclose(logits, full.logits, atol=1e-5, rtol=0)
    with pytest.raises(ValueError):
        blocks_to_dynamic_cache([source.export_kv(0, (0, 1))], g)  # layer 2 missing


def test_a_model_whose_files_changed_refuses_the_old_descriptor(model_dir: Path, tmp_path: Path) -> None:
    original = HfModel.load(model_dir, block_tokens=B)
    original.require(original.descriptor())
    copy = Path(shutil.copytree(model_dir, tmp_path / "changed"))
    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-2] ^= 0x01
    (copy / "model.safetensors").write_bytes(weights)
    changed = HfModel.load(copy, block_tokens=B)
    with pytest.raises(ValidationError, match="compat_id"):
        changed.require(original.descriptor())
    with pytest.raises(ValidationError):
        HfModel.load(model_dir, block_tokens=B, kv_dtype="bf16").require(original.descriptor())
    with pytest.raises(ValidationError):
        HfModel(original.module, block_tokens=B).descriptor()  # built in memory: no files to derive it from
