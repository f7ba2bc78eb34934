"""The picoquic venv's interpreter for tests that run parties on the picoquic back-end (Python >= 3.12).

``$KVSP_PICO_PYTHON``, else what ``.ci/pico-env`` makes or reuses. Where no Python >= 3.12 exists the
test is skipped, unless ``KVSP_REQUIRE_PICO`` is set (CI): then it fails.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def _built() -> tuple[Path | None, str]:
    done = subprocess.run(["bash", str(REPO / ".ci" / "pico-env")], cwd=REPO, capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode == 0:
        return Path(done.stdout.strip().splitlines()[-1]), ""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return None, lines[-1] if lines else f"exit status {done.returncode}"


def pico_python() -> Path:
    configured = os.environ.get("KVSP_PICO_PYTHON")
    if configured:
        return Path(configured)
    python, why = _built()
    if python is not None:
        return python
    if "no Python >= 3.12" in why and not os.environ.get("KVSP_REQUIRE_PICO"):
        pytest.skip(f"the picoquic path needs Python >= 3.12: {why}")
    pytest.fail(f".ci/pico-env failed: {why}")
