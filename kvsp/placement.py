"""The placement cost model of spec section 6.4, as pure functions over records.

    fetch_us(i)     = max over sources s of ( rtt_us(i,s) + 8 * bytes_from(s) / mbit_per_s(i,s) )
    recompute_us(i) = 1e6 * tokens / prefill_tokens_per_s(i)
    wait_us(i)      = queued(i) * mean service time at i
    cost(i)         = wait_us(i) + min( fetch_us(i) + recompute_us_of_unmatched(i), recompute_us_of_all(i) )

Choices the spec leaves open, made here:

- **Sources.**  Each block is loaded whole from one replica.  Blocks are taken in prefix order and
  each goes to the replica that minimises the resulting max over sources (ties: the earlier finish at
  that source, then the holder URI, then the order given).  Greedy, so not always optimal, but
  deterministic and O(blocks x replicas).
- **Reachability.**  An instance reaches a holder only through a link it reports for that holder URI
  (compared as written); replicas at holders without a link are skipped.  The loadable prefix ends at
  the first matched block that is neither resident nor reachable; its tokens and all later ones are
  recomputed, because engines extend a cache at its end rather than fill holes.
- **Residency.**  A block counts as resident (no fetch, no recompute) when its key is in ``resident``
  or one of its replicas is held by the instance itself (holder URI equal to the instance URI).
- **Rates.**  A replica's octets are spread over its residency entries in proportion to their layer
  counts.  Octets in a storage tier (local-storage, remote-storage) with a ``read_mbit_per_s`` move at
  ``min(link rate, read rate)``; all other octets at the link rate.  Only storage tiers are reduced, as
  the spec says; a storage entry without a read rate is not reduced.
- **Volume.**  ``bytes_from`` uses each replica's ``size`` unless ``block_bytes`` is given.  When
  ``layers`` (the model's layer count) is given, replicas that do not hold all layers are skipped.
- **Infinity.**  A prefill rate of 0 makes recomputing any token infinitely slow; `choose_instance`
  never picks an instance with infinite cost, nor one that is not active (section 6.3).

Computation (the results above do not depend on it):

- `PreparedBlocks` derives what the model needs of the replicas once per request: per block the
  holders and the replicas that hold every layer, and per distinct residency layout and volume a
  `ReplicaProfile` (whether it holds every layer; per residency entry the bits it carries and the read
  rate that caps them).  Pricing an instance is then a few look-ups per replica, and each transfer time
  is computed once per (profile, holder) and link set: it is kept in the instance's `LinkIndex`
  (``derived``, cached with the status's links), so the requests placed while a status is current
  reuse it, and blocks with two sources are compared without an inner loop.  The PC prices every
  candidate against one `PreparedBlocks`; the functions below build one per call.
- The fast greedy path is exact when rates are positive and RTTs and bit counts finite and
  non-negative, as a parsed record guarantees (the profiles and `InstanceStatus.link_index` say so:
  ``sound``): finish times then only grow and are never NaN, so a running maximum equals
  ``max(loads)`` and the ranks can be compared field by field.
  Anything else takes the plain path, the greedy above written out literally, so the results are the
  same, bit for bit, either way.
- Lower bounds, for callers that look for the cheapest instance (the PC's Placer):
  `PreparedBlocks.floor_us` is ``wait_us(i) + recompute of the tokens after the last matched block``,
  valid because fetch_us >= 0 and recompute grows with the tokens, so an instance whose bound already
  loses need not be priced; `PreparedBlocks.estimate_within` stops a plan as soon as its fetch time so
  far shows that the cost exceeds a given limit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from kvsp.records.lookup import TargetEstimate
from kvsp.records.replica import ReplicaRecord
from kvsp.records.status import InstanceStatus, Link, LinkIndex
from kvsp.registry import InstanceState

Blocks = Sequence[Sequence[ReplicaRecord]]


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """Which replica to load each block of the loadable prefix from, and how long it takes.

    ``sources[i]`` is the replica chosen for matched block i, or None when the block is resident.
    """

    fetch_us: float
    sources: tuple[ReplicaRecord | None, ...]

    @property
    def loaded_blocks(self) -> int:
        """Leading matched blocks that will be in the instance after the fetch."""
        return len(self.sources)


@dataclass(frozen=True, slots=True)
class Estimate:
    """The cost model's answer for one candidate instance (all times in microseconds).

    ``sources`` is the fetch plan that was priced (one entry per block of the loadable prefix, None
    for a resident block) even when recomputing everything is cheaper; ``loaded_blocks`` is what the
    PC should actually load: the plan's length when ``uses_cache``, else 0.
    """

    instance: str
    state: InstanceState
    wait_us: float
    fetch_us: float
    residual_us: float  # recompute of the tokens that the loadable prefix does not cover
    recompute_us: float  # recompute of all prompt tokens
    cost_us: float
    sources: tuple[ReplicaRecord | None, ...]
    uses_cache: bool  # whether the fetch branch of the min() is the cheaper one

    @property
    def loaded_blocks(self) -> int:
        return len(self.sources) if self.uses_cache else 0


def recompute_us(status: InstanceStatus, tokens: int) -> float:
    """Time to prefill ``tokens`` tokens at the instance's reported rate (infinite at rate 0)."""
    if tokens < 0:
        raise ValueError("tokens must not be negative")
    if tokens == 0:
        return 0.0
    if status.prefill_tokens_per_s <= 0:
        return math.inf
    return 1e6 * tokens / status.prefill_tokens_per_s


