"""Role identifiers (spec section 5, D1), moqt_namespace (D3) and Problem Details (section 7)."""

from __future__ import annotations

import base64
import contextlib
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsp.errors import ValidationError
from kvsp.identifiers import TrackNamespace, check_base_uri, check_role_id, role_id
from kvsp.problems import Problem, ProblemError, ProblemType

SECTION_7 = [
    ("kvsp-not-found", 404), ("kvsp-scope-denied", 403), ("kvsp-incompatible", 409),
    ("kvsp-lease-quota", 429), ("kvsp-stale-epoch", 409), ("kvsp-invalid-state", 409),
    ("kvsp-digest-mismatch", 422), ("kvsp-plan-conflict", 409), ("kvsp-layers-unavailable", 404),
]


def test_role_id_is_b64url_sha256_of_uri() -> None:
    uri = "https://h1.example/kvsp/"
    expected = base64.urlsafe_b64encode(hashlib.sha256(uri.encode()).digest()).decode().rstrip("=")
    assert role_id(uri) == expected
    assert len(role_id(uri)) == 43 and "=" not in role_id(uri)
    assert role_id("https://h1.example/kvsp") != role_id(uri)  # exactly as written


@pytest.mark.parametrize("bad", ["", "a" * 42, "a" * 44, "+" * 43, "/" * 43])
def test_check_role_id_rejects(bad: str) -> None:
    with pytest.raises(ValidationError):
        check_role_id(bad)


@pytest.mark.parametrize("uri", ["http://h/", "https:///x", "h1.example", "https://h:99999/", "https://h/#f"])
def test_check_base_uri_rejects(uri: str) -> None:
    with pytest.raises(ValidationError):
        check_base_uri(uri, "holder")


def test_namespace_encoding_by_hand() -> None:
    ns = TrackNamespace(bytes(range(32)), bytes(16), role_id("https://h/"), bytes(32))
    raw = base64.urlsafe_b64decode(ns.encode() + "=" * (-len(ns.encode()) % 4))
    # D3: five fields, each preceded by its length as one octet.
    assert raw[:5] == b"\x04kvsp"
    assert raw[5] == 64 and raw[6:70] == bytes(range(32)).hex().encode()
    assert raw[70] == 32 and raw[71:103] == b"0" * 32
    assert raw[103] == 43 and raw[104:147] == role_id("https://h/").encode()
    assert raw[147] == 64 and len(raw) == 148 + 64


@given(st.binary(min_size=32, max_size=32), st.binary(min_size=16, max_size=16),
       st.binary(min_size=32, max_size=32), st.text(max_size=30))
def test_namespace_round_trip(compat: bytes, scope: bytes, key: bytes, uri: str) -> None:
    ns = TrackNamespace(compat, scope, role_id(uri), key)
    assert TrackNamespace.decode(ns.encode()) == ns
    assert TrackNamespace.from_fields(ns.fields()) == ns


@given(st.binary(max_size=250))
def test_namespace_fuzz(data: bytes) -> None:
    text = base64.urlsafe_b64encode(data).decode().rstrip("=")
    with contextlib.suppress(ValidationError):
        TrackNamespace.decode(text)


@pytest.mark.parametrize("suffix,status", SECTION_7)
def test_problem_types_match_section_7(suffix: str, status: int) -> None:
    kind = next(p for p in ProblemType if p.suffix == suffix)
    assert kind.status == status
    assert kind.uri == "https://iana.org/assignments/kvsp#" + suffix
    problem = Problem.of(kind, "detail here")
    parsed = Problem.from_bytes(problem.to_bytes())
    assert parsed == problem and parsed.kind is kind
    assert ProblemError.of(kind).problem.status == status


def test_every_problem_type_is_in_section_7() -> None:
    assert {p.suffix for p in ProblemType} == {s for s, _ in SECTION_7}


@pytest.mark.parametrize("body", [b"{}", b'{"status": "404"}', b'{"status": 99}', b"[]", b"nope"])
def test_problem_parse_rejects(body: bytes) -> None:
    with pytest.raises(ValidationError):
        Problem.from_bytes(body)
