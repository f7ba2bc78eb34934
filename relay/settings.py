"""``[relay]`` of a role configuration (see docs/relay.md).

    [relay]
    listen = "127.0.0.1:4443"                   # UDP: MOQT over QUIC
    uri = "moqt://127.0.0.1:4443/relay"         # this relay's URI; its path is the only PATH accepted
    upstream = ["moqt://spine:4443/relay"]      # optional: where requests go that no publisher here serves
    peers = ["https://spine.example/kvsp/"]     # relays trusted to publish and subscribe for others
    open_prefixes = ["interop"]                 # namespaces (first fields, "/"-separated) open to anyone
    cache_octets = 268435456                    # object cache bound (0: no cache)
    cache_ttl_s = 60.0                          # no longer than the replicas' TTL (D4)
    subscriber_buffer_octets = 8388608          # per subscriber; beyond it: PUBLISH_DONE TOO_FAR_BEHIND
    token_keys = ["issuer.pub.pem"]             # keys that sign AUTHORIZATION_TOKENs (ES256)
    drain_s = 5.0                               # GOAWAY, then this long before sessions are closed
    upstream_timeout_s = 30.0                   # per object of an upstream FETCH, until its first arrives
    upstream_stall_s = 0.5                      # an upstream FETCH with no progress this long after its first
                                                #   object is given up (the subscriber's stream is reset)
    idle_timeout_s = 5.0                        # QUIC idle timeout; sessions kept by clients' keepalive PINGs
    liveness_timeout_s = 2.0                    # a peer that owes an ACK this long is gone: its session closes,
                                                #   requests forwarded to it are answered with an error
    max_connections_per_client = 256              # concurrent QUIC connections from one IP address
    max_datagram_size = 1452                    # UDP payload to non-loopback peers (8952: jumbo frames)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE

from kvsp.errors import ValidationError
from kvsp.identifiers import check_base_uri
from kvsp.numbers import parse_decimal
from kvsp.reader import ObjectReader
from kvsp.service.config import RoleConfig
from kvsp.service.moqt_config import read_drafts
from moqt.quic import MAX_DATAGRAM_SIZE, MoqtUri, QuicSettings
from moqt.wire import Namespace

KNOWN_KEYS: Final = frozenset({
    "listen", "uri", "upstream", "peers", "open_prefixes", "cache_octets", "cache_ttl_s",
    "subscriber_buffer_octets", "token_keys", "drain_s", "upstream_timeout_s", "upstream_stall_s", "idle_timeout_s",
    "liveness_timeout_s", "max_connections_per_client", "max_datagram_size", "drafts",
})
DEFAULT_CACHE_OCTETS: Final = 256 << 20
DEFAULT_CACHE_TTL_S: Final = 60.0
DEFAULT_SUBSCRIBER_BUFFER: Final = 8 << 20
MAX_OCTETS: Final = 1 << 50
RELAY_QUIC: Final = QuicSettings(recv_batch=16, ack_delay_s=0.001)
"""The relay's QUIC settings, for its upstream and downstream sessions alike (one ``EndpointConfig``).
Datagrams are 64 KiB to loopback peers (``QuicSettings.loopback_datagram_size``). Control comes back to
the event loop every 16 datagrams rather than 64 (4 cost 15 % more CPU, 64 gained nothing); the first
object of a FETCH is flushed at once anyway. ACKs are held back 1 ms, not the block client's 5 ms: the
relay's ACKs clock the publisher's sending, and 5 ms saved no CPU here (docs/relay.md, "QUIC settings")."""


@dataclass(frozen=True, slots=True)
class RelaySettings:
    host: str
    port: int
    uri: str
    upstream: tuple[str, ...] = ()
    peers: frozenset[str] = frozenset()
    open_prefixes: tuple[Namespace, ...] = ()
    cache_octets: int = DEFAULT_CACHE_OCTETS
    cache_ttl_s: float = DEFAULT_CACHE_TTL_S
    subscriber_buffer_octets: int = DEFAULT_SUBSCRIBER_BUFFER
    token_keys: tuple[Path, ...] = ()
    drain_s: float = 5.0
    upstream_timeout_s: float = 30.0
    upstream_stall_s: float = 0.5  # an upstream FETCH whose objects started and then stopped arriving
    idle_timeout_s: float = RELAY_QUIC.idle_timeout_s  # silent sessions (live ones are kept by keepalive)
    liveness_timeout_s: float = 2.0  # how soon a vanished peer with requests in flight is noticed
    max_connections_per_client: int = 256
    max_datagram_size: int = RELAY_QUIC.max_datagram_size  # to non-loopback peers (loopback: 64 KiB)
    drafts: tuple[int, ...] | None = None  # MOQT drafts accepted downstream and offered upstream (None: all)
    backend: str = "aioquic"  # [moqt] quic: the QUIC stack of both legs

    @property
    def quic(self) -> QuicSettings:
        """`RELAY_QUIC` with this relay's timeouts, connection cap, datagram size and back-end."""
        return dataclasses.replace(RELAY_QUIC, idle_timeout_s=self.idle_timeout_s,
                                   liveness_timeout_s=self.liveness_timeout_s,
                                   max_connections_per_client=self.max_connections_per_client,
                                   max_datagram_size=self.max_datagram_size, drafts=self.drafts, quic=self.backend)

    @property
    def path(self) -> str:
        return MoqtUri.parse(self.uri).path

    @classmethod
    def from_config(cls, config: RoleConfig) -> RelaySettings:
        """Validate ``config.section("relay")``; errors name the member as ``relay.<key>``."""
        section = dict(config.section("relay"))
        for name in section:
            if name not in KNOWN_KEYS:
                raise ValidationError(f"relay.{name}", f"unknown key; known: {sorted(KNOWN_KEYS)}")
        r = ObjectReader(section, "relay")
        host, port = _listen(r.str("listen", max_length=300))
        uri = _moqt_uri(r.str("uri", max_length=2048), "relay.uri")
        return cls(
            host, port, uri,
            upstream=tuple(_moqt_uri(_text(m, v), m) for m, v in _items(r, "upstream")),
            peers=frozenset(check_base_uri(_text(m, v), m) for m, v in _items(r, "peers")),
            open_prefixes=tuple(_prefix(_text(m, v), m) for m, v in _items(r, "open_prefixes")),
            cache_octets=_int(r, "cache_octets", DEFAULT_CACHE_OCTETS, minimum=0),
            cache_ttl_s=_seconds(r, "cache_ttl_s", DEFAULT_CACHE_TTL_S),
            subscriber_buffer_octets=_int(r, "subscriber_buffer_octets", DEFAULT_SUBSCRIBER_BUFFER, minimum=1),
            token_keys=tuple(config.path(_text(m, v)) for m, v in _items(r, "token_keys")),
            drain_s=_seconds(r, "drain_s", 5.0),
            upstream_timeout_s=_seconds(r, "upstream_timeout_s", 30.0),
            upstream_stall_s=_seconds(r, "upstream_stall_s", 0.5),
            idle_timeout_s=_seconds(r, "idle_timeout_s", RELAY_QUIC.idle_timeout_s),
            liveness_timeout_s=_seconds(r, "liveness_timeout_s", 2.0),
            max_connections_per_client=_int(r, "max_connections_per_client", 256, minimum=1),
            max_datagram_size=_datagram_size(r),
            drafts=read_drafts(r, "drafts", "relay"),
            backend=_backend(r, config),
        )


