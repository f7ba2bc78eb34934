"""The engine interface and the deterministic test engine (kvsp/engine.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsp.container import Geometry, decode_container, encode_container
from kvsp.engine import (
    LOGIT_SCALE,
    DeterministicTestEngine,
    Engine,
    EngineGeometry,
    LayerKv,
    block_importer,
    greedy_sampler,
    top_p_sampler,
)
from kvsp.records import Sampler
from kvsp.registry import Codec

G = EngineGeometry(layers=3, kv_heads=2, head_dim=4, block_tokens=4, vocab_size=101)
PROMPT = [128000, 791, 6460, 374, 264, 1296, 315, 279, 42, 43]  # two blocks and a tail of two
M64 = (1 << 64) - 1
KIND_K, KIND_V = 0x4B5653502D4B0000, 0x4B5653502D560000


def mix(x: int) -> int:
    """SplitMix64's finaliser written out on Python integers, independently of the numpy version."""
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def documented_kv(kind: int, token: int, position: int, layer: int, head: int, dim: int) -> np.float16:
    h = mix(mix(mix(mix(mix(kind ^ token) ^ position) ^ layer) ^ head) ^ dim)
    return np.float16((h >> 40) / 2**24 * 2 - 1)


def generate(engine: Engine, tokens: list[int], n: int) -> list[int]:
    out = [engine.prefill(tokens).token]
    out.extend(engine.decode_step().token for _ in range(n - 1))
    return out


def test_the_test_engine_satisfies_the_engine_protocol() -> None:
    engine: Engine = DeterministicTestEngine(G)  # checked by mypy
    assert engine.geometry is G and engine.context_length == 0


def test_kv_is_the_documented_function() -> None:
    engine = DeterministicTestEngine(G)
    engine.prefill(PROMPT)
    [layer1] = engine.export_kv(1, (1, 1))
    k = np.frombuffer(layer1.k, dtype="<f2").reshape(G.block_tokens, G.kv_heads, G.head_dim)
    v = np.frombuffer(layer1.v, dtype="<f2").reshape(G.block_tokens, G.kv_heads, G.head_dim)
    for t in range(G.block_tokens):
        position = 4 + t
        for head in range(G.kv_heads):
            for dim in range(G.head_dim):
                assert k[t, head, dim] == documented_kv(KIND_K, PROMPT[position], position, 1, head, dim)
                assert v[t, head, dim] == documented_kv(KIND_V, PROMPT[position], position, 1, head, dim)


def test_logits_and_greedy_token_are_the_documented_function_of_the_cache() -> None:
    engine = DeterministicTestEngine(G)
    step = engine.prefill(PROMPT)
    fingerprint = hashlib.blake2b(digest_size=8, person=b"kvsp-test-ctx")
    for position in range(len(PROMPT)):
        for layer in range(G.layers):
            for kind in (KIND_K, KIND_V):
                row = [documented_kv(kind, PROMPT[position], position, layer, h, d)
                       for h in range(G.kv_heads) for d in range(G.head_dim)]
                fingerprint.update(np.array(row, dtype="<f2").tobytes())
    s = mix(int.from_bytes(fingerprint.digest(), "little"))
    expected = [np.float32(((mix(s ^ v) >> 11) * 2.0**-53 * 2 - 1) * LOGIT_SCALE) for v in range(G.vocab_size)]
    assert step.logits.dtype == np.float32 and list(step.logits) == expected
    assert step.token == int(np.argmax(expected))


def test_same_tokens_give_the_same_kv_and_next_token_on_two_engines() -> None:
    a, b = DeterministicTestEngine(G), DeterministicTestEngine(G)
    assert a.prefill(PROMPT).token == b.prefill(PROMPT).token
    for block in range(2):
        for x, y in zip(a.export_kv(block, (0, 2)), b.export_kv(block, (0, 2)), strict=True):
            assert (x.layer, bytes(x.k), bytes(x.v)) == (y.layer, bytes(y.k), bytes(y.v))
    assert generate(a, PROMPT, 8) == generate(b, PROMPT, 8)