def wait_us(status: InstanceStatus, mean_service_us: float) -> float:
    """Queueing delay: queued requests times the mean service time the PC has observed."""
    return status.queued * mean_service_us


def transfer_us(record: ReplicaRecord, link: Link, volume: int) -> float:
    """8 * octets / rate for one replica over one link, with storage-tier octets at the tier's rate."""
    held = record.layer_count()
    if held == 0:  # no residency stated (only a record built in code): plain link rate
        return 8 * volume / link.mbit_per_s
    total = 0.0
    for entry in record.residency:
        rate = link.mbit_per_s
        if entry.is_storage and entry.read_mbit_per_s is not None:
            rate = min(rate, entry.read_mbit_per_s)
        total += 8 * volume * entry.layer_count / held / rate
    return total


Shares = tuple[tuple[float, float | None], ...]


class ReplicaProfile(NamedTuple):
    """What the cost model needs of a replica's residency for one volume, derived once per request.

    Replicas with equal residency (tier, layers, read rate per entry) and volume share one profile.
    ``shares`` has one ``(bits, read_mbit_per_s)`` pair per residency entry, so that over a link of
    rate R the replica takes ``sum(bits / min(R, read))`` microseconds (summed from 0.0 in entry order),
    ``read`` None meaning R: the very terms of `transfer_us`, with ``bits = 8 * volume * layer_count / held``
    (one pair ``(8 * volume, None)`` when no layer is stated).
    ``sound``: every bit count is finite and >= 0 and every read rate is > 0, so no transfer time is
    negative or NaN (always so for a parsed record).  A replica that does not hold every layer is
    never a source and has no shares.
    """

    complete: bool  # holds layers 0..layers-1 (True when the model's layer count is not given)
    shares: Shares
    sound: bool

    @classmethod
    def of(cls, record: ReplicaRecord, volume: int, layers: int | None) -> ReplicaProfile:
        if layers is not None and not record.holds(0, layers - 1):
            return cls(False, (), True)
        held = record.layer_count()
        if held == 0:  # the plain-link-rate case of `transfer_us`
            shares: Shares = ((float(8 * volume), None),)
        else:
            shares = tuple([(8 * volume * entry.layer_count / held,
                             entry.read_mbit_per_s if entry.read_mbit_per_s is not None and entry.is_storage else None)
                            for entry in record.residency])
        sound = True
        for bits, read in shares:
            if not (0 <= bits < math.inf and (read is None or read > 0)):
                sound = False
        return cls(True, shares, sound)


_UNKNOWN: Final = ReplicaProfile(True, (), False)  # not derivable: the plain path handles the record literally
# A replica that can be a source: holder number, (profile, holder) pair number, record, holder URI.
_Source = tuple[int, int, ReplicaRecord, str]
# Every distinct `Shares` gets a number that is never reused, so that transfer times derived for one link
# set (`LinkIndex.derived`) can be found again by later requests with replicas of the same profile.
_SHARES_IDS: dict[Shares, int] = {}
_NEXT_SHARES_ID: Final = itertools.count()
_MAX_SHARES_IDS: Final = 4096
_MAX_DERIVED: Final = 8192  # transfer times kept per link set


