"""docs/policy.md stays true: its examples are run through the real loaders and parsers.

- every ```toml block loads: a role file (it has ``roles``) with `RoleConfig.load`, next to the doc's
  first policy example as ``policy.toml``; any other block with `Policy.from_toml`; a block whose first
  line is ``# refused: MESSAGE`` must be refused with exactly that message;
- the ``[quotas]`` table names every field of `Quotas` with its default, and nothing else;
- ``[publish_for]`` goes the way the doc says: the key publishes for the listed holders at the IS and
  at the relay, never the other way round;
- every ```json block parses with the record type it shows, and the lookup and lease answers answer
  the requests shown next to them;
- the ``kvsp certs`` transcript is what the command prints, run twice in one folder.
"""

from __future__ import annotations

import re
import shlex
import stat
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from control.cli import main as kvsp_main
from control.frontend.settings import KNOWN_KEYS as FRONTEND_KEYS
from control.holder.settings import KNOWN_KEYS as HOLDER_KEYS
from control.index.app import acts_for
from control.index.settings import KNOWN_KEYS as IS_KEYS
from control.instance.settings import KNOWN_KEYS as INSTANCE_KEYS
from control.pc.settings import KNOWN_KEYS as PC_KEYS
from kvsp.encoding import parse_json
from kvsp.errors import ValidationError
from kvsp.identifiers import role_id
from kvsp.problems import PROBLEM_TYPE_BASE, Problem
from kvsp.records import Lease, LeaseRenewal, LeaseRequest, LookupRequest, LookupResponse
from kvsp.service.config import KNOWN_ROLES, RoleConfig
from kvsp.service.policy import Policy, Quotas
from moqt.tracks import Action
from relay.auth import relay_authorizer
from relay.settings import KNOWN_KEYS as RELAY_KEYS

DOC = Path(__file__).resolve().parent.parent / "docs" / "policy.md"
TEXT = DOC.read_text()
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
REFUSED = "# refused:"
ROLE_KEYS: Mapping[str, frozenset[str]] = {
    "is": IS_KEYS, "holder": HOLDER_KEYS, "pc": PC_KEYS, "instance": INSTANCE_KEYS, "relay": RELAY_KEYS,
    "frontend": FRONTEND_KEYS,
}
SCOPE_HEX = "0f" * 16
COMPAT_HEX = "ab" * 32


def blocks(language: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(TEXT) if m.group(1) == language]


def section(title: str) -> str:
    """The text of the ``## title`` section, up to the next ``## ``."""
    start = TEXT.index(f"\n## {title}\n")
    end = TEXT.find("\n## ", start + 1)
    return TEXT[start:end if end != -1 else len(TEXT)]


def is_role_file(text: str) -> bool:
    return "roles" in tomllib.loads(text)


def policy_examples() -> list[str]:
    return [b for b in blocks("toml") if not b.startswith(REFUSED) and not is_role_file(b)]


def first_line(text: str) -> str:
    return text.splitlines()[0][:60] if text.strip() else "(empty)"


TOML = blocks("toml")
JSON = blocks("json")


def test_the_doc_has_its_examples() -> None:
    assert len(TOML) >= 10
    assert any(is_role_file(b) for b in TOML)
    assert any(b.startswith(REFUSED) for b in TOML)
    assert len(JSON) >= 8
    assert len(blocks("console")) == 1


# -- TOML ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", TOML, ids=[first_line(b) for b in TOML])
def test_every_toml_example_loads_or_is_refused_as_the_doc_says(text: str, tmp_path: Path) -> None:
    if text.startswith(REFUSED):
        expected = text.splitlines()[0].removeprefix(REFUSED).strip()
        with pytest.raises(ValidationError) as refused:
            Policy.from_toml(text)
        assert str(refused.value) == expected
    elif is_role_file(text):
        (tmp_path / "policy.toml").write_text(policy_examples()[0])
        (tmp_path / "role.toml").write_text(text)
        config = RoleConfig.load(tmp_path / "role.toml")
        assert config.policy == Policy.from_toml(policy_examples()[0])
        assert config.tls is not None and config.tls.ca == tmp_path / "pki" / "ca.pem"
        for role, table in config.sections.items():
            assert set(table) <= ROLE_KEYS[role], role
    else:
        Policy.from_toml(text)


