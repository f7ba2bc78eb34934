"""KVSP records (spec sections 4.4 and 6), by property: Hypothesis round trips of valid records, a fuzz check
that any input gives a record or `ValidationError` and nothing else, and the fast paths checked against the
full rules. The spec examples and one case per rule are in tests/test_records.py."""

from __future__ import annotations

import itertools
import json

import pytest
import rfc8785
from hypothesis import given
from hypothesis import strategies as st

from kvsp.encoding import canonical_json, parse_hex
from kvsp.errors import ValidationError
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.reader import ObjectReader
from kvsp.records import (
    InstanceStatus,
    JsonRecord,
    Lease,
    LeaseRenewal,
    LeaseRequest,
    Link,
    LookupRequest,
    LookupResponse,
    PrefetchBlock,
    PrefetchDirective,
    PrefetchState,
    PrefetchStatus,
    ReplicaRecord,
    ReshardAbort,
    ReshardCommit,
    ReshardPlan,
    Residency,
    Sampler,
    SessionCheckpoint,
    Shard,
    ShardFetch,
    ShardMap,
    StateChange,
    TargetEstimate,
    digest_of_layers,
    parse_reshard_message,
)
from kvsp.records.base import HOLDER_SCHEMES, HTTPS, check_layer_range, check_uri, read_finite
from kvsp.registry import InstanceState, Tier
from tests.test_records import (
    EXAMPLES,
    H1,
    K0,
    RELAY,
    Parser,
    doc,
    edit,
)

# -- Hypothesis: valid records round trip ----------------------------------------------------
k32 = st.binary(min_size=32, max_size=32)
k16 = st.binary(min_size=16, max_size=16)
safe = st.integers(0, 2**53 - 1)
positive = st.integers(1, 2**53 - 1)
finite = st.floats(0, 1e15, allow_nan=False)
rate = st.floats(1e-3, 1e15)
host = st.from_regex(r"[a-z][a-z0-9-]{0,8}(\.[a-z]{2,4}){1,2}", fullmatch=True)
https = st.builds("https://{}/{}".format, host, st.from_regex(r"[a-z0-9/._-]{0,12}", fullmatch=True))
moqt = st.builds("moqt://{}:{}/kvsp".format, host, st.integers(1, 65535))
uuids = st.uuids().map(str)
tokens = st.lists(st.integers(0, 2**32 - 1), max_size=20).map(tuple)
text = st.text(min_size=1, max_size=20)


@st.composite
def residencies(draw: st.DrawFn, top: int) -> tuple[Residency, ...]:
    """Non-overlapping inclusive ranges within 0..top, in any order."""
    cuts = sorted(draw(st.lists(st.integers(0, top + 1), min_size=2, max_size=10, unique=True)))
    pairs = [(cuts[i], cuts[i + 1] - 1) for i in range(0, len(cuts) - 1, 2)]
    entries = [Residency(draw(st.sampled_from(list(Tier))), p, draw(st.none() | rate)) for p in pairs]
    return tuple(draw(st.permutations(entries)))


@st.composite
def replicas(draw: st.DrawFn, key: bytes | None = None, compat: bytes | None = None,
             scope: bytes | None = None) -> ReplicaRecord:
    key, compat, scope = key or draw(k32), compat or draw(k32), scope or draw(k16)
    layer_digests = tuple(draw(st.lists(k32, max_size=8)))
    top = len(layer_digests) - 1 if layer_digests else 200
    digest = digest_of_layers(layer_digests) if layer_digests else draw(k32)
    namespace = None
    holder = draw(https)
    if draw(st.booleans()):
        namespace, holder = TrackNamespace(compat, scope, role_id(holder), key), draw(moqt)
    return ReplicaRecord(key, compat, scope, holder, draw(st.integers(1, 0xFFFF)), draw(safe), digest,
                         draw(residencies(max(top, 0))), draw(positive), layer_digests, namespace)


