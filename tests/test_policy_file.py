"""The policy file (decision D2, docs/policy.md): what it grants, and that a mistake in it is an error at
start-up, never a grant or a refusal made silently."""

from __future__ import annotations

import pytest

from kvsp.errors import ValidationError
from kvsp.service.policy import Policy

SCOPE = "6d1c6481cd428737da312c089db3832a"
H1 = "https://127.0.0.1:9443/h1/"
RELAY = "moqt://127.0.0.1:4433/relay"
FE = "https://127.0.0.1:8600/fe/"

GOOD = f"""
pc = "https://127.0.0.1:8444/pc/"
instances = ["https://127.0.0.1:8500/ii1/"]

[[scope]]
id = "{SCOPE}"
lookup = ["{FE}"]
read = ["*"]
store = ["{H1}"]

[publish_for]
"{RELAY}" = ["{H1}"]

[quotas]
keys_per_lookup = 64
"""


def test_a_whole_policy_grants_what_it_says() -> None:
    policy = Policy.from_toml(GOOD)
    scope = bytes.fromhex(SCOPE)
    assert policy.may_lookup(FE, scope) and not policy.may_lookup(H1, scope)
    assert policy.may_read("https://anyone.test/", scope)
    assert policy.may_store(H1, scope) and not policy.may_store(FE, scope)
    assert policy.may_publish_for(RELAY, H1) and not policy.may_publish_for(RELAY, FE)
    assert policy.is_instance("https://127.0.0.1:8500/ii1/") and policy.quotas.keys_per_lookup == 64


@pytest.mark.parametrize(("text", "member"), [
    (GOOD.replace("[[scope]]", "[[scopes]]"), "scopes"),
    (GOOD.replace("instances =", "instance ="), "instance"),
    ("pc_uri = \"https://127.0.0.1:8444/pc/\"\n" + GOOD, "pc_uri"),
    (GOOD.replace("read = ", "reed = "), "scope[0].reed"),
    (GOOD.replace("store = ", "stores = "), "scope[0].stores"),
])
def test_an_unknown_member_is_refused_by_name(text: str, member: str) -> None:
    with pytest.raises(ValidationError, match="unknown member") as refused:
        Policy.from_toml(text)
    assert refused.value.member == member


def test_a_wildcard_holder_in_publish_for_is_refused() -> None:
    """may_publish_for compares identities, so "*" would have delegated nothing while reading as "all"."""
    with pytest.raises(ValidationError, match='"\\*" is not allowed here') as refused:
        Policy.from_toml(GOOD.replace(f'"{RELAY}" = ["{H1}"]', f'"{RELAY}" = ["*"]'))
    assert refused.value.member == f"publish_for.{RELAY}"


def test_a_wildcard_instance_is_refused() -> None:
    with pytest.raises(ValidationError, match="must name each instance"):
        Policy.from_toml(GOOD.replace('instances = ["https://127.0.0.1:8500/ii1/"]', 'instances = ["*"]'))
