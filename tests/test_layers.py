"""Decision D9 is a checked contract: `lint-imports` (import-linter, contracts in pyproject.toml).

The contract must hold on this tree and must break on a planted violation of each kind: an upward import
between the layers, and an adapter module reached from a sans-I/O core (even through another module).
The planted checks run on a copy of the packages, so this tree is never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("moqt", "kvsp", "relay", "control", "benchmarks", "interop", "tests")
LINT = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([LINT, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


@pytest.fixture
def copy_of_tree(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def plant(path: Path, line: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + f"\n{line}  # planted\n", encoding="utf-8")


def test_the_layer_contracts_hold_on_this_tree() -> None:
    done = lint(REPO)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout


def test_an_upward_import_breaks_the_layers_contract(copy_of_tree: Path) -> None:
    plant(copy_of_tree / "kvsp" / "keys.py", "import relay.core")
    done = lint(copy_of_tree)
    assert done.returncode != 0
    assert "D9 layers" in done.stdout and "kvsp.keys -> relay.core" in done.stdout, done.stdout[-4000:]


def test_an_adapter_reached_through_another_module_breaks_the_core_contract(copy_of_tree: Path) -> None:
    # kvsp.keys is a core; kvsp.client.http is an aiohttp adapter in the same layer, so only the
    # "cores import no asyncio/aiohttp/aioquic, even indirectly" contract can catch this one.
    plant(copy_of_tree / "kvsp" / "keys.py", "import kvsp.client.http")
    done = lint(copy_of_tree)
    assert done.returncode != 0
    assert "sans-I/O cores" in done.stdout and "kvsp.keys -> kvsp.client.http" in done.stdout, done.stdout[-4000:]


def test_a_benchmark_importing_tests_breaks_its_contract(copy_of_tree: Path) -> None:
    plant(copy_of_tree / "benchmarks" / "bench_keys.py", "import tests.conftest")
    done = lint(copy_of_tree)
    assert done.returncode != 0
    assert "benchmarks.bench_keys -> tests.conftest" in done.stdout, done.stdout[-4000:]
