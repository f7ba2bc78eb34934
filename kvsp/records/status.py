"""Instance Status Record (spec sections 4.4 and 6.3): load, rates and links of one inference instance.

Rules enforced beyond the member types:

- ``links`` names each holder at most once, since placement looks links up by holder URI;
- ``mbit_per_s`` of a link is greater than 0 (a link that carries nothing is no link; placement
  divides by it); ``rtt_us`` is an integer, like every duration in the spec;
- ``kv_utilization`` lies in [0, 1]; ``requested_state`` is null, absent or a registry state
  (the spec defines only "sleeping"; the PC decides what to do with the others).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Self

from kvsp._reader import ObjectReader
from kvsp.records._common import (
    HOLDER_SCHEMES,
    MAX_SAFE_INT,
    JsonRecord,
    check_unique,
    read_count,
    read_finite,
    read_positive,
    read_uri,
)
from kvsp.registry import INSTANCE_STATES, InstanceState

MAX_LINKS: Final = 4096


@dataclass(frozen=True, slots=True)
class Link(JsonRecord):
    """The instance's measured path to one holder (an https or moqt base URI, as in Replica Records)."""

    holder: str
    mbit_per_s: float
    rtt_us: int

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        return cls(read_uri(r, "holder", HOLDER_SCHEMES), read_finite(r, "mbit_per_s", positive=True),
                   r.int("rtt_us", maximum=MAX_SAFE_INT))

    def to_json(self) -> dict[str, object]:
        return {"holder": self.holder, "mbit_per_s": self.mbit_per_s, "rtt_us": self.rtt_us}


def _read_state(r: ObjectReader, name: str) -> InstanceState:
    return InstanceState(r.choice(name, INSTANCE_STATES))


@dataclass(frozen=True, slots=True)
class InstanceStatus(JsonRecord):
    """What an instance reports to the PC with PUT instances/{instance-id}/status."""

    instance: str
    epoch: int
    state: InstanceState
    running: int
    queued: int
    batch_size: int
    kv_utilization: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    links: tuple[Link, ...]
    ttl_ms: int
    requested_state: InstanceState | None = None

    @property
    def is_active(self) -> bool:
        """Only active instances get new requests or prefetch directives (section 6.3)."""
        return self.state is InstanceState.ACTIVE

    def link_to(self, holder: str) -> Link | None:
        """The link to ``holder`` (compared as written), or None when the instance reports none."""
        for link in self.links:
            if link.holder == holder:
                return link
        return None

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        links = tuple(Link.from_reader(o) for o in r.objects("links", max_items=MAX_LINKS))
        check_unique([link.holder for link in links], r.member("links"), "must not repeat a holder")
        return cls(
            instance=read_uri(r, "instance"),
            epoch=read_count(r, "epoch"),
            state=_read_state(r, "state"),
            running=read_count(r, "running"),
            queued=read_count(r, "queued"),
            batch_size=read_count(r, "batch_size"),
            kv_utilization=read_finite(r, "kv_utilization", maximum=1.0),
            prefill_tokens_per_s=read_finite(r, "prefill_tokens_per_s"),
            decode_tokens_per_s=read_finite(r, "decode_tokens_per_s"),
            links=links,
            ttl_ms=read_positive(r, "ttl_ms"),
            requested_state=r.optional("requested_state", lambda n: _read_state(r, n)),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "instance": self.instance,
            "epoch": self.epoch,
            "state": self.state.value,
            "running": self.running,
            "queued": self.queued,
            "batch_size": self.batch_size,
            "kv_utilization": self.kv_utilization,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "links": [link.to_json() for link in self.links],
            "requested_state": None if self.requested_state is None else self.requested_state.value,
            "ttl_ms": self.ttl_ms,
        }