@pytest.mark.parametrize("text", [b for b in TOML if not b.startswith(REFUSED) and is_role_file(b)])
def test_listen_defaults_to_the_host_and_port_of_the_base_uri(text: str, tmp_path: Path) -> None:
    doc = tomllib.loads(text)
    doc.pop("policy", None)
    server = RoleConfig.from_mapping(doc, tmp_path).server
    if "listen" in doc["server"]:
        assert f"{server.host}:{server.port}" == doc["server"]["listen"]
    else:
        parts = urlsplit(doc["server"]["base_uri"])
        assert (server.host, server.port) == (parts.hostname, parts.port or 443)


def test_a_role_file_without_listen_on_an_https_uri_without_port_binds_443(tmp_path: Path) -> None:
    base = "https://is.kvsp.example/is/"
    server = RoleConfig.from_mapping({"roles": ["is"], "server": {"base_uri": base}}, tmp_path).server
    assert (server.host, server.port, server.base_path) == ("is.kvsp.example", 443, "/is/")
    empty_host = {"roles": ["is"], "server": {"base_uri": base, "listen": ":8443"}}
    assert RoleConfig.from_mapping(empty_host, tmp_path).server.host == "127.0.0.1"


def test_the_complete_example_uses_every_top_level_member() -> None:
    doc = tomllib.loads(policy_examples()[0])
    assert set(doc) == {"pc", "instances", "scope", "publish_for", "quotas"}


def test_absent_members_admit_nothing() -> None:
    empty = Policy.from_toml(next(b for b in policy_examples() if not tomllib.loads(b)))
    assert empty == Policy()
    who, scope = "https://ii1.kvsp.example:7410/ii1/", bytes(16)
    assert not (empty.is_pc(who) or empty.is_instance(who) or empty.may_lookup(who, scope)
                or empty.may_read(who, scope) or empty.may_store(who, scope))
    assert empty.quotas == Quotas()


def test_star_means_any_identity_where_it_is_allowed() -> None:
    example = policy_examples()[0]
    [public_hex] = [s["id"] for s in tomllib.loads(example)["scope"] if "*" in s["read"]]
    policy, public = Policy.from_toml(example), bytes.fromhex(public_hex)
    stranger = "https://anyone.kvsp.example/"
    assert policy.may_read(stranger, public) and policy.may_lookup(stranger, public)
    assert not policy.may_store(stranger, public)


# -- quotas ----------------------------------------------------------------------------------------
def test_the_quota_table_is_the_quotas_with_their_defaults() -> None:
    rows = re.findall(r"^\| `(\w+)` \| (\d+|derived)", section("`[quotas]`"), re.MULTILINE)
    assert {name: None if default == "derived" else int(default) for name, default in rows} == {
        f.name: f.default for f in fields(Quotas)}
    assert len(rows) == len(fields(Quotas))


# -- publish_for -----------------------------------------------------------------------------------
def namespace_of(holder: str) -> tuple[bytes, ...]:
    return (b"kvsp", COMPAT_HEX.encode(), SCOPE_HEX.encode(), role_id(holder).encode())


@pytest.mark.parametrize("text", [b for b in policy_examples() if "publish_for" in tomllib.loads(b)])
def test_publish_for_keys_are_delegates_and_values_the_holders(text: str) -> None:
    policy = Policy.from_toml(text)
    assert policy.publish_for
    relay = relay_authorizer(policy)
    for delegate, holders in policy.publish_for.items():
        for holder in holders:
            assert acts_for(policy, delegate, role_id(holder))
            assert relay(delegate, namespace_of(holder), Action.PUBLISH_NAMESPACE)
            assert not acts_for(policy, holder, role_id(delegate))
            assert not relay(holder, namespace_of(delegate), Action.PUBLISH_NAMESPACE)


# -- JSON ------------------------------------------------------------------------------------------
def check_health(doc: dict[str, object]) -> None:
    roles = doc["roles"]
    assert isinstance(roles, list) and set(roles) <= set(KNOWN_ROLES)
    assert isinstance(doc["uptime_s"], float)
    assert set(doc) - {"status", "roles", "uptime_s"} <= set(roles)