links = st.builds(Link, https | moqt, rate, safe)
states = st.sampled_from(list(InstanceState))
params = st.dictionaries(st.text(max_size=8), st.none() | st.booleans() | st.integers(-2**53 + 1, 2**53 - 1)
                         | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8), max_size=5)


@st.composite
def statuses(draw: st.DrawFn) -> InstanceStatus:
    link_list = draw(st.lists(links, max_size=4, unique_by=lambda link: link.holder))
    return InstanceStatus(draw(https), draw(safe), draw(states), draw(safe), draw(safe), draw(safe),
                          draw(st.floats(0, 1)), draw(finite), draw(finite), tuple(link_list), draw(positive),
                          draw(st.none() | states))


@st.composite
def checkpoints(draw: st.DrawFn) -> SessionCheckpoint:
    generated = draw(tokens)
    sampler = Sampler(draw(text), tuple(sorted(draw(params).items())), draw(safe), draw(safe), draw(st.booleans()))
    return SessionCheckpoint(draw(uuids), draw(safe), draw(k32), draw(k16), tuple(draw(st.lists(k32, max_size=4))),
                             draw(tokens), generated, len(generated), sampler)


@st.composite
def lookup_responses(draw: st.DrawFn) -> LookupResponse:
    compat, scope = draw(k32), draw(k16)
    keys = draw(st.lists(k32, max_size=3))
    groups = tuple(tuple(draw(st.lists(replicas(k, compat, scope), min_size=1, max_size=2))) for k in keys)
    targets = draw(st.lists(st.builds(TargetEstimate, https, st.none() | finite, st.none() | finite),
                            max_size=3, unique_by=lambda t: t.instance))
    return LookupResponse(groups, tuple(targets))


@st.composite
def shard_maps(draw: st.DrawFn) -> ShardMap:
    cuts = sorted(draw(st.lists(st.integers(0, 10**6), min_size=2, max_size=8, unique=True)))
    members = draw(st.lists(https, min_size=1, max_size=4))
    shards = tuple(Shard((a, b), draw(st.sampled_from(members))) for a, b in itertools.pairwise(cuts))
    return ShardMap(draw(text), draw(safe), shards)


@st.composite
def plans(draw: st.DrawFn) -> ReshardPlan:
    cuts = sorted(draw(st.lists(st.integers(0, 10**6), max_size=10, unique=True)))
    pieces = [(a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=False)]
    kinds = [draw(st.sampled_from(["retain", "fetch", "release"])) for _ in pieces]
    version = draw(st.integers(0, 2**53 - 2))
    return ReshardPlan(
        draw(text), version, version + 1, draw(positive),
        tuple(p for p, k in zip(pieces, kinds, strict=True) if k == "retain"),
        tuple(ShardFetch(p, draw(https)) for p, k in zip(pieces, kinds, strict=True) if k == "fetch"),
        tuple(p for p, k in zip(pieces, kinds, strict=True) if k == "release"))


key_tuples = st.lists(k32, min_size=1, max_size=5, unique=True).map(tuple)
blocks = st.lists(st.builds(PrefetchBlock, k32, st.lists(https | moqt, min_size=1, max_size=3, unique=True)
                            .map(tuple)), min_size=1, max_size=3, unique_by=lambda b: b.block_key).map(tuple)
RECORDS: list[st.SearchStrategy[JsonRecord]] = [
    replicas(),
    statuses(),
    checkpoints(),
    st.builds(LookupRequest, k16, k32, key_tuples, st.lists(https, max_size=3, unique=True).map(tuple)),
    lookup_responses(),
    st.builds(LeaseRequest, key_tuples, positive),
    st.builds(LeaseRenewal, positive),
    st.builds(Lease, st.from_regex(r"[A-Za-z0-9_-]{1,128}", fullmatch=True), key_tuples, positive),
    st.builds(PrefetchDirective, uuids, k16, k32, blocks, positive, positive, st.none() | text),
    st.builds(PrefetchStatus, uuids, st.sampled_from(list(PrefetchState)),
              st.lists(k32, max_size=4, unique=True).map(tuple)),
    shard_maps(),
    plans(),
    st.builds(ReshardCommit, text, positive),
    st.builds(ReshardAbort, text, positive),
    st.builds(StateChange, states),
]


