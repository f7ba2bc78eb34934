"""The relay role: ``kvsp serve relay --config FILE`` (see docs/relay.md).

MOQT over QUIC on ``[relay] listen``; on the role's mutual-TLS HTTPS listener, beside ``GET {base}health``
(facts: draining, upstreams, subscribers, publishers) and ``GET {base}metrics``
(Prometheus: objects and octets in and out, cache hits and misses, subscribers, upstream requests), the
same counters as JSON at ``GET {base}relay/stats``. Upstream relays are kept connected with backoff.
On shutdown the relay drains: GOAWAY to every peer, ``drain_s`` for them to leave, then close.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvsp.errors import ValidationError
from kvsp.moqt_binding import kvsp_token_rule
from kvsp.service.app import HEALTH
from kvsp.service.config import RoleConfig
from kvsp.service.metrics import MoqtSessionsCollector, metrics_of
from kvsp.service.tokens import load_token_key
from moqt.api import TokenRule, UpstreamLink
from moqt.auth import TokenClaims
from moqt.quic import EndpointConfig
from moqt.wire import Namespace
from relay.auth import relay_authorizer
from relay.core import RelayStats, is_prefix
from relay.server import Relay
from relay.settings import RelaySettings

log = logging.getLogger("kvsp.relay.app")

COUNTERS = {
    "objects_in": "Objects received from publishers and upstream relays",
    "bytes_in": "Payload octets received from publishers and upstream relays",
    "objects_out": "Objects sent to subscribers",
    "bytes_out": "Payload octets sent to subscribers",
    "cache_hits": "FETCHes answered from the object cache",
    "cache_misses": "FETCHes that went upstream",
    "upstream_fetches": "FETCH requests sent upstream",
    "upstream_subscribes": "SUBSCRIBE requests sent upstream",
    "too_far_behind": "Subscriptions ended with TOO_FAR_BEHIND",
    "refused": "Requests refused as unauthorized",
    "cut_through": "Objects passed on piece by piece while they were still arriving",
}
GAUGES = {
    "subscribers": "Downstream subscriptions being served",
    "publishers": "Sessions that published namespaces here",
    "cache_hit_ratio": "Cache hits / (hits + misses) since start",
}


class RelayCollector(Collector):
    """Exports `RelayStats` at scrape time (no second set of counters to keep in step), and the QUIC
    connections the listener refused for its per-address cap."""

    def __init__(self, stats: RelayStats, refused: Callable[[], int] = lambda: 0) -> None:
        self.stats = stats
        self.refused = refused

    def collect(self) -> Iterable[Metric]:
        yield CounterMetricFamily("kvsp_relay_connections_refused", "QUIC connections refused: over "
                                  "max_connections_per_client from one address", value=self.refused())
        values = self.stats.to_json()
        for name, doc in COUNTERS.items():
            yield CounterMetricFamily(f"kvsp_relay_{name}", doc, value=values[name])
        for name, doc in GAUGES.items():
            yield GaugeMetricFamily(f"kvsp_relay_{name}", doc, value=values[name])


class RelayRole:
    """The relay of one process: its `Relay`, upstream links and lifecycle."""

    def __init__(self, config: RoleConfig, settings: RelaySettings) -> None:
        tls = config.tls
        if tls is None:
            raise ValidationError("tls", "the relay needs [tls]: every MOQT session is mutually authenticated (D3)")
        self.settings = settings
        keys = tuple(load_token_key(path) for path in settings.token_keys)
        self.endpoint_config = EndpointConfig.from_files(tls.cert, tls.key, tls.ca, settings.quic, token_keys=keys)
        opened = settings.open_prefixes
        self.relay = Relay(settings, authorize=relay_authorizer(config.policy, peers=settings.peers,
                                                                open_prefixes=opened),
                           token_rule=_token_rule(opened))
        token = config.moqt.token_source("the relay's upstream link") if settings.upstream else None
        self.links = [UpstreamLink(self.relay, uri, self.endpoint_config, token=token) for uri in settings.upstream]

    def refused_connections(self) -> int:
        server = self.relay.server
        return 0 if server is None else server.refused

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        port = await self.relay.listen(self.settings.host, self.settings.port, self.endpoint_config)
        log.info("relaying MOQT on %s:%d as %s (drafts %s, %s)", self.settings.host, port, self.settings.uri,
                 ", ".join(str(p.draft) for p in self.endpoint_config.settings.profiles), self.settings.backend)
        for link in self.links:
            link.start()
        try:
            yield
        finally:
            for link in self.links:
                await link.close()
            await self.relay.drain()


def _token_rule(opened: tuple[Namespace, ...]) -> TokenRule:
    """A token covers the open namespaces, and KVSP ones by scope or prefix (``kvsp_token_rule``)."""

    def rule(claims: TokenClaims, namespace: Namespace) -> bool:
        return any(is_prefix(p, namespace) for p in opened) or kvsp_token_rule(claims, namespace)

    return rule


RELAY: web.AppKey[RelayRole] = web.AppKey("kvsp.relay", RelayRole)


async def stats_handler(request: web.Request) -> web.Response:
    """The counters, the namespaces published here and the upstream relays connected now."""
    role = request.app[RELAY]
    body: dict[str, object] = dict(role.relay.stats.to_json())
    body["namespaces"] = len(role.relay.table.under(()))
    body["upstreams"] = sum(1 for link in role.links if link.usable)
    body["cache_octets"] = role.relay.cache.octets
    body["connections_refused"] = role.refused_connections()
    return web.json_response(body)


def _health(app: web.Application) -> dict[str, object]:
    """GET {base}health facts: whether it drains, its upstream sessions, subscribers and publishers."""
    role = app[RELAY]
    stats = role.relay.stats
    return {"draining": role.relay.draining, "upstreams": sum(1 for link in role.links if link.usable),
            "subscribers": stats.subscribers, "publishers": stats.publishers}


def setup(app: web.Application, config: RoleConfig) -> None:
    """Relay MOQT per ``[relay]``; stats at ``{base}relay/stats`` and in ``{base}metrics``."""
    role = RelayRole(config, RelaySettings.from_config(config))
    app[RELAY] = role
    metrics_of(app).registry.register(RelayCollector(role.relay.stats, role.refused_connections))
    metrics_of(app).registry.register(MoqtSessionsCollector("kvsp_relay", lambda: role.relay.server))
    app.router.add_get(config.server.base_path + "relay/stats", stats_handler)
    app[HEALTH]["relay"] = _health
    app.cleanup_ctx.append(role.lifecycle)
