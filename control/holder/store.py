"""Which blocks the holder keeps, in which tier, and what to give up under pressure (sans-I/O).

`BlockStore` is bookkeeping only: it never touches bytes, sockets or the clock.  Callers pass ``now``
and get back *events* (`Place`, `Demote`, `Move`, `Withdraw`, `Evict`, `Publish`, `Republish`) that say what
the adapter must do with the data and with the Index Service, in order.  That keeps every policy
decision (LRU order, capacity, lease pinning, retention) testable without a disk or a server.

Rules the store guarantees:

* **Capacity** is counted per tier in octets of layer data (K and V sections).  A tier never holds
  more than its capacity once the events of a call are applied.
* **Placement is per layer range.**  Tiers are ordered fastest first; a block's layers are split into
  contiguous ranges, the lower layers in the faster tier.  Under pressure the *highest* layers of the
  least recently used block move down one tier (`Demote`), only as many as are needed, so a reader
  can still start on the first layers from memory while the rest stream from disk.  Every change of
  residency is followed by `Republish`, so the Index Service sees the new split.
* **Split on arrival** (``fast_layers`` N > 0): a new block's first N layers go to the fastest tier and
  the rest to the next one, so the fast tier holds the start of many blocks (a reader computes on
  layer l while layer l+1 arrives); the record reports the split (spec section 4.4).
* **Explicit moves**: `arrange` gives a block a new split (promotion or demotion of any layer range,
  still lower layers in faster tiers), making room like `put` does, and returns `Move` events and a
  `Republish`.
* **Leases pin.**  A block whose key is leased is never evicted by `put` or `expire`; it may only
  be demoted (moving data is not evicting it).  `force_evict` (a fault: the data is lost or must go)
  is the one path that evicts leased data, and it returns `Withdraw` first: the adapter completes the
  withdrawal before it drops the data (spec section 6.6).
* **Every eviction is announced**: `Withdraw` comes before its `Evict` in the event list.
* **Retention**: an entry expires ``retention_s`` after it was stored (spec section 10: retention
  limits); an expired entry is no longer served unless leased, and `expire` removes it.
* **Adoption**: blocks found in local storage at startup are taken in with their original stored-at
  time (`adopt`), then `trim` brings each tier back within its capacity (it may have shrunk).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Protocol

from kvsp.container import ContainerHeader, LayerRange
from kvsp.errors import KvspError
from kvsp.registry import Tier

EVICT_CAPACITY: Final = "capacity"
EVICT_EXPIRED: Final = "expired"
EVICT_FAULT: Final = "fault"


class StoreError(KvspError):
    """Root of the store's errors."""


class PlacementError(StoreError):
    """An arrangement the store cannot take: not contiguous, an absent tier, or slower below faster."""


class BlockExistsError(StoreError):
    """A replica for this (compat, scope, key) is already held (HTTP 412: the old copy is kept)."""


# -- identities and metadata -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class BlockId:
    """A block resource: blocks/{compat}/{scope}/{block_key} (spec section 6.7)."""

    compat_id: bytes
    scope_id: bytes
    block_key: bytes

    def __str__(self) -> str:
        return f"{self.compat_id.hex()}/{self.scope_id.hex()}/{self.block_key.hex()}"


@dataclass(frozen=True, slots=True)
class BlockMeta:
    """What a stored block is, fixed when it is stored: the header, the digests and the sizes.

    ``repr_digest`` is the SHA-256 of the full container as stored, computed once so that serving
    the whole block never hashes it again.
    """

    block: BlockId
    header: ContainerHeader
    layer_digests: tuple[bytes, ...]
    digest: bytes
    repr_digest: bytes
    _ends: tuple[int, ...] = field(init=False, repr=False, compare=False)  # cumulative layer octets

    def __post_init__(self) -> None:
        if len(self.layer_digests) != self.header.layer_count:
            raise ValueError("one layer digest per layer is required")
        if self.header.first_layer != 0:
            raise ValueError("the store keeps whole blocks: the first layer must be 0")
        object.__setattr__(self, "_ends", (0, *itertools.accumulate(map(sum, self.header.lengths))))

    @property
    def codec(self) -> int:
        return self.header.codec

    @property
    def size(self) -> int:
        """Octets of the full container (the record's ``size``)."""
        return self.header.container_length

    @property
    def layers(self) -> LayerRange:
        return self.header.layer_range

    @property
    def data_octets(self) -> int:
        """Octets of layer data: what the block costs in a tier."""
        return self._ends[-1]

    def octets(self, layers: LayerRange) -> int:
        """Layer data octets of the inclusive range ``layers``."""
        return self._ends[layers.last + 1] - self._ends[layers.first]

    def offset(self, layer: int) -> int:
        """Offset of ``layer`` in the data section of the full container."""
        return self._ends[layer]


