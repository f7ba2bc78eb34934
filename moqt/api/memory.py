"""Two API endpoints over an in-memory ``moqt.testing.MoqtPair``: real QUIC and TLS, no sockets.

Why: the publisher/subscriber logic (authentication at setup, authorization, FETCH and SUBSCRIBE
serving, assembly, completion, error mapping) is tested here without UDP, the way httpx tests its
clients against a mock transport. `MemoryLink` implements the ``Link`` interface the API needs; the
pair is pumped (datagrams moved both ways, fake-clock timers fired) on the event loop whenever either
side writes, and each side's session events are handed to the handler bound to it.

The server side's peer identity is given (it stands for a verified client certificate) or None, in
which case the peer must authenticate with a token at setup, exactly as over ``moqt.quic``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from moqt.api.endpoint import Endpoint
from moqt.api.publisher import Publisher
from moqt.api.subscriber import Subscriber
from moqt.events import MoqtEvent
from moqt.params import AuthToken, SetupParameters
from moqt.profiles import DRAFT_14, Profile
from moqt.quic.aioquic_hooks import send_buffered
from moqt.testing import MoqtPair, Peer
from moqt.tls import PeerAuthentication

Handler = Callable[[MoqtEvent], None]


class MemoryLink(PeerAuthentication):
    """One side of a `MemoryNet`: the ``Link`` interface over one peer of the pair."""

    def __init__(self, net: MemoryNet, peer: Peer, *, peer_identity: str | None,
                 token_keys: Sequence[ec.EllipticCurvePublicKey] = ()) -> None:
        super().__init__(token_keys)
        self.net = net
        self.peer = peer
        self.handler: Handler | None = None
        self._closed = False
        if peer_identity is not None:
            self.peer_identity = peer_identity
            self.authenticated_by = "certificate"

    @property
    def closed(self) -> bool:
        return self._closed or (self.peer.session is not None and self.peer.session.is_closed)

    async def drain(self, stream_id: int) -> None:
        for _ in range(1000):  # the pair moves everything flow control allows in one pump
            if self.closed or send_buffered(self.peer.quic, stream_id) == 0:
                return
            self.net.pump()
            await asyncio.sleep(0)

    def transmit_soon(self) -> None:
        self.net.schedule()

    async def wait_closed(self) -> None:
        self.net.pump()

    def close(self, error_code: int = 0, reason: str = "") -> None:
        if not self._closed:
            self._closed = True
            self.peer.quic.close(error_code=error_code, reason_phrase=reason)
            self.net.schedule()


class MemoryNet:
    """A `MoqtPair` driven by the event loop; ``client``/``server`` are its two links.

    ``profile`` is the draft both sessions speak; the pair's TLS offers and accepts only its ALPN, as
    two endpoints that agreed on it would. A relay bridging drafts is tested with one net per side.
    """

    def __init__(self, *, client_identity: str | None = "https://client.test/",
                 server_identity: str = "https://server.test/", token: bytes | None = None,
                 token_keys: Sequence[ec.EllipticCurvePublicKey] = (), profile: Profile = DRAFT_14,
                 client_options: dict[str, Any] | None = None, server_options: dict[str, Any] | None = None) -> None:
        tokens = (AuthToken.use_value(0, token),) if token is not None else ()
        client = {"deliver_partial_objects": True, "path": "/moqt",
                  "setup_parameters": SetupParameters(authorization_tokens=tokens), **(client_options or {})}
        server = {"auto_accept": False, "path": "/moqt", **(server_options or {})}
        self.profile = profile
        self.pair = MoqtPair(client_options=client, server_options=server, profile=profile)
        self.client = MemoryLink(self, self.pair.client, peer_identity=server_identity)
        self.server = MemoryLink(self, self.pair.server, peer_identity=client_identity, token_keys=token_keys)
        self._scheduled = False

    def schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.pump)

    def pump(self) -> None:
        """Move datagrams until quiet and deliver each side's events to its handler."""
        self._scheduled = False
        for _ in range(1000):
            self.pair.pump()
            delivered = False
            for link in (self.client, self.server):
                if link.handler is None:
                    continue
                for event in link.peer.take():
                    delivered = True
                    link.handler(event)
            if not delivered:
                return

    def serve(self, publisher: Publisher) -> None:
        """Let ``publisher`` serve the client of this pair."""
        endpoint = publisher.attach(self.server, self.server.peer.moqt)
        self.server.handler = endpoint.handle
        self.schedule()

    async def connect_publisher(self, publisher: Publisher) -> Endpoint:
        """The client side as ``publisher``'s session to a relay served on the server side (as
        ``Publisher.connect_relay`` makes over QUIC): established, our namespaces published there."""
        endpoint = publisher.attach(self.client, self.client.peer.moqt)
        self.client.handler = endpoint.handle
        self.schedule()
        await asyncio.wait_for(asyncio.shield(endpoint.established), 10)
        await publisher.adopt_relay(endpoint)
        return endpoint

    async def subscriber(self, *, timeout_s: float | None = 10.0, max_inbox_octets: int = 64 << 20) -> Subscriber:
        """The client side as an established `Subscriber` (raises ``SetupRefused`` if refused)."""
        subscriber = Subscriber.attach(self.client, self.client.peer.moqt, timeout_s=timeout_s,
                                       max_inbox_octets=max_inbox_octets)
        self.client.handler = subscriber.endpoint.handle
        self.schedule()
        await asyncio.wait_for(subscriber.wait_established(), 10)
        return subscriber
