"""The reference model files and the descriptor derived from a model directory (kvsp/hf/refmodel.py, descriptor.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open
from tokenizers import Tokenizer

from control.cli import main
from kvsp.descriptor import CompatDescriptor
from kvsp.errors import ValidationError
from kvsp.hf import descriptor_from_model_dir
from kvsp.hf.descriptor import positional_of
from kvsp.hf.refmodel import ModelShape, init_model

SHAPE = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, vocab=400, seed=3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("ref"), SHAPE)


def copy_of(model_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model_dir, tmp_path / "copy"))


def test_reference_model_files(model_dir: Path) -> None:
    assert sorted(p.name for p in model_dir.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    config = json.loads((model_dir / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"]) == (2, 64, 4, 2, 400)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["kvsp_model"] == "kvsp-reference-llama"
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == 400 and tokenizer.token_to_id("</s>") == 2
    text = "The KV cache of a prompt prefix"
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids) == text and len(ids) < len(text) // 2  # BPE merges learned from the corpus
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("model.layers.0.self_attn.k_proj.weight").shape == (2 * 16, 64)  # GQA: 2 KV heads
    assert {"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"} <= keys


def test_the_same_arguments_write_the_same_octets(model_dir: Path, tmp_path: Path) -> None:
    again = init_model(tmp_path / "again", SHAPE)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (model_dir / name).read_bytes()
    other = init_model(tmp_path / "other", ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, vocab=400, seed=4))
    assert (other / "model.safetensors").read_bytes() != (model_dir / "model.safetensors").read_bytes()


def test_descriptor_members_follow_the_spec_definitions(model_dir: Path) -> None:
    d = descriptor_from_model_dir(model_dir, block_tokens=16)
    assert d.model_digest == hashlib.sha256((model_dir / "model.safetensors").read_bytes()).digest()
    assert d.tokenizer_digest == hashlib.sha256((model_dir / "tokenizer.json").read_bytes()).digest()
    assert (d.model, d.layers, d.kv_heads, d.head_dim, d.kv_dtype, d.positional, d.block_tokens, d.layout) == (
        "kvsp-reference-llama", 2, 2, 16, "fp32", "rope;theta=10000", 16, "kvsp-layout-1")
    assert d.adapters is None
    assert CompatDescriptor.from_json(d.to_json()).compat_id == d.compat_id


def test_weight_files_are_hashed_in_ascending_byte_order_of_their_names(model_dir: Path, tmp_path: Path) -> None:
    root = copy_of(model_dir, tmp_path)
    (root / "model.safetensors").unlink()
    parts = {"b.safetensors": b"bee", "B.safetensors": b"BEE", "a.safetensors": b"ay",
             "model.safetensors.index.json": b"{}"}
    for name, data in parts.items():
        (root / name).write_bytes(data)
    d = descriptor_from_model_dir(root, block_tokens=16)
    assert d.model_digest == hashlib.sha256(b"BEE" + b"ay" + b"bee").digest()  # "B" < "a" < "b"; index not hashed


def test_changed_files_change_the_compat_id(model_dir: Path, tmp_path: Path) -> None:
    before = descriptor_from_model_dir(model_dir, block_tokens=16).compat_id
    root = copy_of(model_dir, tmp_path)
    assert descriptor_from_model_dir(root, block_tokens=16).compat_id == before  # the files, not the path
    weights = bytearray((root / "model.safetensors").read_bytes())
    weights[-1] ^= 0x01  # one bit of the last weight
    (root / "model.safetensors").write_bytes(weights)
    changed_weights = descriptor_from_model_dir(root, block_tokens=16).compat_id
    shutil.copy(model_dir / "model.safetensors", root / "model.safetensors")
    (root / "tokenizer.json").write_text((model_dir / "tokenizer.json").read_text().replace("<pad>", "<PAD>"))
    changed_tokenizer = descriptor_from_model_dir(root, block_tokens=16).compat_id
    assert len({before, changed_weights, changed_tokenizer}) == 3
    assert descriptor_from_model_dir(model_dir, block_tokens=32).compat_id != before
    assert descriptor_from_model_dir(model_dir, block_tokens=16, kv_dtype="bf16").compat_id != before


@pytest.mark.parametrize(("config", "positional"), [
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}, "rope;theta=500000"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0}},
     "rope;theta=500000,scaling=llama3"),
    ({"rope_theta": 1000000, "rope_scaling": {"type": "linear", "factor": 2.0}}, "rope;theta=1000000,scaling=linear"),
    ({"rope_theta": 10000.0, "rope_scaling": None}, "rope;theta=10000"),
    ({}, "rope;theta=10000"),
])
def test_positional_from_old_and_new_config_styles(config: dict[str, object], positional: str) -> None:
    assert positional_of(config) == positional


def test_unusable_directories_are_refused(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        positional_of({"rope_theta": 10000.5})
    root = copy_of(model_dir, tmp_path)
    (root / "tokenizer.json").unlink()
    with pytest.raises(ValidationError, match="tokenizer"):
        descriptor_from_model_dir(root, block_tokens=16)
    shutil.copy(model_dir / "tokenizer.json", root / "tokenizer.json")
    (root / "model.safetensors").unlink()
    with pytest.raises(ValidationError, match="weight"):
        descriptor_from_model_dir(root, block_tokens=16)
    shutil.copy(model_dir / "model.safetensors", root / "model.safetensors")
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "dtype": "int8"}))
    with pytest.raises(ValidationError, match="dtype"):
        descriptor_from_model_dir(root, block_tokens=16)
    (root / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16", "num_key_value_heads": 0}))
    with pytest.raises(ValidationError, match="num_key_value_heads"):
        descriptor_from_model_dir(root, block_tokens=16)
    (root / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    assert descriptor_from_model_dir(root, block_tokens=16).kv_dtype == "bf16"
    (root / "config.json").write_text("[1]")
    with pytest.raises(ValidationError):
        descriptor_from_model_dir(root, block_tokens=16)


def test_cli_init_and_descriptor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "m"
    assert main(["model", "init", str(target), "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
                 "--vocab", "400", "--seed", "3"]) == 0
    assert capsys.readouterr().out.strip() == str(target)
    assert main(["model", "descriptor", str(target), "--block-tokens", "16"]) == 0
    printed = capsys.readouterr().out.strip()
    d = CompatDescriptor.from_bytes(printed)
    assert printed.encode() == d.canonical()
    assert d.compat_id == descriptor_from_model_dir(target, block_tokens=16).compat_id
    assert main(["model", "descriptor", str(target), "--kv-dtype", "fp8-e4m3", "--model", "x"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_dtype"] == "fp8-e4m3"
    assert main(["model", "init", str(tmp_path / "bad"), "--heads", "3"]) == 2
    assert main(["model", "descriptor", str(tmp_path / "absent")]) == 2
    assert capsys.readouterr().err.count("\n") == 2  # one line per error


def test_the_cli_and_the_descriptor_import_no_torch() -> None:
    code = ("import sys, control.cli, kvsp.hf, kvsp.engine; "
            "print(sorted(m for m in ('torch', 'transformers', 'safetensors', 'tokenizers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
