"""The ``[pc]`` configuration table and how ``setup`` wires the PC alone or combined with the IS."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from control.index.app import STATUS_BOARD
from control.pc.app import PC
from control.pc.settings import PcSettings
from control.serve import build_app
from kvsp.errors import ValidationError
from kvsp.service.config import RoleConfig
from tests.support.vectors import APPENDIX_A_COMPAT_ID, APPENDIX_A_SCOPE_ID, APPENDIX_A_SCOPE_KEY, VECTORS

BASE = "https://127.0.0.1:7401/pc/"


def config(tmp_path: Path, pc: dict[str, object], roles: tuple[str, ...] = ("pc",)) -> RoleConfig:
    doc: dict[str, object] = {"roles": list(roles), "server": {"base_uri": BASE}, "pc": pc}
    return RoleConfig.from_mapping(doc, tmp_path)


def test_defaults(tmp_path: Path) -> None:
    settings = PcSettings.from_config(config(tmp_path, {}))
    assert settings.index is None and settings.min_active == 1 and settings.instances is None
    assert settings.deterministic_methods == frozenset({"greedy"})
    assert settings.check_interval_s == 0.25 and settings.call_timeout_s == 5.0
    # Combined with the IS, the PC looks up at itself.
    assert PcSettings.from_config(config(tmp_path, {}, ("pc", "is"))).index == BASE


def test_keys_and_descriptors_are_loaded(tmp_path: Path) -> None:
    (tmp_path / "scope.key").write_text(APPENDIX_A_SCOPE_KEY.hex() + "\n")
    settings = PcSettings.from_config(config(tmp_path, {
        "index": "https://is.example/kvsp/", "scope_keys": {APPENDIX_A_SCOPE_ID: "scope.key"},
        "descriptors": [str(VECTORS / "appendix_a_descriptor.json")], "min_active": 0, "mean_service_ms": 1.5,
        "operators": ["https://ops.example/"], "instances": ["https://ii1.example/"],
        "deterministic_methods": ["greedy", "top-p"]}))
    scope = bytes.fromhex(APPENDIX_A_SCOPE_ID)
    assert settings.scope_keys[scope].scope_id == scope
    assert list(settings.descriptors) == [bytes.fromhex(APPENDIX_A_COMPAT_ID)]
    assert settings.instances == frozenset({"https://ii1.example/"}) and settings.mean_service_ms == 1.5


@pytest.mark.parametrize(("pc", "member"), [
    ({"colour": "blue"}, "pc.colour"),
    ({"min_active": -1}, "pc.min_active"),
    ({"status_check_interval_ms": 0}, "pc.status_check_interval_ms"),
    ({"index": "http://is.example/"}, "pc.index"),
    ({"operators": ["not a uri"]}, "pc.operators[0]"),
    ({"descriptors": ["missing.json"]}, "pc.descriptors[0]"),
    ({"scope_keys": {APPENDIX_A_SCOPE_ID: "missing.key"}}, f"pc.scope_keys.{APPENDIX_A_SCOPE_ID}"),
    ({"scope_keys": {"00" * 16: "scope.key"}}, f"pc.scope_keys.{'00' * 16}"),
    ({"scope_keys": {APPENDIX_A_SCOPE_ID: "short.key"}}, f"pc.scope_keys.{APPENDIX_A_SCOPE_ID}"),
    ({"scope_keys": ["scope.key"]}, "pc.scope_keys"),
], ids=["unknown", "min-active", "interval", "index", "operator", "descriptor", "key-file", "key-scope",
        "key-short", "keys-type"])
def test_bad_settings_name_the_member(tmp_path: Path, pc: dict[str, object], member: str) -> None:
    (tmp_path / "scope.key").write_text(APPENDIX_A_SCOPE_KEY.hex())
    (tmp_path / "short.key").write_text("00ff")
    with pytest.raises(ValidationError) as info:
        PcSettings.from_config(config(tmp_path, pc))
    assert info.value.member == member
    assert APPENDIX_A_SCOPE_KEY.hex() not in str(info.value)  # a Scope Key never appears in an error


def _status_routes(app: web.Application) -> list[str]:
    return [r.method for r in app.router.routes()
            if r.resource is not None and r.resource.canonical == "/pc/instances/{instance_id}/status"]


def test_pc_alone_and_combined_with_the_is(tmp_path: Path) -> None:
    alone = build_app(config(tmp_path, {}))
    assert alone[PC].board is None and alone[PC].settings.index is None
    assert _status_routes(alone) == ["PUT"]
    combined = build_app(config(tmp_path, {}, ("pc", "is")))
    assert combined[PC].board is not None and _status_routes(combined) == ["PUT"]  # the PC's, not the IS's
    reversed_order = build_app(config(tmp_path, {}, ("is", "pc")))
    assert reversed_order[PC].board is reversed_order[STATUS_BOARD]
