"""What every harness shares: the contract check, a byte cursor for structured inputs, and the entry point.

Why a cursor of our own rather than atheris' ``FuzzedDataProvider``: the stateful harnesses read an
input as a sequence of operations, and their seed corpora are written by encoding such sequences
(``OpWriter``); the provider consumes integers from the end of the buffer, which no encoder can aim at.
The cursor never raises: an exhausted input reads as zeros and empty strings, so every input is a
valid program and the fuzzer spends no time on framing.

Why instrumentation is applied after import (`instrument_packages`): the harness modules import their
targets at the top so that pytest can import them without atheris (tests/test_fuzz_harnesses.py);
atheris' ``instrument_imports`` only sees imports made inside it, so the entry point instruments the
already-loaded functions of the named packages instead, as ``atheris.instrument_all`` does for all.
"""

from __future__ import annotations

import gc
import sys
import tempfile
import types
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
CORPUS: Final = Path(__file__).resolve().parent / "corpus"

TestOneInput = Callable[[bytes], None]


class ContractViolation(AssertionError):
    """A target broke its contract (accepted or typed error, no state change on refusal, round trip...).

    An AssertionError so that pytest reports it as a failure; not an ``assert`` statement, which
    ``python -O`` would strip.
    """


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ContractViolation(message)


class Cursor:
    """Reads a fuzz input as small fields; past the end every read is zero or empty (never raises)."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    @property
    def remaining(self) -> int:
        return len(self._data) - self._pos

    def u8(self) -> int:
        if self._pos >= len(self._data):
            return 0
        value = self._data[self._pos]
        self._pos += 1
        return value

    def u16(self) -> int:
        return (self.u8() << 8) | self.u8()

    def choice(self, count: int) -> int:
        """An index below ``count`` (one octet, so at most 256 choices)."""
        return self.u8() % count

    def flag(self) -> bool:
        return bool(self.u8() & 1)

    def take(self, count: int) -> bytes:
        chunk = self._data[self._pos : self._pos + count]
        self._pos += len(chunk)
        return chunk

    def chunk(self) -> bytes:
        """A length octet, then that many octets (fewer at the end of the input)."""
        return self.take(self.u8())

    def long_chunk(self) -> bytes:
        """A 16-bit length, then that many octets."""
        return self.take(self.u16())

    def rest(self) -> bytes:
        return self.take(self.remaining)


class OpWriter:
    """The inverse of `Cursor`, for writing seed inputs of the structured harnesses."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def u8(self, value: int) -> OpWriter:
        self._buf.append(value & 0xFF)
        return self

    def u16(self, value: int) -> OpWriter:
        self._buf += (value & 0xFFFF).to_bytes(2, "big")
        return self

    def raw(self, data: bytes) -> OpWriter:
        self._buf += data
        return self

    def chunk(self, data: bytes) -> OpWriter:
        if len(data) > 0xFF:
            raise ValueError("a chunk is at most 255 octets; use long_chunk")
        return self.u8(len(data)).raw(data)

    def long_chunk(self, data: bytes) -> OpWriter:
        if len(data) > 0xFFFF:
            raise ValueError("a long chunk is at most 65535 octets")
        return self.u16(len(data)).raw(data)

    def getvalue(self) -> bytes:
        return bytes(self._buf)


def split_points(data: bytes, cursor: Cursor, *, max_pieces: int = 8) -> list[bytes]:
    """``data`` cut where the cursor says (each octet: the next piece's length, 0 meaning one octet), the
    rest of it in one piece once the cursor's octets or ``max_pieces`` run out."""
    pieces: list[bytes] = []
    pos = 0
    while pos < len(data) and len(pieces) < max_pieces - 1 and cursor.remaining:
        step = cursor.u8() or 1
        pieces.append(data[pos : pos + step])
        pos += step
    if pos < len(data) or not pieces:  # an empty input is one empty piece: a FIN still arrives with it
        pieces.append(data[pos:])
    return pieces


def instrument_packages(prefixes: Iterable[str]) -> int:
    """Add atheris' coverage instrumentation to every loaded function of the named packages.

    Returns the number of functions instrumented.  Must run before ``atheris.Setup``.
    """
    # Imported here, not at the top: pytest imports the harnesses (and this module) without atheris.
    import atheris  # type: ignore[import-untyped]  # noqa: PLC0415  # atheris ships no type stubs

    wanted = tuple(prefixes)

    def ours(module: object) -> bool:
        return isinstance(module, str) and any(module == p or module.startswith(p + ".") for p in wanted)

    count = 0
    for obj in gc.get_objects():
        if isinstance(obj, types.FunctionType) and ours(obj.__module__):
            atheris.instrument_func(obj)
            count += 1
    return count


DEFAULT_MAX_LEN: Final = 4096
# QUIC varints at the edges of each length (RFC 9000 section 16), for libFuzzer's dictionary: random
# mutation rarely writes eight 0xff octets where a Location or an ID is read.
VARINT_EDGES: Final = (b"\xff" * 8, b"\xc0" + b"\x00" * 7, b"\xbf\xff\xff\xff", b"\x80\x00\x00\x00", b"\x7f\xff",
                       b"\x40\x00", b"\x3f", b"\x40\x40", b"\xc0\x00\x00\x01\x00\x00\x00\x00")


def fuzz_main(test_one_input: TestOneInput, instrument: Sequence[str], *, max_len: int = DEFAULT_MAX_LEN,
              dictionary: Sequence[bytes] = (), argv: list[str] | None = None) -> None:
    """The entry point of ``python3 fuzz/fuzz_<target>.py [libFuzzer options] [corpus dirs]``.

    ``max_len`` is the target's longest input unless the command line gives ``-max_len``: instrumented
    Python costs microseconds per branch, so a decoder that loops over its input (a block of pairs, a
    namespace of fields) slows to a crawl on inputs longer than its structures need.  ``dictionary``
    entries are offered to libFuzzer's mutator (``-dict``) unless the command line gives its own.
    """
    import atheris  # noqa: PLC0415  # as in instrument_packages

    # Comparisons of str against constants (startswith, ==) and regex matches become libFuzzer hints,
    # so the fuzzer learns member names, schemes and prefixes instead of guessing them byte by byte.
    atheris.enabled_hooks.add("RegEx")
    atheris.enabled_hooks.add("str")
    count = instrument_packages(instrument)
    print(f"INFO: instrumented {count} functions of {', '.join(instrument)}", file=sys.stderr)
    args = list(sys.argv if argv is None else argv)
    if not any(a.startswith("-max_len=") for a in args):
        args.insert(1, f"-max_len={max_len}")
    if dictionary and not any(a.startswith("-dict=") for a in args):
        args.insert(1, f"-dict={write_dictionary(dictionary)}")
    atheris.Setup(args, test_one_input)
    atheris.Fuzz()


def write_dictionary(entries: Sequence[bytes]) -> Path:
    """A libFuzzer dictionary file (one quoted, hex-escaped entry per line) in the temporary directory."""
    lines = ['"' + "".join(f"\\x{b:02x}" for b in entry) + '"' for entry in entries]
    with tempfile.NamedTemporaryFile("w", prefix="kvsp-fuzz-", suffix=".dict", delete=False) as out:
        out.write("\n".join(lines) + "\n")
    return Path(out.name)


def corpus_dir(target: str) -> Path:
    return CORPUS / target


def load_corpus(target: str) -> list[bytes]:
    """The committed seeds of ``target`` (empty when none were written)."""
    folder = corpus_dir(target)
    if not folder.is_dir():
        return []
    return [p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()]
