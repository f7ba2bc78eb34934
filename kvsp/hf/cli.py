"""``kvsp model``: write the reference model, print a model directory's Compatibility Descriptor.

    kvsp model init DIR [--layers N --hidden H --heads A --kv-heads G --vocab V --seed S]
    kvsp model descriptor DIR [--block-tokens B] [--kv-dtype T] [--model NAME]

``descriptor`` prints the descriptor as canonical JSON (JCS), so ``kvsp model descriptor DIR | kvsp
compat-id -`` gives its Compatibility ID.  torch and transformers are imported only by ``init``.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvsp.registry import ELEMENT_TYPES

DEFAULT_BLOCK_TOKENS = 16


def cmd_model_init(args: argparse.Namespace) -> None:
    from kvsp.hf.refmodel import ModelShape, init_model  # noqa: PLC0415 - torch only for this command

    try:
        shape = ModelShape(layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                           vocab=args.vocab, seed=args.seed)
    except ValueError as exc:
        from kvsp.errors import ValidationError  # noqa: PLC0415

        raise ValidationError("model init", str(exc)) from exc
    print(init_model(args.dir, shape))


def cmd_model_descriptor(args: argparse.Namespace) -> None:
    from kvsp.hf.descriptor import descriptor_from_model_dir  # noqa: PLC0415

    descriptor = descriptor_from_model_dir(args.dir, block_tokens=args.block_tokens, kv_dtype=args.kv_dtype,
                                           model=args.model)
    print(descriptor.canonical().decode())


def add_model_parser(sub: Any) -> None:
    """Add ``model`` to the ``kvsp`` subcommands (``sub`` is argparse's subparsers action)."""
    p = sub.add_parser("model", help="the reference model and model descriptors (Hugging Face directories)")
    msub = p.add_subparsers(dest="model_command", required=True, parser_class=type(p))
    init = msub.add_parser("init", help="write the small seeded Llama reference model into DIR")
    init.add_argument("dir")
    init.add_argument("--layers", type=int, default=4)
    init.add_argument("--hidden", type=int, default=256)
    init.add_argument("--heads", type=int, default=8)
    init.add_argument("--kv-heads", type=int, default=2)
    init.add_argument("--vocab", type=int, default=2048)
    init.add_argument("--seed", type=int, default=0)
    init.set_defaults(func=cmd_model_init)
    desc = msub.add_parser("descriptor", help="print the Compatibility Descriptor of a model directory")
    desc.add_argument("dir")
    desc.add_argument("--block-tokens", type=int, default=DEFAULT_BLOCK_TOKENS)
    desc.add_argument("--kv-dtype", choices=sorted(ELEMENT_TYPES), help="default: the model's dtype")
    desc.add_argument("--model", help="the model name (default: from config.json)")
    desc.set_defaults(func=cmd_model_descriptor)
