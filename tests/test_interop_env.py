"""The README's test command builds the aiomoqt interop venv itself (issue 13, item 10).

A skip of the interop suite must mean that the machine truly cannot run it (no Python >= 3.12), and
the skip reason must say so; a merely absent venv is built by the first interop test.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from interop.harness import AIOMOQT_VERSION, InteropUnavailable, aiomoqt_version, build_interop_venv


def test_an_absent_venv_is_built(tmp_path: Path) -> None:
    venv = tmp_path / "venv-interop"
    assert not venv.exists()
    python = build_interop_venv(venv)
    assert python == venv / "bin" / "python"
    assert aiomoqt_version(python) == AIOMOQT_VERSION
    # a second call reuses it as it is (no rebuild: the interpreter file is the same one)
    before = python.stat().st_mtime_ns
    assert build_interop_venv(venv) == python
    assert python.stat().st_mtime_ns == before


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the test interpreter is itself >= 3.12")
def test_without_python_3_12_the_reason_says_so(tmp_path: Path) -> None:
    """Only Python 3.11 reachable: the build fails with a reason naming what the machine lacks."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "ls", "sort", "dirname", "rm", "cat"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "PYENV_ROOT": str(tmp_path / "no-pyenv"),
           "KVSP_INTEROP_BASE_PYTHON": sys.executable}
    with pytest.raises(InteropUnavailable, match=r"cannot be built on this machine: .*no Python >= 3\.12"):
        build_interop_venv(tmp_path / "venv-interop", env=env)
    assert not (tmp_path / "venv-interop").exists()