def check_problem(doc: dict[str, object]) -> None:
    problem = Problem.from_json(doc)
    kind = problem.kind
    if kind is None:
        assert problem.type == "about:blank"
    else:
        assert problem.type.startswith(PROBLEM_TYPE_BASE)
        assert (problem.status, problem.title) == (kind.status, kind.title)


def parser_of(doc: dict[str, object]) -> Callable[[dict[str, object]], object]:
    keys = set(doc)
    if "matched" in keys:
        return LookupResponse.from_json
    if {"scope_id", "compat_id", "block_keys"} <= keys:
        return LookupRequest.from_json
    if "lease" in keys:
        return Lease.from_json
    if keys == {"block_keys", "ttl_ms"}:
        return LeaseRequest.from_json
    if keys == {"ttl_ms"}:
        return LeaseRenewal.from_json
    if {"type", "status", "title"} <= keys:
        return check_problem
    if doc.get("status") == "ok" and "roles" in keys:
        return check_health
    raise AssertionError(f"a JSON example of no known kind: {sorted(keys)}")


def parsed(text: str) -> dict[str, object]:
    doc = parse_json(text)
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("text", JSON, ids=[first_line(b) for b in JSON])
def test_every_json_example_parses_as_what_it_shows(text: str) -> None:
    doc = parsed(text)
    parser_of(doc)(doc)


def test_the_lookup_answer_answers_the_lookup_request() -> None:
    [request] = [LookupRequest.from_json(d) for d in map(parsed, JSON) if parser_of(d) == LookupRequest.from_json]
    [answer] = [LookupResponse.from_json(d) for d in map(parsed, JSON) if parser_of(d) == LookupResponse.from_json]
    answer.check_request(request)
    assert 0 < answer.matched < len(request.block_keys)
    assert len(answer.targets) < len(request.targets)  # the target without a status is left out


def test_the_lease_answer_grants_the_lease_request() -> None:
    [request] = [LeaseRequest.from_json(d) for d in map(parsed, JSON) if parser_of(d) == LeaseRequest.from_json]
    [lease] = [Lease.from_json(d) for d in map(parsed, JSON) if parser_of(d) == Lease.from_json]
    assert (lease.block_keys, lease.ttl_ms) == (request.block_keys, request.ttl_ms)
    assert re.fullmatch(r"[A-Za-z0-9_-]{32}", lease.lease)


# -- kvsp certs ------------------------------------------------------------------------------------
def transcript() -> list[tuple[list[str], list[str]]]:
    """(arguments, expected output lines) per ``$ kvsp ...`` line of the console block."""
    runs: list[tuple[list[str], list[str]]] = []
    for line in blocks("console")[0].splitlines():
        if line.startswith("$ "):
            runs.append((shlex.split(line[2:])[1:], []))
        else:
            runs[-1][1].append(line)
    return runs


def test_kvsp_certs_prints_what_the_doc_shows_and_reuses_the_ca(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    pki = tmp_path / "pki"
    seen: list[dict[str, bytes]] = []
    for args, expected in transcript():
        assert args[:2] == ["certs", "pki"]
        assert kvsp_main(args) == 0
        assert capsys.readouterr().out.splitlines() == expected
        seen.append({p.name: p.read_bytes() for p in pki.iterdir()})
    first, second = seen
    assert set(first) == {"ca.pem", "ca.key", "is.pem", "is.key", "h1.pem", "h1.key"}
    assert set(second) == set(first) | {"fe.pem", "fe.key"}
    for name in ("ca.pem", "ca.key", "h1.pem", "h1.key"):
        assert second[name] == first[name], name
    for name in ("is.pem", "is.key"):
        assert second[name] != first[name], name
    for path in pki.glob("*.key"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name


def test_kvsp_certs_without_a_role_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    said = re.search(r"Without `--role` it prints `([^`]+)`\s+and exits with status (\d+)", TEXT)
    assert said is not None
    monkeypatch.chdir(tmp_path)
    assert kvsp_main(["certs", "pki"]) == int(said.group(2))
    assert capsys.readouterr().err.strip() == said.group(1)
