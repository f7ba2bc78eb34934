"""Client verification cost: Repr-Digest + layer digests + replica digest vs one SHA-256 pass.

Section 6.7 makes a client hash every received octet twice (the container for Repr-Digest, each layer
for its layer digest).  The client overlaps the two on two cores (kvsp.client.verify), so the goal is
a wall time within 1.1x of a single hashlib.sha256 pass over the same octets.

Cases, for a 2 MiB block of 32 layers and a 64 MiB block of 32 layers:

* ``verify_*``: the complete-buffer check (`verify_block_bytes`) vs one sha256 pass.  Goal <= 1.1.
* ``stream_*``: what `HolderClient` runs per body chunk (64 KiB chunks through `BlockVerifier`: parse,
  copy into the receive buffer, verify) vs the same receive without verification plus one sha256 pass,
  so the copy into the receive buffer is in both.  Goal <= 1.1.
* ``*_sequential``: the same with both hashes on one thread (no overlap): the "before" figure.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from benchmarks.timing import Sample, case, measure
from kvsp.client.verify import BlockCheck, BlockVerifier, verify_block_bytes
from kvsp.container import decode_container, encode_container, replica_digest
from kvsp.container_stream import ContainerReader
from kvsp.records import ReplicaRecord, Residency
from kvsp.registry import Tier

CHUNK = 64 << 10
GOAL = "wall time <= 1.1x one sha256 pass (ratio <= 1.1)"


def make_block(total: int, layers: int = 32) -> tuple[bytes, ReplicaRecord]:
    section = total // layers // 2
    rng = os.urandom(section * 2 * layers)
    parts = [(rng[2 * i * section : (2 * i + 1) * section], rng[(2 * i + 1) * section : (2 * i + 2) * section])
             for i in range(layers)]
    data = encode_container(1, 0, 16, parts)
    digests = decode_container(data).layer_digests()
    record = ReplicaRecord(bytes(32), bytes(32), bytes(16), "https://h.example/", 1, len(data),
                           replica_digest(digests), (Residency(Tier.HOST, (0, layers - 1)),), 60_000, digests)
    return data, record


def _stream(data: bytes, check: BlockCheck, repr_digest: bytes, pool: ThreadPoolExecutor | None) -> None:
    verifier = BlockVerifier(check, repr_digest, executor=pool)
    view = memoryview(data)
    for pos in range(0, len(data), CHUNK):
        verifier.feed(view[pos : pos + CHUNK])
    block = verifier.verify_sync()
    if not block.replica_verified:
        raise AssertionError("the benchmark must exercise every check")


def _receive_only(data: bytes) -> None:
    reader = ContainerReader()
    view = memoryview(data)
    for pos in range(0, len(data), CHUNK):
        reader.feed(view[pos : pos + CHUNK])
    reader.close()


def _cases(label: str, data: bytes, record: ReplicaRecord, pool: ThreadPoolExecutor,
           reps: int) -> list[dict[str, object]]:
    check = BlockCheck.for_replica(record)
    sha = hashlib.sha256(data).digest()

    def timed(fn: Callable[[], object]) -> Sample:
        return measure(fn, reps=reps, warmup=2)

    one_pass = timed(lambda: hashlib.sha256(data).digest())
    def receive_and_hash() -> None:
        _receive_only(data)
        hashlib.sha256(data).digest()

    receive_and_pass = timed(receive_and_hash)
    rows = [
        case(f"verify_{label}", timed(lambda: verify_block_bytes(data, sha, check, executor=pool)), one_pass, GOAL,
             goal_max_ratio=1.1),
        case(f"verify_{label}_sequential", timed(lambda: verify_block_bytes(data, sha, check)), one_pass,
             "informative: before overlapping (expect ~2)"),
        case(f"stream_{label}", timed(lambda: _stream(data, check, sha, pool)), receive_and_pass, GOAL,
             goal_max_ratio=1.1),
        case(f"stream_{label}_sequential", timed(lambda: _stream(data, check, sha, None)), receive_and_pass,
             "informative: before overlapping"),
    ]
    return rows


def run(quick: bool = False) -> dict[str, object]:
    sizes = [("2MiB_32layers", 2 << 20), ("64MiB_32layers", 64 << 20)]
    cases: list[dict[str, object]] = []
    with ThreadPoolExecutor(2, thread_name_prefix="bench-digest") as pool:
        for label, size in sizes:
            data, record = make_block(size)
            reps = (15 if size <= 4 << 20 else 5) if quick else (51 if size <= 4 << 20 else 11)
            cases += _cases(label, data, record, pool, reps)
    return {"name": "client", "params": {"chunk": CHUNK, "layers": 32, "cores": os.cpu_count()}, "cases": cases}


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
