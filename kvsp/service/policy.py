"""Authorization policy (decision D2), read from one TOML file by every role.

    pc = "https://127.0.0.1:7400/"          # the only identity that sends directives
    instances = ["https://ii1.example/"]     # the inference instances: the PC takes status and checkpoints
                                             # from these only, and sends prompts to no one else

    [[scope]]
    id = "6d1c6481cd428737da312c089db3832a"  # scope_id, hex16
    lookup = ["https://pc.example/"]          # may POST lookup for this scope
    read = ["https://ii1.example/"]           # may GET blocks / lease them
    store = ["https://ii1.example/"]          # may PUT blocks and publish replicas

    [publish_for]
    "https://ii1.example/" = ["https://h1.example/"]   # may publish replicas on behalf of h1

    [quotas]
    lease_octets_per_client = 1073741824

``"*"`` in a scope's list means any authenticated identity (for a shared public-prefix scope, or tests);
it is refused in ``instances``, because an instance receives the prompts of the sessions it is given.
An empty or missing ``instances`` admits no instance: every certificate of the deployment CA is
authenticated, so being authenticated says nothing about being an instance (section 9).
Scope Keys never appear here: the IS, relays and cache-only holders never need them.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Final

from kvsp.encoding import parse_hex
from kvsp.errors import ValidationError
from kvsp.identifiers import check_base_uri

ANY = "*"
IDENTITY_SCHEMES = frozenset({"https", "moqt"})


LEASE_OCTETS_CEILING = 4 << 30  # the most a derived lease_octets_per_client allows (control/holder/quota.py)


@dataclass(frozen=True, slots=True)
class Quotas:
    """Every quota the spec calls REQUIRED (section 9), with a default (D2).

    ``lease_octets_per_client`` unset (None) is derived by each holder from its capacity: a quarter of
    what its tiers hold together, at most `LEASE_OCTETS_CEILING` (control/holder/quota.py).
    """

    lease_octets_per_client: int | None = None
    lease_ttl_ms_max: int = 60_000
    pending_directives_per_instance: int = 64
    keys_per_lookup: int = 4096
    body_limit_octets: int = 1 << 20
    block_body_limit_octets: int = 1 << 30
    replica_ttl_ms_max: int = 600_000


@dataclass(frozen=True, slots=True)
class ScopeGrant:
    lookup: frozenset[str] = frozenset()
    read: frozenset[str] = frozenset()
    store: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Policy:
    pc: str | None = None
    scopes: Mapping[bytes, ScopeGrant] = field(default_factory=dict)
    publish_for: Mapping[str, frozenset[str]] = field(default_factory=dict)
    quotas: Quotas = field(default_factory=Quotas)
    instances: frozenset[str] = frozenset()

    # -- decisions --------------------------------------------------------------------------
    def _granted(self, scope_id: bytes, identity: str, action: str) -> bool:
        grant = self.scopes.get(scope_id)
        if grant is None:
            return False
        allowed: frozenset[str] = getattr(grant, action)
        return identity in allowed or ANY in allowed

    def may_lookup(self, identity: str, scope_id: bytes) -> bool:
        return self._granted(scope_id, identity, "lookup")

    def may_read(self, identity: str, scope_id: bytes) -> bool:
        return self._granted(scope_id, identity, "read")

    def may_store(self, identity: str, scope_id: bytes) -> bool:
        return self._granted(scope_id, identity, "store")

    def may_publish_for(self, identity: str, holder: str) -> bool:
        """Only holders publish for themselves, unless the policy names a delegate (section 6.1)."""
        return identity == holder or holder in self.publish_for.get(identity, frozenset())

    def is_pc(self, identity: str) -> bool:
        return self.pc is not None and identity == self.pc

    def is_instance(self, identity: str) -> bool:
        """Only listed identities may act as inference instances (report status, checkpoint sessions)."""
        return identity in self.instances

    # -- loading ----------------------------------------------------------------------------
    @classmethod
    def from_toml(cls, text: str) -> Policy:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValidationError("policy", f"malformed TOML ({exc})") from exc
        return cls.from_mapping(doc)

    @classmethod
    def load(cls, path: Path) -> Policy:
        return cls.from_toml(path.read_text())

    @classmethod
    def from_mapping(cls, doc: Mapping[str, object]) -> Policy:
        # A misspelt member ("scopes", "[[scope]] reed") would otherwise grant or refuse silently.
        _known_members(doc, POLICY_MEMBERS, "policy", "")
        pc = doc.get("pc")
        if pc is not None and not isinstance(pc, str):
            raise ValidationError("pc", "must be a string")
        if pc is not None:
            check_base_uri(pc, "pc")
        scopes: dict[bytes, ScopeGrant] = {}
        raw_scopes = doc.get("scope", [])
        if not isinstance(raw_scopes, list):
            raise ValidationError("scope", "must be an array of tables ([[scope]])")
        for i, entry in enumerate(raw_scopes):
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                raise ValidationError(f"scope[{i}].id", "must be a hex16 scope ID")
            _known_members(entry, SCOPE_MEMBERS, f"scope[{i}]", f"scope[{i}].")
            sid = parse_hex(entry["id"], 16, f"scope[{i}].id")
            if sid in scopes:
                raise ValidationError(f"scope[{i}].id", "scope listed twice")
            scopes[sid] = ScopeGrant(**{a: _identities(entry.get(a, []), f"scope[{i}].{a}")
                                        for a in ("lookup", "read", "store")})
        raw_pub = doc.get("publish_for", {})
        if not isinstance(raw_pub, dict):
            raise ValidationError("publish_for", "must be a table")
        publish_for = {check_base_uri(k, "publish_for", IDENTITY_SCHEMES): _identities(v, f"publish_for.{k}")
                       for k, v in raw_pub.items()}
        for delegate, holders in publish_for.items():
            if ANY in holders:  # may_publish_for compares identities: "*" would match no holder at all
                raise ValidationError(f"publish_for.{delegate}", 'must name each holder; "*" is not allowed here')
        instances = _identities(doc.get("instances", []), "instances")
        if ANY in instances:
            raise ValidationError("instances", 'must name each instance; "*" is not allowed here')
        return cls(pc, scopes, publish_for, _quotas(doc.get("quotas", {})), instances)


POLICY_MEMBERS: Final = frozenset({"pc", "scope", "publish_for", "quotas", "instances"})
SCOPE_MEMBERS: Final = frozenset({"id", "lookup", "read", "store"})


def _known_members(table: Mapping[str, object], known: frozenset[str], where: str, prefix: str) -> None:
    for name in table:
        if name not in known:
            raise ValidationError(f"{prefix}{name}", f"unknown member of {where}; known: {sorted(known)}")


def _identities(value: object, member: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationError(member, "must be an array of identity URIs")
    return frozenset(v if v == ANY else check_base_uri(v, member, IDENTITY_SCHEMES) for v in value)


def _quotas(value: object) -> Quotas:
    if not isinstance(value, dict):
        raise ValidationError("quotas", "must be a table")
    known = {f.name for f in fields(Quotas)}
    for name, v in value.items():
        if name not in known:
            raise ValidationError(f"quotas.{name}", f"unknown quota; known: {sorted(known)}")
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValidationError(f"quotas.{name}", "must be a positive integer")
    return Quotas(**value)
