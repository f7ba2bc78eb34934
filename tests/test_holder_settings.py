"""The [holder] configuration table: defaults, paths, descriptors and refusal of bad values."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from control.holder.settings import DEFAULT_KEY_FILE, HolderSettings
from kvsp.errors import ValidationError
from kvsp.service.config import RoleConfig, ServerConfig
from kvsp.service.policy import Policy
from tests.support.holder import descriptor, write_descriptor


def config(tmp: Path, **holder: object) -> RoleConfig:
    return RoleConfig(("holder",), ServerConfig("https://127.0.0.1:7443/h/", "127.0.0.1", 7443), None, Policy(),
                      tmp, {"holder": holder})


MOQT = {"moqt_listen": "127.0.0.1:4433", "moqt_uri": "moqt://127.0.0.1:4433/holder"}


def test_moqt_drafts_pin_the_listener_newest_first(tmp_path: Path) -> None:
    every = HolderSettings.from_config(config(tmp_path, **MOQT)).moqt
    assert every is not None and every.drafts is None  # None: every draft this build speaks
    pinned = HolderSettings.from_config(config(tmp_path, **MOQT, moqt_drafts=[14, 16])).moqt
    assert pinned is not None and pinned.drafts == (16, 14)


def test_defaults(tmp_path: Path) -> None:
    s = HolderSettings.from_config(config(tmp_path))
    assert s.index is None and s.descriptors == {} and s.storage_dir is None and s.encryption_key_file is None
    assert (s.replica_ttl_ms, s.retention_ms, s.host_capacity_octets) == (120_000, 3_600_000, 1 << 30)
    assert s.verify_stored


def test_verify_stored_is_a_boolean(tmp_path: Path) -> None:
    assert not HolderSettings.from_config(config(tmp_path, verify_stored=False)).verify_stored
    with pytest.raises(ValidationError, match="verify_stored"):
        HolderSettings.from_config(config(tmp_path, verify_stored="no"))


def test_paths_resolve_against_the_config_folder(tmp_path: Path) -> None:
    d = descriptor()
    write_descriptor(d, tmp_path / "d.json")
    s = HolderSettings.from_config(config(tmp_path, descriptors=["d.json"], storage_dir="blocks",
                                          index="https://is.example/kvsp/", replica_ttl_ms=30_000))
    assert s.descriptors == {d.compat_id: d}
    assert s.storage_dir == tmp_path / "blocks" and s.encryption_key_file == tmp_path / DEFAULT_KEY_FILE
    assert s.index == "https://is.example/kvsp/" and s.replica_ttl_ms == 30_000


@pytest.mark.parametrize("holder,member", [
    ({"capacity": 1}, "holder.capacity"),
    ({"host_capacity_octets": 0}, "holder"),
    ({"host_capacity_octets": -1}, "holder.host_capacity_octets"),
    ({"replica_ttl_ms": "120000"}, "holder.replica_ttl_ms"),
    ({"index": "http://is.example/"}, "holder.index"),
    ({"descriptors": ["missing.json"]}, "holder.descriptors[0]"),
    ({"descriptors": [1]}, "holder.descriptors[0]"),
    ({"descriptors": "d.json"}, "holder.descriptors"),
    ({"moqt_drafts": [14]}, "holder.moqt_drafts"),  # without moqt_listen
    ({**MOQT, "moqt_drafts": [13]}, "holder.moqt_drafts"),
    ({**MOQT, "moqt_drafts": []}, "holder.moqt_drafts"),
    ({**MOQT, "moqt_drafts": ["16"]}, "holder.moqt_drafts[0]"),
    ({**MOQT, "moqt_drafts": 16}, "holder.moqt_drafts"),
])
def test_bad_values_are_refused_with_their_member(tmp_path: Path, holder: dict[str, object], member: str) -> None:
    with pytest.raises(ValidationError) as info:
        HolderSettings.from_config(config(tmp_path, **holder))
    assert info.value.member == member


def test_setup_generates_the_storage_key(tmp_path: Path) -> None:
    from control.holder.app import HOLDER  # noqa: PLC0415
    from control.serve import build_app  # noqa: PLC0415

    app = build_app(config(tmp_path, storage_dir="blocks", host_capacity_octets=0), allow_insecure=True)
    key_file = tmp_path / DEFAULT_KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and len(bytes.fromhex(key_file.read_text())) == 32
    holder = app[HOLDER]
    assert holder.host is None and holder.disk is not None and holder.store.tiers == (holder.disk.tier,)