@dataclass(frozen=True, slots=True)
class Segment:
    """Layers ``layers`` of one block reside in ``tier``."""

    tier: Tier
    layers: LayerRange


@dataclass(frozen=True, slots=True)
class Entry:
    """One held replica.  Immutable: the store replaces it on change, so a reader's snapshot stays
    consistent across awaits while the store moves on."""

    meta: BlockMeta
    placement: tuple[Segment, ...]  # ascending, contiguous, covering every layer
    stored_at: float
    expires_at: float

    @property
    def block(self) -> BlockId:
        return self.meta.block

    def segment_in(self, tier: Tier) -> Segment | None:
        for segment in self.placement:
            if segment.tier is tier:
                return segment
        return None

    def octets_in(self, tier: Tier) -> int:
        segment = self.segment_in(tier)
        return 0 if segment is None else self.meta.octets(segment.layers)

    def segments(self, layers: LayerRange) -> list[Segment]:
        """The parts of ``layers`` by tier, in layer order (each clipped to ``layers``)."""
        out = []
        for segment in self.placement:
            first = max(segment.layers.first, layers.first)
            last = min(segment.layers.last, layers.last)
            if first <= last:
                out.append(Segment(segment.tier, LayerRange(first, last)))
        return out

    def remaining_s(self, now: float) -> float:
        return max(0.0, self.expires_at - now)


# -- events ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Place:
    """Keep the new block's ``layers`` in ``tier``."""

    meta: BlockMeta
    tier: Tier
    layers: LayerRange

    @property
    def block(self) -> BlockId:
        return self.meta.block


@dataclass(frozen=True, slots=True)
class Move:
    """Copy ``layers`` from ``source`` to ``target`` (up or down), then free them in ``source``: an
    explicit promotion or demotion made by `BlockStore.arrange`, or (as `Demote`) one made for room."""

    meta: BlockMeta
    layers: LayerRange
    source: Tier
    target: Tier

    @property
    def block(self) -> BlockId:
        return self.meta.block


@dataclass(frozen=True, slots=True)
class Demote(Move):
    """A capacity-driven `Move` to a slower tier, made to take a new block (counted as a demotion).

    The event carries the metadata because a later event of the same batch may evict the block.
    """


@dataclass(frozen=True, slots=True)
class Withdraw:
    """Withdraw the block's replica record from the Index Service (before its `Evict`)."""

    block: BlockId


@dataclass(frozen=True, slots=True)
class Evict:
    """Drop every octet of ``block`` from every tier.  ``reason``: capacity, expired or fault."""

    block: BlockId
    reason: str


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish the new replica's record."""

    block: BlockId


@dataclass(frozen=True, slots=True)
class Republish:
    """The block's residency changed: publish its record again."""

    block: BlockId


Event = Place | Demote | Move | Withdraw | Evict | Publish | Republish


@dataclass(frozen=True, slots=True)
class PutOutcome:
    """The events of a `BlockStore.put`, and the tier the block went to (None: no room).

    Even without room the events may move other blocks (demotions made while looking for space);
    they are valid and must be applied.
    """

    events: tuple[Event, ...]
    tier: Tier | None


@dataclass(frozen=True, slots=True)
class ArrangeOutcome:
    """The events of a `BlockStore.arrange`; ``done`` is False when there was no room (the events may
    still move or evict other blocks while looking for it, and must be applied)."""

    events: tuple[Event, ...]
    done: bool


class Pins(Protocol):
    """Who says whether a block key is leased (the `LeaseTable`)."""

    def is_leased(self, block_key: bytes, now: float) -> bool: ...


class _NoPins:
    def is_leased(self, block_key: bytes, now: float) -> bool:
        return False


NO_PINS: Final = _NoPins()


# -- the store -------------------------------------------------------------------------------------