def _backend(r: ObjectReader, config: RoleConfig) -> str:
    """``[moqt] quic``; picoquic needs token keys (its listener sees no client certificate) and, with
    upstream relays, the token this relay presents to them."""
    moqt = config.moqt
    moqt.check_listener("relay.token_keys", r.has("token_keys"))
    if r.has("upstream"):
        moqt.check_dialler("relay.upstream")
    return moqt.quic


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep:
        raise ValidationError("relay.listen", "must be HOST:PORT")
    return host.strip("[]") or "127.0.0.1", parse_decimal(port, "relay.listen", maximum=65535)


def _moqt_uri(value: str, member: str) -> str:
    try:
        MoqtUri.parse(value)
    except ValueError as exc:
        raise ValidationError(member, str(exc)) from exc
    return value


def _prefix(value: str, member: str) -> Namespace:
    fields = tuple(f.encode() for f in value.split("/"))
    if not value or any(not f for f in fields):
        raise ValidationError(member, "must be non-empty namespace fields separated by '/'")
    return fields


def _items(r: ObjectReader, name: str) -> list[tuple[str, object]]:
    return list(r.items(name, max_items=64)) if r.has(name) else []


def _text(member: str, value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > 4096:
        raise ValidationError(member, "must be a non-empty string")
    return value


def _int(r: ObjectReader, name: str, default: int, *, minimum: int) -> int:
    value = r.optional(name, lambda n: r.int(n, minimum=minimum, maximum=MAX_OCTETS))
    return default if value is None else value


def _datagram_size(r: ObjectReader) -> int:
    """The path's UDP payload: at least QUIC's 1200 (RFC 9000 section 14), at most the IPv4 maximum."""
    value = r.optional("max_datagram_size",
                       lambda n: r.int(n, minimum=SMALLEST_MAX_DATAGRAM_SIZE, maximum=MAX_DATAGRAM_SIZE))
    return RELAY_QUIC.max_datagram_size if value is None else value


def _seconds(r: ObjectReader, name: str, default: float) -> float:
    value = r.optional(name, r.raw)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 86_400:
        raise ValidationError(f"relay.{name}", "must be a number of seconds in (0, 86400]")
    return float(value)
