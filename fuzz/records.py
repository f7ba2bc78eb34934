"""What the record harnesses (``fuzz_records_*``) share: the parse-or-refuse contract and the spec examples.

Input of every record harness: one octet choosing the parser, then JSON text (any encoding that
``json.detect_encoding`` reads).  Contract (kvsp/records/__init__.py): parsing returns a record or
raises ``ValidationError``, nothing else; a parsed record is writable (``to_bytes`` never raises, since
the parser refused what JCS cannot write), parses back to an equal record and writes the same octets
again (canonical JSON is a fixed point); and the record's own queries work on it without raising.

The seeds are the spec's examples (section 4.4 and 6.x) with the Appendix A values filled in.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fuzz.common import check
from kvsp.errors import ValidationError
from kvsp.identifiers import TrackNamespace, role_id

R = TypeVar("R")

# Appendix A (spec), verbatim.
COMPAT = "5ed5c2f238839655d7c4029e12b7f31caf9e7421f4edb4057feee6dab760ee0f"
SCOPE = "6d1c6481cd428737da312c089db3832a"
K0 = "9ca9d8b60f37f84726a27deb4cdc0d075714607a131632c2366e30b99fb1163b"
K1 = "653275884ca44f8945fd4c902611c467394b73656e64c78d8522648cb75aefc1"
LAYER_DIGESTS = [hashlib.sha256(f"layer {i}".encode()).hexdigest() for i in range(4)]
DIGEST = "sha-256:" + hashlib.sha256(b"".join(bytes.fromhex(d) for d in LAYER_DIGESTS)).hexdigest()
H1 = "https://h1.example/kvsp/"
II7, II9 = "https://ii7.example/kvsp/", "https://ii9.example/kvsp/"
UUID = "6f1d0a9e-2c55-4d7e-9a0e-5b7f2f9f6a11"
DIRECTIVE = "a2b7c9e0-1f3d-4c1a-8f5b-6d2e9a7c3b10"
RELAY = "moqt://relay.example:4443/kvsp"


def replica(key: str = K0, holder: str = H1, namespace: str | None = None) -> dict[str, object]:
    out: dict[str, object] = {
        "block_key": key, "compat_id": COMPAT, "scope_id": SCOPE, "holder": holder, "codec": 1, "size": 2097152,
        "digest": DIGEST, "layer_digests": LAYER_DIGESTS,
        "residency": [{"tier": "device", "layers": [0, 1]},
                      {"tier": "host", "layers": [2, 3], "read_mbit_per_s": 400000}],
        "ttl_ms": 600000,
    }
    if namespace is not None:
        out["moqt_namespace"] = namespace
    return out


def moqt_replica() -> dict[str, object]:
    """A replica served over MOQT: its namespace names the producer (spec section 4.4, decision D3)."""
    namespace = TrackNamespace(bytes.fromhex(COMPAT), bytes.fromhex(SCOPE), role_id(H1), bytes.fromhex(K0))
    return replica(holder=RELAY, namespace=namespace.encode())


STATUS: dict[str, object] = {
    "instance": II7, "epoch": 12, "state": "active", "running": 18, "queued": 3, "batch_size": 32,
    "kv_utilization": 0.71, "prefill_tokens_per_s": 42000, "decode_tokens_per_s": 3100,
    "links": [{"holder": H1, "mbit_per_s": 200000, "rtt_us": 12}], "requested_state": None, "ttl_ms": 3000,
}
SAMPLER: dict[str, object] = {"method": "top-p", "params": {"p": 0.9}, "seed": 7, "step": 3, "deterministic": False}
CHECKPOINT: dict[str, object] = {
    "session": UUID, "epoch": 1, "compat_id": COMPAT, "scope_id": SCOPE, "prompt_blocks": [K0, K1],
    "prompt_tail": [374, 264], "generated": [1296, 315, 279], "output_offset": 3, "sampler": SAMPLER,
}
LOOKUP: dict[str, object] = {"scope_id": SCOPE, "compat_id": COMPAT, "block_keys": [K0, K1, "77" * 32],
                             "targets": [II7, II9]}
LOOKUP_RESPONSE: dict[str, object] = {
    "matched": 2, "replicas": [[replica(K0)], [replica(K1)]],
    "targets": [{"instance": II7, "fetch_us": 850.5, "recompute_us": 12000}],
}
PREFETCH: dict[str, object] = {
    "directive": DIRECTIVE, "request_ref": "opaque-value-from-PC", "scope_id": SCOPE, "compat_id": COMPAT,
    "blocks": [{"block_key": K0, "sources": [H1]}], "layer_order": "ascending", "deadline_ms": 50, "lease_ms": 2000,
}
PREFETCH_STATUS: dict[str, object] = {"directive": DIRECTIVE, "state": "partial", "loaded": [K0]}
SHARD_MAP: dict[str, object] = {
    "map": "c3f8...e1", "version": 4,
    "shards": [{"tokens": [0, 32768], "instance": "https://ii1.example/kvsp/"},
               {"tokens": [32768, 65536], "instance": "https://ii2.example/kvsp/"},
               {"tokens": [65536, 98304], "instance": "https://ii3.example/kvsp/"}],
}
PLAN: dict[str, object] = {
    "map": "c3f8...e1", "from": 4, "to": 5, "deadline_ms": 200, "retain": [[0, 32768]],
    "fetch": [{"tokens": [32768, 49152], "from": "https://ii2.example/kvsp/"}], "release": [],
}
LEASE_REQUEST: dict[str, object] = {"block_keys": [K0, K1], "ttl_ms": 2000}
LEASE: dict[str, object] = {"lease": "l-8f3a_2", "block_keys": [K0, K1], "ttl_ms": 1500}


def text(value: object) -> bytes:
    return json.dumps(value).encode()


def nothing(record: object) -> None:
    """The default use of a record: none beyond the round trip."""


@dataclass(frozen=True, slots=True)
class Parser(Generic[R]):
    """One record parser with its writer and the queries to run on what it accepts."""

    name: str
    parse: Callable[[bytes], R]
    write: Callable[[R], bytes]
    use: Callable[[R], None] = nothing

    def run(self, data: bytes) -> None:
        try:
            record = self.parse(data)
        except ValidationError:
            return
        out = self.write(record)
        again = self.parse(out)
        check(again == record, f"{self.name}: the written record parses to a different one")
        check(self.write(again) == out, f"{self.name}: canonical JSON is not a fixed point")
        self.use(record)


def record_input(data: bytes, parsers: Sequence[Parser[Any]]) -> None:
    """The body of every record harness's ``test_one_input``."""
    if not data:
        return
    parsers[data[0] % len(parsers)].run(data[1:])


def record_seeds(parsers: Sequence[Parser[Any]], examples: dict[str, Sequence[object]]) -> list[bytes]:
    """Each example, JSON-encoded, behind the octet that selects its parser."""
    index = {p.name: i for i, p in enumerate(parsers)}
    return [bytes([index[name]]) + (v if isinstance(v, bytes) else text(v))
            for name, values in examples.items() for v in values]
