"""The picoquic venv's interpreter for tests that run parties on the picoquic back-end (Python >= 3.12).

``interop.pico.ensure_pico_python`` (``$KVSP_PICO_PYTHON``, else what ``.ci/pico-env`` makes or reuses).
Where no Python >= 3.12 exists the test is skipped, unless ``KVSP_REQUIRE_PICO`` is set (CI): then it fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from interop.harness import InteropUnavailable
from interop.pico import ensure_pico_python


def pico_python() -> Path:
    try:
        return ensure_pico_python()
    except InteropUnavailable as exc:
        if "no Python >= 3.12" in str(exc) and not os.environ.get("KVSP_REQUIRE_PICO"):
            pytest.skip(f"the picoquic path needs Python >= 3.12: {exc}")
        pytest.fail(str(exc))
