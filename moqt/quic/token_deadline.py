"""D3's auth deadline, shared by both QUIC back-ends: a peer with no verified certificate has
``auth_timeout_s`` to present a valid AUTHORIZATION_TOKEN (``authenticate_with_token``), else it is
closed UNAUTHORIZED. On aioquic that is a certificate-less client; on picoquic, every client (its
server never sees a client certificate, docs/moqt-picoquic.md)."""

from __future__ import annotations

import asyncio

from moqt.kinds import SessionError
from moqt.tls import PeerAuthentication


class TokenDeadline(PeerAuthentication):
    """`PeerAuthentication` with the deadline; the subclass provides ``close`` and sets
    ``_auth_timer = None`` before calling ``PeerAuthentication.__init__``."""

    _auth_timer: asyncio.TimerHandle | None

    def close(self, error: SessionError | int = SessionError.NO_ERROR, reason: str = "") -> None:
        raise NotImplementedError

    def _start_auth_deadline(self, timeout_s: float) -> None:
        self._auth_timer = asyncio.get_running_loop().call_later(timeout_s, self._auth_deadline)

    def _authenticated(self) -> None:
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None

    def _auth_deadline(self) -> None:
        self._auth_timer = None
        if self.authenticated_by is None:
            self.close(SessionError.UNAUTHORIZED, "no client certificate and no valid authorization token")
