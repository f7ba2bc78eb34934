"""Typed writers of the TOML files ``kvsp serve`` reads: role configurations (D1) and the policy (D2).

One frozen dataclass per role table (`IndexSection` is ``[is]``, `HolderSection` ``[holder]``, ...), whose
fields are the keys that role's own settings loader accepts; a field left ``None`` is not written, so the
role's default applies.  `RoleFile` adds the head (``roles``, ``policy``, ``[server]``, ``[tls]``), and
`PolicyFile` writes the policy.  tests/test_deploy_configs.py round-trips every table through its loader.

    RoleFile(("holder",), pki.uri("h1"), Tls.of("h1"), "policy.toml",
             sections=(HolderSection(index=pki.uri("is"), descriptors=("model.json",)),)).write(tmp / "h1.toml")
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

TomlValue = object  # str, bool, int, float, a Sequence or Mapping of them, or a dataclass (an inline table)


def toml_value(value: TomlValue) -> str:
    """``value`` as a TOML value; a dataclass is an inline table of its fields that are not ``None``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, int | float):
        return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return toml_value(_members(value))
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, Sequence):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def toml_key(key: str) -> str:
    """A bare key where TOML allows one, else a quoted key (URIs as keys: ``[publish_for]``)."""
    return key if key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key) else json.dumps(key)


def toml_table(name: str, values: Mapping[str, TomlValue]) -> str:
    return f"\n[{name}]\n" + "".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in values.items())


def _members(obj: object) -> dict[str, TomlValue]:
    return {f.name: v for f in dataclasses.fields(obj) if (v := getattr(obj, f.name)) is not None}  # type: ignore[arg-type]


# -- role tables ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class HolderLink:
    """One ``[instance] links`` entry: a path to a holder, as the status reports it (section 6.4)."""

    holder: str
    mbit_per_s: float
    rtt_us: int


@dataclass(frozen=True, slots=True)
class IndexSection:
    """``[is]`` (control/index/settings.py)."""

    ROLE: ClassVar[str] = "is"
    sweep_interval_s: float | None = None
    sweep_batch: int | None = None
    max_replicas: int | None = None
    block_tokens: int | None = None
    descriptors: Sequence[str] | None = None
    backend: str | None = None  # "memory" or "redis"
    redis: RedisTable | None = None


@dataclass(frozen=True, slots=True)
class HolderSection:
    """``[holder]`` (control/holder/settings.py)."""

    ROLE: ClassVar[str] = "holder"
    index: str | Sequence[str] | None = None  # one IS, or several to fail over between
    descriptors: Sequence[str] | None = None
    replica_ttl_ms: int | None = None
    retention_ms: int | None = None
    host_capacity_octets: int | None = None
    storage_dir: str | None = None
    storage_capacity_octets: int | None = None
    encryption_key_file: str | None = None
    verify_stored: bool | None = None
    withdraw_timeout_ms: int | None = None
    moqt_listen: str | None = None
    moqt_uri: str | None = None
    moqt_token_keys: Sequence[str] | None = None
    moqt_relay: str | None = None
    moqt_max_datagram_size: int | None = None
    moqt_max_connections_per_client: int | None = None
    moqt_drafts: Sequence[int] | None = None
    torch_tiers: bool | None = None
    device_capacity_octets: int | None = None
    device: str | None = None
    fast_layers: int | None = None


@dataclass(frozen=True, slots=True)
class RedisTable:
    """A role's ``redis`` table (control/backend.py), written inline: ``redis = { url = ... }``."""

    url: str
    cluster: bool | None = None
    password_file: str | None = None
    username: str | None = None
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    timeout_ms: int | None = None
    key_prefix: str | None = None