def test_export_is_kvsp_layout_1_and_fits_a_container() -> None:
    engine = DeterministicTestEngine(G)
    engine.prefill(PROMPT)
    layers = engine.export_kv(0, (0, 2))
    assert [lk.layer for lk in layers] == [0, 1, 2]
    assert all(lk.k.nbytes == lk.v.nbytes == G.section_octets == 4 * 2 * 4 * 2 for lk in layers)
    geometry = Geometry.for_dtype(G.kv_heads, G.head_dim, "fp16", G.layers)
    data = encode_container(Codec.RAW, 0, G.block_tokens, [(lk.k, lk.v) for lk in layers], geometry=geometry)
    container = decode_container(data, geometry=geometry)
    assert [bytes(layer.k) for layer in container.layers] == [bytes(lk.k) for lk in layers]
    assert [bytes(lk.k) for lk in engine.reference_kv(PROMPT, 0)] == [bytes(lk.k) for lk in layers]


def test_loaded_prefix_is_used_instead_of_recomputed() -> None:
    source = DeterministicTestEngine(G)
    expected = source.prefill(PROMPT).token
    blocks = [source.export_kv(b, (0, G.layers - 1)) for b in range(2)]
    engine = DeterministicTestEngine(G)
    assert engine.prefill(PROMPT, blocks).token == expected
    assert (engine.loaded_tokens, engine.recomputed_tokens) == (8, 2)


def test_layer_by_layer_import_counts_once_a_block_has_every_layer() -> None:
    source = DeterministicTestEngine(G)
    expected = source.prefill(PROMPT).token
    engine = DeterministicTestEngine(G)
    for lk in source.export_kv(0, (0, 2)):
        engine.import_kv(0, lk.layer, lk.k, lk.v)
    for lk in source.export_kv(1, (0, 1)):  # block 1 lacks its last layer: it is recomputed
        engine.import_kv(1, lk.layer, lk.k, lk.v)
    assert engine.prefill(PROMPT).token == expected
    assert engine.loaded_tokens == 4


def test_a_whole_block_imported_at_once_counts_like_its_layers() -> None:
    source = DeterministicTestEngine(G)
    expected = source.prefill(PROMPT).token
    geometry = Geometry.for_dtype(G.kv_heads, G.head_dim, "fp16", G.layers)
    wire = [encode_container(Codec.RAW, 0, G.block_tokens, [(lk.k, lk.v) for lk in source.export_kv(b, (0, 2))],
                             geometry=geometry) for b in range(2)]
    engine = DeterministicTestEngine(G)
    assert block_importer(engine) is engine and block_importer(object()) is None
    for block, data in enumerate(wire):
        engine.import_block(block, decode_container(data))
    assert engine.prefill(PROMPT).token == expected and engine.loaded_tokens == 8
    short = Geometry.for_dtype(G.kv_heads, G.head_dim, "fp16", 2)
    two = encode_container(Codec.RAW, 0, G.block_tokens, [(b"\0" * G.section_octets,) * 2] * 2, geometry=short)
    with pytest.raises(ValueError, match="3 layers"):
        engine.import_block(0, decode_container(two))


def test_wrong_kv_changes_the_output() -> None:
    source = DeterministicTestEngine(G)
    good = source.prefill(PROMPT)
    blocks = [source.export_kv(b, (0, 2)) for b in range(2)]
    bad_k = bytearray(blocks[1][2].k)
    bad_k[0] ^= 0x01
    blocks[1] = [*blocks[1][:2], LayerKv(2, memoryview(bad_k), blocks[1][2].v)]
    engine = DeterministicTestEngine(G)
    assert not np.array_equal(engine.prefill(PROMPT, blocks).logits, good.logits)


def test_restoring_the_sampler_mid_stream_gives_the_same_continuation() -> None:
    sampler = top_p_sampler(0.9, 7)
    a = DeterministicTestEngine(G, sampler)
    full = generate(a, PROMPT, 16)
    assert a.sampler_state() == dataclasses.replace(sampler, step=16)
    for cut in (1, 5, 15):
        b = DeterministicTestEngine(G)
        b.restore_sampler(dataclasses.replace(sampler, step=cut))
        assert generate(b, PROMPT + full[:cut], 16 - cut) == full[cut:]


