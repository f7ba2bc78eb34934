"""Prometheus metrics for every role (spec section 8 SHOULDs), one registry per process.

Served at ``GET {base}metrics`` on the role's mutual-TLS listener: a scraper authenticates like any
other client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric

if TYPE_CHECKING:
    from moqt.quic.backend import QuicServer


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


class MoqtSessionsCollector:
    """``{prefix}_moqt_sessions_total{draft}``: MOQT sessions a role's listener started, by the draft
    their ALPN agreed (read from ``sessions_by_draft`` of either back-end's server at scrape time), so an
    operator sees which drafts the clients speak before retiring one. Every accepted draft has a
    series from the start (0)."""

    def __init__(self, prefix: str, server: Callable[[], QuicServer | None]) -> None:
        self.prefix, self.server = prefix, server

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(f"{self.prefix}_moqt_sessions", "MOQT sessions started, by draft",
                                     labels=("draft",))
        server = self.server()
        if server is not None:
            counts = dict.fromkeys(server.drafts, 0) | server.sessions_by_draft
            for draft, n in sorted(counts.items()):
                family.add_metric((str(draft),), n)
        yield family