@dataclass(frozen=True, slots=True)
class PcSection:
    """``[pc]`` (control/pc/settings.py)."""

    ROLE: ClassVar[str] = "pc"
    index: str | Sequence[str] | None = None  # one IS, or several to fail over between
    scope_keys: Mapping[str, str] | None = None  # Scope ID (hex) -> key file
    descriptors: Sequence[str] | None = None
    min_active: int | None = None
    status_check_interval_ms: int | None = None
    mean_service_ms: float | None = None
    call_timeout_ms: int | None = None
    resume_timeout_ms: int | None = None
    reshard_deadline_ms: int | None = None
    operators: Sequence[str] | None = None
    instances: Sequence[str] | None = None
    deterministic_methods: Sequence[str] | None = None
    backend: str | None = None  # "memory" or "redis"
    redis: RedisTable | None = None
    lease_ttl_ms: int | None = None


@dataclass(frozen=True, slots=True)
class InstanceSection:
    """``[instance]`` (control/instance/settings.py)."""

    ROLE: ClassVar[str] = "instance"
    pc: str | Sequence[str] | None = None  # one PC, or every PC of an active/standby group
    index: str | Sequence[str] | None = None  # one IS, or several to fail over between
    engine: str | None = None
    descriptors: Sequence[str] | None = None
    scope_keys: Mapping[str, str] | None = None  # Scope ID (hex) -> key file
    replicate_to: Sequence[str] | None = None
    peers: Sequence[str] | None = None
    idle_for_s: float | None = None
    links: Sequence[HolderLink] | None = None
    moqt_relay: str | None = None
    layerwise: bool | str | None = None
    moqt_fetch: bool | None = None
    publish_live: bool | None = None
    vocab_size: int | None = None
    status_ttl_ms: int | None = None
    max_sessions: int | None = None
    batch_size: int | None = None
    max_tokens_limit: int | None = None
    default_resume_max_tokens: int | None = None
    release_batch: int | None = None
    checkpoint_every: int | None = None
    max_unreleased: int | None = None
    kv_capacity_tokens: int | None = None
    pc_timeout_ms: int | None = None
    load_timeout_ms: int | None = None
    final_ack_timeout_ms: int | None = None
    finished_retention_ms: int | None = None
    prefetch_concurrency: int | None = None
    memory_blocks_octets: int | None = None
    max_maps: int | None = None
    test_prefill_us_per_token: int | None = None
    test_decode_us_per_token: int | None = None
    moqt_object_timeout_ms: int | None = None
    moqt_drafts: Sequence[int] | None = None
    fetch_concurrency: int | None = None
    hf_chunk_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class RelaySection:
    """``[relay]`` (relay/settings.py)."""

    ROLE: ClassVar[str] = "relay"
    listen: str | None = None
    uri: str | None = None
    upstream: Sequence[str] | None = None
    peers: Sequence[str] | None = None
    open_prefixes: Sequence[str] | None = None
    cache_octets: int | None = None
    cache_ttl_s: float | None = None
    subscriber_buffer_octets: int | None = None
    token_keys: Sequence[str] | None = None
    drain_s: float | None = None
    upstream_timeout_s: float | None = None
    upstream_stall_s: float | None = None
    idle_timeout_s: float | None = None
    liveness_timeout_s: float | None = None
    max_connections_per_client: int | None = None
    max_datagram_size: int | None = None
    drafts: Sequence[int] | None = None


@dataclass(frozen=True, slots=True)
class PublicTls:
    cert: str
    key: str


@dataclass(frozen=True, slots=True)
class FrontendSection:
    """``[frontend]`` (control/frontend/settings.py)."""

    ROLE: ClassVar[str] = "frontend"
    pc: str | Sequence[str] | None = None  # one PC, or every PC of an active/standby group
    listen: str | None = None
    public_tls: PublicTls | None = None
    model: str | None = None
    descriptor: str | None = None
    tokenizer: str | None = None
    tenants: Mapping[str, str] | None = None  # tenant -> Scope ID (hex)
    api_keys: Mapping[str, str] | None = None  # tenant -> key file
    anonymous_tenant: str | None = None
    max_prompt_tokens: int | None = None
    max_tokens_limit: int | None = None
    max_concurrent: int | None = None
    body_limit_octets: int | None = None
    stall_ms: int | None = None
    request_timeout_ms: int | None = None
    stranded_retry_ms: int | None = None
    max_concurrent_per_tenant: int | None = None
    max_concurrent_per_client: int | None = None
    max_connections_per_client: int | None = None  # the public listener's


