"""Shared plumbing of the aiomoqt-side peers (run by the Python 3.12 interop venv, not by kvsp).

Protocol with the harness (interop/harness.py): every line a peer writes to stdout that starts with
``@interop `` is one JSON object with a ``"kind"``; everything else (aiomoqt's logging goes to
stderr) is diagnostics. Peers exit 0 when they ran to the end, whatever the outcome they report.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for interop.content

from aiomoqt.utils.logger import set_log_level

from interop.content import BlockSpec

__all__ = ["DRAFTS", "PREFIX", "BlockSpec", "add_block_args", "add_draft_arg", "block_from", "emit", "object_json",
           "parse_moqt_uri", "quiet_logging", "supported_drafts"]

PREFIX = "@interop "
DRAFTS = (14, 16, 18)  # decision D3's drafts: ALPN moq-00 (version 0xff00000e), moqt-16, moqt-18
ALL = "all"


def add_draft_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draft", default="14", choices=[*map(str, DRAFTS), ALL],
                        help="MOQT draft to speak: 14, 16 or 18 pins aiomoqt to that draft alone (its ALPN only: "
                             "moq-00, moqt-16, moqt-18); 'all' is aiomoqt's own default, every draft it has "
                             "offered / accepted newest first (22, 20, 18, 16, 14)")


def supported_drafts(args: argparse.Namespace) -> int | None:
    """``--draft`` as aiomoqt's ``supported_drafts`` takes it: one draft number, or None for its default list."""
    return None if args.draft == ALL else int(args.draft)


def emit(kind: str, **fields: object) -> None:
    print(PREFIX + json.dumps({"kind": kind, **fields}, sort_keys=True), flush=True)


def add_block_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", required=True, help="namespace fields, hex, comma-separated")
    parser.add_argument("--track", default="raw")
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--k-size", type=int, required=True)
    parser.add_argument("--v-size", type=int, required=True)


def block_from(args: argparse.Namespace) -> BlockSpec:
    return BlockSpec.from_args(args.namespace, args.track, args.layers, args.k_size, args.v_size)


def parse_moqt_uri(uri: str) -> tuple[str, int, str]:
    parts = urlsplit(uri)
    if parts.scheme != "moqt" or not parts.hostname or parts.port is None:
        raise SystemExit(f"{uri!r}: expected moqt://host:port/path")
    return parts.hostname, parts.port, parts.path


def quiet_logging(debug: bool) -> None:
    level = logging.DEBUG if debug else logging.WARNING
    set_log_level(level)
    logging.basicConfig(level=level, stream=sys.stderr)


def object_json(group: int, subgroup: int | None, obj: int, *, status: int | None, payload: bytes,
                extensions: object, recv_us: int) -> dict[str, object]:
    ext = {}
    if isinstance(extensions, dict):
        ext = {str(k): (v.hex() if isinstance(v, bytes | bytearray) else v) for k, v in extensions.items()}
    return {"group": group, "subgroup": subgroup, "object": obj, "status": int(status or 0),
            "payload": bytes(payload).hex(), "extensions": ext, "recv_us": recv_us}
