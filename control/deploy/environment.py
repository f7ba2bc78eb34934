"""The environment of role child processes: they import kvsp from the same tree as their parent."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the tree on ``PYTHONPATH`` (installed or not), output unbuffered."""
    path = os.environ.get("PYTHONPATH")
    root = str(REPO_ROOT)
    return {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{path}" if path else root, "PYTHONUNBUFFERED": "1",
            **extra}
