"""Placement of a request (spec section 6.4) and the prefetch directive that goes with it, sans-I/O.

`Placer.place` turns a lookup response and the instances' status records into one decision:

- `Assign` to the active instance with the lowest cost (`kvsp.placement`), with a prefetch directive
  when loading the matched blocks beats recomputing them there;
- `Wake` of a sleeping instance, with its directive, when no active instance has acceptable cost
  (``max_cost_us``) or capacity (``max_queued``, ``max_kv_utilization``): the directive goes out at
  once after the state change so that loading overlaps the start (section 6.4);
- `NoPlacement` when neither exists.

Choices the spec leaves to the PC, made here:

- When the lookup carries a target estimate from the IS for an instance (section 6.2), its fetch_us
  replaces the PC's own: the IS may know links and residency the PC does not.  The PC's own plan still
  orders each block's sources.
- A directive lists the blocks of the loadable prefix that are not resident at the instance, each
  with the holder the cost model chose first and the other holders of that block after it (at most
  ``max_sources``), so the instance can fall back without asking the PC.
- deadline_ms is the estimated fetch time times ``deadline_slack``, at least ``min_deadline_ms``;
  lease_ms is at least the deadline, so a lease cannot run out while the block is still being loaded.
- A sleeping instance is woken only when it is cheaper than the best active one, or there is none.

Cost: the replicas' facts are derived once per request (`kvsp.placement.PreparedBlocks`) and the
candidates are priced in the order of a lower bound of their cost (`PreparedBlocks.floor_us`); once the
bound of the next one loses to the best cost found, no later one can win, so they are not priced.  The
decision is the one pricing every candidate would give (cheapest finite cost, ties by instance URI and,
among sleeping records of one URI, the first; of active records of one URI the last counts).
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from control.pc.core.events import Assign, NoPlacement, Placement, Wake
from kvsp.placement import Estimate, PreparedBlocks, recompute_us, wait_us
from kvsp.records import (
    InstanceStatus,
    LookupResponse,
    PrefetchBlock,
    PrefetchDirective,
    ReplicaRecord,
    TargetEstimate,
)
from kvsp.registry import InstanceState


def new_directive_id() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True, slots=True)
class PlacerConfig:
    """Policy knobs of the PC; ``block_tokens`` comes from the Compatibility Descriptor."""

    block_tokens: int
    mean_service_us: float = 0.0
    max_cost_us: float = math.inf
    max_queued: int | None = None
    max_kv_utilization: float = 1.0
    layers: int | None = None
    block_bytes: int | None = None
    lease_ms: int = 2000
    min_deadline_ms: int = 50
    deadline_slack: float = 2.0
    max_sources: int = 4


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """What the PC knows about a request: its scope, compatibility and prompt length in tokens."""

    scope_id: bytes
    compat_id: bytes
    prompt_tokens: int
    request_ref: str | None = None


@dataclass(frozen=True, slots=True)
class _Candidate:
    estimate: Estimate
    load_blocks: int  # leading matched blocks to make resident (0: recompute everything)


class Placer:
    """Picks an instance per request with the cost model of section 6.4."""

    __slots__ = ("_config", "_new_id")

    def __init__(self, config: PlacerConfig, *, new_id: Callable[[], str] = new_directive_id) -> None:
        self._config = config
        self._new_id = new_id

    def place(self, request: PlacementRequest, lookup: LookupResponse, active: Sequence[InstanceStatus],
              sleeping: Sequence[InstanceStatus] = (), *, resident: Mapping[str, Collection[bytes]] | None = None,
              service_us: Mapping[str, float] | None = None) -> Placement:
        """``active``/``sleeping`` come from `InstanceRegistry.eligible` and `.sleeping`; records in any
        other state are ignored, so a non-active instance never gets work or a directive."""
        pricing = _Pricing(self._config, request, lookup, resident or {}, service_us or {})
        by_uri: dict[str, InstanceStatus] = {}  # one record per URI, the last one given
        for s in active:
            if s.state is InstanceState.ACTIVE and self._has_capacity(s):
                shadowed = by_uri.get(s.instance)
                if shadowed is not None:
                    pricing.candidate(shadowed)  # priced and dropped, as a dict of candidates would do
                by_uri[s.instance] = s
        best = pricing.cheapest(list(by_uri.values()))
        if best is not None and best.estimate.cost_us <= self._config.max_cost_us:
            return Assign(best.estimate.instance, best.estimate.cost_us, self._directive(request, lookup, best))
        wake = pricing.cheapest([s for s in sleeping if s.state is InstanceState.SLEEPING])
        if wake is not None and (best is None or wake.estimate.cost_us < best.estimate.cost_us):
            return Wake(wake.estimate.instance, wake.estimate.cost_us, self._directive(request, lookup, wake))
        if best is not None:
            return Assign(best.estimate.instance, best.estimate.cost_us, self._directive(request, lookup, best))
        return NoPlacement("no active instance with capacity and no sleeping instance to wake")

    def _has_capacity(self, status: InstanceStatus) -> bool:
        limit = self._config.max_queued
        return (limit is None or status.queued <= limit) and status.kv_utilization <= self._config.max_kv_utilization

    def _directive(self, request: PlacementRequest, lookup: LookupResponse,
                   candidate: _Candidate) -> PrefetchDirective | None:
        """The prefetch directive for the blocks to load, or None when nothing is worth loading."""
        est = candidate.estimate
        blocks: list[PrefetchBlock] = []
        for i in range(candidate.load_blocks):
            chosen = est.sources[i] if i < len(est.sources) else None
            if i < len(est.sources) and chosen is None:
                continue  # already resident at the instance
            sources = self._sources(lookup.replicas[i], chosen, est.instance)
            if not sources:
                break  # nothing to load it from: later blocks could not extend the prefix
            blocks.append(PrefetchBlock(lookup.replicas[i][0].block_key, sources))
        if not blocks:
            return None
        cfg = self._config
        fetch_ms = est.fetch_us / 1000 if math.isfinite(est.fetch_us) else 0.0
        deadline_ms = max(cfg.min_deadline_ms, math.ceil(fetch_ms * cfg.deadline_slack))
        return PrefetchDirective(
            directive=self._new_id(), scope_id=request.scope_id, compat_id=request.compat_id,
            blocks=tuple(blocks), deadline_ms=deadline_ms, lease_ms=max(cfg.lease_ms, deadline_ms),
            request_ref=request.request_ref,
        )

    def _sources(self, group: Sequence[ReplicaRecord], chosen: ReplicaRecord | None, instance: str) -> tuple[str, ...]:
        holders = [chosen.holder] if chosen is not None else []
        holders.extend(r.holder for r in group)
        ordered = [h for h in dict.fromkeys(holders) if h != instance]
        return tuple(ordered[: self._config.max_sources])


class _Pricing:
    """The cost model applied to the candidates of one request, with the replicas' facts derived once."""

    __slots__ = ("_blocks", "_config", "_lookup", "_request", "_resident", "_service_us", "_targets")

    def __init__(self, config: PlacerConfig, request: PlacementRequest, lookup: LookupResponse,
                 resident: Mapping[str, Collection[bytes]], service_us: Mapping[str, float]) -> None:
        self._config = config
        self._request = request
        self._lookup = lookup
        self._resident = resident
        self._service_us = service_us
        self._blocks: PreparedBlocks | None = None  # built when the first candidate is priced
        self._targets: dict[str, TargetEstimate] = {}
        for target in lookup.targets:
            self._targets.setdefault(target.instance, target)  # the first estimate for an instance counts

    @property
    def blocks(self) -> PreparedBlocks:
        if self._blocks is None:
            cfg = self._config
            self._blocks = PreparedBlocks(self._lookup.replicas, block_bytes=cfg.block_bytes, layers=cfg.layers)
        return self._blocks

    def _mean_service_us(self, status: InstanceStatus) -> float:
        return self._service_us.get(status.instance, self._config.mean_service_us)

    def _target_fetch_us(self, status: InstanceStatus) -> float | None:
        target = self._targets.get(status.instance)
        return None if target is None else target.fetch_us

    def candidate(self, status: InstanceStatus) -> _Candidate:
        """The priced candidate with its fetch plan."""
        cfg, request, lookup = self._config, self._request, self._lookup
        est = self.blocks.estimate(status, prompt_tokens=request.prompt_tokens, block_tokens=cfg.block_tokens,
                                   mean_service_us=self._mean_service_us(status),
                                   resident=self._resident.get(status.instance, ()))
        target_fetch_us = self._target_fetch_us(status)
        if target_fetch_us is None:
            return _Candidate(est, est.loaded_blocks)
        # The IS's estimate covers all matched blocks (section 6.2); it replaces the PC's own.
        residual = recompute_us(status, request.prompt_tokens - lookup.matched * cfg.block_tokens)
        with_cache = target_fetch_us + residual
        uses_cache = lookup.matched > 0 and with_cache <= est.recompute_us
        est = dataclasses.replace(est, fetch_us=target_fetch_us, residual_us=residual, uses_cache=uses_cache,
                                  cost_us=est.wait_us + min(with_cache, est.recompute_us))
        return _Candidate(est, lookup.matched if uses_cache else 0)

    def _estimate_within(self, status: InstanceStatus, limit_us: float) -> Estimate | None:
        """The PC's own estimate, or None when its cost is certainly above ``limit_us``."""
        cfg, request = self._config, self._request
        return self.blocks.estimate_within(status, prompt_tokens=request.prompt_tokens,
                                           block_tokens=cfg.block_tokens,
                                           mean_service_us=self._mean_service_us(status), limit_us=limit_us,
                                           resident=self._resident.get(status.instance, ()))

    def _cost_us(self, status: InstanceStatus, target_fetch_us: float) -> float:
        """``candidate(status).estimate.cost_us`` when the IS gave a fetch estimate: no fetch plan needed."""
        cfg, request = self._config, self._request
        residual = recompute_us(status, request.prompt_tokens - self._lookup.matched * cfg.block_tokens)
        everything = recompute_us(status, request.prompt_tokens)
        return wait_us(status, self._mean_service_us(status)) + min(target_fetch_us + residual, everything)

    def _floor_us(self, status: InstanceStatus) -> float:
        """A lower bound of the candidate's cost when that cost is finite (-inf: none known)."""
        cfg = self._config
        floor = self.blocks.floor_us(status, prompt_tokens=self._request.prompt_tokens,
                                     block_tokens=cfg.block_tokens, mean_service_us=self._mean_service_us(status))
        target_fetch_us = self._target_fetch_us(status)
        if target_fetch_us is not None and target_fetch_us < 0:  # the bound assumes fetch_us >= 0
            return -math.inf
        return floor

    def cheapest(self, statuses: Sequence[InstanceStatus]) -> _Candidate | None:
        """The candidate with the lowest finite cost (ties: the smaller URI, then the earlier record), or None.

        Candidates are priced in the order of their lower bound; pricing stops at the first bound whose
        (bound, URI, position) exceeds the best (cost, URI, position) so far: no candidate from there on
        can be cheaper.  A fetch plan stops as soon as it shows a cost above the best one, and only the
        winner's fetch plan is needed when the IS gave its fetch estimate.
        """
        floors = [self._floor_us(s) for s in statuses]
        # Without a bound (-inf) a candidate is always priced: those go first, in the order given.
        order = sorted(range(len(statuses)),
                       key=lambda i: (floors[i], statuses[i].instance if floors[i] > -math.inf else "", i))
        best_key: tuple[float, str, int] | None = None
        best: _Candidate | None = None
        for i in order:
            status = statuses[i]
            if best_key is not None and (floors[i], status.instance, i) > best_key:
                break
            target_fetch_us = self._target_fetch_us(status)
            if target_fetch_us is not None and floors[i] > -math.inf:
                cost = self._cost_us(status, target_fetch_us)  # sound records: the fetch plan cannot raise
                candidate = None
            elif target_fetch_us is None and best_key is not None:
                est = self._estimate_within(status, best_key[0])
                if est is None:
                    continue  # its plan already costs more than the best: it cannot win
                candidate = _Candidate(est, est.loaded_blocks)
                cost = est.cost_us
            else:
                candidate = self.candidate(status)
                cost = candidate.estimate.cost_us
            key = (cost, status.instance, i)
            if math.isfinite(cost) and (best_key is None or key < best_key):
                best_key, best = key, candidate
        if best is None and best_key is not None:  # the winner's fetch plan, which its cost did not need
            best = self.candidate(statuses[best_key[2]])
        return best
