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
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from kvsp.records.lookup import TargetEstimate
from kvsp.records.replica import ReplicaRecord
from kvsp.records.status import InstanceStatus, Link
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


def _is_resident(group: Sequence[ReplicaRecord], status: InstanceStatus, resident: Collection[bytes]) -> bool:
    return group[0].block_key in resident or any(record.holder == status.instance for record in group)


def plan_fetch(status: InstanceStatus, replicas_per_block: Blocks, *, resident: Collection[bytes] = (),
               block_bytes: int | None = None, layers: int | None = None) -> FetchPlan:
    """Greedy choice of a source per matched block (see the module docstring) and the resulting fetch_us."""
    loads: dict[str, float] = {}  # holder -> rtt + transfer time of what it sends
    sources: list[ReplicaRecord | None] = []
    for group in replicas_per_block:
        if not group:
            break
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


def fetch_us(status: InstanceStatus, replicas_per_block: Blocks, *, resident: Collection[bytes] = (),
             block_bytes: int | None = None, layers: int | None = None) -> float:
    """Time to make *all* matched blocks resident at the instance; infinite if one cannot be loaded."""
    plan = plan_fetch(status, replicas_per_block, resident=resident, block_bytes=block_bytes, layers=layers)
    return plan.fetch_us if plan.loaded_blocks == len(replicas_per_block) else math.inf


def estimate(status: InstanceStatus, replicas_per_block: Blocks, *, prompt_tokens: int, block_tokens: int,
             mean_service_us: float, resident: Collection[bytes] = (), block_bytes: int | None = None,
             layers: int | None = None) -> Estimate:
    """cost(i) of section 6.4 for one candidate, with the parts it is made of."""
    if block_tokens <= 0:
        raise ValueError("block_tokens must be positive")
    if prompt_tokens < len(replicas_per_block) * block_tokens:
        raise ValueError("prompt_tokens must cover every matched block")
    plan = plan_fetch(status, replicas_per_block, resident=resident, block_bytes=block_bytes, layers=layers)
    residual = recompute_us(status, prompt_tokens - plan.loaded_blocks * block_tokens)
    everything = recompute_us(status, prompt_tokens)
    with_cache = plan.fetch_us + residual
    wait = wait_us(status, mean_service_us)
    return Estimate(
        instance=status.instance, state=status.state, wait_us=wait, fetch_us=plan.fetch_us,
        residual_us=residual, recompute_us=everything, cost_us=wait + min(with_cache, everything),
        sources=plan.sources, uses_cache=plan.loaded_blocks > 0 and with_cache <= everything,
    )


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
    fetch = fetch_us(status, replicas_per_block, resident=resident, block_bytes=block_bytes, layers=layers)
    recompute = recompute_us(status, len(replicas_per_block) * block_tokens)
    return TargetEstimate(status.instance, fetch if math.isfinite(fetch) else None,
                          recompute if math.isfinite(recompute) else None)
