"""Sans-I/O cores load no asyncio, aiohttp or aioquic, not even through a package ``__init__`` (D9).

Each core is imported in a fresh interpreter, because within this test process those modules are
long loaded. The forbidden sets follow ../shared/tools/check_layers.py: a ``moqt.*`` core may load
aioquic (the session consumes aioquic's events and writes into its ``QuicConnection``, as aioquic's
``H3Connection`` does), never asyncio or aiohttp; every other core loads none of the three.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = ("asyncio", "aiohttp", "aioquic")

MOQT_CORES = ("moqt.wire", "moqt.messages", "moqt.data", "moqt.profiles", "moqt.session", "moqt.auth",
              "moqt.tls", "moqt.tracks")
OTHER_CORES = ("relay.core", "kvsp.moqt_binding", "kvsp.container", "kvsp.container_stream", "kvsp.records",
               "kvsp.descriptor", "kvsp.keys", "kvsp.placement", "kvsp.identifiers", "kvsp.problems", "kvsp.numbers",
               "kvsp.output", "kvsp.reader", "control.pc.core", "control.instance.core", "control.holder.store",
               "control.holder.leases", "control.index.store", "control.index.status", "control.listener.core",
               "control.frontend.admission", "control.holder.quota", "kvsp.service.logs")


def _loaded(module: str) -> list[str]:
    """Which of ``ADAPTERS`` importing ``module`` loads, in a fresh interpreter."""
    code = f"import sys, {module}; print(' '.join(m for m in {ADAPTERS!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.parametrize("module", MOQT_CORES + OTHER_CORES)
def test_core_loads_no_asyncio_or_aiohttp(module: str) -> None:
    assert not {"asyncio", "aiohttp"} & set(_loaded(module))


@pytest.mark.parametrize("module", OTHER_CORES)
def test_core_outside_moqt_loads_no_aioquic(module: str) -> None:
    assert "aioquic" not in _loaded(module)


def test_the_adapters_do_load_asyncio() -> None:
    """The check can fail: the asyncio side of the same packages is seen."""
    assert "asyncio" in _loaded("moqt.api")
    assert "asyncio" in _loaded("moqt.quic")
