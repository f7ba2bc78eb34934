"""The Compatibility Descriptor of a Hugging Face model directory (spec section 4.1, decision D6).

Derived from the files, never typed in, so that a changed weight or tokenizer file changes the
compat_id and a cache made with the old files is not used:

* ``model_digest``: SHA-256 over the weight files concatenated in ascending byte order of their file
  names (UTF-8 octets).  Weight files are the ``*.safetensors`` files of the directory; a directory
  without any uses its ``pytorch_model*.bin`` files.  Index files (``*.index.json``) are not weights.
* ``tokenizer_digest``: SHA-256 of the tokenizer definition file, ``tokenizer.json`` (a directory that
  only has a SentencePiece ``tokenizer.model`` uses that).
* geometry from ``config.json``: ``layers`` = num_hidden_layers, ``kv_heads`` = num_key_value_heads (else
  num_attention_heads), ``head_dim`` = head_dim (else hidden_size / num_attention_heads).
* ``positional``: ``rope;theta=N`` always (the theta is stated, so the ID never depends on what a reader
  believes the default is) plus ``,scaling=NAME`` when the rope type is not "default".  A theta that is
  not an integer cannot be written in the registered syntax and is refused.
* ``kv_dtype``: given, else the model's ``dtype``/``torch_dtype`` from the config, else fp32 (what
  transformers loads when the config names none).
* ``model``: given, else the config's ``kvsp_model`` member (the reference model writes one), else its
  ``_name_or_path`` when that is a hub-style name rather than a local path, else its ``model_type``.

No torch here: computing a descriptor needs only the files.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kvsp.descriptor import CompatDescriptor
from kvsp.errors import ValidationError

CONFIG_FILE: Final = "config.json"
TOKENIZER_FILES: Final = ("tokenizer.json", "tokenizer.model")
MAX_CONFIG_OCTETS: Final = 1 << 20
DEFAULT_ROPE_THETA: Final = 10000.0  # transformers' default for Llama-family configs that name none
_CHUNK: Final = 1 << 20
DTYPE_NAMES: Final[Mapping[str, str]] = {
    "float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
    "float8_e4m3fn": "fp8-e4m3", "float8_e5m2": "fp8-e5m2",
}


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """The files of a model directory that its identity is computed from."""

    config: dict[str, object]
    weights: tuple[Path, ...]  # in ascending byte order of their names
    tokenizer: Path


def read_config(directory: Path) -> dict[str, object]:
    path = directory / CONFIG_FILE
    data = path.read_bytes() if path.stat().st_size <= MAX_CONFIG_OCTETS else b""
    if not data:
        raise ValidationError(str(path), f"missing, empty or larger than {MAX_CONFIG_OCTETS} octets")
    try:
        config = json.loads(data)
    except ValueError as exc:
        raise ValidationError(str(path), f"malformed JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ValidationError(str(path), "must be a JSON object")
    return config


def model_files(directory: str | Path) -> ModelFiles:
    root = Path(directory)
    config = read_config(root)
    files = [p for p in root.iterdir() if p.is_file()]
    weights = [p for p in files if p.name.endswith(".safetensors")]
    if not weights:
        weights = [p for p in files if p.name.startswith("pytorch_model") and p.name.endswith(".bin")]
    if not weights:
        raise ValidationError(str(root), "no weight files (*.safetensors or pytorch_model*.bin)")
    weights.sort(key=lambda p: p.name.encode("utf-8"))
    tokenizer = next((root / name for name in TOKENIZER_FILES if (root / name).is_file()), None)
    if tokenizer is None:
        raise ValidationError(str(root), f"no tokenizer definition file ({' or '.join(TOKENIZER_FILES)})")
    return ModelFiles(config, tuple(weights), tokenizer)


def digest_files(paths: tuple[Path, ...] | list[Path]) -> bytes:
    """SHA-256 of the files' contents concatenated in the given order, read in chunks."""
    h = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    return h.digest()


def _int(config: Mapping[str, object], name: str, default: int | None = None) -> int:
    value = config.get(name, default)
    if value is None and default is not None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError(f"{CONFIG_FILE}.{name}", "must be a positive integer")
    return value


def geometry_of(config: Mapping[str, object]) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a transformers config."""
    heads = _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", heads)
    hidden = _int(config, "hidden_size")
    head_dim = _int(config, "head_dim", hidden // heads if hidden % heads == 0 else None)
    return _int(config, "num_hidden_layers"), kv_heads, head_dim


def rope_parameters(config: Mapping[str, object]) -> tuple[float, str]:
    """(theta, rope type) from the transformers 5 ``rope_parameters`` or the older ``rope_theta``/``rope_scaling``."""
    params = config.get("rope_parameters")
    if not isinstance(params, Mapping):
        scaling = config.get("rope_scaling")
        params = {**(scaling if isinstance(scaling, Mapping) else {}), "rope_theta": config.get("rope_theta")}
    theta = params.get("rope_theta")
    theta = DEFAULT_ROPE_THETA if theta is None else theta
    kind = params.get("rope_type", params.get("type", "default"))
    if isinstance(theta, bool) or not isinstance(theta, int | float) or theta <= 0:
        raise ValidationError(f"{CONFIG_FILE}.rope_theta", "must be a positive number")
    if not isinstance(kind, str):
        raise ValidationError(f"{CONFIG_FILE}.rope_type", "must be a string")
    return float(theta), kind


def positional_of(config: Mapping[str, object]) -> str:
    theta, kind = rope_parameters(config)
    if theta != int(theta):
        raise ValidationError(f"{CONFIG_FILE}.rope_theta", f"{theta} is not an integer; the registry syntax has none")
    text = f"rope;theta={int(theta)}"
    return text if kind == "default" else f"{text},scaling={kind.lower()}"


def kv_dtype_of_config(config: Mapping[str, object]) -> str:
    name = config.get("dtype", config.get("torch_dtype")) or "float32"
    if not isinstance(name, str) or name.removeprefix("torch.") not in DTYPE_NAMES:
        raise ValidationError(f"{CONFIG_FILE}.dtype", f"{name!r} has no KVSP element type")
    return DTYPE_NAMES[name.removeprefix("torch.")]


def model_name(config: Mapping[str, object]) -> str:
    for member in ("kvsp_model", "_name_or_path"):
        value = config.get(member)
        if isinstance(value, str) and value and not value.startswith(("/", ".", "~")) and "\\" not in value:
            return value
    value = config.get("model_type")
    if not isinstance(value, str) or not value:
        raise ValidationError(CONFIG_FILE, "names no model (kvsp_model, _name_or_path or model_type); pass one")
    return value


def descriptor_from_model_dir(directory: str | Path, *, block_tokens: int, kv_dtype: str | None = None,
                              model: str | None = None) -> CompatDescriptor:
    """The Compatibility Descriptor of the model in ``directory`` (see the module for each member)."""
    files = model_files(directory)
    layers, kv_heads, head_dim = geometry_of(files.config)
    return CompatDescriptor(
        model=model or model_name(files.config),
        model_digest=digest_files(files.weights),
        tokenizer_digest=digest_files([files.tokenizer]),
        layers=layers, kv_heads=kv_heads, head_dim=head_dim,
        kv_dtype=kv_dtype or kv_dtype_of_config(files.config),
        positional=positional_of(files.config),
        block_tokens=block_tokens,
    )