@given(st.one_of(RECORDS))
def test_valid_records_round_trip(record: JsonRecord) -> None:
    data = record.to_bytes()
    assert type(record).from_bytes(data) == record
    assert type(record).from_json(record.to_json()) == record
    assert type(record).from_bytes(data).to_bytes() == data


@given(st.one_of(plans(), st.builds(ReshardCommit, text, positive), st.builds(ReshardAbort, text, positive)))
def test_reshard_messages_round_trip(message: JsonRecord) -> None:
    assert parse_reshard_message(json.loads(message.to_bytes())) == message


# -- fuzz: anything in -> record or ValidationError, never another exception ------------------
strings = st.text(max_size=12) | st.sampled_from(["\ud800", "https://\udc00.example/", H1, RELAY, K0, "active"])
scalars = (st.none() | st.booleans() | st.integers() | st.integers(10**300, 10**400)
           | st.floats() | strings)
json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(strings, c, max_size=4),
                           max_leaves=20)
PARSERS = [parse for parse, _ in EXAMPLES.values()]


def _parses_or_rejects(parse: Parser, value: object) -> None:
    try:
        record = parse(value)
    except ValidationError:
        return
    assert parse(json.loads(record.to_bytes())) == record  # what parses also writes out and back


@given(st.sampled_from(PARSERS), json_values)
def test_fuzz_any_json(parse: Parser, value: object) -> None:
    _parses_or_rejects(parse, value)


@given(st.sampled_from(list(EXAMPLES)), st.data(), json_values)
def test_fuzz_one_member_of_a_valid_example(name: str, data: st.DataObject, new: object) -> None:
    """Replace one member anywhere in a valid document, which reaches the deeper rules."""
    value = doc(name)
    paths: list[str] = []

    def walk(node: object, path: str) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
        for key, child in items:
            sub = f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]"
            paths.append(sub.lstrip("."))
            walk(child, sub)

    walk(value, "")
    path = data.draw(st.sampled_from(paths))
    _parses_or_rejects(EXAMPLES[name][0], edit(value, path, new))


@given(st.sampled_from(list(EXAMPLES.values())), st.binary(max_size=64) | st.sampled_from(
    [b"", b"\xff\xfe", b"[" * 100_000, b"1" * 5000, b'{"a": NaN}', b"1e400"]))
def test_fuzz_any_bytes(example: tuple[Parser, str], data: bytes) -> None:
    parse, text = example
    record_type = type(parse(json.loads(text)))
    try:
        record = record_type.from_bytes(data)
    except ValidationError:
        return
    assert record_type.from_bytes(record.to_bytes()) == record


