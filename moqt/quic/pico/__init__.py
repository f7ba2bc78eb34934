"""MOQT over picoquic through aiopquic (issue 19; facts in docs/moqt-picoquic.md). Python >= 3.12 only.

Importable anywhere: aiopquic is imported when a server or client starts, and its absence is then one
`PicoquicUnsupportedError`.

* `shim`: an aioquic-shaped connection a sans-I/O ``MoqtSession`` writes into, carried onto aiopquic's
  ``QuicConnection``, and aiopquic's events turned into aioquic's event classes.
* `connection`: `PicoConnection`, the ``moqt.api.endpoint.Link`` surface of ``MoqtConnection``.
* `server` (`pico_serve`, `PicoServer`) and `client` (`pico_connect`); `config`: settings and PEM files
  for aiopquic, and what this back-end refuses.
"""

from moqt.quic.pico.client import pico_connect
from moqt.quic.pico.config import PicoquicUnsupportedError
from moqt.quic.pico.connection import PicoConnection, PicoEventHandler, PicoSessionFactory
from moqt.quic.pico.server import PicoServer, pico_serve

__all__ = [
    "PicoConnection",
    "PicoEventHandler",
    "PicoServer",
    "PicoSessionFactory",
    "PicoquicUnsupportedError",
    "pico_connect",
    "pico_serve",
]