def test_restored_sampler_state_round_trips_through_the_checkpoint_record() -> None:
    a = DeterministicTestEngine(G, top_p_sampler(0.8, 3))
    generate(a, PROMPT, 4)
    state = Sampler.from_json(a.sampler_state().to_json())
    b = DeterministicTestEngine(G)
    b.restore_sampler(state)
    assert b.sampler_state() == a.sampler_state()


def test_different_seeds_differ_and_greedy_is_deterministic() -> None:
    runs = {tuple(generate(DeterministicTestEngine(G, top_p_sampler(1.0, seed)), PROMPT, 12)) for seed in range(4)}
    assert len(runs) > 1
    assert greedy_sampler().deterministic and not top_p_sampler(0.9, 1).deterministic


def test_top_p_with_a_tiny_p_is_greedy() -> None:
    greedy = generate(DeterministicTestEngine(G, greedy_sampler()), PROMPT, 10)
    assert generate(DeterministicTestEngine(G, top_p_sampler(1e-9, 5)), PROMPT, 10) == greedy


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=12), st.integers(0, 2**31))
def test_any_prompt_is_reproducible(tokens: list[int], seed: int) -> None:
    a = generate(DeterministicTestEngine(G, top_p_sampler(0.9, seed)), tokens, 3)
    b = generate(DeterministicTestEngine(G, top_p_sampler(0.9, seed)), tokens, 3)
    assert a == b and all(0 <= t < G.vocab_size for t in a)


def test_misuse_is_refused() -> None:
    engine = DeterministicTestEngine(G)
    with pytest.raises(RuntimeError):
        engine.decode_step()
    with pytest.raises(ValueError):
        engine.prefill([])
    engine.prefill(PROMPT)
    with pytest.raises(ValueError):
        engine.export_kv(2, (0, 0))  # block 2 is the incomplete tail
    with pytest.raises(ValueError):
        engine.export_kv(0, (0, 3))
    with pytest.raises(ValueError):
        engine.import_kv(0, 0, b"\x00" * 3, b"\x00" * 3)
    with pytest.raises(ValueError):
        DeterministicTestEngine(G, Sampler("beam", (), 0, 0, True))
    with pytest.raises(ValueError):
        EngineGeometry(0, 1, 1, 1, 1)


def test_context_grows_past_its_first_allocation() -> None:
    engine = DeterministicTestEngine(G)
    out = generate(engine, PROMPT[:1], 40)
    context = PROMPT[:1] + out[:39]  # the last sampled token is not in the cache yet
    assert engine.context_length == 40
    for block in (0, 9):
        exported = [bytes(lk.k) + bytes(lk.v) for lk in engine.export_kv(block, (0, 2))]
        assert exported == [bytes(lk.k) + bytes(lk.v) for lk in engine.reference_kv(context, block)]


# -- layer-wise prefill (LayerwiseEngine) ---------------------------------------------------------------


def test_layerwise_prefill_waits_for_each_layer_and_announces_it() -> None:
    source = DeterministicTestEngine(G)
    expected = source.prefill(PROMPT)
    blocks = [source.export_kv(b, (0, G.layers - 1)) for b in range(2)]
    engine = DeterministicTestEngine(G)
    events: list[str] = []

    def wait_layer(layer: int) -> None:
        events.append(f"wait {layer}")
        for block in range(2):  # the layer arrives only when the engine asks for it
            lk = blocks[block][layer]
            engine.import_kv(block, layer, lk.k, lk.v)

    def on_layer(layer: int) -> None:
        events.append(f"done {layer}")
        for block in range(2):
            [mine] = engine.export_kv(block, (layer, layer))
            assert bytes(mine.k) + bytes(mine.v) == bytes(blocks[block][layer].k) + bytes(blocks[block][layer].v)
        if layer < G.layers - 1:
            with pytest.raises(ValueError):
                engine.export_kv(0, (layer, layer + 1))  # the next layer is not computed yet

    step = engine.prefill_layerwise(PROMPT, 2, wait_layer, on_layer)
    assert events == [f"{what} {layer}" for layer in range(G.layers) for what in ("wait", "done")]
    assert step.token == expected.token and np.array_equal(step.logits, expected.logits)
    assert (engine.loaded_tokens, engine.recomputed_tokens) == (8, 2)
    assert engine.decode_step().token == source.decode_step().token and engine.context_length == len(PROMPT) + 1