@given(st.sampled_from(list(EXAMPLES.values())), st.data())
def test_fuzz_corrupted_example_bytes(example: tuple[Parser, str], data: st.DataObject) -> None:
    parse, text = example
    raw = bytearray(parse(json.loads(text)).to_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        value = json.loads(bytes(raw))
    except ValueError:
        return
    _parses_or_rejects(parse, value)


# -- fast paths: each must accept exactly what the full rules accept ------------------------------------

_json_scalars = (st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.text(max_size=8)
                 | st.floats(allow_nan=True, allow_infinity=True)
                 | st.sampled_from([0.0, -0.0, 1e-4, 9.99e-5, 1e-7, 1e16, 1e21, 2.0**53, 2.0**53 + 2, 0.1, 400000.0,
                                    -1.5, 123456789.125, 5e-324, 1.7976931348623157e308, 2**53 - 1, -(2**53) + 1,
                                    2**53, "\x00\x1f\x7f\u2028\ud800", "\U0001f600", "\ue000"]))
_json_values = st.recursive(_json_scalars, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                            | st.dictionaries(st.text(max_size=4) | st.sampled_from(["\ue000", "\U0001f600"]),
                                              inner, max_size=4), max_leaves=12)


@given(_json_values)
def test_canonical_json_is_rfc8785(value: object) -> None:
    """The json.dumps fast path writes the octets rfc8785 writes, and fails where rfc8785 fails."""
    try:
        expected = rfc8785.dumps(value)  # type: ignore[arg-type]
    except rfc8785.CanonicalizationError:
        with pytest.raises(ValidationError, match="JCS"):
            canonical_json(value)
        return
    assert canonical_json(value) == expected


def test_canonical_json_examples() -> None:
    expected = b'{"a":[1,0,0.5,0.00001,1e+21],"b":400000}'
    assert canonical_json({"b": 400000.0, "a": [1.0, -0.0, 0.5, 1e-5, 1e21]}) == expected
    assert canonical_json({"\ue000": 1, "\U0001f600": 2}) == rfc8785.dumps({"\ue000": 1, "\U0001f600": 2})
    with pytest.raises(ValidationError):
        canonical_json({"a": "\ud800"})
    with pytest.raises(ValidationError):
        canonical_json(2**53)


_residency_values = st.fixed_dictionaries(
    {"tier": st.sampled_from(["host", "device", "local-storage", "HOST", "", 1]) | st.none(),
     "layers": st.sampled_from([[0, 1], [3, 3], [2, 1], [0], [0, 1, 2], [-1, 2], [0, 2**32 - 1], [0, 2**32],
                                [True, 1], [0.0, 1.0], [0.5, 1], "0-1", None, [0, 2**53]])},
    optional={"read_mbit_per_s": st.sampled_from([None, 1, 0, -1, 0.5, 0.0, True, 1e400, float("nan"), 2**53,
                                                  2**53 + 1, 10**400, "1", 400000.0])})


@given(_residency_values)
def test_residency_fast_path_equals_the_full_rules(value: dict[str, object]) -> None:
    def full() -> Residency:  # the general path only, as it was before the fast path
        r = ObjectReader(value)
        rate = r.optional("read_mbit_per_s", lambda n: read_finite(r, n, positive=True))
        return Residency(Tier(r.choice("tier", frozenset(t.value for t in Tier))),
                         check_layer_range(r.raw("layers"), r.member("layers")), rate)

    try:
        expected = full()
    except ValidationError as exc:
        with pytest.raises(ValidationError) as info:
            Residency.from_json(value)
        assert (info.value.member, str(info.value)) == (exc.member, str(exc))
        return
    parsed = Residency.from_json(value)
    assert parsed == expected and type(parsed.read_mbit_per_s) is type(expected.read_mbit_per_s)


@pytest.mark.parametrize("text", ["AB" * 32, "ab" * 31 + "a ", " " + "ab" * 31 + "a", "ab" * 31 + "g0",
                                  "ab" * 31 + "\u0661\u0662", "ab" * 33, "ab" * 31 + "a"])
def test_hex_rules_after_the_round_trip_check(text: str) -> None:
    """Uppercase, spaces (which bytes.fromhex accepts) and non-ASCII digits are refused, alone and in lists."""
    with pytest.raises(ValidationError, match="block_key"):
        parse_hex(text, 32, "block_key")
    value = json.loads(EXAMPLES["replica"][1])
    digests = [d for d in value.get("layer_digests", [])] or ["00" * 32]
    value["layer_digests"] = [*digests[:-1], text]
    with pytest.raises(ValidationError, match=r"layer_digests\[" if len(text) == 64 else "layer_digests"):
        ReplicaRecord.from_json(value)


def test_uri_cache_keeps_the_scheme_rule() -> None:
    """A URI accepted for https+moqt is still refused where only https is allowed (and vice versa)."""
    uri = "moqt://relay.example:4443/kvsp/"
    assert check_uri(uri, "holder", HOLDER_SCHEMES) == uri
    with pytest.raises(ValidationError, match="scheme"):
        check_uri(uri, "instance", HTTPS)
    with pytest.raises(ValidationError, match="printable ASCII"):
        check_uri("https://h.example/a b", "holder", HTTPS)
