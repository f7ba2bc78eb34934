"""The instance's Prometheus metrics (spec section 8), as typed attributes rather than name lookups."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from kvsp.service.metrics import Metrics


@dataclass(frozen=True, slots=True)
class InstanceMetrics:
    tokens_fetched: Counter  # label: source (local: own tier; remote: fetched from a holder)
    tokens_recomputed: Counter
    digest_failures: Counter
    fetch_attempts: Counter  # label: outcome (kvsp.client.fetch.Outcome)
    prefetches: Counter  # label: state (final state of the directive)
    prefetch_blocks: Counter
    blocks_placed: Counter  # label: origin (loaded, computed)
    blocks_replicated: Counter  # label: result (stored, present, failed)
    sessions: Counter  # label: kind (start, resume)
    sessions_ended: Counter  # label: reason (max_tokens, fenced, failed)
    tokens_generated: Counter
    checkpoints: Counter  # label: result (acked, stale, refused, failed)
    resumes: Counter
    status_reports: Counter  # label: result (ok, failed)
    reshard_plans: Counter  # label: result (acked, failed, expired)
    reshard_bytes_moved: Counter
    reshard_bytes_retained: Counter
    reshard_bytes_discarded: Counter  # fetched for a version that was aborted or expired
    shard_bytes_held: Gauge  # KV octets of the authoritative versions of every map held
    shard_bytes_staged: Gauge  # KV octets fetched for versions not yet committed
    sessions_running: Gauge
    sessions_queued: Gauge
    layerwise_prefills: Counter  # label: result (overlapped, fallback)
    live_layers: Counter  # MOQT objects published live during prefills

    @classmethod
    def register(cls, metrics: Metrics) -> InstanceMetrics:
        c, g = metrics.counter, metrics.gauge
        return cls(
            tokens_fetched=c("kvsp_instance_tokens_fetched_total", "Prompt/context tokens whose KV was loaded",
                             ("source",)),
            tokens_recomputed=c("kvsp_instance_tokens_recomputed_total", "Context tokens whose KV was computed"),
            digest_failures=c("kvsp_instance_digest_failures_total", "Fetched blocks that failed a digest"),
            fetch_attempts=c("kvsp_instance_fetch_attempts_total", "Replica attempts", ("outcome",)),
            prefetches=c("kvsp_instance_prefetches_total", "Prefetch directives finished", ("state",)),
            prefetch_blocks=c("kvsp_instance_prefetch_blocks_total", "Blocks loaded by prefetch directives"),
            blocks_placed=c("kvsp_instance_blocks_placed_total", "Blocks placed in the own tiers", ("origin",)),
            blocks_replicated=c("kvsp_instance_blocks_replicated_total", "Block copies PUT to replicate_to",
                                ("result",)),
            sessions=c("kvsp_instance_sessions_total", "Sessions admitted", ("kind",)),
            sessions_ended=c("kvsp_instance_sessions_ended_total", "Sessions ended", ("reason",)),
            tokens_generated=c("kvsp_instance_tokens_generated_total", "Output tokens sampled"),
            checkpoints=c("kvsp_instance_checkpoints_total", "Checkpoint PUTs to the PC", ("result",)),
            resumes=c("kvsp_instance_resumes_total", "Sessions resumed from a checkpoint (migrations in)"),
            status_reports=c("kvsp_instance_status_reports_total", "Status PUTs to the PC", ("result",)),
            reshard_plans=c("kvsp_instance_reshard_plans_total", "Reshard plans answered", ("result",)),
            reshard_bytes_moved=c("kvsp_instance_reshard_bytes_moved_total", "KV octets fetched for reshard plans"),
            reshard_bytes_retained=c("kvsp_instance_reshard_bytes_retained_total",
                                     "KV octets kept in place across reshard commits"),
            reshard_bytes_discarded=c("kvsp_instance_reshard_bytes_discarded_total",
                                      "KV octets fetched for reshard plans and discarded (abort, deadline)"),
            shard_bytes_held=g("kvsp_instance_shard_bytes_held", "KV octets of the shard maps' authoritative versions"),
            shard_bytes_staged=g("kvsp_instance_shard_bytes_staged", "KV octets fetched for uncommitted versions"),
            sessions_running=g("kvsp_instance_sessions_running", "Sessions generating now"),
            sessions_queued=g("kvsp_instance_sessions_queued", "Sessions admitted and waiting"),
            layerwise_prefills=c("kvsp_instance_layerwise_prefills_total",
                                 "Prefills overlapped with loading the prefix layer by layer", ("result",)),
            live_layers=c("kvsp_instance_live_layers_total", "Block layers published live over MOQT in prefills"),
        )
