"""A kept-up session to a relay: connect, announce, and reconnect with backoff when it is lost.

Used by a relay for its upstream relays (rack relay -> spine relay) and by a publisher (a KVSP holder)
for its rack relay.
``Publisher.connect_relay`` makes the session (we are the QUIC client), serves the relay's FETCH and
SUBSCRIBE over it and announces the publisher's namespaces again on every new session. A session that
ends, or whose peer sent GOAWAY (draining), is replaced; failed attempts wait ``backoff_delay``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Final, TypeAlias

from moqt.api.endpoint import Endpoint
from moqt.api.publisher import Publisher
from moqt.errors import MoqtError
from moqt.kinds import SessionError
from moqt.quic import EndpointConfig

log = logging.getLogger(__name__)

POLL_S: Final = 0.2  # how often a held session is checked for GOAWAY (it carries no event of its own)


TokenSource: TypeAlias = bytes | Callable[[], bytes | None] | None
"""The token presented at each connect: fixed octets, or a callable read at every connect (a token file
that the deployment rotates)."""


def backoff_delay(attempt: int, *, base_s: float = 0.1, cap_s: float = 5.0) -> float:
    """Seconds to wait before attempt ``attempt + 1`` after ``attempt`` failures in a row (exponential)."""
    return 0.0 if attempt <= 0 else min(cap_s, base_s * 2 ** min(attempt - 1, 30))


class UpstreamLink:
    """One relay URI kept connected for ``publisher`` (see the module docstring)."""

    def __init__(self, publisher: Publisher, uri: str, config: EndpointConfig, *, token: TokenSource = None,
                 base_s: float = 0.1, cap_s: float = 5.0) -> None:
        self.publisher = publisher
        self.uri = uri
        self.config = config
        self.token = token
        self.base_s, self.cap_s = base_s, cap_s
        self.endpoint: Endpoint | None = None
        self.connects = 0
        self.failures = 0
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def usable(self) -> bool:
        endpoint = self.endpoint
        return endpoint is not None and endpoint.usable and not endpoint.session.goaway_received

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def wait_connected(self, timeout_s: float) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout_s)

    async def _run(self) -> None:
        attempt = 0
        while True:
            await asyncio.sleep(backoff_delay(attempt, base_s=self.base_s, cap_s=self.cap_s))
            try:
                token = self.token() if callable(self.token) else self.token
                self.endpoint = await self.publisher.connect_relay(self.uri, self.config, token=token)
            except (OSError, MoqtError, TimeoutError, ValueError) as exc:  # ConnectionError is an OSError; a
                # token file that cannot be read is a ValueError: retried, as it may be being replaced
                attempt += 1
                self.failures += 1
                log.info("relay %s unreachable (attempt %d): %s", self.uri, attempt, exc)
                continue
            attempt = 0
            self.connects += 1
            self._connected.set()
            log.info("connected to relay %s", self.uri)
            await self._hold(self.endpoint)
            self._connected.clear()
            log.info("session to relay %s ended; reconnecting", self.uri)

    async def _hold(self, endpoint: Endpoint) -> None:
        """Until the session is lost or the relay asks us to leave (GOAWAY). After GOAWAY the old
        session is left to finish its open requests (the relay closes it when it has drained) while
        the next one is made: new requests only go to sessions without GOAWAY."""
        while endpoint.usable and not endpoint.session.goaway_received:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(endpoint.link.wait_closed()), POLL_S)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.endpoint is not None and self.endpoint.usable:
            await self.endpoint.aclose(SessionError.NO_ERROR, "closing", timeout_s=1.0)
