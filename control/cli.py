"""The ``kvsp`` command line.

Output formats are a contract (tests cover them).  Any invalid input ends with a non-zero status and
exactly one line on stderr saying what is wrong; no traceback.
"""

from __future__ import annotations

import argparse
import mmap
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from control.up.cli import add_parsers as add_up_parsers
from kvsp.container import decode_container, replica_digest
from kvsp.descriptor import CompatDescriptor
from kvsp.encoding import canonical_json, format_digest
from kvsp.errors import KvspError, ValidationError
from kvsp.hf.cli import add_model_parser
from kvsp.keys import ScopeKey, block_keys
from kvsp.pki import MOQT_TOKEN_SUFFIX, RoleSpec, make_dev_moqt_tokens, make_dev_pki
from kvsp.service.logs import FORMAT_ENV, LOG_FORMATS, log_format
from kvsp.service.logs import configure as configure_logs

EXIT_INVALID = 2
MAX_TEXT_INPUT = 64 * 1024 * 1024  # descriptors and token lists are small; refuse runaway input
_TOKEN_SEPARATORS = re.compile(r"\s*,\s*|\s+")


class CliError(KvspError):
    """A command-line usage or input error."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as the CLI contract says
        raise CliError(message)


def _read_text(name: str) -> str:
    data = sys.stdin.buffer.read(MAX_TEXT_INPUT + 1) if name == "-" else _read_file(name)
    if len(data) > MAX_TEXT_INPUT:
        raise CliError(f"{name}: larger than {MAX_TEXT_INPUT} octets")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"{name}: not UTF-8 text") from exc


def _read_file(name: str) -> bytes:
    path = Path(name)
    if path.stat().st_size > MAX_TEXT_INPUT:
        raise CliError(f"{name}: larger than {MAX_TEXT_INPUT} octets")
    return path.read_bytes()


def parse_token_list(text: str, source: str = "tokens") -> list[int]:
    """Integers separated by commas and/or whitespace."""
    stripped = text.strip()
    if not stripped:
        return []
    items = _TOKEN_SEPARATORS.split(stripped)
    for i, item in enumerate(items):
        if not item.isascii() or not item.isdigit():
            raise CliError(f"{source}: item {i + 1} ({item[:20]!r}) is not a non-negative integer")
    return [int(item) for item in items]


def cmd_compat_id(args: argparse.Namespace) -> None:
    descriptor = CompatDescriptor.from_bytes(_read_text(args.file))
    print(descriptor.compat_id_hex)


def cmd_block_keys(args: argparse.Namespace) -> None:
    descriptor = CompatDescriptor.from_bytes(_read_text(args.descriptor))
    scope_key = ScopeKey.from_hex(args.scope_key)
    if args.tokens is not None:
        tokens = parse_token_list(args.tokens, "--tokens")
    else:
        tokens = parse_token_list(_read_text(args.tokens_file), args.tokens_file)
    keys = block_keys(scope_key, descriptor.compat_id, descriptor.block_tokens, tokens)
    out = {"compat_id": descriptor.compat_id_hex, "scope_id": scope_key.scope_id.hex(),
           "block_keys": [k.hex() for k in keys]}
    print(canonical_json(out).decode())


def cmd_container_inspect(args: argparse.Namespace) -> None:
    path = Path(args.file)
    with path.open("rb") as f:
        if path.stat().st_size == 0:
            data: bytes | mmap.mmap = b""
        else:  # map the file: inspecting a large container reads only what it hashes
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        container = decode_container(data)
        digests = container.layer_digests()
        layers = [{"layer": lv.layer, "k_length": len(lv.k), "v_length": len(lv.v), "digest": d.hex()}
                  for lv, d in zip(container.layers, digests, strict=True)]
        out = {"version": container.version, "flags": container.flags, "codec": container.codec,
               "first_layer": container.first_layer, "layer_count": container.layer_count,
               "token_count": container.token_count, "layers": layers,
               "digest": format_digest(replica_digest(digests))}
        del container, layers  # release views before the map closes
        if isinstance(data, mmap.mmap):
            data.close()
    print(canonical_json(out).decode())


def cmd_certs(args: argparse.Namespace) -> None:
    if not args.role:
        raise CliError("certs: give at least one --role NAME=URI")
    roles = [RoleSpec.parse(text) for text in args.role]
    for issued in make_dev_pki(Path(args.dir), roles):
        print(f"{issued.name}\t{issued.uri}\t{issued.cert_path}\t{issued.key_path}")
    if args.moqt_tokens:
        for path in make_dev_moqt_tokens(Path(args.dir), roles):
            print(f"{path.name.removesuffix(MOQT_TOKEN_SUFFIX)}\tmoqt-token\t{path}")


def cmd_serve(args: argparse.Namespace) -> None:
    import asyncio  # noqa: PLC0415 - the network roles load only for this command

    from control.serve import serve  # noqa: PLC0415
    from kvsp.service.config import RoleConfig  # noqa: PLC0415

    fmt = log_format(args.log_format)  # a bad KVSP_LOG_FORMAT is one line too, before anything starts
    config = RoleConfig.load(Path(args.config))
    roles = tuple(r for r in args.roles.split(",") if r)
    unknown = [r for r in roles if r not in config.roles]
    if unknown:
        raise CliError(f"serve: roles {unknown} are not in {args.config} (roles = {list(config.roles)})")
    configure_logs(fmt)
    try:
        import uvloop  # noqa: PLC0415

        runner: Callable[..., object] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on every platform we test
        runner = asyncio.run
    runner(serve(config, roles or None))


def cmd_demo(args: argparse.Namespace) -> None:
    from control import demo  # noqa: PLC0415

    demo.main(args.dir)


def find_benchmarks(starts: Sequence[Path]) -> Path | None:
    """The source checkout whose benchmarks/ to run: the first of ``starts`` or their parents that has one."""
    for start in starts:
        for folder in (start, *start.parents):
            if (folder / "benchmarks" / "__main__.py").is_file():
                return folder
    return None


def cmd_bench(args: argparse.Namespace) -> None:
    # The suites measure a source checkout and use its tests' helpers, so they are not installed with
    # the package: run ``python -m benchmarks`` in the checkout (here or above, or the editable install's).
    import subprocess  # noqa: PLC0415

    root = find_benchmarks([Path.cwd(), Path(__file__).resolve().parent.parent])
    if root is None:
        raise CliError("bench: no benchmarks/ folder here, above, or beside the kvsp package; run it in a kvsp "
                       "source checkout")
    forward = [flag for flag, on in (("--quick", args.quick), ("--no-plots", args.no_plots), ("--list", args.list))
               if on]
    forward += ["--out", str(Path(args.out).resolve())] if args.out else []
    forward += ["--timeout", str(args.timeout)] if args.timeout is not None else []
    forward += ["--only", *args.only] if args.only else []
    done = subprocess.run([sys.executable, "-m", "benchmarks", *forward], cwd=root, check=False)
    if done.returncode:
        raise SystemExit(done.returncode)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvsp", description="KV Cache Storage Protocol tools")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("compat-id", help="print the Compatibility ID of a descriptor (FILE or -)")
    p.add_argument("file")
    p.set_defaults(func=cmd_compat_id)

    p = sub.add_parser("block-keys", help="compute Block Keys of a token sequence")
    p.add_argument("--descriptor", required=True)
    p.add_argument("--scope-key", required=True, help="hex, at least 32 octets")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--tokens", help="comma- and/or space-separated integers")
    group.add_argument("--tokens-file")
    p.set_defaults(func=cmd_block_keys)

    p = sub.add_parser("container", help="KV Block Container tools")
    csub = p.add_subparsers(dest="container_command", required=True, parser_class=_Parser)
    ci = csub.add_parser("inspect", help="describe a container file as JSON")
    ci.add_argument("file")
    ci.set_defaults(func=cmd_container_inspect)

    p = sub.add_parser("demo", help="walk through the protocol core on embedded defaults")
    p.add_argument("--dir", help="where to write the demo PKI (default: a temporary folder)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("serve", help="run one or more roles (is, holder, pc, instance, relay)")
    p.add_argument("roles", help="comma-separated roles, all of them in the config's roles")
    p.add_argument("--config", required=True)
    p.add_argument("--log-format", choices=LOG_FORMATS,
                   help=f"text (default) or json: one object per line (also ${FORMAT_ENV})")
    p.set_defaults(func=cmd_serve)

    add_model_parser(sub)

    p = sub.add_parser("certs", help="make a development CA and role certificates")
    p.add_argument("dir")
    p.add_argument("--role", action="append", default=[], metavar="NAME=URI")
    p.add_argument("--moqt-tokens", action="store_true",
                   help="also a D3 token per role (NAME.moqt-token, signed by moqt-issuer.key): MOQT over picoquic")
    p.set_defaults(func=cmd_certs)

    p = sub.add_parser("bench", help="run the benchmarks of a source checkout (python -m benchmarks)")
    p.add_argument("--quick", action="store_true", help="CI-sized runs")
    p.add_argument("--out", help="folder for results.json, results.md, plots/ (default benchmarks/results)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="suites to run (default all)")
    p.add_argument("--timeout", type=float, help="seconds per suite")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--list", action="store_true", help="print the suites and exit")
    p.set_defaults(func=cmd_bench)

    add_up_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        func: Callable[[argparse.Namespace], None] = args.func
        func(args)
    except (KvspError, ValidationError) as exc:
        print(f"kvsp: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except OSError as exc:
        print(f"kvsp: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_INVALID
    return 0



if __name__ == "__main__":
    sys.exit(main())
