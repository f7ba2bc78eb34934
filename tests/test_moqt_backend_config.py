"""``[moqt]`` of a role configuration (the QUIC back-end and the role's token), what each role demands of it
on picoquic, and the development tokens of ``kvsp certs --moqt-tokens`` (issue 19 items 1 and 2)."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from control.cli import main as cli_main
from control.holder.settings import HolderSettings
from kvsp.errors import ValidationError
from kvsp.identifiers import TrackNamespace
from kvsp.moqt_binding import kvsp_token_rule
from kvsp.pki import MOQT_ISSUER_PUB, RoleSpec, make_dev_moqt_tokens
from kvsp.service.config import RoleConfig, ServerConfig
from kvsp.service.moqt_config import MoqtConfig, read_moqt
from kvsp.service.policy import Policy
from kvsp.service.tokens import load_token_key
from moqt.auth import MAX_TOKEN_OCTETS, verify_token
from relay.settings import RelaySettings

SERVER = ServerConfig("https://127.0.0.1:7443/h/", "127.0.0.1", 7443)
HOLDER_MOQT: dict[str, object] = {"moqt_listen": "127.0.0.1:4433", "moqt_uri": "moqt://127.0.0.1:4433/holder"}
RELAY: dict[str, object] = {"listen": "127.0.0.1:4443", "uri": "moqt://127.0.0.1:4443/relay"}
PICO = MoqtConfig("picoquic")  # built directly: on Python 3.11 the table itself refuses picoquic


def role(roles: tuple[str, ...], tmp: Path, section: Mapping[str, object], moqt: MoqtConfig) -> RoleConfig:
    return RoleConfig(roles, SERVER, None, Policy(), tmp, {roles[0]: dict(section)}, moqt)


def test_the_table_defaults_to_aioquic_and_resolves_the_token_path(tmp_path: Path) -> None:
    assert read_moqt(None, tmp_path) == MoqtConfig()
    assert RoleConfig.from_mapping({"roles": ["relay"], "server": {"base_uri": SERVER.base_uri}}, tmp_path).moqt \
        == MoqtConfig("aioquic", None)
    got = read_moqt({"quic": "aioquic", "token": "pki/r.moqt-token"}, tmp_path)
    assert got == MoqtConfig("aioquic", tmp_path / "pki" / "r.moqt-token")


def test_bad_values_are_refused_naming_the_member(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"moqt\.tls.*unknown key"):
        read_moqt({"tls": 1}, tmp_path)
    with pytest.raises(ValidationError, match=r"moqt\.quic.*back-ends are aioquic, picoquic"):
        read_moqt({"quic": "msquic"}, tmp_path)
    with pytest.raises(ValidationError, match="moqt"):
        read_moqt("picoquic", tmp_path)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="picoquic is allowed on Python >= 3.12")
def test_picoquic_on_python_3_11_is_refused_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValidationError, match=r"moqt\.quic.*needs Python >= 3\.12"):
        read_moqt({"quic": "picoquic"}, tmp_path)
    config = tmp_path / "relay.toml"
    config.write_text(f'roles = ["relay"]\n[server]\nbase_uri = "{SERVER.base_uri}"\n[moqt]\nquic = "picoquic"\n')
    assert cli_main(["serve", "relay", "--config", str(config)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs Python >= 3.12" in err[0], err


def test_the_token_is_read_at_each_call_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "r.moqt-token"
    moqt = MoqtConfig("aioquic", path)
    with pytest.raises(ValidationError, match="cannot read"):
        moqt.token()
    path.write_bytes(b"first")
    source = moqt.token_source("the relay")
    assert source is not None and source() == b"first"
    path.write_bytes(b"rotated")  # a token replaced on disk is what the next connection presents
    assert source() == b"rotated"
    path.write_bytes(b"x" * (MAX_TOKEN_OCTETS + 1))
    with pytest.raises(ValidationError, match=r"1\.\.8192 octets"):
        source()
    assert MoqtConfig().token_source("anyone") is None  # aioquic without a token: the certificate


def test_a_picoquic_client_needs_a_token() -> None:
    with pytest.raises(ValidationError, match=r"moqt\.token.*presents no client certificate"):
        PICO.token_source("instance.moqt_fetch")


def test_a_picoquic_holder_needs_token_keys_and_a_token_for_its_relay(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"holder\.moqt_token_keys.*sees no client certificates"):
        HolderSettings.from_config(role(("holder",), tmp_path, dict(HOLDER_MOQT), PICO))
    keyed = {**HOLDER_MOQT, "moqt_token_keys": ["issuer.pub.pem"]}
    assert HolderSettings.from_config(role(("holder",), tmp_path, keyed, PICO)).moqt is not None
    with pytest.raises(ValidationError, match=r"moqt\.token.*moqt_relay"):
        HolderSettings.from_config(role(("holder",), tmp_path, {**keyed, "moqt_relay": RELAY["uri"]}, PICO))
    tokened = MoqtConfig("picoquic", tmp_path / "h.moqt-token")
    assert HolderSettings.from_config(role(("holder",), tmp_path, {**keyed, "moqt_relay": RELAY["uri"]}, tokened))


def test_a_picoquic_relay_needs_token_keys_and_a_token_for_its_upstreams(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"relay\.token_keys"):
        RelaySettings.from_config(role(("relay",), tmp_path, dict(RELAY), PICO))
    keyed = {**RELAY, "token_keys": ["issuer.pub.pem"]}
    assert RelaySettings.from_config(role(("relay",), tmp_path, keyed, PICO)).backend == "picoquic"
    upstream = {**keyed, "upstream": ["moqt://127.0.0.1:4444/spine"]}
    with pytest.raises(ValidationError, match=r"moqt\.token.*upstream"):
        RelaySettings.from_config(role(("relay",), tmp_path, upstream, PICO))
    settings = RelaySettings.from_config(role(("relay",), tmp_path, upstream, MoqtConfig("picoquic", tmp_path / "t")))
    assert settings.backend == "picoquic"
    if sys.version_info >= (3, 12):
        assert settings.quic.quic == "picoquic"  # both legs: the listener and the upstream links share it
    assert RelaySettings.from_config(role(("relay",), tmp_path, dict(RELAY), MoqtConfig())).quic.quic == "aioquic"


def test_dev_tokens_name_the_role_cover_kvsp_namespaces_and_verify(tmp_path: Path) -> None:
    roles = [RoleSpec("relay", "https://127.0.0.1:7444/relay/"), RoleSpec("ii1", "https://127.0.0.1:7445/ii1/")]
    paths = make_dev_moqt_tokens(tmp_path, roles)
    assert [p.name for p in paths] == ["relay.moqt-token", "ii1.moqt-token"]
    assert all(p.stat().st_mode & 0o077 == 0 for p in paths)  # bearer secrets: owner only
    issuer = load_token_key(tmp_path / MOQT_ISSUER_PUB)
    claims = verify_token(paths[1].read_bytes(), [issuer], time.time())
    assert claims.subject == "https://127.0.0.1:7445/ii1/"
    block = TrackNamespace(b"\x01" * 32, b"\x02" * 16, "h1", b"\x03" * 32).fields()
    assert kvsp_token_rule(claims, block)  # what it may read is then its identity's policy
    assert not kvsp_token_rule(claims, (b"other", b"x"))
    make_dev_moqt_tokens(tmp_path, roles[:1])  # the issuer is reused: earlier tokens stay valid
    assert verify_token(paths[1].read_bytes(), [load_token_key(tmp_path / MOQT_ISSUER_PUB)], time.time())