@dataclass(frozen=True, slots=True)
class MoqtSection:
    """``[moqt]`` (kvsp/service/moqt_config.py): the QUIC back-end of the process and its token file."""

    ROLE: ClassVar[str] = "moqt"
    quic: str | None = None
    token: str | None = None


Section = IndexSection | HolderSection | PcSection | InstanceSection | RelaySection | FrontendSection | MoqtSection
SECTIONS: tuple[type[Section], ...] = (IndexSection, HolderSection, PcSection, InstanceSection, RelaySection,
                                       FrontendSection)


# -- the role file ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ServerLimits:
    """The listener keys of ``[server]`` (kvsp/service/config.py `ListenerLimits`)."""

    handshake_timeout_ms: int | None = None
    header_timeout_ms: int | None = None
    body_timeout_ms: int | None = None
    body_min_octets_per_s: int | None = None
    idle_timeout_ms: int | None = None
    send_timeout_ms: int | None = None
    max_connections_per_client: int | None = None


@dataclass(frozen=True, slots=True)
class Tls:
    cert: str
    key: str
    ca: str

    @classmethod
    def of(cls, name: str, folder: str | Path = "") -> Tls:
        """The files `kvsp.pki.make_dev_pki` writes for ``name``, in ``folder`` (relative to the config)."""
        prefix = f"{folder}/" if str(folder) else ""
        return cls(f"{prefix}{name}.pem", f"{prefix}{name}.key", f"{prefix}ca.pem")


@dataclass(frozen=True, slots=True)
class RoleFile:
    """One ``kvsp serve`` configuration: the head and one table per role that has settings."""

    roles: Sequence[str]
    base_uri: str
    tls: Tls | None = None
    policy: str | None = None  # the policy file, relative to the configuration's folder
    listen: str | None = None  # [server] listen; default: the base URI's host and port
    sections: Sequence[Section] = ()
    limits: ServerLimits | None = None  # the [server] listener keys

    def render(self) -> str:
        head = f"roles = {toml_value(list(self.roles))}\n"
        if self.policy is not None:
            head += f"policy = {toml_value(self.policy)}\n"
        server: dict[str, TomlValue] = {"base_uri": self.base_uri}
        if self.listen is not None:
            server["listen"] = self.listen
        if self.limits is not None:
            server.update(_members(self.limits))
        out = head + toml_table("server", server)
        if self.tls is not None:
            out += toml_table("tls", _members(self.tls))
        return out + "".join(toml_table(s.ROLE, _members(s)) for s in self.sections)

    def write(self, path: Path) -> Path:
        path.write_text(self.render())
        return path


# -- the policy -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ScopeEntry:
    """One ``[[scope]]`` of the policy: who may look up, read and store in the scope ``id`` (hex)."""

    id: str
    lookup: Sequence[str] = ()
    read: Sequence[str] = ()
    store: Sequence[str] = ()

    @classmethod
    def open_to(cls, scope_id: bytes, members: Sequence[str]) -> ScopeEntry:
        """Every right in the scope for ``members``."""
        return cls(scope_id.hex(), tuple(members), tuple(members), tuple(members))


@dataclass(frozen=True, slots=True)
class PolicyFile:
    """The policy (D2): the PC, the instances, the scopes, publish-for delegations and quotas."""

    pc: str | None = None
    instances: Sequence[str] | None = None
    scopes: Sequence[ScopeEntry] = ()
    publish_for: Mapping[str, Sequence[str]] | None = None
    quotas: Mapping[str, int] | None = None

    def render(self) -> str:
        out = "".join(f"{k} = {toml_value(v)}\n" for k, v in (("pc", self.pc), ("instances", self.instances))
                      if v is not None)
        for scope in self.scopes:
            out += "\n[[scope]]\n" + "".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in _members(scope).items())
        if self.publish_for is not None:
            out += toml_table("publish_for", self.publish_for)
        if self.quotas is not None:
            out += toml_table("quotas", self.quotas)
        return out

    def write(self, path: Path) -> Path:
        path.write_text(self.render())
        return path
