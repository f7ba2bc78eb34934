"""The Index Service role over HTTPS with mutual TLS (spec sections 5, 6.1, 6.2; decisions D1, D2).

Routes, relative to the role's base URI:

- ``PUT replicas/{holder-id}/{block_key}``: publish or refresh (201 on create, 200 on refresh; the
  body is the record as stored, with its TTL capped);
- ``DELETE replicas/{holder-id}/{block_key}[?producer={holder-id}]``: withdraw the caller's own
  records there (204; 404 ``kvsp-not-found``);
- ``POST lookup``: longest-prefix lookup with optional per-target estimates;
- ``PUT instances/{instance-id}/status``: only when the PC role is not in this process; with it, the
  PC owns that route and shares the `StatusBoard` through `STATUS_BOARD`.

Each record at a path belongs to its producer (`ReplicaRecord.producer_id`): the holder for ``https``
records, the namespace's holder-id for ``moqt`` ones, whose path is often a relay's shared by many
producers.  Only the producer, or an identity the policy lets publish for it, creates, replaces or
withdraws it; the store keys entries by producer so that nothing else can (sections 4.4, 6.1, 9).

Everything protocol-shaped lives in the sans-I/O `ReplicaIndex` and `StatusBoard`; this module only
authorizes, reads the clock, and moves JSON.  Errors are raised as `ProblemError`/`ValidationError`
and turned into Problem Details by ``control.http``'s middleware, in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from control.http import JSON_MEDIA_TYPE, identity, json_response, read_json
from control.index.encode import lookup_json
from control.index.settings import IndexSettings
from control.index.status import StatusBoard
from control.index.store import ReplicaIndex
from kvsp import placement
from kvsp.encoding import parse_hex
from kvsp.errors import ValidationError
from kvsp.identifiers import check_role_id, role_id
from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.records import InstanceStatus, LookupRequest, ReplicaRecord, TargetEstimate
from kvsp.service.app import CLOCK, Clock
from kvsp.service.config import RoleConfig
from kvsp.service.metrics import metrics_of
from kvsp.service.policy import Policy

INDEX: web.AppKey[ReplicaIndex] = web.AppKey("kvsp.is.index", ReplicaIndex)
STATUS_BOARD: web.AppKey[StatusBoard] = web.AppKey("kvsp.status_board", StatusBoard)
Groups = Sequence[Sequence[ReplicaRecord]]


def status_board_of(app: web.Application) -> StatusBoard:
    """The process's one `StatusBoard`, created by whichever of IS and PC is set up first."""
    if STATUS_BOARD not in app:
        app[STATUS_BOARD] = StatusBoard()
    return app[STATUS_BOARD]


# -- authorization (section 6.1, section 9, decision D2) ----------------------------------------------
def acts_for(policy: Policy, who: str, holder_id: str) -> bool:
    """Whether ``who`` is the holder with this holder-id, or may publish on that holder's behalf."""
    if role_id(who) == holder_id:
        return True
    return any(role_id(holder) == holder_id for holder in policy.publish_for.get(who, ()))


def may_publish(policy: Policy, who: str, record: ReplicaRecord) -> bool:
    """Whether ``who`` is the record's producer or a delegate of it (sections 4.4, 6.1).

    For an ``https`` record the producer is the holder named in it.  For a replica served over MOQT,
    the record's holder is the endpoint or relay and the namespace's holder-id field names the
    producer, which section 4.4 makes the holder for authorization; being (or delegating for) the
    relay does not suffice, since the relay serves many producers' tracks under one URI.
    """
    return acts_for(policy, who, record.producer_id)


def _forbidden(detail: str) -> ProblemError:
    return ProblemError(Problem.generic(403, "Forbidden", detail))


# -- metrics (section 8) ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class IndexMetrics:
    """Request-driven counters; hit ratio = keys_matched / keys_requested."""

    lookups: Counter
    keys_requested: Counter
    keys_matched: Counter
    publishes: Counter  # label result: created | refreshed
    withdrawals: Counter
    scope_denials: Counter  # label operation: publish | lookup
    identity_denials: Counter  # label operation: publish | withdraw | status
    statuses: Counter

    @classmethod
    def of(cls, app: web.Application) -> IndexMetrics:
        m = metrics_of(app)
        return cls(
            lookups=m.counter("kvsp_is_lookups", "POST lookup requests answered"),
            keys_requested=m.counter("kvsp_is_lookup_keys_requested", "Block Keys asked for in lookups"),
            keys_matched=m.counter("kvsp_is_lookup_keys_matched", "Block Keys matched by lookups"),
            publishes=m.counter("kvsp_is_publishes", "Replica publications", ("result",)),
            withdrawals=m.counter("kvsp_is_withdrawals", "Replica withdrawals"),
            scope_denials=m.counter("kvsp_is_scope_denials", "Requests refused with kvsp-scope-denied",
                                    ("operation",)),
            identity_denials=m.counter("kvsp_is_identity_denials", "Requests refused: not that holder or instance",
                                       ("operation",)),
            statuses=m.counter("kvsp_is_instance_statuses", "Instance Status Records accepted"),
        )


