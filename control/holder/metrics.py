"""The holder's Prometheus metrics (spec section 8), as typed attributes rather than name lookups."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from kvsp.service.metrics import Metrics


@dataclass(frozen=True, slots=True)
class HolderMetrics:
    blocks_stored: Counter
    blocks_served: Counter  # label: part (full, range; moqt-full, moqt-range)
    bytes_served: Counter  # label: transport (https, moqt)
    store_rejections: Counter  # label: reason (exists, full, digest, malformed, incompatible)
    lease_grants: Counter
    lease_rejections: Counter  # label: reason (ttl, octets, not-found)
    evictions: Counter  # label: reason (capacity, expired, fault)
    demotions: Counter
    digest_failures: Counter  # label: where (put: a sent Repr-Digest; storage: data at rest)
    index_failures: Counter  # label: operation (publish, withdraw)
    tier_used: Gauge  # label: tier
    tier_capacity: Gauge  # label: tier
    tier_read_rate: Gauge  # label: tier
    leases_active: Gauge
    blocks_adopted: Counter  # blocks taken over from local storage at startup
    adoption_drops: Counter  # label: reason (see control.holder.disk DROP_*)

    @classmethod
    def register(cls, metrics: Metrics) -> HolderMetrics:
        c, g = metrics.counter, metrics.gauge
        served = c("kvsp_holder_bytes_served_total", "Octets served: HTTPS containers, MOQT layer payloads",
                   ("transport",))
        for transport in ("https", "moqt"):  # both series from the start (0), so rates exist before a read
            served.labels(transport)
        return cls(
            blocks_stored=c("kvsp_holder_blocks_stored_total", "Blocks stored by PUT"),
            blocks_served=c("kvsp_holder_blocks_served_total", "Block representations served", ("part",)),
            bytes_served=served,
            store_rejections=c("kvsp_holder_store_rejections_total", "Block PUTs refused", ("reason",)),
            lease_grants=c("kvsp_holder_lease_grants_total", "Leases granted"),
            lease_rejections=c("kvsp_holder_lease_rejections_total", "Lease requests refused", ("reason",)),
            evictions=c("kvsp_holder_evictions_total", "Replicas evicted", ("reason",)),
            demotions=c("kvsp_holder_demotions_total", "Layer ranges moved host -> local-storage"),
            digest_failures=c("kvsp_holder_digest_failures_total", "Data that failed its digest", ("where",)),
            index_failures=c("kvsp_holder_index_failures_total", "Failed IS requests", ("operation",)),
            tier_used=g("kvsp_holder_tier_used_octets", "Layer data octets held per tier", ("tier",)),
            tier_capacity=g("kvsp_holder_tier_capacity_octets", "Configured capacity per tier", ("tier",)),
            tier_read_rate=g("kvsp_holder_tier_read_mbit_per_s", "Measured read rate per tier", ("tier",)),
            leases_active=g("kvsp_holder_leases_active", "Leases currently held"),
            blocks_adopted=c("kvsp_holder_blocks_adopted_total", "Blocks taken over from local storage at startup"),
            adoption_drops=c("kvsp_holder_adoption_drops_total", "Stored blocks removed at startup, not adopted",
                             ("reason",)),
        )
