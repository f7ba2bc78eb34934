"""examples/two-rack: setup.sh makes the PKI, keys and Scope IDs, and every role accepts its config."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from cryptography import x509

from control.deploy.environment import child_env
from control.frontend.settings import FrontendSettings
from control.holder.settings import HolderSettings
from control.index.settings import IndexSettings
from control.instance.settings import InstanceSettings
from control.pc.settings import PcSettings
from control.up.layout import bytes_model_descriptor
from kvsp.service.config import RoleConfig
from relay.settings import RelaySettings

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "two-rack"
READERS: dict[str, Callable[[RoleConfig], object]] = {
    "is": lambda c: IndexSettings.from_section(c.section("is"), c.base_dir), "pc": PcSettings.from_config,
    "holder": HolderSettings.from_config, "relay": RelaySettings.from_config, "instance": InstanceSettings.from_config,
    "frontend": FrontendSettings.from_config}


def fake_model(folder: Path) -> None:
    """What the configs check of the model without loading it (the engine loads it at start-up)."""
    from tokenizers import Tokenizer, models  # noqa: PLC0415

    folder.mkdir()
    (folder / "config.json").write_text("{}")
    Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]")).save(str(folder / "tokenizer.json"))


def test_setup_and_every_config_of_the_two_rack_example(tmp_path: Path) -> None:
    work = tmp_path / "two-rack"
    shutil.copytree(EXAMPLE, work)
    descriptor = tmp_path / "descriptor.json"
    descriptor.write_text(json.dumps(bytes_model_descriptor().to_json()))
    fake_model(work / "model")
    env = {**child_env(), "KVSP": "python3 -m control.cli", "MODEL_JSON": str(descriptor)}
    done = subprocess.run(["sh", str(work / "setup.sh")], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    configs = sorted(work.glob("*.toml")) + sorted(work.glob("rack-*/*.toml"))
    seen_roles: set[str] = set()
    names = []
    for path in configs:
        if path.name == "policy.toml":
            continue
        assert "@SCOPE_ID" not in path.read_text()
        config = RoleConfig.load(path)
        assert config.tls is not None
        cert = x509.load_pem_x509_certificate(config.tls.cert.read_bytes())
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert config.server.base_uri in uris.get_values_for_type(x509.UniformResourceIdentifier)
        for role in config.roles:
            READERS[role](config)
            seen_roles.add(role)
        names.append(path.stem)
    assert seen_roles == set(READERS)
    assert sorted(names) == sorted(["pc", "fe", "holder-a", "relay-a", "ii-a1", "ii-a2", "holder-b", "relay-b",
                                    "ii-b1", "ii-b2"])
    assert (work / "keys" / "public.scope.key").stat().st_mode & 0o077 == 0