class StoreCollector(Collector):
    """Values the stores own, read at scrape time so that no request path has to update them."""

    def __init__(self, index: ReplicaIndex, board: StatusBoard) -> None:
        self.index = index
        self.board = board

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily("kvsp_is_replicas", "Replica records held (live until swept)",
                                value=len(self.index))
        yield CounterMetricFamily("kvsp_is_expirations", "Replica records removed at expiry",
                                  value=self.index.stats.expired)
        yield GaugeMetricFamily("kvsp_is_instances", "Instances with an unexpired-until-swept status",
                                value=len(self.board))


# -- handlers -------------------------------------------------------------------------------------
class IndexService:
    """The IS request handlers, bound to their stores, policy, clock and metrics."""

    def __init__(self, index: ReplicaIndex, board: StatusBoard, *, policy: Policy, settings: IndexSettings,
                 clock: Clock, metrics: IndexMetrics) -> None:
        self.index = index
        self.board = board
        self.policy = policy
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.body_limit = policy.quotas.body_limit_octets

    async def publish(self, request: web.Request) -> web.Response:
        """PUT replicas/{holder-id}/{block_key} (section 6.1)."""
        who = identity(request)
        holder_id, block_key = _replica_path(request)
        record = await read_json(request, ReplicaRecord.from_json, self.body_limit)
        if role_id(record.holder) != holder_id:
            raise ValidationError("holder-id", "must be the holder-id of the record's holder")
        if record.block_key != block_key:
            raise ValidationError("block_key", "must equal the record's block_key")
        if not may_publish(self.policy, who, record):
            self.metrics.identity_denials.labels("publish").inc()
            raise _forbidden(f"{who} may not publish replicas of producer {record.producer_id} "
                             f"(holder {record.holder})")
        if not self.policy.may_store(who, record.scope_id):
            self.metrics.scope_denials.labels("publish").inc()
            raise ProblemError.of(ProblemType.SCOPE_DENIED, f"{who} may not store in scope {record.scope_id.hex()}")
        stored = self.index.put(record, holder_id, self.clock())
        self.metrics.publishes.labels("created" if stored.created else "refreshed").inc()
        return json_response(stored.record, status=201 if stored.created else 200)

    async def withdraw(self, request: web.Request) -> web.Response:
        """DELETE replicas/{holder-id}/{block_key}: the caller's own records there (sections 6.1, 7).

        Removes the records at the path whose producer the caller is or may publish for, narrowed to
        one producer by ``?producer={holder-id}``; other producers' records stay.  Which answer comes
        depends only on the caller's own records and on the policy, never on anyone else's, so that
        nobody probes other producers' replicas: 204 when one was removed; else 404 when the caller
        could have had one there (it acts for the path's holder-id or for the producer it named);
        else 403.
        """
        who = identity(request)
        holder_id, block_key = _replica_path(request)
        named = request.query.get("producer")
        producer = None if named is None else check_role_id(named, "producer")
        policy = self.policy

        def own(candidate: str) -> bool:
            return (producer is None or candidate == producer) and acts_for(policy, who, candidate)

        if self.index.withdraw(holder_id, block_key, self.clock(), own):
            self.metrics.withdrawals.inc()
            return web.Response(status=204)
        if acts_for(policy, who, holder_id if producer is None else producer):
            raise ProblemError.of(ProblemType.NOT_FOUND, "no such replica")
        self.metrics.identity_denials.labels("withdraw").inc()
        raise _forbidden(f"{who} has no replica to withdraw at holder-id {holder_id} and may not act for it")

    async def lookup(self, request: web.Request) -> web.Response:
        """POST lookup (section 6.2): longest prefix, replicas per key, estimates per known target."""
        who = identity(request)
        limit = self.policy.quotas.keys_per_lookup
        body = await read_json(request, lambda v: LookupRequest.from_json(v, max_keys=limit), self.body_limit)
        if not self.policy.may_lookup(who, body.scope_id):
            self.metrics.scope_denials.labels("lookup").inc()
            raise ProblemError.of(ProblemType.SCOPE_DENIED, f"{who} may not look up scope {body.scope_id.hex()}")
        now = self.clock()
        groups = self.index.lookup(body.scope_id, body.compat_id, body.block_keys, now)
        targets = tuple(self._estimates(body, groups, now))
        self.metrics.lookups.inc()
        self.metrics.keys_requested.inc(len(body.block_keys))
        self.metrics.keys_matched.inc(len(groups))
        return web.Response(body=lookup_json(groups, targets), content_type=JSON_MEDIA_TYPE)

    def _estimates(self, body: LookupRequest, groups: Groups, now: float) -> Iterable[TargetEstimate]:
        """section 6.4 estimates for each target whose status is known; the others are omitted."""
        if not body.targets:
            return
        shape = self.settings.shape(body.compat_id)
        # Each replica's facts are derived once per lookup, not once per target.
        prepared = placement.PreparedBlocks(groups, layers=shape.layers if shape is not None else None)
        for target in body.targets:
            status = self.board.get(target, now)
            if status is None:
                continue
            if shape is None:  # B unknown: the fetch time is still meaningful, recompute is not
                fetch = prepared.fetch_us(status)
                yield TargetEstimate(target, fetch if math.isfinite(fetch) else None, None)
            else:
                yield prepared.target_estimate(status, block_tokens=shape.block_tokens)

    async def put_status(self, request: web.Request) -> web.Response:
        """PUT instances/{instance-id}/status (section 6.3), when this process has no PC role.

        The IS keeps statuses only for estimates; it decides no lifecycle, so it answers with the
        state the instance reported (a request to sleep is neither granted nor refused here).
        """
        who = identity(request)
        instance_id = check_role_id(request.match_info["instance_id"], "instance-id")
        status = await read_json(request, InstanceStatus.from_json, self.body_limit)
        if role_id(status.instance) != instance_id:
            raise ValidationError("instance-id", "must be the instance-id of the record's instance")
        # Only a listed instance reports status (D2), as at the PC: lookups turn statuses into the
        # estimates that place sessions, so an identity that is not an instance must not appear there.
        if who != status.instance or not self.policy.is_instance(who):
            self.metrics.identity_denials.labels("status").inc()
            raise _forbidden(f"{who} may not report the status of {status.instance}")
        entry = self.board.put(status, self.clock())
        self.metrics.statuses.inc()
        return json_response({"state": entry.status.state.value})


