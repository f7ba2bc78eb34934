"""Prometheus metrics for every role (spec section 8 SHOULDs), one registry per process.

Served at ``GET {base}metrics`` on the role's mutual-TLS listener: a scraper authenticates like any
other client.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest


@dataclass(slots=True)
class Metrics:
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))
    counters: dict[str, Counter] = field(default_factory=dict)
    gauges: dict[str, Gauge] = field(default_factory=dict)

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        if name not in self.counters:
            self.counters[name] = Counter(name, doc, labels, registry=self.registry)
        return self.counters[name]

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        if name not in self.gauges:
            self.gauges[name] = Gauge(name, doc, labels, registry=self.registry)
        return self.gauges[name]

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


METRICS: web.AppKey[Metrics] = web.AppKey("kvsp.metrics", Metrics)


def metrics_of(app: web.Application) -> Metrics:
    if METRICS not in app:
        app[METRICS] = Metrics()
    return app[METRICS]


async def metrics_handler(request: web.Request) -> web.Response:
    body = request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