def test_layerwise_prefill_takes_layers_imported_from_another_thread() -> None:
    source = DeterministicTestEngine(G)
    expected = source.prefill(PROMPT).token
    engine = DeterministicTestEngine(G)
    arrived = [threading.Event() for _ in range(G.layers)]

    def loader() -> None:
        for layer in range(G.layers):
            for block in range(2):
                [lk] = source.export_kv(block, (layer, layer))
                engine.import_kv(block, layer, bytes(lk.k), bytes(lk.v))
            arrived[layer].set()

    def wait_layer(layer: int) -> None:
        if not arrived[layer].wait(5):
            raise TimeoutError(f"layer {layer}")

    thread = threading.Thread(target=loader)
    thread.start()
    try:
        step = engine.prefill_layerwise(PROMPT, 2, wait_layer)
    finally:
        thread.join()
    assert step.token == expected and engine.loaded_tokens == 8


def test_layerwise_prefill_with_wrong_prefix_kv_changes_the_output() -> None:
    source = DeterministicTestEngine(G)
    good = source.prefill(PROMPT)
    engine = DeterministicTestEngine(G)
    for block in range(2):
        for lk in source.export_kv(block, (0, G.layers - 1)):
            k = bytearray(lk.k)
            k[0] ^= 0x01 if (block, lk.layer) == (1, 2) else 0
            engine.import_kv(block, lk.layer, k, lk.v)
    assert not np.array_equal(engine.prefill_layerwise(PROMPT, 2, lambda _: None).logits, good.logits)


def test_layerwise_prefill_without_a_prefix_is_a_plain_prefill() -> None:
    expected = DeterministicTestEngine(G).prefill(PROMPT)
    done: list[int] = []
    step = DeterministicTestEngine(G).prefill_layerwise(PROMPT, 0, lambda _: None, done.append)
    assert step.token == expected.token and done == list(range(G.layers))


def test_layerwise_prefill_aborts_cleanly() -> None:
    engine = DeterministicTestEngine(G)

    def wait_layer(layer: int) -> None:
        if layer == 1:
            raise TimeoutError("layer 1 did not arrive")

    with pytest.raises(TimeoutError):
        engine.prefill_layerwise(PROMPT, 0, wait_layer)
    assert engine.context_length == 0
    with pytest.raises(RuntimeError):
        engine.decode_step()
    with pytest.raises(ValueError):
        engine.export_kv(0, (0, 0))
    with pytest.raises(ValueError, match="not imported"):  # wait_layer returned but the layer is missing
        engine.prefill_layerwise(PROMPT, 1, lambda _: None)
    with pytest.raises(ValueError):
        engine.prefill_layerwise(PROMPT, 3, lambda _: None)  # only two complete blocks
    assert engine.prefill(PROMPT).token == DeterministicTestEngine(G).prefill(PROMPT).token


def test_section_size_follows_the_kv_dtype() -> None:
    assert EngineGeometry(2, 2, 4, 4, 10, "fp32").section_octets == 4 * 2 * 4 * 4
    assert EngineGeometry(2, 2, 4, 4, 10, "fp8-e4m3").section_octets == 4 * 2 * 4
    with pytest.raises(ValueError):
        EngineGeometry(2, 2, 4, 4, 10, "int4")
    with pytest.raises(ValueError):
        DeterministicTestEngine(EngineGeometry(2, 2, 4, 4, 10, "fp32"))
