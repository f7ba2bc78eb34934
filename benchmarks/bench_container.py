"""Benchmarks of the KV Block Container codec (kvsp.container), against the floor each operation has.

* decode: time per decode for 1, 16 and 64 MiB containers of 32 layers.  Decoding only views the
  buffer, so the time should not grow with the size (ratio to the smallest size, goal <= 1.5).
* encode: `encode_container` of a 64 MiB, 32-layer container against one copy of the same payload into
  a fresh buffer (``bytes(view)``: one allocation plus one memcpy, the least any encoder that returns
  new octets does), goal <= 1.5x; and `encode_into` a preallocated buffer against ``numpy.copyto``
  between preallocated arrays (a bare memcpy, no page faults), goal <= 1.5x.  A fresh 64 MiB buffer
  costs several times a bare memcpy in page faults, which is why both pairs are reported.
  `encode_parts` (no copy) and the stream reader (one copy, 64 KiB chunks) are reported against the
  fresh-copy floor.
* digests: all layer digests of 64 MiB against one SHA-256 pass over the same octets, goal <= 1.1x.

Every figure is the median (and quartiles) of several repetitions after a warm-up (benchmarks.timing);
candidate and baseline are measured in alternation (`paired`).
Run: ``python benchmarks/bench_container.py [--quick]``; prints JSON.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys

import numpy as np

from benchmarks.timing import Sample, case, measure, paired
from kvsp.container import Geometry, decode_container, encode_container, encode_into, encode_parts
from kvsp.container_stream import ContainerReader
from kvsp.registry import Codec

MiB = 1 << 20
LAYERS = 32
GEOMETRY = Geometry(kv_heads=8, head_dim=128, element_size=2)  # bf16: 4 KiB per token per section


def _payload(size: int) -> memoryview:
    return memoryview(np.random.default_rng(size).bytes(size))


def _sections(payload: memoryview) -> list[tuple[memoryview, memoryview]]:
    section = payload.nbytes // (2 * LAYERS)
    return [(payload[2 * i * section : (2 * i + 1) * section],
             payload[(2 * i + 1) * section : (2 * i + 2) * section]) for i in range(LAYERS)]


def _container(size: int) -> bytes:
    tokens = size // (2 * LAYERS * GEOMETRY.section_length(1))
    return encode_container(Codec.RAW, 0, tokens, _sections(_payload(size)), geometry=GEOMETRY)


def _decode_cases(sizes: list[int], reps: int) -> list[dict[str, object]]:
    cases = []
    smallest: Sample | None = None
    for size in sizes:
        buf = _container(size)
        tokens = decode_container(buf).token_count
        sample = measure(functools.partial(decode_container, buf, geometry=GEOMETRY), reps=reps, warmup=1, inner=200)
        name = f"decode-{size // MiB}MiB-{LAYERS}layers-{tokens}tokens"
        if smallest is None:
            smallest = sample
            cases.append(case(name, sample, None, "informative: the reference for the larger sizes"))
            continue
        cases.append(case(name, sample, smallest, "decode time independent of size: <= 1.5x the smallest "
                          "(ratio <= 1.5)", goal_max_ratio=1.5))
    return cases


def _copy_cases(size: int, reps: int) -> list[dict[str, object]]:
    payload = _payload(size)
    layers = _sections(payload)
    tokens = size // (2 * LAYERS * GEOMETRY.section_length(1))
    label = f"{size // MiB}MiB"

    def fresh_copy() -> bytes:
        return bytes(payload)

    encode, fresh = paired(lambda: encode_container(Codec.RAW, 0, tokens, layers), fresh_copy, reps=reps)
    source = np.frombuffer(payload, dtype=np.uint8)
    dest = np.empty(size + 20 + 16 * LAYERS, dtype=np.uint8)
    into, copyto = paired(lambda: encode_into(dest, Codec.RAW, 0, tokens, layers),
                          lambda: np.copyto(dest[:size], source), reps=reps)
    parts = measure(lambda: encode_parts(Codec.RAW, 0, tokens, layers), reps=reps, warmup=1, inner=100)
    buf = memoryview(encode_container(Codec.RAW, 0, tokens, layers))

    def stream() -> None:
        reader = ContainerReader(geometry=GEOMETRY)
        for offset in range(0, buf.nbytes, 64 * 1024):
            reader.feed(buf[offset : offset + 64 * 1024])
        reader.close()

    streamed, fresh2 = paired(stream, fresh_copy, reps=reps)
    container = decode_container(buf)
    digests, sha = paired(container.layer_digests, lambda: hashlib.sha256(payload).digest(), reps=reps)
    return [
        case(f"encode-{label}", encode, fresh, "<= 1.5x one fresh copy, bytes(view) (ratio <= 1.5)",
             goal_max_ratio=1.5),
        case(f"encode-into-preallocated-{label}", into, copyto, "<= 1.5x numpy.copyto, a bare memcpy (ratio <= 1.5)",
             goal_max_ratio=1.5),
        case(f"encode-parts-{label}", parts, fresh, "informative: no copy, against one fresh copy"),
        case(f"stream-reader-{label}-64KiB-chunks", streamed, fresh2, "informative: one copy in 64 KiB chunks, "
             "against one fresh copy"),
        case(f"layer-digests-{label}", digests, sha, "<= 1.1x one SHA-256 pass (ratio <= 1.1)", goal_max_ratio=1.1),
    ]


def run(quick: bool = False) -> dict[str, object]:
    """Run every case; ``quick`` uses smaller containers and fewer repetitions (for CI smoke runs)."""
    reps = 3 if quick else 9
    sizes = [1 * MiB, 4 * MiB, 8 * MiB] if quick else [1 * MiB, 16 * MiB, 64 * MiB]
    cases = _decode_cases(sizes, reps) + _copy_cases(sizes[-1], reps)
    return {"name": "container", "cases": cases}


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv[1:]), indent=2))
