"""The instance adapter's own pieces without a network: settings, extension records, the engine factory,
the shard wire layout, the token log and the checkpoint sender."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from control.holder.store import BlockId
from control.instance.blocks import MemoryBlocks
from control.instance.core import OutputToken
from control.instance.engines import (
    PREFILL_REFERENCE_TOKENS,
    EngineFactory,
    Pacing,
    RateMeter,
    calibrate,
    check_geometry,
    engine_factory,
)
from control.instance.loading import import_prefix
from control.instance.output import MAX_QUEUED, CheckpointSender, TokenLog
from control.instance.pc_client import Fenced
from control.instance.records import (
    CheckpointAck,
    EndLine,
    ResumeSession,
    StartSession,
    end_line,
    parse_token_line,
    token_line,
)
from control.instance.resharding import ShardLayout
from control.instance.role import memory_tier
from control.instance.sessions import spec_for_resume, spec_for_start
from control.instance.settings import InstanceSettings
from kvsp.client.http import TransportError
from kvsp.container import Geometry, decode_container, encode_container
from kvsp.engine import (
    BlockKv,
    Engine,
    EngineGeometry,
    Step,
    block_exporter,
    block_importer,
    greedy_sampler,
    top_p_sampler,
)
from kvsp.errors import ValidationError
from kvsp.keys import ScopeKey
from kvsp.records import SessionCheckpoint
from kvsp.registry import Codec
from kvsp.service.config import RoleConfig
from tests.support.instance import COMPAT, DESCRIPTOR, PROMPT, SCOPE, SCOPE_KEY, B, keys_of, write_files

SID = "6f1d0a9e-2c55-4d7e-9a0e-5b7f2f9f6a11"


# -- settings ------------------------------------------------------------------------------------------
def config(tmp: Path, instance: dict[str, object], holder: dict[str, object] | None = None) -> RoleConfig:
    doc: dict[str, object] = {"roles": ["instance", "holder"], "server": {"base_uri": "https://127.0.0.1:1/ii/"},
                              "instance": instance}
    if holder is not None:
        doc["holder"] = holder
    return RoleConfig.from_mapping(doc, tmp)


def test_settings_of_the_contract_example_take_the_holders_descriptor(tmp_path: Path) -> None:
    model, key = write_files(tmp_path)
    cfg = config(tmp_path, {"pc": "https://127.0.0.1:7401/pc/", "index": "https://127.0.0.1:7401/pc/",
                            "engine": "test", "scope_keys": {SCOPE.hex(): key}, "status_ttl_ms": 3000},
                 {"descriptors": [model]})
    settings = InstanceSettings.from_config(cfg)
    assert settings.descriptor.compat_id == COMPAT and settings.scope_keys[SCOPE] == SCOPE_KEY
    assert settings.limits.status_ttl_ms == 3000 and settings.limits.max_sessions == 64
    assert settings.limits.checkpoint_every == 64 and settings.peers == frozenset()


@pytest.mark.parametrize(("change", "member"), [
    ({"statsu_ttl_ms": 1}, "instance.statsu_ttl_ms"),
    ({"pc": "http://plain/"}, "instance.pc"),
    ({"status_ttl_ms": 2}, "instance.status_ttl_ms"),
    ({"engine": "hf:/models"}, "instance.engine"),
    ({"scope_keys": {"00" * 16: "scope.key"}}, "instance.scope_keys." + "00" * 16),
])
def test_settings_refuse_what_would_misbehave(tmp_path: Path, change: dict[str, object], member: str) -> None:
    model, key = write_files(tmp_path)
    section: dict[str, object] = {"pc": "https://127.0.0.1:7401/pc/", "index": "https://127.0.0.1:7401/pc/",
                                  "descriptors": [model], "scope_keys": {SCOPE.hex(): key}}
    section.update(change)
    with pytest.raises(ValidationError) as caught:
        InstanceSettings.from_config(config(tmp_path, section))
    assert caught.value.member == member


def test_settings_need_one_model(tmp_path: Path) -> None:
    model, _ = write_files(tmp_path)
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dataclasses.replace(DESCRIPTOR, model="other").to_json()))
    cfg = config(tmp_path, {"pc": "https://p/", "index": "https://i/"}, {"descriptors": [model, str(other)]})
    with pytest.raises(ValidationError, match="several models"):
        InstanceSettings.from_config(cfg)


# -- the engine ----------------------------------------------------------------------------------------
def test_the_test_engine_takes_the_descriptors_geometry_and_refuses_other_element_sizes() -> None:
    make, geometry = engine_factory("test", DESCRIPTOR, vocab_size=97)
    assert (geometry.layers, geometry.kv_heads, geometry.head_dim, geometry.block_tokens) == (2, 2, 4, 4)
    assert make(greedy_sampler()).geometry == geometry
    with pytest.raises(ValidationError):
        engine_factory("test", dataclasses.replace(DESCRIPTOR, kv_dtype="fp32"), vocab_size=97)
    with pytest.raises(ValidationError, match="disagrees"):
        check_geometry(EngineGeometry(3, 2, 4, 4, 97, "fp16"), DESCRIPTOR)


# -- extension records -----------------------------------------------------------------------------------
def test_token_lines_are_canonical_json_one_per_line() -> None:
    assert token_line(OutputToken(3, 2, 791)) == b'{"epoch":2,"index":3,"token":791}\n'
    assert end_line(EndLine("max_tokens", 2)) == b'{"end":true,"epoch":2,"reason":"max_tokens"}\n'
    assert parse_token_line(b'{"index":3,"epoch":2,"token":791,"extra":1}') == OutputToken(3, 2, 791)
    assert parse_token_line('{"end":true,"reason":"stop","epoch":4}') == EndLine("stop", 4)
    for bad in (b'{"end":false,"reason":"stop","epoch":1}', b'{"index":-1,"epoch":1,"token":2}',
                b'{"index":0,"epoch":1,"token":4294967296}', b'{"end":true,"reason":"moved","epoch":1}'):
        with pytest.raises(ValidationError):
            parse_token_line(bad)


def start(**change: object) -> dict[str, object]:
    body: dict[str, object] = {"session": SID, "epoch": 1, "scope_id": SCOPE.hex(), "compat_id": COMPAT.hex(),
                               "prompt": list(PROMPT), "max_tokens": 5, "sampler": greedy_sampler().to_json()}
    body.update(change)
    return body


def test_start_session_parses_the_contract_shape_and_refuses_bad_bodies() -> None:
    parsed = StartSession.from_json(start())
    assert parsed.prompt == PROMPT and parsed.sampler == greedy_sampler()
    assert StartSession.from_json(parsed.to_json()) == parsed
    for bad in (start(prompt=[]), start(epoch=0), start(max_tokens=0), start(session=SID.upper()),
                start(prompt=[2**32])):
        with pytest.raises(ValidationError):
            StartSession.from_json(bad)


def test_resume_body_is_a_checkpoint_with_an_optional_budget() -> None:
    checkpoint = SessionCheckpoint(SID, 2, COMPAT, SCOPE, (), PROMPT, (5, 6), 2, greedy_sampler())
    assert ResumeSession.from_json(checkpoint.to_json()) == ResumeSession(checkpoint, None)
    body = ResumeSession(checkpoint, 9)
    assert ResumeSession.from_json(json.loads(body.to_bytes())) == body
    with pytest.raises(ValidationError):
        ResumeSession.from_json({**checkpoint.to_json(), "max_tokens": 1})


def test_specs_of_start_and_resume_name_the_same_blocks() -> None:
    started = spec_for_start(StartSession.from_json(start()), SCOPE_KEY, B)
    assert started.keys == tuple(keys_of(PROMPT)) and started.base.prompt_tail == PROMPT[8:]
    generated = (7, 8, 9, 10, 11, 12)
    checkpoint = dataclasses.replace(started.base, epoch=2, generated=generated, output_offset=6)
    resumed = spec_for_resume(ResumeSession(checkpoint, 20), SCOPE_KEY, B, 100)
    assert resumed.keys == tuple(keys_of([*PROMPT, *generated]))  # the chain continues over the generated tokens
    assert resumed.required == 2 and resumed.context[8:] == (*PROMPT[8:], *generated)
    assert spec_for_resume(ResumeSession(checkpoint), ScopeKey(SCOPE_KEY.secret()), B, 100).max_tokens == 100


# -- shard layout ----------------------------------------------------------------------------------------
def test_shard_ranges_round_trip_through_a_layer_ordered_container() -> None:
    layout = ShardLayout.of(DESCRIPTOR.geometry())
    data = np.random.default_rng(1).integers(0, 256, 5 * layout.bytes_per_token, dtype=np.uint8).tobytes()
    parts = layout.to_container(5, [memoryview(data)])
    body = b"".join(bytes(p) for p in parts)
    c = decode_container(body, geometry=DESCRIPTOR.geometry())
    row = layout.row
    assert bytes(c.layer(1).k[:row]) == data[2 * row : 3 * row]  # token 0, layer 1, K
    assert layout.from_container(body, DESCRIPTOR.geometry(), 5) == data


# -- the token log and the checkpoint sender -------------------------------------------------------------
async def test_token_log_wakes_readers_and_refuses_gaps() -> None:
    log = TokenLog(1, (4, 5))
    waiter = asyncio.ensure_future(log.wait(2))
    await asyncio.sleep(0)
    assert not waiter.done()
    log.extend([OutputToken(2, 1, 6)])
    await asyncio.wait_for(waiter, 1)
    with pytest.raises(RuntimeError):
        log.extend([OutputToken(4, 1, 7)])
    log.close(None)
    await asyncio.wait_for(log.wait(10), 1)  # closed: no more waiting


def checkpoint_at(offset: int) -> SessionCheckpoint:
    return SessionCheckpoint(SID, 1, COMPAT, SCOPE, (), PROMPT, tuple(range(offset)), offset,
                             top_p_sampler(0.9, 1))


async def test_sender_keeps_order_bounds_its_queue_retries_and_stops_when_fenced() -> None:
    sent: list[int] = []
    acked: list[int] = []
    gate = asyncio.Event()
    failures = [TransportError("down")]

    async def put(cp: SessionCheckpoint) -> CheckpointAck:
        await gate.wait()
        if failures:
            raise failures.pop()
        sent.append(cp.output_offset)
        if cp.output_offset == 99:
            raise Fenced("moved")
        return CheckpointAck(cp.session, cp.epoch, cp.output_offset)

    fenced: list[Fenced] = []
    sender = CheckpointSender(put, lambda a: acked.append(a.output_offset), fenced.append, lambda _: None)
    for offset in range(1, MAX_QUEUED + 4):
        sender.submit(checkpoint_at(offset))
    gate.set()
    assert await sender.flush(5)
    # the first failed and was replaced by the newest waiting one; the oldest beyond the bound were dropped
    assert sent[-1] == MAX_QUEUED + 3 and sent == sorted(sent) and len(sent) <= MAX_QUEUED
    assert acked == sent
    sender.submit(checkpoint_at(99))
    assert not await sender.flush(5) and fenced and sender.fenced
    sender.submit(checkpoint_at(100))  # ignored once fenced
    await sender.close()
    assert sent[-1] == 99


# -- the engine's rates, whole-block imports, the own block cache --------------------------------------------
def test_prefill_rate_moves_by_each_prefills_tokens() -> None:
    meter = RateMeter(1000.0, PREFILL_REFERENCE_TOKENS)
    meter.observe(4, 0.1)  # 40 tokens/s from a 4-token recompute: barely moves it
    assert 990 < meter.rate < 1000
    meter.observe(PREFILL_REFERENCE_TOKENS, PREFILL_REFERENCE_TOKENS / 500)  # a long one moves it by the EWMA weight
    assert meter.rate == pytest.approx(0.8 * 999.375 + 0.2 * 500, rel=1e-3)
    decode = RateMeter()
    decode.observe(1, 0.01)
    decode.observe(1, 0.02)
    assert decode.rate == pytest.approx(0.8 * 100 + 0.2 * 50)


class Recording:
    """What calibrate uses of an engine, recording the prompt lengths it prefills."""

    def __init__(self, engine: Engine, lengths: list[int]) -> None:
        self.engine, self.lengths = engine, lengths

    def prefill(self, tokens: Sequence[int], loaded: Sequence[BlockKv] = ()) -> Step:
        self.lengths.append(len(tokens))
        return self.engine.prefill(tokens, loaded)

    def decode_step(self) -> Step:
        return self.engine.decode_step()


def test_calibration_runs_longer_prompts_within_its_budget() -> None:
    lengths: list[int] = []
    make, _ = engine_factory("test", DESCRIPTOR, vocab_size=97)
    recording: EngineFactory = lambda s: Recording(make(s), lengths)  # type: ignore[assignment,return-value] # noqa: E731
    assert min(calibrate(recording, B, target_tokens=256, budget_s=30.0)) > 0
    assert lengths == [4 * B, 8 * B, 16 * B, 32 * B, 64 * B]  # doubled up to the target (B = 4: 256 tokens)
    lengths.clear()
    paced, _ = engine_factory("test", DESCRIPTOR, vocab_size=97, pacing=Pacing(10_000, 0))  # 10 ms a token
    slow: EngineFactory = lambda s: Recording(paced(s), lengths)  # type: ignore[assignment,return-value] # noqa: E731
    calibrate(slow, B, budget_s=0.5)
    assert lengths == [4 * B]  # 0.16 s, and the next (taken as 2.5x) would not fit in 0.5 s


def test_whole_blocks_are_imported_at_once_through_a_paced_engine() -> None:
    make, _ = engine_factory("test", DESCRIPTOR, vocab_size=97, pacing=Pacing(1, 0))
    source = make(greedy_sampler())
    expected = source.prefill(PROMPT).token
    blocks = [decode_container(encode_container(Codec.RAW, 0, B, [(lk.k, lk.v) for lk in source.export_kv(i, (0, 1))],
                                                geometry=Geometry.for_dtype(2, 4, "fp16", 2)))
              for i in range(len(PROMPT) // B)]
    engine = make(greedy_sampler())
    assert block_importer(engine) is engine  # type: ignore[comparison-overlap]  # the engine is its own importer
    import_prefix(engine, blocks)
    assert engine.prefill(PROMPT).token == expected
    assert engine._engine.loaded_tokens == len(blocks) * B  # type: ignore[attr-defined]


async def test_the_own_block_cache_lives_in_torch_memory_with_the_hf_engine() -> None:
    assert memory_tier("test") is None  # plain octets: the test engine needs no torch
    tier = memory_tier("hf:/models/llama")
    torch_tiers = pytest.importorskip("control.holder.torch_tiers", reason="torch is the hf engine's extra")
    assert isinstance(tier, torch_tiers.TorchHostTier) and tier.pin == torch_tiers.cuda_available()
    geometry = Geometry.for_dtype(2, 4, "fp16", 2)
    data = encode_container(Codec.RAW, 0, B, [(bytes(range(64)), bytes(64))] * 2, geometry=geometry)
    blocks = MemoryBlocks(1 << 20, geometry, tier)
    block = BlockId(COMPAT, SCOPE, bytes(32))
    assert await blocks.place(block, data) and len(tier) == 1
    read = await blocks.read(block)
    assert read is not None and bytes(read.layer(0).k) == bytes(range(64))


def test_a_paced_engine_exports_whole_blocks_only_when_its_engine_does() -> None:
    make, _geometry = engine_factory("test", DESCRIPTOR, vocab_size=97, pacing=Pacing(1, 0))
    assert block_exporter(make(greedy_sampler())) is None  # the test engine writes sections, not blocks
