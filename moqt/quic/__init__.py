"""The asyncio adapter between UDP sockets, aioquic's ``QuicConnection`` and a sans-I/O MOQT session.

Laid out like ``aioquic.asyncio``:

* `config`: ``moqt://`` URIs (`MoqtUri`), QUIC knobs (`QuicSettings`), credentials and trust
  (`EndpointConfig`).
* `connection`: `MoqtConnection`, one QUIC connection feeding its session every QUIC event, with
  backpressure (``write``/``drain``), timers and peer authentication.
* `endpoint`, `udp`: a UDP socket read in batches (one transmit per connection per batch), large
  buffers and optional UDP GSO.
* `client` (`connect`) and `server` (`serve`, `MoqtServer`: routing by connection ID, the
  per-address connection cap).
* `token_deadline`: D3's auth deadline for a peer without a verified certificate, shared with the
  picoquic back-end (`moqt.quic.pico`, Python >= 3.12 with aiopquic; imported on its own).
* `liveness`: when a connection PINGs (keepalive) and when it gives a silent peer up, sans-I/O;
  `refusal`: TLS alerts as crypto errors for refused certificates, a stateless CONNECTION_REFUSED.
* `aioquic_hooks`: the one module that overrides or reads aioquic's private methods and state
  (64 KiB datagrams through 4-octet STREAM lengths, client-certificate requests, the peer's
  ``max_udp_payload_size``, send-buffer sizes); pyproject.toml pins aioquic to the releases it was
  checked against.
"""

from moqt.quic.client import connect
from moqt.quic.config import (
    ALPN,
    DEFAULT_PORT,
    LOOPBACK_DATAGRAM_SIZE,
    MAX_DATAGRAM_SIZE,
    EndpointConfig,
    MoqtUri,
    QuicSettings,
)
from moqt.quic.connection import (
    ConnectionClosedError,
    ConnectionStats,
    EventHandler,
    MoqtConnection,
    SessionFactory,
    SessionLike,
    TimedSession,
)
from moqt.quic.server import MoqtServer, serve

__all__ = [
    "ALPN",
    "DEFAULT_PORT",
    "LOOPBACK_DATAGRAM_SIZE",
    "MAX_DATAGRAM_SIZE",
    "ConnectionClosedError",
    "ConnectionStats",
    "EndpointConfig",
    "EventHandler",
    "MoqtConnection",
    "MoqtServer",
    "MoqtUri",
    "QuicSettings",
    "SessionFactory",
    "SessionLike",
    "TimedSession",
    "connect",
    "serve",
]
