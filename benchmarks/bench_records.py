"""Throughput of the record codecs on the Index Service's hot path (publish and lookup).

Run: ``python -m benchmarks.bench_records [--quick]``; prints JSON.
"""

from __future__ import annotations

import hashlib
import json
import sys

from benchmarks.timing import case, paired
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


def run(quick: bool = False) -> dict[str, object]:
    """Each codec operation against the bare ``json`` call on the same document (informative)."""
    value = replica_json(0)
    text = json.dumps(value).encode()
    record = ReplicaRecord.from_json(value)
    groups = [[replica_json(i)] for i in range(64)]
    response = {"matched": 64, "replicas": groups}
    reps, inner = (5, 50) if quick else (9, 300)

    def each_record() -> object:
        return [[ReplicaRecord.from_json(r) for r in group] for group in groups]

    pairs = [
        ("ReplicaRecord.from_bytes", lambda: ReplicaRecord.from_bytes(text), lambda: json.loads(text),
         "informative: parse and validate, against json.loads of the same octets"),
        ("ReplicaRecord.to_bytes", record.to_bytes, lambda: json.dumps(value).encode(),
         "informative: against json.dumps of the same document"),
        ("LookupResponse.from_json-64keys", lambda: LookupResponse.from_json(response), each_record,
         "informative: against ReplicaRecord.from_json of each of the 64 records"),
    ]
    cases = []
    for name, ours, bare, goal in pairs:
        sample, base = paired(ours, bare, reps=reps, inner=inner if "64keys" not in name else max(1, inner // 50))
        row = case(name, sample, base, goal)
        row["us_per_op"] = round(sample.median_s * 1e6, 2)
        cases.append(row)
    return {"name": "records", "params": {"layers": LAYERS, "record_octets": len(text)}, "cases": cases}


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv[1:]), indent=2))
