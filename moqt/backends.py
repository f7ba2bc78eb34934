"""The QUIC back-ends by name, and which this interpreter can run: importable without aioquic or aiopquic,
so that configuration cores (``kvsp.service.moqt_config``) validate ``quic`` without pulling a QUIC stack.
What each back-end is: moqt/quic/backend.py."""

from __future__ import annotations

import sys
from typing import Final

QUIC_BACKENDS: Final = ("aioquic", "picoquic")


def check_quic_backend(name: str) -> None:
    """Refuse an unknown QUIC stack, and picoquic where aiopquic cannot exist (one line each)."""
    if name not in QUIC_BACKENDS:
        raise ValueError(f"quic = {name!r}: the QUIC back-ends are {', '.join(QUIC_BACKENDS)}")
    if name == "picoquic" and sys.version_info < (3, 12):
        raise ValueError(f"quic = \"picoquic\" needs Python >= 3.12 (aiopquic has no build for "
                         f"{sys.version_info.major}.{sys.version_info.minor}); run this role on 3.12+ or use aioquic")
