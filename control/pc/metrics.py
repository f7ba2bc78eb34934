"""PC metrics (spec section 8: migrations; plus placement and resharding), one registry per process."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from control.pc.core import InstanceRegistry, SessionTable
from kvsp.registry import InstanceState
from kvsp.service.metrics import Metrics


@dataclass(frozen=True, slots=True)
class PcMetrics:
    """Counters updated on the request and action paths; labels say the outcome."""

    placements: Counter  # result: assigned | woken | none
    cache_placements: Counter  # placements that came with a prefetch directive (loading beats recompute)
    prefetches: Counter  # result: accepted | failed
    starts: Counter  # result: accepted | failed
    migrations: Counter  # sessions resumed on another instance (resume accepted)
    resume_failures: Counter  # resume refused or undeliverable (the PC moves on)
    stranded: Counter  # reason: no-instance | no-checkpoint
    stale_epochs: Counter  # message: status | checkpoint
    statuses: Counter  # status records accepted
    denials: Counter  # operation: status | checkpoint | request | session | map
    instance_failures: Counter  # reason: expired | fault | restarted
    state_changes: Counter  # result: accepted | failed (PUT state attempts)
    reshards: Counter  # outcome: committed | aborted
    lookup_failures: Counter  # lookups at the IS that failed (placement went on without the cache)
    leader: Gauge  # 1 while this PC leads (holds the lease with its state loaded), else 0
    takeovers: Counter  # times this PC loaded the state from the store and began to lead
    step_downs: Counter  # times it stopped leading (lease lost or lapsed, a write fenced)
    store_errors: Counter  # op: writes and loads whose outcome is unknown (store unreachable)
    fenced_writes: Counter  # op: writes (renewals too) the store refused because this PC's fence was not the lease
    not_leader: Counter  # status: role requests answered 421 (naming the leader) or 503 (none known)

    @classmethod
    def register(cls, m: Metrics) -> PcMetrics:
        return cls(
            placements=m.counter("kvsp_pc_placements", "Placement decisions for POST requests", ("result",)),
            cache_placements=m.counter("kvsp_pc_cache_placements", "Placements that load cached blocks"),
            prefetches=m.counter("kvsp_pc_prefetches_sent", "Prefetch directives sent", ("result",)),
            starts=m.counter("kvsp_pc_session_starts", "POST sessions/{session}/start sent", ("result",)),
            migrations=m.counter("kvsp_pc_migrations", "Sessions resumed on another instance"),
            resume_failures=m.counter("kvsp_pc_resume_failures", "Resumes refused or undeliverable"),
            stranded=m.counter("kvsp_pc_sessions_stranded", "Sessions left without an instance", ("reason",)),
            stale_epochs=m.counter("kvsp_pc_stale_epoch_rejections", "Messages refused with kvsp-stale-epoch",
                                   ("message",)),
            statuses=m.counter("kvsp_pc_instance_statuses", "Instance Status Records accepted"),
            denials=m.counter("kvsp_pc_denials", "Requests refused for the client's identity", ("operation",)),
            instance_failures=m.counter("kvsp_pc_instance_failures", "Instance incarnations declared failed",
                                        ("reason",)),
            state_changes=m.counter("kvsp_pc_state_changes", "PUT state attempts", ("result",)),
            reshards=m.counter("kvsp_pc_reshards", "Reshard moves finished", ("outcome",)),
            lookup_failures=m.counter("kvsp_pc_lookup_failures", "Lookups at the IS that failed"),
            leader=m.gauge("kvsp_pc_leader", "1 while this PC leads"),
            takeovers=m.counter("kvsp_pc_takeovers", "Times this PC loaded the state and began to lead"),
            step_downs=m.counter("kvsp_pc_step_downs", "Times this PC stopped leading"),
            store_errors=m.counter("kvsp_pc_store_errors", "Store operations with an unknown outcome", ("op",)),
            fenced_writes=m.counter("kvsp_pc_fenced_writes", "Writes refused for a fence that was not the lease",
                                    ("op",)),
            not_leader=m.counter("kvsp_pc_not_leader_answers", "Role requests answered by a PC that does not lead",
                                 ("status",)),
        )


class HasCores(Protocol):
    """What the collector reads; the PC replaces its cores when it takes over, so it reads them anew."""

    @property
    def registry(self) -> InstanceRegistry: ...

    @property
    def sessions(self) -> SessionTable: ...


class PcCollector(Collector):
    """Gauges read from the cores at scrape time, so no request path has to keep them current."""

    def __init__(self, pc: HasCores) -> None:
        self.pc = pc

    def collect(self) -> Iterable[Metric]:
        registry, sessions = self.pc.registry, self.pc.sessions
        by_state = GaugeMetricFamily("kvsp_pc_instances", "Instances by the PC's view of their state",
                                     labels=("state",))
        counts = dict.fromkeys(InstanceState, 0)
        for instance in registry:
            state = registry.state_of(instance)
            if state is not None:
                counts[state] += 1
        for state, n in counts.items():
            by_state.add_metric((state.value,), n)
        yield by_state
        yield GaugeMetricFamily("kvsp_pc_sessions", "Sessions tracked (including tombstones)",
                                value=len(sessions))
        yield GaugeMetricFamily("kvsp_pc_sessions_waiting", "Sessions stranded until an instance is free",
                                value=len(sessions.stranded()))
