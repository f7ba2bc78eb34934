"""Which replicas of a block a client may use, and in which order it tries them (spec section 6.4).

Why: a lookup returns every replica of a block; the client tries them cheapest first and falls back
down the list.  The cost is the section 6.4 estimate for one source, ``rtt_us + 8 * octets / rate``,
computed with `kvsp.placement.transfer_us` on the residency entries that hold the needed layers, so a
source that keeps them in a storage tier with a low ``read_mbit_per_s`` ranks lower.  Ties go to the
replica whose slowest needed tier is faster (device before host before storage), then to the order
of the lookup answer.  Pure functions over records: no I/O, easy to test.

**Relays** (decision D4): a client with a rack relay (``LinkTable.local_relay``) reaches every ``moqt``
replica through it -- the relay chain routes by the record's ``moqt_namespace``, so the block crosses
the spine once and the rack relay's cache serves the next readers.  Such replicas are rewritten to
name the local relay (`via_relay`), merged when several name the same namespace, and tried first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from kvsp.container import LayerRange
from kvsp.placement import transfer_us
from kvsp.records import Link, ReplicaRecord, Residency
from kvsp.records.base import uri_scheme
from kvsp.registry import Tier

TIER_RANK: Final = {Tier.DEVICE: 0, Tier.HOST: 1, Tier.REMOTE_MEMORY: 2, Tier.LOCAL_STORAGE: 3,
                    Tier.REMOTE_STORAGE: 4}
HTTPS_ONLY: Final = frozenset({"https"})
HTTPS_AND_MOQT: Final = frozenset({"https", "moqt"})


@dataclass(frozen=True, slots=True)
class LinkTable:
    """The client's measured links to holders, with a default for holders it has not measured."""

    links: Mapping[str, Link]
    default_mbit_per_s: float = 10_000.0
    default_rtt_us: int = 1_000
    local_relay: str | None = None  # the moqt:// URI of the client's own rack relay

    @classmethod
    def of(cls, links: Sequence[Link] = (), *, default_mbit_per_s: float = 10_000.0,
           default_rtt_us: int = 1_000, local_relay: str | None = None) -> LinkTable:
        return cls({link.holder: link for link in links}, default_mbit_per_s, default_rtt_us, local_relay)

    def to(self, holder: str) -> Link:
        link = self.links.get(holder)
        return link if link is not None else Link(holder, self.default_mbit_per_s, self.default_rtt_us)


def full_range(record: ReplicaRecord) -> LayerRange | None:
    """All layers of the replica: those its layer digests cover, else its one contiguous held range."""
    if record.layer_digests:
        return LayerRange(0, len(record.layer_digests) - 1)
    held = record.layers_held()
    return LayerRange(*held[0]) if len(held) == 1 else None


def needed_range(group: Sequence[ReplicaRecord], layers: LayerRange | None,
                 model_layers: int | None) -> LayerRange | None:
    """The layers a client needs from one block: the requested range, else the whole block.

    The whole block is ``0..model_layers-1`` when the model's layer count is known, else the widest
    full range among the replicas (a replica that holds only some layers is then not a candidate).
    """
    if layers is not None:
        return layers
    if model_layers is not None:
        return LayerRange(0, model_layers - 1)
    ranges = [r for r in map(full_range, group) if r is not None and r.first == 0]
    return max(ranges, key=lambda r: r.last, default=None)


def eligible(record: ReplicaRecord, needed: LayerRange, schemes: frozenset[str] = HTTPS_ONLY) -> bool:
    """Whether this client can fetch ``needed`` from the replica and verify it (section 6.7).

    Only holders whose URI scheme is in ``schemes`` (``moqt`` replicas need a client with the MOQT
    block client).  A replica that holds the layers but lists no layer digests is used only when
    ``needed`` is all of it, so that the replica digest still vouches for the data: otherwise only the
    holder's own Repr-Digest would.  Over MOQT every object is checked against its layer digest, so a
    ``moqt`` replica without layer digests is never eligible.
    """
    scheme = uri_scheme(record.holder)
    if scheme not in schemes or not record.holds(needed.first, needed.last):
        return False
    if record.layer_digests:
        return needed.last < len(record.layer_digests)
    return scheme == "https" and full_range(record) == needed


def _clipped(record: ReplicaRecord, needed: LayerRange) -> tuple[Residency, ...]:
    out = []
    for entry in record.residency:
        first, last = max(entry.first, needed.first), min(entry.last, needed.last)
        if first <= last:
            out.append(Residency(entry.tier, (first, last), entry.read_mbit_per_s))
    return tuple(out)


def estimate_us(record: ReplicaRecord, needed: LayerRange, link: Link) -> float:
    """rtt + transfer time of the needed layers' share of the replica's octets (section 6.4)."""
    entries = _clipped(record, needed)
    held = record.layer_count()
    volume = record.size * needed.count // held if held else record.size
    return link.rtt_us + transfer_us(replace(record, residency=entries), link, volume)


def slowest_tier(record: ReplicaRecord, needed: LayerRange) -> int:
    return max((TIER_RANK.get(entry.tier, len(TIER_RANK)) for entry in _clipped(record, needed)),
               default=len(TIER_RANK))


def via_relay(record: ReplicaRecord, relay: str) -> ReplicaRecord:
    """A ``moqt`` replica as reached through ``relay``: the same namespace, digests and residency."""
    return record if record.holder == relay else replace(record, holder=relay)


def _through_local_relay(group: Sequence[ReplicaRecord], relay: str | None) -> list[ReplicaRecord]:
    """With a rack relay: every moqt replica rewritten to it, one per namespace (the first one's)."""
    if relay is None:
        return list(group)
    out: list[ReplicaRecord] = []
    seen: set[object] = set()
    for record in group:
        if uri_scheme(record.holder) != "moqt" or record.moqt_namespace is None:
            out.append(record)
        elif record.moqt_namespace not in seen:
            seen.add(record.moqt_namespace)
            out.append(via_relay(record, relay))
    return out


def rank_replicas(group: Sequence[ReplicaRecord], links: LinkTable, *, layers: LayerRange | None = None,
                  model_layers: int | None = None, schemes: frozenset[str] = HTTPS_ONLY) -> tuple[ReplicaRecord, ...]:
    """The usable replicas of one block, cheapest first (see the module docstring), among the holders
    reachable with ``schemes`` (https and moqt replicas compete on the same cost estimate); with a
    local relay, the replicas reached through it come first."""
    needed = needed_range(group, layers, model_layers)
    if needed is None:
        return ()
    relay = links.local_relay if "moqt" in schemes else None
    scored = []
    for position, record in enumerate(_through_local_relay(group, relay)):
        if eligible(record, needed, schemes):
            cost = estimate_us(record, needed, links.to(record.holder))
            local = relay is not None and record.holder == relay
            scored.append(((not local, cost, slowest_tier(record, needed), position), record))
    scored.sort(key=lambda item: item[0])
    return tuple(record for _, record in scored)
