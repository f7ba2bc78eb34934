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
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from control.pc.core.events import Assign, NoPlacement, Placement, Wake
from kvsp.placement import Estimate, choose_instance, estimate, recompute_us
from kvsp.records import InstanceStatus, LookupResponse, PrefetchBlock, PrefetchDirective, ReplicaRecord
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
        resident = resident or {}
        service_us = service_us or {}
        active_c = {c.estimate.instance: c for c in (
            self._candidate(request, lookup, s, resident.get(s.instance, ()), service_us)
            for s in active if s.state is InstanceState.ACTIVE and self._has_capacity(s))}
        best = choose_instance(c.estimate for c in active_c.values())
        if best is not None and best.cost_us <= self._config.max_cost_us:
            return Assign(best.instance, best.cost_us, self._directive(request, lookup, active_c[best.instance]))
        wake = self._best_sleeping(request, lookup, sleeping, resident, service_us)
        if wake is not None and (best is None or wake.estimate.cost_us < best.cost_us):
            return Wake(wake.estimate.instance, wake.estimate.cost_us, self._directive(request, lookup, wake))
        if best is not None:
            return Assign(best.instance, best.cost_us, self._directive(request, lookup, active_c[best.instance]))
        return NoPlacement("no active instance with capacity and no sleeping instance to wake")

    def _has_capacity(self, status: InstanceStatus) -> bool:
        limit = self._config.max_queued
        return (limit is None or status.queued <= limit) and status.kv_utilization <= self._config.max_kv_utilization

    def _best_sleeping(self, request: PlacementRequest, lookup: LookupResponse, sleeping: Sequence[InstanceStatus],
                       resident: Mapping[str, Collection[bytes]], service_us: Mapping[str, float]) -> _Candidate | None:
        candidates = [self._candidate(request, lookup, s, resident.get(s.instance, ()), service_us)
                      for s in sleeping if s.state is InstanceState.SLEEPING]
        finite = [c for c in candidates if math.isfinite(c.estimate.cost_us)]
        return min(finite, key=lambda c: (c.estimate.cost_us, c.estimate.instance), default=None)

    def _candidate(self, request: PlacementRequest, lookup: LookupResponse, status: InstanceStatus,
                   resident: Collection[bytes], service_us: Mapping[str, float]) -> _Candidate:
        cfg = self._config
        est = estimate(status, lookup.replicas, prompt_tokens=request.prompt_tokens, block_tokens=cfg.block_tokens,
                       mean_service_us=service_us.get(status.instance, cfg.mean_service_us), resident=resident,
                       block_bytes=cfg.block_bytes, layers=cfg.layers)
        target = next((t for t in lookup.targets if t.instance == status.instance), None)
        if target is None or target.fetch_us is None:
            return _Candidate(est, est.loaded_blocks)
        # The IS's estimate covers all matched blocks (section 6.2); it replaces the PC's own.
        residual = recompute_us(status, request.prompt_tokens - lookup.matched * cfg.block_tokens)
        with_cache = target.fetch_us + residual
        uses_cache = lookup.matched > 0 and with_cache <= est.recompute_us
        est = dataclasses.replace(est, fetch_us=target.fetch_us, residual_us=residual, uses_cache=uses_cache,
                                  cost_us=est.wait_us + min(with_cache, est.recompute_us))
        return _Candidate(est, lookup.matched if uses_cache else 0)

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
