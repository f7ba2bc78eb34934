"""Instance Status Record (spec sections 4.4 and 6.3): load, rates and links of one inference instance.

Rules enforced beyond the member types:

- ``links`` names each holder at most once, since placement looks links up by holder URI;
- ``mbit_per_s`` of a link is greater than 0 (a link that carries nothing is no link; placement
  divides by it); ``rtt_us`` is an integer, like every duration in the spec;
- ``kv_utilization`` lies in [0, 1]; ``requested_state`` is null, absent or a registry state
  (the spec defines only "sleeping"; the PC decides what to do with the others).

Placement looks links up by holder for every candidate replica, so `InstanceStatus.link_index` builds
a holder -> link map on first use and keeps it in a bounded cache keyed by the identity of the record's
``links`` tuple (held by the cache, so the identity cannot be reused while cached; records that share
the tuple, like a `dataclasses.replace` copy with another state, share the map).  The record itself,
its members, equality and JSON are untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Self

from kvsp.reader import ObjectReader
from kvsp.records.base import (
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
MAX_CACHED_LINK_INDEXES: Final = 4096  # link maps kept by `InstanceStatus.link_index`; then it starts over


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


@dataclass(frozen=True, slots=True)
class LinkIndex:
    """An instance's links by holder URI (see `InstanceStatus.link_index`).

    ``by_holder`` keeps the first link reported for each holder, as `InstanceStatus.link_to` does.
    ``sound`` says that every link has ``0 <= rtt_us <= MAX_SAFE_INT`` and ``mbit_per_s > 0``: always
    true of a parsed record; a record built in code may break it, and placement then takes its plain path.
    """

    by_holder: Mapping[str, Link]
    sound: bool
    # Derived per link set by placement (kvsp.placement owns the keys and values: transfer times by holder
    # and replica profile, start times by holder list).  The links are immutable, so what is derived from
    # them holds as long as this index does.
    derived: dict[object, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, links: tuple[Link, ...]) -> LinkIndex:
        by_holder: dict[str, Link] = {}
        sound = True
        for link in links:
            by_holder.setdefault(link.holder, link)
            if not (0 <= link.rtt_us <= MAX_SAFE_INT and link.mbit_per_s > 0):
                sound = False
        return cls(by_holder, sound)


_link_indexes: dict[int, tuple[tuple[Link, ...], LinkIndex]] = {}  # id(links) -> (links, index)


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
        return self.link_index().by_holder.get(holder)

    def link_index(self) -> LinkIndex:
        """The links by holder URI, built on the first call for this ``links`` tuple and then cached."""
        links = self.links
        cached = _link_indexes.get(id(links))
        if cached is not None and cached[0] is links:
            return cached[1]
        index = LinkIndex.of(links)
        if type(links) is not tuple:  # a mutable sequence built in code: its contents may change
            return index
        if len(_link_indexes) >= MAX_CACHED_LINK_INDEXES:
            _link_indexes.clear()
        _link_indexes[id(links)] = (links, index)
        return index

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
