"""What the aiomoqt vector scripts (``aiomoqt_d16_vectors.py``, ``aiomoqt_d18_vectors.py``) share.

Imports aiomoqt alone (no kvsp), like the scripts: they print the octets aiomoqt's own encoders write,
one JSON line per vector, for the tests to commit as hex.
"""

from __future__ import annotations

import importlib.metadata
import json
from typing import Any

VERSION = importlib.metadata.version("aiomoqt")


def octets(buf: Any) -> bytes:
    """The octets an aiomoqt ``serialize`` wrote (a Buffer up to its position, or bytes)."""
    return bytes(buf.data[: buf.tell()]) if hasattr(buf, "tell") else bytes(buf)


def emit(name: str, kind: str, data: bytes, source: str) -> None:
    print(json.dumps({"name": name, "kind": kind, "hex": data.hex(), "source": f"aiomoqt {VERSION}, {source}"}))


def control(name: str, message: Any, *, prof: Any) -> None:
    """Emit a control message as aiomoqt serializes it at the draft of ``prof``."""
    cls = type(message)
    emit(name, "control", octets(message.serialize(prof=prof)), f"{cls.__module__}.{cls.__qualname__}.serialize")
