"""The front end's Prometheus metrics, served at ``{base}metrics`` on its mutual-TLS listener."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from kvsp.service.metrics import Metrics


@dataclass(frozen=True, slots=True)
class FrontendMetrics:
    requests: Counter  # label: status (HTTP status of the answer, or of the stream's end)
    tokens: Counter
    moves: Counter
    resumes: Counter
    resume_seconds: Counter
    duplicates: Counter
    resubmissions: Counter
    in_flight: Gauge

    @classmethod
    def register(cls, metrics: Metrics) -> FrontendMetrics:
        c, g = metrics.counter, metrics.gauge
        return cls(
            requests=c("kvsp_frontend_requests_total", "Completion requests answered", ("status",)),
            tokens=c("kvsp_frontend_tokens_total", "Output tokens delivered to clients"),
            moves=c("kvsp_frontend_session_moves_total", "Owner or epoch changes followed"),
            resumes=c("kvsp_frontend_resumes_total", "Streams resumed after a break"),
            resume_seconds=c("kvsp_frontend_resume_seconds_total",
                             "Sum of the gaps between the last token before a break and the first after it"),
            duplicates=c("kvsp_frontend_discarded_lines_total", "Token lines discarded (repeated or lower epoch)"),
            resubmissions=c("kvsp_frontend_resubmissions_total", "Requests submitted again after stranding"),
            in_flight=g("kvsp_frontend_requests_in_flight", "Completion requests being served"),
        )
