"""KVSP records (spec sections 4.4 and 6): spec examples, one case per validation rule, JCS output,
Hypothesis round trips, and a fuzz check that bad input only ever raises `ValidationError`."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable

import pytest
import rfc8785

from kvsp.errors import ValidationError
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.records import (
    InstanceStatus,
    JsonRecord,
    Lease,
    LeaseRenewal,
    LeaseRequest,
    Link,
    LookupRequest,
    LookupResponse,
    PrefetchDirective,
    PrefetchState,
    PrefetchStatus,
    ReplicaRecord,
    ReshardPlan,
    Residency,
    SessionCheckpoint,
    ShardFetch,
    ShardMap,
    StateChange,
    TargetEstimate,
    digest_of_layers,
    parse_reshard_message,
)
from kvsp.registry import InstanceState, Tier
from tests.support.vectors import APPENDIX_A_COMPAT_ID, APPENDIX_A_K0, APPENDIX_A_K1, APPENDIX_A_SCOPE_ID

# Placeholders of the spec examples are filled with the Appendix A values.
COMPAT, SCOPE, K0, K1 = APPENDIX_A_COMPAT_ID, APPENDIX_A_SCOPE_ID, APPENDIX_A_K0, APPENDIX_A_K1
LAYER_DIGESTS = [hashlib.sha256(f"layer {i}".encode()).hexdigest() for i in range(32)]
DIGEST = "sha-256:" + digest_of_layers(tuple(bytes.fromhex(d) for d in LAYER_DIGESTS)).hex()
H1, II7, II9 = "https://h1.example/kvsp/", "https://ii7.example/kvsp/", "https://ii9.example/kvsp/"
UUID = "6f1d0a9e-2c55-4d7e-9a0e-5b7f2f9f6a11"
DIRECTIVE = "a2b7c9e0-1f3d-4c1a-8f5b-6d2e9a7c3b10"
RELAY = "moqt://relay.example:4443/kvsp"


# -- spec examples (section 4.4 and 6.x), as JSON text ------------------------------------------
def replica_text(key: str = K0) -> str:
    return f"""{{
  "block_key": "{key}", "compat_id": "{COMPAT}", "scope_id": "{SCOPE}",
  "holder": "https://h1.example/kvsp/", "codec": 1, "size": 2097152, "digest": "{DIGEST}",
  "layer_digests": {json.dumps(LAYER_DIGESTS)},
  "residency": [
    {{ "tier": "device", "layers": [0, 15] }},
    {{ "tier": "host", "layers": [16, 31], "read_mbit_per_s": 400000 }}
  ],
  "ttl_ms": 600000
}}"""


STATUS_TEXT = """{
  "instance": "https://ii7.example/kvsp/", "epoch": 12, "state": "active", "running": 18, "queued": 3,
  "batch_size": 32, "kv_utilization": 0.71, "prefill_tokens_per_s": 42000, "decode_tokens_per_s": 3100,
  "links": [{ "holder": "https://h1.example/kvsp/", "mbit_per_s": 200000, "rtt_us": 12 }],
  "requested_state": null, "ttl_ms": 3000
}"""
CHECKPOINT_TEXT = f"""{{
  "session": "{UUID}", "epoch": 1, "compat_id": "{COMPAT}", "scope_id": "{SCOPE}",
  "prompt_blocks": ["{K0}", "{K1}"], "prompt_tail": [374, 264], "generated": [1296, 315, 279],
  "output_offset": 3,
  "sampler": {{ "method": "top-p", "params": {{ "p": 0.9 }}, "seed": 7, "step": 3, "deterministic": false }}
}}"""
LOOKUP_TEXT = f"""{{
  "scope_id": "{SCOPE}", "compat_id": "{COMPAT}",
  "block_keys": ["{K0}", "{K1}", "{"77" * 32}"],
  "targets": ["https://ii7.example/kvsp/", "https://ii9.example/kvsp/"]
}}"""
LOOKUP_RESPONSE_TEXT = (f'{{"matched": 2, "replicas": [[{replica_text(K0)}], [{replica_text(K1)}]], '
                        f'"targets": [{{"instance": "{II7}", "fetch_us": 850.5, "recompute_us": 12000}}]}}')
PREFETCH_TEXT = f"""{{
  "directive": "{DIRECTIVE}", "request_ref": "opaque-value-from-PC", "scope_id": "{SCOPE}",
  "compat_id": "{COMPAT}", "blocks": [{{ "block_key": "{K0}", "sources": ["https://h1.example/kvsp/"] }}],
  "layer_order": "ascending", "deadline_ms": 50, "lease_ms": 2000
}}"""
PREFETCH_STATUS_TEXT = f'{{"directive": "{DIRECTIVE}", "state": "partial", "loaded": ["{K0}"]}}'
SHARD_MAP_TEXT = """{
  "map": "c3f8...e1", "version": 4,
  "shards": [
    { "tokens": [0, 32768], "instance": "https://ii1.example/kvsp/" },
    { "tokens": [32768, 65536], "instance": "https://ii2.example/kvsp/" },
    { "tokens": [65536, 98304], "instance": "https://ii3.example/kvsp/" }
  ]
}"""
PLAN_TEXT = """{
  "map": "c3f8...e1", "from": 4, "to": 5, "deadline_ms": 200, "retain": [[0, 32768]],
  "fetch": [{ "tokens": [32768, 49152], "from": "https://ii2.example/kvsp/" }], "release": []
}"""
LEASE_REQUEST_TEXT = f'{{"block_keys": ["{K0}", "{K1}"], "ttl_ms": 2000}}'
LEASE_TEXT = f'{{"lease": "l-8f3a_2", "block_keys": ["{K0}", "{K1}"], "ttl_ms": 1500}}'

Parser = Callable[[object], JsonRecord]
EXAMPLES: dict[str, tuple[Parser, str]] = {
    "replica": (ReplicaRecord.from_json, replica_text()),
    "status": (InstanceStatus.from_json, STATUS_TEXT),
    "checkpoint": (SessionCheckpoint.from_json, CHECKPOINT_TEXT),
    "lookup": (LookupRequest.from_json, LOOKUP_TEXT),
    "lookup_response": (LookupResponse.from_json, LOOKUP_RESPONSE_TEXT),
    "lease_request": (LeaseRequest.from_json, LEASE_REQUEST_TEXT),
    "lease_renewal": (LeaseRenewal.from_json, '{"ttl_ms": 2000}'),
    "lease": (Lease.from_json, LEASE_TEXT),
    "prefetch": (PrefetchDirective.from_json, PREFETCH_TEXT),
    "prefetch_status": (PrefetchStatus.from_json, PREFETCH_STATUS_TEXT),
    "shard_map": (ShardMap.from_json, SHARD_MAP_TEXT),
    "reshard": (parse_reshard_message, PLAN_TEXT),
    "commit": (parse_reshard_message, '{"map": "c3f8...e1", "commit": 5}'),
    "abort": (parse_reshard_message, '{"map": "c3f8...e1", "abort": 5}'),
    "state": (StateChange.from_json, '{"state": "draining"}'),
}


def doc(name: str) -> dict[str, object]:
    value: dict[str, object] = json.loads(EXAMPLES[name][1])
    return value


@pytest.mark.parametrize("name", EXAMPLES)
def test_spec_example_parses_and_round_trips(name: str) -> None:
    parse, text = EXAMPLES[name]
    record = parse(json.loads(text))
    assert parse(json.loads(record.to_bytes())) == record
    assert type(record).from_bytes(record.to_bytes()) == record
    assert record.to_json() == json.loads(text) or name in {"lookup_response", "replica", "status"}


def test_replica_example_values() -> None:
    r = ReplicaRecord.from_bytes(replica_text().encode())
    assert r.block_key.hex() == K0 and r.scope_id.hex() == SCOPE and len(r.layer_digests) == 32
    assert r.residency[1] == Residency(Tier.HOST, (16, 31), 400000.0)
    assert r.layers_held() == ((0, 31),) and r.holds(0, 31) and not r.holds(0, 32)
    assert r.tier_of(15) is Tier.DEVICE and r.tier_of(16) is Tier.HOST and r.tier_of(32) is None
    assert r.verify_digest_chain() and r.to_json() == json.loads(replica_text())


def test_status_checkpoint_and_plan_example_values() -> None:
    s = InstanceStatus.from_bytes(STATUS_TEXT)
    assert s.is_active and s.requested_state is None and s.link_to(H1) == Link(H1, 200000.0, 12)
    assert s.link_to(II9) is None
    c = SessionCheckpoint.from_bytes(CHECKPOINT_TEXT)
    assert c.sampler.param("p") == 0.9 and c.generated == (1296, 315, 279) and c.output_offset == 3
    plan = parse_reshard_message(json.loads(PLAN_TEXT))
    assert plan == ReshardPlan("c3f8...e1", 4, 5, 200, ((0, 32768),),
                               (ShardFetch((32768, 49152), "https://ii2.example/kvsp/"),), ())
    assert ShardMap.from_bytes(SHARD_MAP_TEXT).owner_of(32768) == "https://ii2.example/kvsp/"


def test_lookup_response_matches_request() -> None:
    response = LookupResponse.from_bytes(LOOKUP_RESPONSE_TEXT)
    assert response.matched == 2 and response.targets == (TargetEstimate(II7, 850.5, 12000.0),)
    response.check_request(LookupRequest.from_bytes(LOOKUP_TEXT))


def test_prefetch_defaults_and_status_check() -> None:
    value = doc("prefetch")
    del value["layer_order"], value["request_ref"]
    directive = PrefetchDirective.from_json(value)
    assert directive.layer_order == "ascending" and directive.request_ref is None
    PrefetchStatus.from_bytes(PREFETCH_STATUS_TEXT).check_directive(directive)
    done = PrefetchStatus(DIRECTIVE, PrefetchState.COMPLETE, (bytes.fromhex(K0),))
    done.check_directive(directive)


# -- one case per rule: bad input -> ValidationError naming the member ------------------------
DELETE = object()
_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def edit(value: dict[str, object], path: str, new: object) -> object:
    """Set, append or delete the member at ``path`` (``a.b[1].c``); "$" replaces the whole document."""
    if path == "$":
        return new
    keys: list[str | int] = [m[0] if m[0] else int(m[1]) for m in _TOKEN.findall(path)]
    target: object = value
    for key in keys[:-1]:
        target = target[key]  # type: ignore[index]
    if new is DELETE:
        del target[keys[-1]]  # type: ignore[attr-defined]
    elif isinstance(target, list) and keys[-1] == len(target):
        target.append(new)  # one past the end appends
    else:
        target[keys[-1]] = new  # type: ignore[index]
    return value


NS_OTHER_KEY = TrackNamespace(bytes.fromhex(COMPAT), bytes.fromhex(SCOPE), role_id(H1), bytes(32)).encode()
NS_K0 = TrackNamespace(bytes.fromhex(COMPAT), bytes.fromhex(SCOPE), role_id(H1), bytes.fromhex(K0)).encode()

BAD: list[tuple[str, dict[str, object], str]] = [
    # (example, {path: new value}, member named by the error)
    ("replica", {"$": [1]}, "$"),
    ("replica", {"block_key": DELETE}, "block_key"),
    ("replica", {"block_key": K0.upper()}, "block_key"),
    ("replica", {"block_key": K0[:-2]}, "block_key"),
    ("replica", {"compat_id": 5}, "compat_id"),
    ("replica", {"scope_id": K0}, "scope_id"),
    ("replica", {"holder": "http://h1.example/kvsp/"}, "holder"),
    ("replica", {"holder": "https://h1.example/kvsp/#x"}, "holder"),
    ("replica", {"holder": "https://h\u00e9.example/"}, "holder"),
    ("replica", {"holder": "https://h1.example/a b"}, "holder"),
    ("replica", {"codec": 0}, "codec"),
    ("replica", {"codec": 65536}, "codec"),
    ("replica", {"codec": True}, "codec"),
    ("replica", {"size": -1}, "size"),
    ("replica", {"size": 2**53}, "size"),
    ("replica", {"size": 1.5}, "size"),
    ("replica", {"digest": K0}, "digest"),
    ("replica", {"digest": "sha-256:" + "00" * 32}, "digest"),
    ("replica", {"layer_digests": []}, "layer_digests"),
    ("replica", {"layer_digests": "x"}, "layer_digests"),
    ("replica", {"layer_digests[3]": "sha-256:" + K0}, "layer_digests[3]"),
    ("replica", {"layer_digests[5]": LAYER_DIGESTS[5].upper()}, "layer_digests[5]"),
    ("replica", {"layer_digests[6]": None}, "layer_digests[6]"),
    ("replica", {"residency": DELETE}, "residency"),
    ("replica", {"residency": []}, "residency"),
    ("replica", {"residency[0]": "device"}, "residency[0]"),
    ("replica", {"residency[0].tier": "gpu"}, "residency[0].tier"),
    ("replica", {"residency[0].layers": [15, 0]}, "residency[0].layers"),
    ("replica", {"residency[0].layers": [0]}, "residency[0].layers"),
    ("replica", {"residency[0].layers": [-1, 15]}, "residency[0].layers[0]"),
    ("replica", {"residency[1].layers": [15, 31]}, "residency[1].layers"),
    ("replica", {"residency[1].layers": [16, 32]}, "residency[1].layers"),
    ("replica", {"residency[1].read_mbit_per_s": 0}, "residency[1].read_mbit_per_s"),
    ("replica", {"residency[1].read_mbit_per_s": "fast"}, "residency[1].read_mbit_per_s"),
    ("replica", {"residency[1].read_mbit_per_s": float("inf")}, "residency[1].read_mbit_per_s"),
    ("replica", {"residency[1].read_mbit_per_s": 10**400}, "residency[1].read_mbit_per_s"),
    ("replica", {"ttl_ms": 0}, "ttl_ms"),
    ("replica", {"holder": RELAY}, "moqt_namespace"),
    ("replica", {"moqt_namespace": NS_K0}, "moqt_namespace"),
    ("replica", {"holder": RELAY, "moqt_namespace": NS_OTHER_KEY}, "moqt_namespace"),
    ("replica", {"holder": RELAY, "moqt_namespace": "AAAA"}, "moqt_namespace"),
    ("status", {"instance": RELAY}, "instance"),
    ("status", {"epoch": -1}, "epoch"),
    ("status", {"state": "sleepy"}, "state"),
    ("status", {"running": "3"}, "running"),
    ("status", {"queued": -1}, "queued"),
    ("status", {"batch_size": 1.5}, "batch_size"),
    ("status", {"kv_utilization": 1.01}, "kv_utilization"),
    ("status", {"kv_utilization": -0.1}, "kv_utilization"),
    ("status", {"prefill_tokens_per_s": -1}, "prefill_tokens_per_s"),
    ("status", {"decode_tokens_per_s": None}, "decode_tokens_per_s"),
    ("status", {"links": {}}, "links"),
    ("status", {"links[0].holder": "ftp://h1.example/"}, "links[0].holder"),
    ("status", {"links[0].mbit_per_s": 0}, "links[0].mbit_per_s"),
    ("status", {"links[0].rtt_us": 1.5}, "links[0].rtt_us"),
    ("status", {"links[1]": {"holder": H1, "mbit_per_s": 1, "rtt_us": 1}}, "links[1]"),
    ("status", {"requested_state": "asleep"}, "requested_state"),
    ("status", {"ttl_ms": -5}, "ttl_ms"),
    ("checkpoint", {"session": UUID.upper()}, "session"),
    ("checkpoint", {"session": "6f1d0a9e2c554d7e9a0e5b7f2f9f6a11"}, "session"),
    ("checkpoint", {"session": "not-a-uuid"}, "session"),
    ("checkpoint", {"epoch": "1"}, "epoch"),
    ("checkpoint", {"compat_id": SCOPE}, "compat_id"),
    ("checkpoint", {"scope_id": COMPAT}, "scope_id"),
    ("checkpoint", {"prompt_blocks[1]": "zz"}, "prompt_blocks[1]"),
    ("checkpoint", {"prompt_tail[0]": 2**32}, "prompt_tail[0]"),
    ("checkpoint", {"generated[2]": -1}, "generated[2]"),
    ("checkpoint", {"output_offset": 2}, "output_offset"),
    ("checkpoint", {"output_offset": 4}, "output_offset"),
    ("checkpoint", {"sampler": DELETE}, "sampler"),
    ("checkpoint", {"sampler.method": ""}, "sampler.method"),
    ("checkpoint", {"sampler.method": "\ud800"}, "sampler.method"),
    ("checkpoint", {"sampler.params": [0.9]}, "sampler.params"),
    ("checkpoint", {"sampler.params.p": [0.9]}, "sampler.params.p"),
    ("checkpoint", {"sampler.params.p": float("nan")}, "sampler.params.p"),
    ("checkpoint", {"sampler.params.p": 10**400}, "sampler.params.p"),
    ("checkpoint", {"sampler.seed": -1}, "sampler.seed"),
    ("checkpoint", {"sampler.step": "3"}, "sampler.step"),
    ("checkpoint", {"sampler.deterministic": 0}, "sampler.deterministic"),
    ("lookup", {"block_keys": []}, "block_keys"),
    ("lookup", {"block_keys[2]": 7}, "block_keys[2]"),
    ("lookup", {"block_keys[1]": "g" * 64}, "block_keys[1]"),
    ("lookup", {"targets": []}, "targets"),
    ("lookup", {"targets[1]": "http://ii9.example/"}, "targets[1]"),
    ("lookup", {"targets[1]": II7}, "targets[1]"),
    ("lookup_response", {"matched": 3}, "replicas"),
    ("lookup_response", {"matched": -1}, "matched"),
    ("lookup_response", {"replicas[1]": []}, "replicas[1]"),
    ("lookup_response", {"replicas[1]": {}}, "replicas[1]"),
    ("lookup_response", {"replicas[1][0].codec": 0}, "replicas[1][0].codec"),
    ("lookup_response", {"replicas[0][1]": json.loads(replica_text(K1))}, "replicas[0][1].block_key"),
    ("lookup_response", {"replicas[1][0].scope_id": "00" * 16}, "replicas[1][0].scope_id"),
    ("lookup_response", {"targets[0].fetch_us": -1}, "targets[0].fetch_us"),
    ("lookup_response", {"targets[0].instance": RELAY}, "targets[0].instance"),
    ("lookup_response", {"targets[1]": {"instance": II7, "fetch_us": 1, "recompute_us": 1}}, "targets[1]"),
    ("lease_request", {"block_keys": []}, "block_keys"),
    ("lease_request", {"block_keys[1]": K0}, "block_keys[1]"),
    ("lease_request", {"ttl_ms": 0}, "ttl_ms"),
    ("lease_renewal", {"ttl_ms": "2000"}, "ttl_ms"),
    ("lease", {"lease": "a/b"}, "lease"),
    ("lease", {"lease": ""}, "lease"),
    ("lease", {"lease": "x" * 129}, "lease"),
    ("lease", {"ttl_ms": DELETE}, "ttl_ms"),
    ("prefetch", {"directive": "a2b7c9e0"}, "directive"),
    ("prefetch", {"request_ref": ""}, "request_ref"),
    ("prefetch", {"request_ref": 5}, "request_ref"),
    ("prefetch", {"blocks": []}, "blocks"),
    ("prefetch", {"blocks[0].sources": []}, "blocks[0].sources"),
    ("prefetch", {"blocks[0].sources[0]": "http://h1.example/"}, "blocks[0].sources[0]"),
    ("prefetch", {"blocks[0].sources": [H1, H1]}, "blocks[0].sources[1]"),
    ("prefetch", {"blocks[1]": {"block_key": K0, "sources": [H1]}}, "blocks[1]"),
    ("prefetch", {"layer_order": "descending"}, "layer_order"),
    ("prefetch", {"deadline_ms": 0}, "deadline_ms"),
    ("prefetch", {"lease_ms": -1}, "lease_ms"),
    ("prefetch_status", {"state": "done"}, "state"),
    ("prefetch_status", {"loaded[0]": K0[:10]}, "loaded[0]"),
    ("prefetch_status", {"loaded[1]": K0}, "loaded[1]"),
    ("prefetch_status", {"directive": DELETE}, "directive"),
    ("shard_map", {"map": ""}, "map"),
    ("shard_map", {"version": -1}, "version"),
    ("shard_map", {"shards": []}, "shards"),
    ("shard_map", {"shards[0].tokens": [0, 0]}, "shards[0].tokens"),
    ("shard_map", {"shards[0].tokens": [0, 1, 2]}, "shards[0].tokens"),
    ("shard_map", {"shards[1].tokens": [32769, 65536]}, "shards[1].tokens"),
    ("shard_map", {"shards[1].tokens": [32000, 65536]}, "shards[1].tokens"),
    ("shard_map", {"shards[2].instance": RELAY}, "shards[2].instance"),
    ("reshard", {"to": 6}, "to"),
    ("reshard", {"from": -1}, "from"),
    ("reshard", {"deadline_ms": 0}, "deadline_ms"),
    ("reshard", {"retain[0]": [5, 5]}, "retain[0]"),
    ("reshard", {"fetch[0].from": DELETE}, "fetch[0].from"),
    ("reshard", {"fetch[0].tokens": [32000, 49152]}, "fetch[0].tokens"),
    ("reshard", {"release": [[100, 200]]}, "release[0]"),
    ("reshard", {"release": DELETE}, "release"),
    ("reshard", {"commit": 5}, "$"),
    ("commit", {"commit": 0}, "commit"),
    ("commit", {"abort": 5}, "$"),
    ("abort", {"abort": "5"}, "abort"),
    ("abort", {"map": None}, "map"),
    ("state", {"state": "sleepy"}, "state"),
    ("state", {"state": DELETE}, "state"),
]


@pytest.mark.parametrize(("name", "changes", "member"), BAD, ids=[f"{n}:{m}" for n, _, m in BAD])
def test_rule_violation_names_member(name: str, changes: dict[str, object], member: str) -> None:
    value: object = doc(name)
    for path, new in changes.items():
        value = edit(value, path, new)  # type: ignore[arg-type]
    with pytest.raises(ValidationError) as info:
        EXAMPLES[name][0](value)
    assert info.value.member == member, info.value


@pytest.mark.parametrize(("parse", "value", "member"), [
    (lambda v: LookupRequest.from_json(v, max_keys=2), doc("lookup"), "block_keys"),
    (lambda v: LeaseRequest.from_json(v, max_keys=1), doc("lease_request"), "block_keys"),
    (lambda v: PrefetchDirective.from_json(v, max_keys=0), doc("prefetch"), "blocks"),
    (lambda v: LookupResponse.from_json(v, max_keys=1), doc("lookup_response"), "matched"),
])
def test_max_keys_quota(parse: Parser, value: object, member: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse(value)
    assert info.value.member == member


def test_moqt_holder_with_matching_namespace_is_accepted() -> None:
    value = edit(edit(doc("replica"), "holder", RELAY), "moqt_namespace", NS_K0)  # type: ignore[arg-type]
    record = ReplicaRecord.from_json(value)
    assert record.moqt_namespace == TrackNamespace.decode(NS_K0)
    assert record.to_json()["moqt_namespace"] == NS_K0


def test_lookup_response_check_request_rules() -> None:
    request = LookupRequest.from_bytes(LOOKUP_TEXT)
    response = LookupResponse.from_bytes(LOOKUP_RESPONSE_TEXT)
    swapped = LookupResponse((response.replicas[1], response.replicas[0]))
    cases = [
        (swapped, request, "replicas[0][0].block_key"),
        (response, LookupRequest(request.scope_id, request.compat_id, request.block_keys[:1]), "matched"),
        (response, LookupRequest(bytes(16), request.compat_id, request.block_keys), "replicas[0][0].scope_id"),
        (response, LookupRequest(request.scope_id, bytes(32), request.block_keys), "replicas[0][0].compat_id"),
        (response, LookupRequest(request.scope_id, request.compat_id, request.block_keys), "targets[0].instance"),
    ]
    for resp, req, member in cases:
        with pytest.raises(ValidationError) as info:
            resp.check_request(req)
        assert info.value.member == member


def test_prefetch_status_check_directive_rules() -> None:
    directive = PrefetchDirective.from_bytes(PREFETCH_TEXT)
    cases = [
        (PrefetchStatus("00000000-0000-4000-8000-000000000000", PrefetchState.PENDING), "directive"),
        (PrefetchStatus(DIRECTIVE, PrefetchState.PARTIAL, (bytes(32),)), "loaded[0]"),
        (PrefetchStatus(DIRECTIVE, PrefetchState.COMPLETE, ()), "loaded"),
    ]
    for status, member in cases:
        with pytest.raises(ValidationError) as info:
            status.check_directive(directive)
        assert info.value.member == member


def test_optional_members_may_be_null() -> None:
    value = doc("replica")
    value["moqt_namespace"] = None
    value["layer_digests"] = None
    value["digest"] = "sha-256:" + "00" * 32  # no layer digests: nothing to check the digest against
    assert ReplicaRecord.from_json(value).layer_digests == ()


# -- unknown members, canonical output --------------------------------------------------------
@pytest.mark.parametrize("name", EXAMPLES)
def test_unknown_members_are_ignored(name: str) -> None:
    parse = EXAMPLES[name][0]
    plain = parse(doc(name))
    value = doc(name)
    value["x-future"] = {"nested": [1, 2]}
    for item in value.values():  # also inside nested objects and arrays of objects
        for inner in item if isinstance(item, list) else [item]:
            if isinstance(inner, dict):
                inner["x-future"] = True
    assert parse(value) == plain


def _keys_sorted(value: object) -> bool:
    if isinstance(value, dict):
        keys = list(value)
        return keys == sorted(keys, key=lambda k: k.encode("utf-16-be")) and all(map(_keys_sorted, value.values()))
    if isinstance(value, list):
        return all(map(_keys_sorted, value))
    return True


@pytest.mark.parametrize("name", EXAMPLES)
def test_output_is_jcs(name: str) -> None:
    data = EXAMPLES[name][0](doc(name)).to_bytes()
    decoded = json.loads(data, object_pairs_hook=dict)
    assert _keys_sorted(decoded) and data == rfc8785.dumps(decoded)
    assert b" " not in data.replace(b"c3f8...e1", b"") and b"\n" not in data


def test_canonical_bytes_by_hand() -> None:
    assert StateChange(InstanceState.DRAINING).to_bytes() == b'{"state":"draining"}'
    # Integral doubles are written without ".0" (JCS follows ECMAScript number formatting).
    assert Link(H1, 200000.0, 12).to_bytes() == b'{"holder":"https://h1.example/kvsp/","mbit_per_s":200000,"rtt_us":12}'
    assert LeaseRenewal(5).to_bytes() == b'{"ttl_ms":5}'
    assert Residency(Tier.HOST, (16, 31), 0.5).to_bytes() == b'{"layers":[16,31],"read_mbit_per_s":0.5,"tier":"host"}'
