"""Which QUIC stack carries a MOQT endpoint: ``QuicSettings.quic`` picks aioquic or picoquic.

``listen`` and ``dial`` are what ``moqt.api`` calls; they start a server or a client connection on the
back-end the settings name and hand the session factory the same kind of connection either way
(`QuicLink`: ``quic`` to build a ``MoqtSession`` on, and ``moqt.api.endpoint.Link``'s surface).

* ``aioquic`` (default): this process's Python QUIC (moqt/quic/client.py, server.py), mutual TLS.
* ``picoquic``: picoquic's C stack through aiopquic on its own thread (moqt/quic/pico/), Python >= 3.12.
  Its servers never see client certificates (peers authenticate with D3 tokens only) and its clients
  check a server's chain and host name but not its identity URI: docs/moqt.md "QUIC back-ends".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeAlias

from aioquic.quic.connection import QuicConnection

from moqt.auth import TokenClaims
from moqt.profiles import Profile
from moqt.quic.client import connect
from moqt.quic.config import EndpointConfig
from moqt.quic.connection import E, SessionLike
from moqt.quic.pico import pico_connect, pico_serve  # aiopquic itself is imported only when one starts
from moqt.quic.server import serve
from moqt.tls import AuthMethod


class Link(Protocol):
    """What ``moqt.api`` needs from a transport connection (either back-end's, or an in-memory one)."""

    token_claims: TokenClaims | None

    @property
    def peer_identity(self) -> str | None: ...

    @property
    def authenticated_by(self) -> AuthMethod | None: ...

    @property
    def closed(self) -> bool: ...

    def authenticate_with_token(self, token: bytes, now: float | None = None) -> TokenClaims: ...

    async def drain(self, stream_id: int) -> None: ...

    def transmit_soon(self) -> None: ...

    def close(self, error_code: int = 0, reason: str = "") -> None: ...

    async def wait_closed(self) -> None: ...


class QuicLink(Link, Protocol):
    """A connection of either back-end, as a session factory sees it: a `Link` with the ``quic`` a
    ``MoqtSession`` is built on and the draft its ALPN agreed."""

    @property
    def quic(self) -> QuicConnection: ...

    @property
    def profile(self) -> Profile: ...


class QuicServer(Protocol):
    """A listening endpoint of either back-end (``MoqtServer``, ``PicoServer``)."""

    refused: int  # connections refused for the per-address cap (picoquic: none, it has no such cap)

    @property
    def port(self) -> int: ...

    @property
    def drafts(self) -> tuple[int, ...]: ...

    @property
    def sessions_by_draft(self) -> dict[int, int]: ...

    def close(self, error: int = 0, reason: str = "server shutting down") -> None: ...

    async def wait_closed(self) -> None: ...


LinkFactory: TypeAlias = Callable[[Any], SessionLike[E]]
"""Called with the new `QuicLink` once its draft is agreed; returns the session built on its ``quic``."""
LinkEventHandler: TypeAlias = Callable[[Any, E], None]


async def listen(host: str, port: int, config: EndpointConfig, session_factory: LinkFactory[E], *,
                 on_event: LinkEventHandler[E] | None = None) -> QuicServer:
    """Accept MOQT on ``host:port`` (0: a free port) over ``config.settings.quic``."""
    if config.settings.quic == "picoquic":
        return await pico_serve(host, port, config, session_factory, on_event=on_event)
    return await serve(host, port, config, session_factory, on_event=on_event)


async def dial(uri: str, config: EndpointConfig, session_factory: LinkFactory[E], *,
               on_event: LinkEventHandler[E] | None = None, expected_identity: str | None = None) -> QuicLink:
    """Connect to a ``moqt://`` URI over ``config.settings.quic``; see ``moqt.quic.connect`` and
    ``moqt.quic.pico.pico_connect`` for what each checks of the server and raises."""
    if config.settings.quic == "picoquic":
        return await pico_connect(uri, config, session_factory, on_event=on_event,
                                  expected_identity=expected_identity)
    return await connect(uri, config, session_factory, on_event=on_event, expected_identity=expected_identity)
