"""The fuzz harnesses of fuzz/ run without atheris: each target's contract check over its committed seeds
and a few hundred random and mutated inputs, so the suite notices a harness that no longer holds
(a target changed, a seed went stale) without the cost of coverage instrumentation.

The coverage-guided runs themselves are ``python3 -m fuzz`` (short in .ci/run, long in docs/fuzzing.md).
"""

from __future__ import annotations

import importlib
import random
import time
from collections.abc import Callable
from types import ModuleType

import pytest

from fuzz.common import Cursor, OpWriter, load_corpus, split_points
from fuzz.run import parse_output, targets

TARGETS = targets()
RANDOM_INPUTS = 300
# An input takes milliseconds at most (the session target is the slowest); seconds would mean a hang.
SLOW_INPUT_S = 5.0


def harness(target: str) -> ModuleType:
    return importlib.import_module(f"fuzz.fuzz_{target}")


def mutate(rng: random.Random, seed: bytes) -> bytes:
    """One of libFuzzer's simpler mutations: flip, insert, erase, overwrite with an extreme, truncate."""
    data = bytearray(seed)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(5)
        pos = rng.randrange(len(data) + 1)
        if kind == 0 and data:
            data[pos % len(data)] ^= 1 << rng.randrange(8)
        elif kind == 1:
            data[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif kind == 2:
            del data[pos : pos + rng.randint(1, 8)]
        elif kind == 3 and data:
            data[pos % len(data)] = rng.choice((0x00, 0x3F, 0x40, 0x7F, 0x80, 0xC0, 0xFF))
        else:
            del data[pos:]
    return bytes(data)


def inputs(target: str, seeds: list[bytes]) -> list[bytes]:
    rng = random.Random(target)  # fixed per target: a failure reproduces
    out = [b"", b"\x00", b"\xff" * 8]
    while len(out) < RANDOM_INPUTS:
        if seeds and rng.random() < 0.7:
            out.append(mutate(rng, rng.choice(seeds)))
        else:
            out.append(rng.randbytes(rng.randint(0, 200)))
    return out


def run_all(test_one_input: Callable[[bytes], None], cases: list[bytes]) -> None:
    for data in cases:
        start = time.perf_counter()
        test_one_input(data)
        took = time.perf_counter() - start
        assert took < SLOW_INPUT_S, f"input {data[:64]!r}... took {took:.1f} s"


def test_every_target_has_seeds() -> None:
    assert len(TARGETS) >= 20
    assert all(load_corpus(t) for t in TARGETS), [t for t in TARGETS if not load_corpus(t)]


@pytest.mark.parametrize("target", TARGETS)
def test_committed_seeds_are_the_harness_seeds(target: str) -> None:
    """The corpus is written by ``python3 -m fuzz --write-seeds``: rerun it when seeds() changes."""
    assert sorted(load_corpus(target)) == sorted(set(harness(target).seeds()))


@pytest.mark.parametrize("target", TARGETS)
def test_seeds_hold_the_contract(target: str) -> None:
    run_all(harness(target).test_one_input, load_corpus(target))


@pytest.mark.parametrize("target", TARGETS)
def test_random_and_mutated_inputs_hold_the_contract(target: str) -> None:
    run_all(harness(target).test_one_input, inputs(target, load_corpus(target)))


def test_cursor_reads_past_the_end_as_zeros() -> None:
    cursor = Cursor(OpWriter().u8(7).u16(0x0102).chunk(b"abc").getvalue())
    assert (cursor.u8(), cursor.u16(), cursor.chunk()) == (7, 0x0102, b"abc")
    assert (cursor.u8(), cursor.flag(), cursor.chunk(), cursor.rest(), cursor.remaining) == (0, False, b"", b"", 0)
    assert split_points(b"abcdef", Cursor(b"\x02\x00\x01")) == [b"ab", b"c", b"d", b"ef"]
    assert split_points(b"", Cursor(b"")) == [b""]


def test_run_report_parses_libfuzzer_output() -> None:
    text = ("#2\tINITED cov: 10 ft: 12 corp: 1/1b exec/s: 0 rss: 40Mb\n"
            "#4096\tpulse  cov: 300 ft: 900 corp: 30/1Kb lim: 40 exec/s: 2048 rss: 50Mb\n"
            "#5000\tDONE   cov: 312 ft: 950 corp: 31/1Kb lim: 40 exec/s: 2500 rss: 51Mb\n"
            "Done 5000 runs in 2 second(s)\nstat::average_exec_per_sec:     2500\nstat::peak_rss_mb:  51\n")
    result = parse_output("x", text, 0, 2.04)
    assert (result.executions, result.exec_per_s, result.cov, result.ft) == (5000, 2500, 312, 950)
    assert result.peak_rss_mb == 51
    assert result.ok
    crashed = parse_output("x", text + "artifact_prefix='a/'; Test unit written to a/x-crash-12ab\n", 1, 1.0)
    assert not crashed.ok and crashed.crash == "a/x-crash-12ab"
