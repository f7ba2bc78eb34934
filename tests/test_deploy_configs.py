"""control.deploy.configs: every role table, with every key its loader knows, round-trips through that loader.

Each section is written with all of its fields set, read back by `RoleConfig.load` (the table must equal
what was written) and validated by the role's own settings class; the set of fields must equal the loader's
``KNOWN_KEYS``, so a key added to a role and not to its writer (or the reverse) fails here.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from control.deploy.configs import (
    SECTIONS,
    FrontendSection,
    HolderLink,
    HolderSection,
    IndexSection,
    InstanceSection,
    PcSection,
    PolicyFile,
    PublicTls,
    RedisTable,
    RelaySection,
    RoleFile,
    ScopeEntry,
    Section,
    Tls,
    toml_value,
)
from control.deploy.fixtures import DESCRIPTOR, SCOPE, SCOPE_KEY
from control.frontend import settings as frontend_settings
from control.holder import settings as holder_settings
from control.index import settings as index_settings
from control.instance import settings as instance_settings
from control.pc import settings as pc_settings
from kvsp.service.config import RoleConfig
from kvsp.service.policy import Policy, Quotas
from relay import settings as relay_settings

PC = "https://127.0.0.1:7401/pc/"
II = "https://127.0.0.1:7402/ii1/"
H1 = "https://127.0.0.1:7403/h1/"
KNOWN = {"is": index_settings.KNOWN_KEYS, "holder": holder_settings.KNOWN_KEYS, "pc": pc_settings.KNOWN_KEYS,
         "instance": instance_settings.KNOWN_KEYS, "relay": relay_settings.KNOWN_KEYS,
         "frontend": frontend_settings.KNOWN_KEYS}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "model.json").write_text(json.dumps(DESCRIPTOR.to_json()))
    (tmp_path / "scope.key").write_text(SCOPE_KEY.secret().hex())
    (tmp_path / "acme.apikey").write_text("sk-kvsp-0123456789abcdef0123456789abcdef\n")
    public = ec.generate_private_key(ec.SECP256R1()).public_key()
    (tmp_path / "issuer.pub.pem").write_bytes(public.public_bytes(serialization.Encoding.PEM,
                                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    PolicyFile(PC, [II], [ScopeEntry.open_to(SCOPE, [PC, II, H1])], {II: [H1]},
               {"keys_per_lookup": 128}).write(tmp_path / "policy.toml")
    return tmp_path


def full_sections() -> list[Section]:
    """One of each table, every field set to a value its loader accepts (and none left at its default)."""
    moqt = "moqt://127.0.0.1:4433/h1"
    return [
        IndexSection(sweep_interval_s=5.0, sweep_batch=500, max_replicas=1000, block_tokens=4,
                     descriptors=["model.json"], backend="redis", redis=RedisTable(url="redis://127.0.0.1:6379/0")),
        HolderSection(index=PC, descriptors=["model.json"], replica_ttl_ms=30_000, retention_ms=60_000,
                      host_capacity_octets=1 << 20, storage_dir="blocks", storage_capacity_octets=1 << 24,
                      encryption_key_file="storage.key", verify_stored=False, withdraw_timeout_ms=500,
                      moqt_listen="127.0.0.1:4433", moqt_uri=moqt, moqt_token_keys=["issuer.pub.pem"],
                      moqt_relay="moqt://127.0.0.1:4443/relay", moqt_max_datagram_size=1400, torch_tiers=False,
                      moqt_max_connections_per_client=8, moqt_drafts=[14],
                      device_capacity_octets=0, device="cpu", fast_layers=1),
        PcSection(index=PC, scope_keys={SCOPE.hex(): "scope.key"}, descriptors=["model.json"], min_active=2,
                  status_check_interval_ms=100, mean_service_ms=1.5, call_timeout_ms=2000, resume_timeout_ms=20_000,
                  reshard_deadline_ms=1000, operators=["https://ops.example/"], instances=[II],
                  deterministic_methods=["greedy"], backend="redis",
                  redis=RedisTable("redis://127.0.0.1:6379/0", cluster=False, timeout_ms=300, key_prefix="t:"),
                  lease_ttl_ms=1500),
        InstanceSection(pc=PC, index=PC, engine="test", descriptors=["model.json"],
                        scope_keys={SCOPE.hex(): "scope.key"}, replicate_to=[H1], peers=[H1], idle_for_s=10.0,
                        links=[HolderLink(H1, 1000.0, 50)], moqt_relay="moqt://127.0.0.1:4443/relay",
                        layerwise=True, moqt_fetch=True, publish_live=True, vocab_size=97, status_ttl_ms=1500,
                        max_sessions=8, batch_size=4, max_tokens_limit=1024, default_resume_max_tokens=512,
                        release_batch=2, checkpoint_every=16, max_unreleased=32, kv_capacity_tokens=4096,
                        pc_timeout_ms=1000, load_timeout_ms=2000, final_ack_timeout_ms=3000,
                        finished_retention_ms=4000, prefetch_concurrency=2, memory_blocks_octets=1 << 20,
                        max_maps=4, test_prefill_us_per_token=10, test_decode_us_per_token=20,
                        moqt_object_timeout_ms=5000, fetch_concurrency=3, hf_chunk_tokens=4, moqt_drafts=[16]),
        RelaySection(listen="127.0.0.1:4443", uri="moqt://127.0.0.1:4443/relay",
                     upstream=["moqt://127.0.0.1:4444/spine"], peers=[H1], open_prefixes=["interop"],
                     cache_octets=1 << 20, cache_ttl_s=30.0, subscriber_buffer_octets=1 << 16,
                     token_keys=["issuer.pub.pem"], drain_s=1.0, upstream_timeout_s=10.0, idle_timeout_s=5.0,
                     upstream_stall_s=0.25, liveness_timeout_s=1.5, max_connections_per_client=8,
                     max_datagram_size=1400, drafts=[16]),
        FrontendSection(pc=PC, listen="127.0.0.1:8000", public_tls=PublicTls("fe-public.pem", "fe-public.key"),
                        model="kvsp-test", descriptor="model.json", tokenizer="bytes", tenants={"acme": SCOPE.hex()},
                        api_keys={"acme": "acme.apikey"}, anonymous_tenant="acme", max_prompt_tokens=100,
                        max_tokens_limit=50, max_concurrent=3, body_limit_octets=4096, stall_ms=200,
                        request_timeout_ms=9000, stranded_retry_ms=700, max_concurrent_per_tenant=2,
                        max_concurrent_per_client=1, max_connections_per_client=32),
    ]


def test_every_role_has_a_section_with_exactly_its_known_keys() -> None:
    assert {cls.ROLE for cls in SECTIONS} == set(KNOWN)
    for cls in SECTIONS:
        assert {f.name for f in dataclasses.fields(cls)} == set(KNOWN[cls.ROLE]), cls.__name__


@pytest.mark.parametrize("section", full_sections(), ids=lambda s: s.ROLE)
def test_section_round_trips_through_the_role_loader(folder: Path, section: Section) -> None:
    if isinstance(section, FrontendSection):  # the public certificate must exist
        for name in ("fe-public.pem", "fe-public.key"):
            (folder / name).write_text("")
    written = {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}
    assert all(v is not None for v in written.values()), "full_sections() leaves a field unset"
    path = RoleFile([section.ROLE], H1, Tls.of("h1", "pki"), "policy.toml", "127.0.0.1:9443", [section]).write(
        folder / f"{section.ROLE}.toml")
    config = RoleConfig.load(path)
    assert config.roles == (section.ROLE,) and config.server.base_uri == H1 and config.server.port == 9443
    assert config.tls is not None and config.tls.cert == folder / "pki" / "h1.pem"
    assert dict(config.section(section.ROLE)) == tomllib.loads(f"v = {toml_value(written)}")["v"]
    loaders = {"is": lambda c: index_settings.IndexSettings.from_section(c.section("is"), c.base_dir),
               "holder": holder_settings.HolderSettings.from_config, "pc": pc_settings.PcSettings.from_config,
               "instance": instance_settings.InstanceSettings.from_config,
               "relay": relay_settings.RelaySettings.from_config,
               "frontend": frontend_settings.FrontendSettings.from_config}
    loaded = loaders[section.ROLE](config)  # the role's own validation accepts every key and value
    assert type(loaded).__name__.endswith("Settings")


def test_values_arrive_as_written(folder: Path) -> None:
    sections = {s.ROLE: s for s in full_sections()}
    holder = HolderSection(index=PC, descriptors=["model.json"], replica_ttl_ms=30_000, storage_dir="blocks")
    instance = sections["instance"]
    path = RoleFile(["instance", "holder"], II, None, "policy.toml", sections=[holder, instance]).write(
        folder / "ii1.toml")
    config = RoleConfig.load(path)
    h = holder_settings.HolderSettings.from_config(config)
    assert (h.index, h.replica_ttl_ms, h.storage_dir) == (PC, 30_000, folder / "blocks")
    ii = instance_settings.InstanceSettings.from_config(config)
    assert (ii.limits.vocab_size, ii.limits.fetch_concurrency, ii.replicate_to) == (97, 3, (H1,))
    assert ii.layerwise is instance_settings.Layerwise.ON and ii.moqt_fetch and ii.links[0].holder == H1
    assert ii.scope_keys[SCOPE].secret() == SCOPE_KEY.secret()


def test_policy_round_trips(folder: Path) -> None:
    policy = Policy.load(folder / "policy.toml")
    assert policy.pc == PC and policy.instances == frozenset({II})
    assert policy.scopes[SCOPE].read == frozenset({PC, II, H1})
    assert policy.publish_for == {II: frozenset({H1})}
    assert policy.quotas == dataclasses.replace(Quotas(), keys_per_lookup=128)


def test_unset_fields_are_not_written() -> None:
    text = RoleFile(["holder"], H1, sections=[HolderSection(index=PC)]).render()
    assert tomllib.loads(text) == {"roles": ["holder"], "server": {"base_uri": H1}, "holder": {"index": PC}}
