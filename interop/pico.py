"""Running kvsp's side on the picoquic back-end: the picoquic venv and `PicoSide` (interop/pico_side.py).

The picoquic back-end needs aiopquic, so Python >= 3.12; the interop venv has aiomoqt and aiopquic but not
this tree's dependencies (aioquic, cbor2, ...), so our side runs in ``.venv-pico`` (``.ci/pico-env``: this
tree editable, aiopquic 0.6.1), or ``$KVSP_PICO_PYTHON``, as a `PeerProcess` like the aiomoqt peers.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from interop.content import BlockSpec
from interop.harness import REPO, Credentials, InteropUnavailable, PeerProcess

PICO_PYTHON_ENV: Final = "KVSP_PICO_PYTHON"
_ENV_SCRIPT: Final = REPO / ".ci" / "pico-env"
_BUILD_TIMEOUT_S: Final = 600.0


@functools.cache
def ensure_pico_python() -> Path:
    """The picoquic venv's interpreter: ``$KVSP_PICO_PYTHON``, else what ``.ci/pico-env`` makes or reuses.
    Raises :class:`InteropUnavailable` with the script's own last line (e.g. no Python >= 3.12 here)."""
    configured = os.environ.get(PICO_PYTHON_ENV)
    if configured:
        if not Path(configured).is_file():
            raise InteropUnavailable(f"${PICO_PYTHON_ENV} names {configured!r}, which does not exist")
        return Path(configured)
    try:
        done = subprocess.run(["bash", str(_ENV_SCRIPT)], cwd=REPO, capture_output=True, text=True,
                              timeout=_BUILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise InteropUnavailable(f".ci/pico-env did not finish in {_BUILD_TIMEOUT_S:.0f} s") from exc
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise InteropUnavailable("the picoquic venv (Python >= 3.12, aiopquic 0.6.1) cannot be had: "
                                 + (lines[-1] if lines else f"exit status {done.returncode}"))
    return Path(done.stdout.strip().splitlines()[-1])


def block_args(blocks: Sequence[BlockSpec], live: Sequence[BlockSpec]) -> list[str]:
    """The blocks as interop/pico_side.py takes them: one size for all, each named by ``--stored``/``--live``."""
    every = [*blocks, *live]
    if not every or len({(b.layers, b.k_size, b.v_size) for b in every}) != 1:
        raise ValueError("our picoquic side handles at least one block, all of one size")
    argv = every[0].to_args()
    for block in blocks:
        argv += ["--stored", block.track_arg()]
    for block in live:
        argv += ["--live", block.track_arg()]
    return argv


def _drafts(drafts: Sequence[int]) -> list[str]:
    return [arg for d in drafts for arg in ("--drafts", str(d))]


class PicoSide:
    """Starts interop/pico_side.py in the picoquic venv; every role is `moqt.api` with ``quic="picoquic"``."""

    def __init__(self, python: Path, credentials: Credentials, token_key: Path) -> None:
        self.python, self.credentials, self.token_key = python, credentials, token_key

    def _argv(self, mode: str, *args: str) -> list[str]:
        return [str(self.python), "-m", "interop.pico_side", mode, "--ca", str(self.credentials.ca), *args]

    def server(self, port: int, blocks: Sequence[BlockSpec], *, live: Sequence[BlockSpec] = (),
               interval: float = 0.05) -> PeerProcess:
        """Our Publisher listening on ``port`` (every draft, as in production), accepting tokens of the
        credentials' issuer. Reports ``ready``, then ``session`` per setup and ``request`` per request."""
        argv = self._argv("serve", "--port", str(port), "--cert", str(self.credentials.cert("kvsp")),
                          "--key", str(self.credentials.key("kvsp")), "--token-key", str(self.token_key),
                          "--interval", str(interval), *block_args(blocks, live))
        return PeerProcess("kvsp picoquic publisher", argv)

    def subscriber(self, uri: str, blocks: Sequence[BlockSpec], *, live: Sequence[BlockSpec] = (),
                   drafts: Sequence[int] = (), token: bytes | None = None) -> PeerProcess:
        """Our Subscriber dialling ``uri``: FETCH of each of ``blocks``, then SUBSCRIBE to each of ``live``;
        one ``result``."""
        argv = self._argv("subscribe", "--uri", uri, *_drafts(drafts), *block_args(blocks, live))
        if token is not None:
            argv += ["--token", token.hex()]
        return PeerProcess("kvsp picoquic subscriber", argv)

    def relay_publisher(self, uri: str, blocks: Sequence[BlockSpec], *, live: Sequence[BlockSpec] = (),
                        drafts: Sequence[int] = (), interval: float = 0.05) -> PeerProcess:
        """Our Publisher dialling the relay at ``uri`` and publishing the blocks' namespaces; ``ready``."""
        argv = self._argv("announce", "--uri", uri, "--interval", str(interval), *_drafts(drafts),
                          *block_args(blocks, live))
        return PeerProcess("kvsp picoquic relay publisher", argv)
