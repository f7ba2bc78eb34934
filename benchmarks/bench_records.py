"""Throughput of the record codecs on the Index Service's hot path (publish and lookup).

Run: PYTHONPATH=. python3 benchmarks/bench_records.py
"""

from __future__ import annotations

import hashlib
import json
import timeit

from kvsp.records import LookupResponse, ReplicaRecord, digest_of_layers

LAYERS = 32


def replica_json(i: int) -> dict[str, object]:
    layer_digests = tuple(hashlib.sha256(f"{i}:{layer}".encode()).digest() for layer in range(LAYERS))
    return {
        "block_key": hashlib.sha256(f"key {i}".encode()).hexdigest(), "compat_id": "ab" * 32,
        "scope_id": "cd" * 16, "holder": "https://h1.example/kvsp/", "codec": 1, "size": 2097152,
        "digest": "sha-256:" + digest_of_layers(layer_digests).hex(),
        "layer_digests": [d.hex() for d in layer_digests],
        "residency": [{"tier": "device", "layers": [0, 15]},
                      {"tier": "host", "layers": [16, 31], "read_mbit_per_s": 400000}],
        "ttl_ms": 600000,
    }


def main() -> None:
    value = replica_json(0)
    text = json.dumps(value).encode()
    record = ReplicaRecord.from_json(value)
    response = {"matched": 64, "replicas": [[replica_json(i)] for i in range(64)]}
    cases = {
        "ReplicaRecord.from_bytes": lambda: ReplicaRecord.from_bytes(text),
        "ReplicaRecord.from_json": lambda: ReplicaRecord.from_json(value),
        "ReplicaRecord.to_bytes": record.to_bytes,
        "LookupResponse.from_json (64 keys)": lambda: LookupResponse.from_json(response),
    }
    for name, fn in cases.items():
        runs, total = timeit.Timer(fn).autorange()
        print(f"{name:40s} {1e6 * total / runs:9.1f} us/op")


if __name__ == "__main__":
    main()
