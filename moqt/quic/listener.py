"""What a MOQT listener keeps of its connections, whichever QUIC stack accepts them.

`Listener` is the base of ``moqt.quic.MoqtServer`` (aioquic) and ``moqt.quic.pico.PicoServer``
(picoquic): the open connections, the per-address counts behind ``max_connections_per_client``
(``refused`` counts those turned away), the sessions started per draft, and shutting down (stop
accepting, close each connection, release the transport once the last has ended). How a connection is
accepted, refused and how the transport is released is each stack's (`_release`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, Protocol, Self, TypeVar

from moqt.kinds import SessionError
from moqt.profiles import Profile
from moqt.quic.config import EndpointConfig
from moqt.quic.connection import E, SessionLike
from moqt.quic.refusal import address_text

log = logging.getLogger("moqt.quic.server")


class Accepted(Protocol):
    @property
    def profile(self) -> Profile: ...

    def close(self, error: SessionError | int = SessionError.NO_ERROR, reason: str = "") -> None: ...


C = TypeVar("C", bound=Accepted)


class Listener(Generic[C, E]):
    """The connections of one listener (see the module docstring)."""

    def __init__(self, config: EndpointConfig, session_factory: Callable[[C], SessionLike[E]]) -> None:
        self.config = config
        self._factory = session_factory
        self._accepting = True
        self.connections: set[C] = set()
        self._peer_of: dict[C, str] = {}
        self._per_peer: dict[str, int] = {}
        self.refused = 0
        #: Sessions started, by the draft their ALPN agreed (metrics: which drafts clients speak).
        self.sessions_by_draft: dict[int, int] = {}
        self._all_closed = asyncio.Event()
        self._all_closed.set()

    @property
    def drafts(self) -> tuple[int, ...]:
        """The drafts this listener accepts, newest first."""
        return tuple(p.draft for p in self.config.settings.profiles)

    def _counted(self, conn: C) -> SessionLike[E]:
        """The session factory as the connections call it: counts each session by its draft."""
        session = self._factory(conn)
        draft = conn.profile.draft
        self.sessions_by_draft[draft] = self.sessions_by_draft.get(draft, 0) + 1
        return session

    def _over_cap(self, peer: str) -> bool:
        """Whether ``peer`` (an IP address) already has ``max_connections_per_client`` connections."""
        cap = self.config.settings.max_connections_per_client
        return cap is not None and self._per_peer.get(peer, 0) >= cap

    def _refused(self, address: Any) -> None:
        self.refused += 1
        log.info("MOQT connection from %s refused: %s connections from that address already "
                 "(max_connections_per_client)", address_text(address), self.config.settings.max_connections_per_client,
                 extra={"kvsp_peer": "moqt.per-peer-cap"})

    def _added(self, conn: C, peer: str) -> None:
        self.connections.add(conn)
        self._peer_of[conn] = peer
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        self._all_closed.clear()

    def _removed(self, conn: C) -> None:
        """A connection ended; once the last has, and the listener is closing, the transport goes."""
        self.connections.discard(conn)
        peer = self._peer_of.pop(conn, None)
        if peer is not None:
            left = self._per_peer.pop(peer) - 1
            if left > 0:
                self._per_peer[peer] = left
        if not self.connections:
            self._all_closed.set()
            if not self._accepting:
                asyncio.get_running_loop().call_soon(self._release)

    def _release(self) -> None:
        """Give the transport up (the socket, picoquic's engine): the listener is closed and empty."""
        raise NotImplementedError

    def close(self, error: SessionError | int = SessionError.NO_ERROR, reason: str = "server shutting down") -> None:
        """Stop accepting and close every connection; the transport goes once the last has ended."""
        self._accepting = False
        for conn in list(self.connections):
            conn.close(error, reason)
        if not self.connections:
            self._release()

    async def wait_closed(self) -> None:
        await self._all_closed.wait()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()
        await self.wait_closed()