class BlockStore:
    """Entries keyed by `BlockId`, in LRU order across tiers, with per-tier capacities in octets.

    ``capacities`` lists the tiers fastest first (``{Tier.HOST: ..., Tier.LOCAL_STORAGE: ...}``);
    data demotes from one tier to the next.  ``fast_layers`` > 0 splits new blocks: the first
    ``fast_layers`` layers in the fastest tier that takes them, the rest in the next tier.
    """

    __slots__ = ("_by_key", "_capacity", "_entries", "_expiry", "_fast_layers", "_pins", "_retention_s", "_tiers",
                 "_used")

    def __init__(self, capacities: Mapping[Tier, int], *, retention_s: float, pins: Pins = NO_PINS,
                 fast_layers: int = 0) -> None:
        if not capacities or any(c < 0 for c in capacities.values()):
            raise ValueError("the store needs at least one tier, with capacities >= 0")
        if fast_layers < 0:
            raise ValueError("fast_layers must be >= 0")
        self._fast_layers = fast_layers
        self._tiers: tuple[Tier, ...] = tuple(capacities)
        self._capacity = dict(capacities)
        self._used = dict.fromkeys(self._tiers, 0)
        self._retention_s = retention_s
        self._pins = pins
        self._entries: OrderedDict[BlockId, Entry] = OrderedDict()  # least recently used first
        self._expiry: dict[BlockId, None] = {}  # insertion order == expiry order (constant retention)
        self._by_key: dict[bytes, set[BlockId]] = {}  # leases name block keys only

    # -- queries ---------------------------------------------------------------------------------
    @property
    def tiers(self) -> tuple[Tier, ...]:
        return self._tiers

    def capacity(self, tier: Tier) -> int:
        return self._capacity[tier]

    def used(self, tier: Tier) -> int:
        return self._used[tier]

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block: object) -> bool:
        return block in self._entries

    def __iter__(self) -> Iterator[Entry]:
        """Entries from least to most recently used."""
        return iter(list(self._entries.values()))

    def peek(self, block: BlockId) -> Entry | None:
        """The entry whatever its expiry, without touching the LRU order."""
        return self._entries.get(block)

    def get(self, block: BlockId, now: float, *, touch: bool = True) -> Entry | None:
        """The live entry (unexpired, or expired but leased), marked as most recently used."""
        entry = self._entries.get(block)
        if entry is None or not self._live(entry, now):
            return None
        if touch:
            self._entries.move_to_end(block)
        return entry

    def with_key(self, block_key: bytes, now: float) -> list[Entry]:
        """Live entries whose block key is ``block_key`` (leases name keys only)."""
        blocks = self._by_key.get(block_key, ())
        return [e for e in (self._entries[b] for b in sorted(blocks)) if self._live(e, now)]

    def is_leased(self, entry: Entry, now: float) -> bool:
        return self._pins.is_leased(entry.block.block_key, now)

    def _live(self, entry: Entry, now: float) -> bool:
        return now < entry.expires_at or self.is_leased(entry, now)

    # -- mutations -------------------------------------------------------------------------------
    def put(self, meta: BlockMeta, now: float) -> PutOutcome:
        """Admit a new block into the fastest tier that can make room for it.

        Raises `BlockExistsError` when a live replica is held (the old copy is kept, spec 6.7).
        """
        events: list[Event] = []
        old = self._entries.get(meta.block)
        if old is not None:
            if self._live(old, now):
                raise BlockExistsError(f"block {meta.block} is already held")
            self._evict(old, EVICT_EXPIRED, events)
        exclude = frozenset({meta.block})
        options = [self._split(meta, i) for i in range(len(self._tiers) - 1)] if self._splits(meta) else []
        options += [(Segment(tier, meta.layers),) for tier in self._tiers]
        for placement in options:
            if all(self._make_room(s.tier, meta.octets(s.layers), now, exclude, events) for s in placement):
                self._admit(meta, placement, now)
                events += (*(Place(meta, s.tier, s.layers) for s in placement), Publish(meta.block))
                return PutOutcome(tuple(events), placement[0].tier)
        return PutOutcome(tuple(events), None)

    def adopt(self, meta: BlockMeta, placement: Sequence[Segment], stored_at: float) -> None:
        """Take in a block found in a tier at startup, stored at ``stored_at`` (retention runs from
        then), as the most recently used.  No room is made: call `trim` after the last one.
        Raises `BlockExistsError` when it is held, `PlacementError` for an invalid placement.
        """
        if meta.block in self._entries:
            raise BlockExistsError(f"block {meta.block} is already held")
        placement = self._checked(meta, placement)
        last = next(reversed(self._expiry), None)
        self._admit(meta, placement, stored_at)
        if last is not None and self._entries[last].expires_at > stored_at + self._retention_s:
            # out of order (callers adopt oldest first, so this is rare): `expire` relies on the order
            self._expiry = dict.fromkeys(sorted(self._expiry, key=lambda b: self._entries[b].expires_at))

    def trim(self, now: float) -> list[Event]:
        """Bring every tier back within its capacity (after adoption, or a smaller capacity): demote
        least recently used data, then evict unleased blocks, as `put` does."""
        events: list[Event] = []
        for tier in self._tiers:
            if self._free(tier) < 0:
                self._make_room(tier, 0, now, frozenset(), events)
        return events

    def _splits(self, meta: BlockMeta) -> bool:
        return 0 < self._fast_layers < meta.layers.count and len(self._tiers) > 1

    def _split(self, meta: BlockMeta, index: int) -> tuple[Segment, ...]:
        """The first ``fast_layers`` layers in tier ``index``, the rest in the next tier."""
        n = self._fast_layers
        return (Segment(self._tiers[index], LayerRange(0, n - 1)),
                Segment(self._tiers[index + 1], LayerRange(n, meta.layers.last)))

    def _admit(self, meta: BlockMeta, placement: tuple[Segment, ...], now: float) -> None:
        self._entries[meta.block] = Entry(meta, placement, now, now + self._retention_s)
        self._expiry[meta.block] = None
        self._by_key.setdefault(meta.block.block_key, set()).add(meta.block)
        for segment in placement:
            self._used[segment.tier] += meta.octets(segment.layers)

    def arrange(self, block: BlockId, placement: Sequence[Segment], now: float) -> ArrangeOutcome:
        """Give a held block a new split across tiers (promote or demote any layer ranges).

        ``placement`` lists (tier, layers) pieces covering every layer once, lower layers in faster
        tiers.  Room is made in the tiers that grow as for `put` (demoting or evicting *other* blocks).
        Raises `PlacementError` for an invalid placement, `KeyError` when the block is not held.
        """
        entry = self.get(block, now, touch=False)
        if entry is None:
            raise KeyError(block)
        target = self._checked(entry.meta, placement)
        if target == entry.placement:
            return ArrangeOutcome((), True)
        meta = entry.meta
        growth = {t: sum(meta.octets(s.layers) for s in target if s.tier is t) - entry.octets_in(t)
                  for t in self._tiers}
        events: list[Event] = []
        for tier, need in growth.items():
            if need > 0 and not self._make_room(tier, need, now, frozenset({block}), events):
                return ArrangeOutcome(tuple(events), False)
        self._entries[block] = replace(self._entries[block], placement=target)
        for tier, change in growth.items():
            self._used[tier] += change
        events += [Move(meta, layers, source, dest) for layers, source, dest in _runs(entry.placement, target)]
        events.append(Republish(block))
        return ArrangeOutcome(tuple(events), True)

    def _checked(self, meta: BlockMeta, placement: Sequence[Segment]) -> tuple[Segment, ...]:
        pieces = tuple(sorted(placement, key=lambda s: s.layers.first))
        expected_first, last_rank = 0, -1
        for segment in pieces:
            if segment.tier not in self._capacity:
                raise PlacementError(f"this holder has no {segment.tier} tier")
            rank = self._tiers.index(segment.tier)
            if rank <= last_rank:
                raise PlacementError("lower layers must be in faster tiers, each tier holding one range")
            if segment.layers.first != expected_first:
                raise PlacementError(f"the placement must cover layers {meta.layers} contiguously")
            expected_first, last_rank = segment.layers.last + 1, rank
        if expected_first != meta.layers.last + 1:
            raise PlacementError(f"the placement must cover layers {meta.layers} contiguously")
        return pieces

    def expire(self, now: float) -> list[Event]:
        """Remove entries past their retention that no lease pins."""
        events: list[Event] = []
        for block in list(self._expiry):
            entry = self._entries[block]
            if entry.expires_at > now:
                break  # later entries were stored later
            if not self.is_leased(entry, now):
                self._evict(entry, EVICT_EXPIRED, events)
        return events

    def force_evict(self, block: BlockId) -> list[Event]:
        """Evict even leased data (a fault).  The `Withdraw` event MUST complete before the `Evict`."""
        entry = self._entries.get(block)
        if entry is None:
            return []
        events: list[Event] = []
        self._evict(entry, EVICT_FAULT, events)
        return events

    # -- capacity --------------------------------------------------------------------------------
    def _free(self, tier: Tier) -> int:
        return self._capacity[tier] - self._used[tier]

    def _lower(self, tier: Tier) -> Tier | None:
        index = self._tiers.index(tier) + 1
        return self._tiers[index] if index < len(self._tiers) else None

    def _make_room(self, tier: Tier, need: int, now: float, exclude: frozenset[BlockId],
                   events: list[Event]) -> bool:
        """Free ``need`` octets in ``tier``: demote LRU data one tier down, then evict unleased LRU blocks."""
        if need > self._capacity[tier]:
            return False
        lower = self._lower(tier)
        if lower is not None:
            for block in list(self._entries):
                if self._free(tier) >= need:
                    return True
                entry = self._entries.get(block)
                if entry is None or block in exclude or entry.segment_in(tier) is None:
                    continue
                if not self._demote(entry, tier, lower, amount=need - self._free(tier), now=now, exclude=exclude,
                                    events=events):
                    break  # the lower tier is full of pinned data: fall back to eviction
        for block in list(self._entries):
            if self._free(tier) >= need:
                return True
            entry = self._entries.get(block)
            if entry is None or block in exclude or entry.octets_in(tier) == 0 or self.is_leased(entry, now):
                continue
            self._evict(entry, EVICT_CAPACITY, events)
        return self._free(tier) >= need

    def _demote(self, entry: Entry, source: Tier, target: Tier, *, amount: int, now: float,
                exclude: frozenset[BlockId], events: list[Event]) -> bool:
        """Move the smallest top slice of ``entry``'s layers in ``source`` worth ``amount`` octets."""
        segment = entry.segment_in(source)
        assert segment is not None  # the caller checked
        meta = entry.meta
        first = segment.layers.last
        while first > segment.layers.first and meta.octets(LayerRange(first, segment.layers.last)) < amount:
            first -= 1
        moving = LayerRange(first, segment.layers.last)
        moved = meta.octets(moving)
        if not self._make_room(target, moved, now, exclude | {entry.block}, events):
            return False
        entry = self._entries[entry.block]  # making room below never evicts an excluded block
        self._entries[entry.block] = replace(entry, placement=_moved(entry.placement, moving, source, target))
        self._used[source] -= moved
        self._used[target] += moved
        events += (Demote(meta, moving, source, target), Republish(entry.block))
        return True

    def _evict(self, entry: Entry, reason: str, events: list[Event]) -> None:
        for segment in entry.placement:
            self._used[segment.tier] -= entry.meta.octets(segment.layers)
        del self._entries[entry.block]
        self._expiry.pop(entry.block, None)
        same_key = self._by_key[entry.block.block_key]
        same_key.discard(entry.block)
        if not same_key:
            del self._by_key[entry.block.block_key]
        events += (Withdraw(entry.block), Evict(entry.block, reason))


