"""The reference model (decision D6): a small Llama-architecture causal LM made locally, nothing downloaded.

`init_model` writes a model directory that any transformers code loads like a hub checkpoint:

* ``config.json``: a `LlamaConfig` (grouped-query attention when ``kv_heads < heads``), with the member
  ``kvsp_model`` naming it for the Compatibility Descriptor;
* ``model.safetensors``: weights drawn from a `torch.Generator` seeded with ``seed``, parameter by
  parameter in ascending name order (normal; std 0.02 for the embeddings, 1/sqrt(fan-in) for the
  projections, so that greedy decoding does not collapse onto one token; RMSNorm weights 1), so the same
  arguments give the same octets and hence the same ``model_digest``;
* ``tokenizer.json``: a byte-level BPE (`tokenizers`) trained on the small corpus embedded below, with
  special tokens ``<pad>`` (0), ``<s>`` (1), ``</s>`` (2) and, beyond the merges the corpus gives,
  ``<reserved_N>`` tokens up to the requested vocabulary size; the model's vocabulary is the tokenizer's;
* ``tokenizer_config.json`` and ``generation_config.json`` so `AutoTokenizer` and ``generate`` work too.

The weights are random: the model produces fluent nonsense, which is all that cache loading, migration
and timing need (every logit is still a real function of every earlier token through attention).
`build_model` makes the same kind of model in memory (for benchmark shapes too large to write).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in kvsp.hf may reach a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

if TYPE_CHECKING:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

MODEL_NAME: Final = "kvsp-reference-llama"
SPECIALS: Final = ("<pad>", "<s>", "</s>")
EMBED_STD: Final = 0.02
_CORPUS: Final = """\
The KV Cache Storage Protocol lets inference instances share the attention key and value cache of a
prompt prefix. A prefix is cut into blocks of a fixed number of tokens; each block is named by a key that
binds the tokens, every earlier block and the model, so a block can only be found by an instance that
would have computed exactly the same keys and values. Holders keep blocks in device memory, host memory
or storage, publish replica records to the index, and serve a range of layers to any authorised peer.
An instance that receives a request asks the index which blocks of its prompt are cached and where,
loads the longest cached prefix layer by layer while it computes, and recomputes only the rest. When an
instance fails, another one resumes the session from its latest checkpoint, loads the blocks that the
failed instance published, restores the sampler and continues the output where it stopped.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick
daft zebras jump! Sphinx of black quartz, judge my vow. Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256
512 1024 2048 4096. def prefill(tokens): return model(tokens) # code, too: for i in range(n): x += i
"""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What `kvsp model init` can vary; the defaults run a few hundred tokens in well under a second on CPU."""

    layers: int = 4
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 2
    vocab: int = 2048
    intermediate: int | None = None  # default: 4 x hidden (the SwiGLU MLP then has 3 x 4 x hidden^2 weights)
    max_positions: int = 8192
    rope_theta: int = 10_000
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.layers, self.hidden, self.heads, self.kv_heads, self.vocab, self.max_positions) < 1:
            raise ValueError("every model dimension must be positive")
        if self.hidden % self.heads or self.heads % self.kv_heads or (self.hidden // self.heads) % 2:
            raise ValueError("hidden must split into heads of even size, and heads into kv_heads groups")
        if self.vocab < 256 + len(SPECIALS):
            raise ValueError(f"a byte-level vocabulary needs at least {256 + len(SPECIALS)} entries")


def build_tokenizer(vocab: int) -> str:
    """tokenizer.json text: byte-level BPE trained on the embedded corpus (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIALS), min_frequency=1,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    # Every line alone and the corpus as one text: more merge candidates from a small corpus.
    tokenizer.train_from_iterator([*_CORPUS.splitlines(), _CORPUS], trainer=trainer)
    # The corpus yields fewer merges than a large vocabulary; reserved tokens fill it up, as real models
    # reserve ids, so the vocabulary has exactly the requested size.
    missing = vocab - tokenizer.get_vocab_size()
    tokenizer.add_tokens([f"<reserved_{i}>" for i in range(max(0, missing))])
    text: str = tokenizer.to_str()
    return text


def llama_config(shape: ModelShape, vocab_size: int) -> LlamaConfig:
    from transformers import LlamaConfig  # noqa: PLC0415

    head_dim = shape.hidden // shape.heads
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=shape.hidden, intermediate_size=shape.intermediate or 4 * shape.hidden,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=head_dim, max_position_embeddings=shape.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": float(shape.rope_theta)},
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )


def seeded_weights(config: LlamaConfig, seed: int, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every parameter of a `LlamaForCausalLM` with ``config``, drawn in ascending name order."""
    import torch  # noqa: PLC0415
    from transformers import LlamaForCausalLM  # noqa: PLC0415

    with torch.device("meta"):
        shapes = {name: p.shape for name, p in LlamaForCausalLM(config).named_parameters()}
    generator = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape)
        else:  # fan-in scaling keeps every layer's output at unit scale, so attention shapes the output
            std = EMBED_STD if "embed_tokens" in name else shape[1] ** -0.5
            tensor = torch.empty(shape).normal_(0.0, std, generator=generator)
        out[name] = tensor if dtype is None else tensor.to(dtype)
    return out


def build_model(shape: ModelShape, *, dtype: torch.dtype | None = None, vocab_size: int | None = None,
                attn_implementation: str = "sdpa") -> LlamaForCausalLM:
    """A seeded model of ``shape`` in memory, in eval mode (no files, no tokenizer)."""
    import torch  # noqa: PLC0415
    from transformers import LlamaForCausalLM  # noqa: PLC0415

    config = llama_config(shape, vocab_size or shape.vocab)
    config._attn_implementation = attn_implementation
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(seeded_weights(config, shape.seed, dtype), assign=True)
    model.model.rotary_emb = type(model.model.rotary_emb)(config)  # its buffers are not parameters
    model.eval()  # type: ignore[no-untyped-call]
    return model


def init_model(directory: str | Path, shape: ModelShape = ModelShape()) -> Path:
    """Write the reference model into ``directory`` (created if needed) and return its path."""
    from safetensors.torch import save_file  # noqa: PLC0415
    from tokenizers import Tokenizer  # noqa: PLC0415

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer_text = build_tokenizer(shape.vocab)
    vocab_size = Tokenizer.from_str(tokenizer_text).get_vocab_size()
    config = llama_config(shape, vocab_size)
    save_file(seeded_weights(config, shape.seed), str(root / "model.safetensors"), metadata={"format": "pt"})
    document = {**json.loads(config.to_json_string(use_diff=False)), "kvsp_model": MODEL_NAME,
                "architectures": ["LlamaForCausalLM"], "dtype": "float32"}
    document.pop("transformers_version", None)  # the same model whatever library wrote it
    (root / "config.json").write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    (root / "tokenizer.json").write_text(tokenizer_text)
    (root / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>", "model_max_length": shape.max_positions}, indent=2) + "\n")
    (root / "generation_config.json").write_text(json.dumps({
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "do_sample": False}, indent=2) + "\n")
    return root