def _shares_id(shares: Shares) -> int:
    found = _SHARES_IDS.get(shares)
    if found is None:
        if len(_SHARES_IDS) >= _MAX_SHARES_IDS:
            _SHARES_IDS.clear()  # forgotten shares get new numbers: stale cache entries are never hit
        found = _SHARES_IDS[shares] = next(_NEXT_SHARES_ID)
    return found


class _Block(NamedTuple):
    key: bytes
    holders: tuple[str, ...]  # every holder of the block, complete or not (for residency)
    sources: tuple[_Source, ...]  # the replicas that hold every layer, in the order given
    # With exactly two sources, their fields unpacked (holder number, pair, record, holder URI), else
    # dummies with r2 None: the common case needs no inner loop.
    h1: int
    p1: int
    r1: ReplicaRecord | None
    u1: str
    h2: int
    p2: int
    r2: ReplicaRecord | None
    u2: str


class PreparedBlocks:
    """The matched blocks of one request, with each replica's facts derived once for every candidate.

    ``plan``/``fetch_us``/``estimate``/``target_estimate`` give what the functions of the same names
    give for the same arguments; `floor_us` bounds ``estimate(...).cost_us`` from below.
    """

    __slots__ = ("_all_holders", "_blocks", "_holder_uris", "_pair_keys", "_pair_shares", "block_bytes", "layers",
                 "matched", "replicas", "sound")

    def __init__(self, replicas_per_block: Blocks, *, block_bytes: int | None = None,
                 layers: int | None = None) -> None:
        self.replicas = replicas_per_block
        self.matched = len(replicas_per_block)
        self.block_bytes = block_bytes
        self.layers = layers
        # residency and volume -> profile, its number, and the number of its shares
        memo: dict[object, tuple[ReplicaProfile, int, int]] = {}
        holders: dict[str, int] = {}  # holder -> its number
        pairs: dict[tuple[int, int], int] = {}  # (profile, holder) -> pair number: a transfer time per instance
        self._pair_keys: list[tuple[str, int]] = []  # per pair: its key in `LinkIndex.derived`
        self._pair_shares: list[Shares] = []
        blocks: list[_Block] = []
        sound = True
        for group in replicas_per_block:
            if not group:
                break  # the plan ends here for every instance
            sources: list[_Source] = []
            for record in group:
                volume = record.size if block_bytes is None else block_bytes
                try:
                    key = (tuple([(e.tier, e.layers, e.read_mbit_per_s) for e in record.residency]), volume)
                    found = memo.get(key)
                    if found is None:
                        profile = ReplicaProfile.of(record, volume, layers)
                        found = memo[key] = (profile, len(memo), _shares_id(profile.shares))
                except Exception:  # only a record built in code gets here (e.g. octets beyond a double)
                    found = (_UNKNOWN, -1, _shares_id(_UNKNOWN.shares))
                profile, number, shares_id = found
                if profile.complete:
                    holder = record.holder
                    h = holders.setdefault(holder, len(holders))
                    pair = pairs.get((number, h))
                    if pair is None:
                        pair = pairs[number, h] = len(self._pair_keys)
                        self._pair_keys.append((holder, shares_id))
                        self._pair_shares.append(profile.shares)
                    sources.append((h, pair, record, holder))
                    sound = sound and profile.sound
            pair_fields = (*sources[0], *sources[1]) if len(sources) == 2 else (0, 0, None, "", 0, 0, None, "")
            blocks.append(_Block(group[0].block_key, tuple([r.holder for r in group]), tuple(sources), *pair_fields))
        self._blocks = tuple(blocks)
        self._holder_uris = tuple(holders)  # by holder number
        self.sound = sound
        # Every holder of a block the plan may reach: a plan for any other instance, with nothing resident,
        # can skip the residency test per block.
        self._all_holders = frozenset([uri for block in self._blocks for uri in block.holders])

    def plan(self, status: InstanceStatus, resident: Collection[bytes] = ()) -> FetchPlan:
        """`plan_fetch` for this instance."""
        links = status.link_index()
        if self.sound and links.sound:
            plan = self._plan_fast(status.instance, links, resident)
            assert plan is not None  # no limit was given
            return plan
        return self._plan_plain(status, resident)

    def _transfers(self, links: LinkIndex) -> list[float]:
        """Per pair, the transfer time over ``links`` (-1.0: no link), kept in ``links.derived`` for later requests.

        All pairs at once, in one loop: a plan needs most of them, and a call per pair would cost more
        than the arithmetic.
        """
        derived = links.derived
        transfers = [derived.get(key) for key in self._pair_keys]
        if None in transfers:
            by_holder = links.by_holder
            if len(derived) >= _MAX_DERIVED:
                derived.clear()
            for pair, (key, shares) in enumerate(zip(self._pair_keys, self._pair_shares, strict=True)):
                if transfers[pair] is not None:
                    continue
                link = by_holder.get(key[0])
                if link is None:
                    transfer = -1.0
                else:  # the terms of `transfer_us`, from 0.0 in entry order
                    rate = link.mbit_per_s
                    transfer = 0.0
                    for bits, read in shares:
                        transfer += bits / (read if read is not None and read < rate else rate)
                transfers[pair] = derived[key] = transfer
        return transfers  # type: ignore[return-value]  # every None was replaced

    def _plan_fast(self, instance: str, links: LinkIndex, resident: Collection[bytes],
                   give_up: tuple[float, float, float, float] | None = None) -> FetchPlan | None:
        """The greedy for ``sound`` records; None once ``give_up`` shows the cost to exceed its limit.

        ``give_up`` is ``(wait, tail, everything, limit)``: the instance's wait, recompute of the
        unmatched tail and of the whole prompt, and the cost to beat.
        """
        # Every finish time is >= 0 and not NaN here, and a holder's finish time only grows, so the
        # running maximum ``current`` is max(loads.values(), default=0.0) and comparing the ranks
        # field by field is comparing the tuples of `_plan_plain`.  ``current`` never exceeds the
        # final fetch_us, and the residual recompute is at least ``tail``: the cost is at least
        # wait + min(current + tail, everything) at every step.  Blocks with two sources (the usual
        # replication) are compared without the inner loop: this runs for every block and candidate.
        wait, tail, everything, limit = (0.0, 0.0, math.inf, math.inf) if give_up is None else give_up
        loads = self._starts(links)  # by holder number: when its next block would start (its RTT at first)
        transfers = self._transfers(links)  # by pair number; -1.0: no link
        current = 0.0
        sources: list[ReplicaRecord | None] = []
        best: ReplicaRecord | None
        some_resident = len(resident) > 0 or instance in self._all_holders  # else no block needs the test
        for key, holders, block_sources, h1, p1, r1, u1, h2, p2, r2, u2 in self._blocks:
            if some_resident and (key in resident or instance in holders):
                sources.append(None)
                continue
            if r2 is None:  # not two sources
                chosen = self._choose(block_sources, loads, transfers, current)
                if chosen is None:
                    break
                best, number, finish = chosen
            else:
                t1, t2 = transfers[p1], transfers[p2]
                if t1 >= 0.0:
                    best, number, finish = r1, h1, loads[h1] + t1  # type: ignore[operator]  # linked: a float
                    if t2 >= 0.0:
                        f2 = loads[h2] + t2  # type: ignore[operator]
                        top1 = finish if finish > current else current
                        top2 = f2 if f2 > current else current
                        if top2 < top1 or (top2 == top1 and (f2 < finish or (f2 == finish and u2 < u1))):
                            best, number, finish = r2, h2, f2
                elif t2 >= 0.0:
                    best, number, finish = r2, h2, loads[h2] + t2  # type: ignore[operator]
                else:
                    break
            loads[number] = finish
            if finish > current:
                current = finish
                least = current + tail
                if wait + (everything if everything < least else least) > limit:
                    return None
            sources.append(best)
        return FetchPlan(current, tuple(sources))

    @staticmethod
    def _choose(block_sources: tuple[_Source, ...], loads: list[float | None], transfers: list[float],
                current: float) -> tuple[ReplicaRecord, int, float] | None:
        """The source of a block with other than two sources: the least (max(current, finish), finish, holder)."""
        best: tuple[ReplicaRecord, int, float] | None = None
        best_max = best_finish = 0.0
        best_holder = ""
        for number, pair, record, holder in block_sources:
            transfer = transfers[pair]
            if transfer < 0.0:
                continue
            finish = loads[number] + transfer  # type: ignore[operator]  # a linked holder has a start
            top = finish if finish > current else current
            if best is None or top < best_max or (top == best_max and (
                    finish < best_finish or (finish == best_finish and holder < best_holder))):
                best, best_max, best_finish, best_holder = (record, number, finish), top, finish, holder
        return best

    def _starts(self, links: LinkIndex) -> list[float | None]:
        """Per holder number, the RTT as a float (None: no link), derived once per link set."""
        key = self._holder_uris
        found = links.derived.get(key)
        if found is None:
            by_holder = links.by_holder
            found = [None if (link := by_holder.get(uri)) is None else float(link.rtt_us) for uri in key]
            derived = links.derived
            if len(derived) >= _MAX_DERIVED:
                derived.clear()
            derived[key] = found
        return list(found)

    def _plan_plain(self, status: InstanceStatus, resident: Collection[bytes]) -> FetchPlan:
        """The greedy of the module docstring, literally (for records that are not ``sound``)."""
        layers, block_bytes = self.layers, self.block_bytes
        loads: dict[str, float] = {}  # holder -> rtt + transfer time of what it sends
        sources: list[ReplicaRecord | None] = []
        for group in itertools.islice(self.replicas, len(self._blocks)):
            if _is_resident(group, status, resident):
                sources.append(None)
                continue
            current = max(loads.values(), default=0.0)
            best: tuple[tuple[float, float, str], ReplicaRecord, float] | None = None
            for record in group:
                link = status.link_to(record.holder)
                if link is None or (layers is not None and not record.holds(0, layers - 1)):
                    continue
                volume = record.size if block_bytes is None else block_bytes
                finish = loads.get(record.holder, float(link.rtt_us)) + transfer_us(record, link, volume)
                rank = (max(current, finish), finish, record.holder)
                if best is None or rank < best[0]:
                    best = (rank, record, finish)
            if best is None:
                break
            _, record, finish = best
            loads[record.holder] = finish
            sources.append(record)
        return FetchPlan(max(loads.values(), default=0.0), tuple(sources))

    def fetch_us(self, status: InstanceStatus, resident: Collection[bytes] = ()) -> float:
        """`fetch_us` for this instance."""
        plan = self.plan(status, resident)
        return plan.fetch_us if plan.loaded_blocks == self.matched else math.inf

    def estimate(self, status: InstanceStatus, *, prompt_tokens: int, block_tokens: int, mean_service_us: float,
                 resident: Collection[bytes] = ()) -> Estimate:
        """`estimate` for this instance."""
        _check_prompt(self.matched, prompt_tokens, block_tokens)
        return self._estimate(status, self.plan(status, resident), prompt_tokens, block_tokens, mean_service_us)

    def estimate_within(self, status: InstanceStatus, *, prompt_tokens: int, block_tokens: int,
                        mean_service_us: float, limit_us: float, resident: Collection[bytes] = ()) -> Estimate | None:
        """`estimate`, or None when the cost is certainly above ``limit_us``: the plan then stops early.

        The plan stops once wait + min(fetch so far + recompute of the tail, recompute of all) exceeds
        the limit, a lower bound of the cost for ``sound`` records (see `_plan_fast`).  A cost equal to
        the limit is always returned.
        """
        _check_prompt(self.matched, prompt_tokens, block_tokens)
        links = status.link_index()
        if not (self.sound and links.sound):
            return self.estimate(status, prompt_tokens=prompt_tokens, block_tokens=block_tokens,
                                 mean_service_us=mean_service_us, resident=resident)
        give_up = (wait_us(status, mean_service_us), recompute_us(status, prompt_tokens - self.matched * block_tokens),
                   recompute_us(status, prompt_tokens), limit_us)
        plan = self._plan_fast(status.instance, links, resident, give_up)
        if plan is None:
            return None
        return self._estimate(status, plan, prompt_tokens, block_tokens, mean_service_us)

    @staticmethod
    def _estimate(status: InstanceStatus, plan: FetchPlan, prompt_tokens: int, block_tokens: int,
                  mean_service_us: float) -> Estimate:
        residual = recompute_us(status, prompt_tokens - plan.loaded_blocks * block_tokens)
        everything = recompute_us(status, prompt_tokens)
        with_cache = plan.fetch_us + residual
        wait = wait_us(status, mean_service_us)
        return Estimate(
            instance=status.instance, state=status.state, wait_us=wait, fetch_us=plan.fetch_us,
            residual_us=residual, recompute_us=everything, cost_us=wait + min(with_cache, everything),
            sources=plan.sources, uses_cache=plan.loaded_blocks > 0 and with_cache <= everything,
        )

    def floor_us(self, status: InstanceStatus, *, prompt_tokens: int, block_tokens: int,
                 mean_service_us: float) -> float:
        """A lower bound of ``estimate(...).cost_us`` whenever that cost is finite; -inf when none is known.

        ``wait + recompute of the unmatched tail``: the fetch time is >= 0 (``sound`` records) and the
        residual recompute covers at least the tail.  It performs every computation of `estimate` that
        could raise for this instance, so skipping the instance cannot hide an error.
        """
        _check_prompt(self.matched, prompt_tokens, block_tokens)
        tail = recompute_us(status, prompt_tokens - self.matched * block_tokens)
        floor = wait_us(status, mean_service_us) + min(tail, recompute_us(status, prompt_tokens))
        if math.isnan(floor) or not (self.sound and status.link_index().sound):
            return -math.inf
        return floor

    def target_estimate(self, status: InstanceStatus, *, block_tokens: int,
                        resident: Collection[bytes] = ()) -> TargetEstimate:
        """`target_estimate` for this instance."""
        fetch = self.fetch_us(status, resident)
        recompute = recompute_us(status, self.matched * block_tokens)
        return TargetEstimate(status.instance, fetch if math.isfinite(fetch) else None,
                              recompute if math.isfinite(recompute) else None)