def _runs(old: Sequence[Segment], new: Sequence[Segment]) -> list[tuple[LayerRange, Tier, Tier]]:
    """Maximal layer ranges that change tier between two placements: (layers, source, target)."""
    def tier_of(placement: Sequence[Segment], layer: int) -> Tier:
        return next(s.tier for s in placement if layer in s.layers)

    out: list[tuple[LayerRange, Tier, Tier]] = []
    last = max(s.layers.last for s in new)
    for layer in range(last + 1):
        source, target = tier_of(old, layer), tier_of(new, layer)
        if source is target:
            continue
        if out and out[-1][0].last == layer - 1 and out[-1][1:] == (source, target):
            out[-1] = (LayerRange(out[-1][0].first, layer), source, target)
        else:
            out.append((LayerRange(layer, layer), source, target))
    return out


def _moved(placement: Sequence[Segment], moving: LayerRange, source: Tier, target: Tier) -> tuple[Segment, ...]:
    """The placement after the top layers ``moving`` of ``source`` join ``target`` (the next tier)."""
    out: list[Segment] = []
    for segment in placement:
        if segment.tier is source:
            if moving.first > segment.layers.first:
                out.append(Segment(source, LayerRange(segment.layers.first, moving.first - 1)))
        elif segment.tier is target:
            continue
        else:
            out.append(segment)
    below = next((s for s in placement if s.tier is target), None)
    last = below.layers.last if below is not None else moving.last
    out.append(Segment(target, LayerRange(moving.first, last)))
    return tuple(sorted(out, key=lambda s: s.layers.first))
