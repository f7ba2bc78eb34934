"""The kvsp command line, through a subprocess: output formats are a contract."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from control import serve
from control.deploy.configs import RoleFile, Tls
from kvsp.service.config import KNOWN_ROLES
from tests.support.vectors import (
    APPENDIX_A_COMPAT_ID,
    APPENDIX_A_K0,
    APPENDIX_A_K1,
    APPENDIX_A_SCOPE_ID,
    APPENDIX_A_TOKENS,
    VECTORS,
)

DESCRIPTOR = str(VECTORS / "appendix_a_descriptor.json")
SCOPE_KEY = bytes(range(32)).hex()


def kvsp(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "control.cli", *args], input=stdin.decode(),
                          capture_output=True, text=True, timeout=60, check=False)


def assert_one_line_error(result: subprocess.CompletedProcess[str], words: str = "") -> None:
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert words in lines[0]


def test_compat_id_file() -> None:
    result = kvsp("compat-id", DESCRIPTOR)
    assert result.returncode == 0 and result.stdout == APPENDIX_A_COMPAT_ID + "\n"


def test_compat_id_stdin() -> None:
    result = kvsp("compat-id", "-", stdin=Path(DESCRIPTOR).read_bytes())
    assert result.stdout == APPENDIX_A_COMPAT_ID + "\n"


def test_block_keys_inline() -> None:
    result = kvsp("block-keys", "--descriptor", DESCRIPTOR, "--scope-key", SCOPE_KEY,
                  "--tokens", ",".join(map(str, APPENDIX_A_TOKENS)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1
    assert json.loads(result.stdout) == {"compat_id": APPENDIX_A_COMPAT_ID, "scope_id": APPENDIX_A_SCOPE_ID,
                                         "block_keys": [APPENDIX_A_K0, APPENDIX_A_K1]}


def test_block_keys_tokens_file_mixed_separators(tmp_path: Path) -> None:
    f = tmp_path / "tokens.txt"
    f.write_text("128000, 791 6460\n374,264\t1296 ,315\n279 7\n")
    result = kvsp("block-keys", "--descriptor", DESCRIPTOR, "--scope-key", SCOPE_KEY, "--tokens-file", str(f))
    assert json.loads(result.stdout)["block_keys"] == [APPENDIX_A_K0, APPENDIX_A_K1]


@pytest.mark.parametrize("args,words", [
    (["compat-id", "/nonexistent/file"], "/nonexistent/file"),
    (["compat-id"], "file"),
    (["nonsense"], "invalid choice"),
    (["block-keys", "--descriptor", DESCRIPTOR, "--scope-key", "00" * 16, "--tokens", "1"], "32 octets"),
    (["block-keys", "--descriptor", DESCRIPTOR, "--scope-key", "xyz" * 30, "--tokens", "1"], "hex"),
    (["block-keys", "--descriptor", DESCRIPTOR, "--scope-key", SCOPE_KEY, "--tokens", "1,,2"], "item 2"),
    (["block-keys", "--descriptor", DESCRIPTOR, "--scope-key", SCOPE_KEY, "--tokens", "1,-2"], "item 2"),
    (["block-keys", "--descriptor", DESCRIPTOR, "--scope-key", SCOPE_KEY, "--tokens", "4294967296"], "token"),
    (["block-keys", "--descriptor", DESCRIPTOR, "--scope-key", SCOPE_KEY], "required"),
    (["container", "inspect", "/nonexistent"], "/nonexistent"),
    (["certs", "/tmp/x"], "--role"),
])
def test_invalid_input_is_one_line(args: list[str], words: str) -> None:
    assert_one_line_error(kvsp(*args), words)


def test_scope_key_never_printed_on_error() -> None:
    secret = "ab" * 31 + "zz"
    result = kvsp("block-keys", "--descriptor", DESCRIPTOR, "--scope-key", secret, "--tokens", "1")
    assert_one_line_error(result)
    assert secret not in result.stderr


def test_invalid_descriptor_names_member(tmp_path: Path) -> None:
    doc = json.loads(Path(DESCRIPTOR).read_text())
    doc["adapters"] = []
    f = tmp_path / "d.json"
    f.write_text(json.dumps(doc))
    assert_one_line_error(kvsp("compat-id", str(f)), "adapters")


def handmade_container(first: int, layers: list[tuple[bytes, bytes]], tokens: int) -> bytes:
    """Section 4.3 written out with struct, independently of kvsp.container."""
    head = b"KVB1" + struct.pack("!BBHIII", 1, 0, 1, first, len(layers), tokens)
    table = b"".join(struct.pack("!QQ", len(k), len(v)) for k, v in layers)
    return head + table + b"".join(k + v for k, v in layers)


def test_container_inspect(tmp_path: Path) -> None:
    layers = [(bytes([i]) * 64, bytes([i + 100]) * 64) for i in range(3)]
    f = tmp_path / "block.kvb"
    f.write_bytes(handmade_container(5, layers, 2))
    result = kvsp("container", "inspect", str(f))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    digests = [hashlib.sha256(k + v).digest() for k, v in layers]
    assert out == {
        "version": 1, "flags": 0, "codec": 1, "first_layer": 5, "layer_count": 3, "token_count": 2,
        "layers": [{"layer": 5 + i, "k_length": 64, "v_length": 64, "digest": d.hex()}
                   for i, d in enumerate(digests)],
        "digest": "sha-256:" + hashlib.sha256(b"".join(digests)).hexdigest(),
    }


@pytest.mark.parametrize("mangle", [
    lambda b: b"XVB1" + b[4:], lambda b: b[:30], lambda b: b + b"x", lambda b: b"", lambda b: b[:4] + b"\x02" + b[5:],
])
def test_container_inspect_invalid(tmp_path: Path, mangle: object) -> None:
    f = tmp_path / "bad.kvb"
    good = handmade_container(0, [(b"k" * 8, b"v" * 8)], 1)
    f.write_bytes(mangle(good))  # type: ignore[operator]
    assert_one_line_error(kvsp("container", "inspect", str(f)))


def test_certs(tmp_path: Path) -> None:
    result = kvsp("certs", str(tmp_path / "pki"), "--role", "is=https://127.0.0.1:8443/", "--role",
                  "h1=https://127.0.0.1:9443/")
    assert result.returncode == 0, result.stderr
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert [r[:2] for r in rows] == [["is", "https://127.0.0.1:8443/"], ["h1", "https://127.0.0.1:9443/"]]
    assert all(Path(r[2]).exists() and Path(r[3]).exists() for r in rows)


def test_demo_walkthrough_runs(tmp_path: Path) -> None:
    result = kvsp("demo", "--dir", str(tmp_path / "pki"))
    assert result.returncode == 0, result.stderr
    for step in range(1, 8):
        assert f"[{step}]" in result.stdout
    assert "chosen: https://127.0.0.1:7001/ii/" in result.stdout
    assert "3 of 4 blocks matched, 3 loaded and verified" in result.stdout
    assert (tmp_path / "pki" / "ca.pem").exists()


def test_serve_relay_without_its_table_is_one_line(tmp_path: Path) -> None:
    config = RoleFile(["relay"], "https://127.0.0.1:1/", Tls("a.pem", "a.key", "ca.pem")).write(tmp_path / "relay.toml")
    assert_one_line_error(kvsp("serve", "relay", "--config", str(config)), "relay.listen")


def test_every_known_role_has_a_module_with_a_setup() -> None:
    assert set(serve.ROLE_MODULES) == set(KNOWN_ROLES)
    for role, load in serve.ROLE_MODULES.items():
        assert callable(load().setup), role
