"""Compatibility Descriptor and Compatibility ID (spec section 4.1, Appendix A)."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsp.descriptor import CompatDescriptor, check_positional
from kvsp.errors import ValidationError
from tests.support.vectors import APPENDIX_A_COMPAT_ID, VECTORS

APPENDIX_TEXT = (VECTORS / "appendix_a_descriptor.json").read_text()

DIGEST = "sha-256:" + "ab" * 32


def test_appendix_a_compat_id(appendix_a_json: dict[str, object]) -> None:
    d = CompatDescriptor.from_json(appendix_a_json)
    assert d.compat_id.hex() == APPENDIX_A_COMPAT_ID


def test_appendix_a_canonical_form_is_jcs(appendix_a_text: str, appendix_a_json: dict[str, object]) -> None:
    # Appendix A gives the descriptor "after JCS canonicalization": our canonical form must be it.
    assert CompatDescriptor.from_json(appendix_a_json).canonical().decode() == appendix_a_text


def test_compat_id_is_independent_of_member_order_and_whitespace(appendix_a_json: dict[str, object]) -> None:
    shuffled = dict(reversed(list(appendix_a_json.items())))
    text = json.dumps(shuffled, indent=3)
    assert CompatDescriptor.from_bytes(text).compat_id.hex() == APPENDIX_A_COMPAT_ID


def test_compat_id_formula(appendix_a_json: dict[str, object]) -> None:
    d = CompatDescriptor.from_json(appendix_a_json)
    expected = hashlib.sha256(b"KVSP-COMPAT-1" + b"\x00" + d.canonical()).digest()
    assert d.compat_id == expected


@pytest.mark.parametrize("member,value", [
    ("model", "other-model"), ("layers", 33), ("kv_dtype", "fp16"), ("positional", "rope;theta=500000"),
    ("block_tokens", 16), ("model_digest", DIGEST),
])
def test_any_change_changes_compat_id(appendix_a_json: dict[str, object], member: str, value: object) -> None:
    changed = dict(appendix_a_json, **{member: value})
    assert CompatDescriptor.from_json(changed).compat_id.hex() != APPENDIX_A_COMPAT_ID


def test_unknown_members_are_kept_in_the_identity(appendix_a_json: dict[str, object]) -> None:
    extended = dict(appendix_a_json, future_member={"x": [1, 2]})
    d = CompatDescriptor.from_json(extended)
    assert d.compat_id.hex() != APPENDIX_A_COMPAT_ID
    assert CompatDescriptor.from_bytes(d.canonical()).compat_id == d.compat_id


def test_adapters_present_in_order(appendix_a_json: dict[str, object]) -> None:
    a, b = "sha-256:" + "01" * 32, "sha-256:" + "02" * 32
    d1 = CompatDescriptor.from_json(dict(appendix_a_json, adapters=[a, b]))
    d2 = CompatDescriptor.from_json(dict(appendix_a_json, adapters=[b, a]))
    assert d1.adapters == (bytes([1]) * 32, bytes([2]) * 32)
    assert d1.compat_id != d2.compat_id  # order of application is part of the identity


# (member, bad value, words expected in the rule) -- one row per descriptor rule of section 4.1.
BAD = [
    ("model", "", "empty"),
    ("model", 5, "string"),
    ("model_digest", "sha-256:" + "AB" * 32, "lowercase"),
    ("model_digest", "sha256:" + "ab" * 32, "sha-256:"),
    ("model_digest", "sha-256:" + "ab" * 31, "64"),
    ("tokenizer_digest", None, "string"),
    ("adapters", [], "absent"),
    ("adapters", ["sha-256:zz"], "64"),
    ("adapters", "sha-256:" + "ab" * 32, "array"),
    ("layers", 0, "between"),
    ("layers", 1.5, "integer"),
    ("layers", True, "integer"),
    ("kv_heads", -1, "between"),
    ("head_dim", "128", "integer"),
    ("kv_dtype", "int8", "one of"),
    ("positional", "alibi", "one of"),
    ("positional", "rope;theta=0500", "leading zeros"),
    ("positional", "rope;theta=", "decimal"),
    ("positional", "rope;scaling=yarn,theta=10000", "theta then scaling"),
    ("positional", "rope;theta=1,theta=2", "theta then scaling"),
    ("positional", "rope;base=3", "theta=N"),
    ("positional", "rope;scaling=YaRN", "lowercase"),
    ("positional", "none;theta=1", "no parameters"),
    ("block_tokens", 0, "between"),
    ("layout", "kvsp-layout-2", "one of"),
]


@pytest.mark.parametrize("member,value,rule", BAD)
def test_invalid_member_is_named(appendix_a_json: dict[str, object], member: str, value: object, rule: str) -> None:
    bad = dict(appendix_a_json, **{member: value})
    with pytest.raises(ValidationError) as info:
        CompatDescriptor.from_json(bad)
    assert info.value.member.startswith(member)
    assert rule in info.value.rule


@pytest.mark.parametrize("member", ["model", "model_digest", "tokenizer_digest", "layers", "kv_heads",
                                    "head_dim", "kv_dtype", "positional", "block_tokens", "layout"])
def test_required_members(appendix_a_json: dict[str, object], member: str) -> None:
    bad = copy.deepcopy(appendix_a_json)
    del bad[member]
    with pytest.raises(ValidationError, match="is required") as info:
        CompatDescriptor.from_json(bad)
    assert info.value.member == member


@pytest.mark.parametrize("value", ["rope", "none", "rope;theta=10000", "rope;theta=500000,scaling=llama3",
                                   "rope;scaling=yarn"])
def test_valid_positional(value: str) -> None:
    assert check_positional(value) == value


@pytest.mark.parametrize("text", ["", "[]", "{", '{"model": NaN}', '"x"', "\xff"])
def test_malformed_documents(text: str) -> None:
    with pytest.raises(ValidationError):
        CompatDescriptor.from_bytes(text)


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ValidationError, match="kv_dtype"):
        CompatDescriptor("m", bytes(32), bytes(32), 2, 2, 2, "int4", "rope", 4)


def test_geometry_helpers(appendix_a_json: dict[str, object]) -> None:
    d = CompatDescriptor.from_json(appendix_a_json)
    assert d.section_length(4) == 4 * 8 * 128 * 2 == 8192
    assert d.block_octets() == 2 * 32 * 8192


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children), max_leaves=20)


MEMBERS = ["model", "model_digest", "layers", "kv_heads", "kv_dtype", "positional", "adapters",
           "block_tokens", "layout", "extension"]


@given(st.dictionaries(st.sampled_from(MEMBERS), json_values, max_size=4), st.booleans())
def test_fuzz_any_json_is_accepted_or_validation_error(changes: dict[str, object], whole: bool) -> None:
    # Mutations of a valid descriptor reach the deep rules; whole random objects the shallow ones.
    doc = changes if whole else {**json.loads(APPENDIX_TEXT), **changes}
    try:
        d = CompatDescriptor.from_json(doc)
    except ValidationError:
        return
    assert CompatDescriptor.from_bytes(d.canonical()).compat_id == d.compat_id


@given(st.binary(max_size=300))
def test_fuzz_any_bytes_is_validation_error(data: bytes) -> None:
    with contextlib.suppress(ValidationError):
        CompatDescriptor.from_bytes(data)