def _replica_path(request: web.Request) -> tuple[str, bytes]:
    """{holder-id} and {block_key} of the path, validated before the body is read."""
    holder_id = check_role_id(request.match_info["holder_id"], "holder-id")
    return holder_id, parse_hex(request.match_info["block_key"], 32, "block_key")


# -- background expiry ---------------------------------------------------------------------------
async def _sweep_forever(index: ReplicaIndex, board: StatusBoard, clock: Clock, settings: IndexSettings) -> None:
    while True:
        await asyncio.sleep(settings.sweep_interval_s)
        now = clock()
        index.sweep(now, settings.sweep_batch)
        while index.due(now):
            await asyncio.sleep(0)  # bounded steps, so a mass expiry never stalls requests
            index.sweep(now, settings.sweep_batch)
        board.sweep(now)


def _sweeper(service: IndexService) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(
            _sweep_forever(service.index, service.board, service.clock, service.settings), name="kvsp-is-sweep")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return context


def setup(app: web.Application, config: RoleConfig) -> None:
    """Add the IS routes, stores, metrics and sweep task to ``app`` (see ``control.serve``)."""
    settings = IndexSettings.from_section(config.section("is"), config.base_dir)
    index = ReplicaIndex(ttl_ms_max=config.policy.quotas.replica_ttl_ms_max, capacity=settings.max_replicas)
    board = status_board_of(app)
    app[INDEX] = index
    service = IndexService(index, board, policy=config.policy, settings=settings,
                           clock=app.get(CLOCK, time.monotonic), metrics=IndexMetrics.of(app))
    metrics_of(app).registry.register(StoreCollector(index, board))
    base = config.server.base_path
    app.router.add_put(base + "replicas/{holder_id}/{block_key}", service.publish)
    app.router.add_delete(base + "replicas/{holder_id}/{block_key}", service.withdraw)
    app.router.add_post(base + "lookup", service.lookup)
    if "pc" not in config.roles:
        app.router.add_put(base + "instances/{instance_id}/status", service.put_status)
    app.cleanup_ctx.append(_sweeper(service))