def _check_prompt(matched: int, prompt_tokens: int, block_tokens: int) -> None:
    if block_tokens <= 0:
        raise ValueError("block_tokens must be positive")
    if prompt_tokens < matched * block_tokens:
        raise ValueError("prompt_tokens must cover every matched block")


def _is_resident(group: Sequence[ReplicaRecord], status: InstanceStatus, resident: Collection[bytes]) -> bool:
    return group[0].block_key in resident or any(record.holder == status.instance for record in group)


def plan_fetch(status: InstanceStatus, replicas_per_block: Blocks, *, resident: Collection[bytes] = (),
               block_bytes: int | None = None, layers: int | None = None) -> FetchPlan:
    """Greedy choice of a source per matched block (see the module docstring) and the resulting fetch_us."""
    return PreparedBlocks(replicas_per_block, block_bytes=block_bytes, layers=layers).plan(status, resident)


def fetch_us(status: InstanceStatus, replicas_per_block: Blocks, *, resident: Collection[bytes] = (),
             block_bytes: int | None = None, layers: int | None = None) -> float:
    """Time to make *all* matched blocks resident at the instance; infinite if one cannot be loaded."""
    return PreparedBlocks(replicas_per_block, block_bytes=block_bytes, layers=layers).fetch_us(status, resident)


def estimate(status: InstanceStatus, replicas_per_block: Blocks, *, prompt_tokens: int, block_tokens: int,
             mean_service_us: float, resident: Collection[bytes] = (), block_bytes: int | None = None,
             layers: int | None = None) -> Estimate:
    """cost(i) of section 6.4 for one candidate, with the parts it is made of."""
    _check_prompt(len(replicas_per_block), prompt_tokens, block_tokens)
    prepared = PreparedBlocks(replicas_per_block, block_bytes=block_bytes, layers=layers)
    return prepared.estimate(status, prompt_tokens=prompt_tokens, block_tokens=block_tokens,
                             mean_service_us=mean_service_us, resident=resident)


def choose_instance(estimates: Iterable[Estimate]) -> Estimate | None:
    """The active candidate with the lowest finite cost (ties: the smaller instance URI), or None.

    Non-active instances are never chosen (section 6.3); None tells the PC that it may start a new
    instance (section 6.4).
    """
    eligible = [e for e in estimates if e.state is InstanceState.ACTIVE and math.isfinite(e.cost_us)]
    return min(eligible, key=lambda e: (e.cost_us, e.instance), default=None)


def target_estimate(status: InstanceStatus, replicas_per_block: Blocks, *, block_tokens: int,
                    resident: Collection[bytes] = (), block_bytes: int | None = None,
                    layers: int | None = None) -> TargetEstimate:
    """The per-target answer of a lookup (section 6.2): fetch and recompute time of the matched blocks.

    A value without a finite estimate becomes None (JSON null).
    """
    prepared = PreparedBlocks(replicas_per_block, block_bytes=block_bytes, layers=layers)
    return prepared.target_estimate(status, block_tokens=block_tokens, resident=resident)
