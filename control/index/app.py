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

Everything protocol-shaped lives in the sans-I/O `ReplicaIndex` and `StatusBoard`, behind the
`IndexBackend` interface (``control.index.backend``): in this process (``backend = "memory"``, the
default), or in Redis shared by every IS process (``backend = "redis"``, ``control.index.redis_store``).
This module only authorizes, reads the clock, and moves JSON.  Errors are raised as
`ProblemError`/`ValidationError` and turned into Problem Details by ``control.http``'s middleware, in
one place.  A back-end that does not answer (`BackendUnavailable`) makes every request a 503 within
``timeout_ms``, lookups included: the index is advisory (section 6.1) and every client already treats
a failed lookup as a miss (it recomputes), while a 503, unlike an empty answer, sends a client that
knows several IS base URIs to the next one, whose path to Redis may be intact.  ``GET {base}health``
and ``kvsp_is_backend_errors_total`` show the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from control.backend import connect
from control.http import JSON_MEDIA_TYPE, identity, json_response, read_json
from control.index.backend import BackendUnavailable, IndexBackend, Matches, MemoryBackend
from control.index.encode import answer_json
from control.index.settings import IndexSettings
from control.index.status import StatusBoard
from control.index.store import ReplicaIndex
from kvsp import placement
from kvsp.encoding import parse_hex
from kvsp.errors import ValidationError
from kvsp.identifiers import check_role_id, role_id
from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.records import InstanceStatus, LookupRequest, ReplicaRecord, TargetEstimate
from kvsp.service.app import CLOCK, HEALTH, Clock
from kvsp.service.config import RoleConfig
from kvsp.service.metrics import metrics_of
from kvsp.service.policy import Policy

# The in-process index; only with backend = "memory" (tests read it).  INDEX_BACKEND is always set.
INDEX: web.AppKey[ReplicaIndex] = web.AppKey("kvsp.is.index", ReplicaIndex)
INDEX_BACKEND: web.AppKey[IndexBackend] = web.AppKey("kvsp.is.backend", IndexBackend)
STATUS_BOARD: web.AppKey[StatusBoard] = web.AppKey("kvsp.status_board", StatusBoard)
Groups = Sequence[Sequence[ReplicaRecord]]
log = logging.getLogger("kvsp.is")


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


def withdrawable(policy: Policy, who: str, producer: str | None) -> frozenset[str]:
    """The producers whose records ``who`` may withdraw: those it `acts_for`, narrowed to ``producer``.

    `acts_for` holds only for ``who``'s own holder-id and those of its publish_for delegations, so this
    finite set is exactly the producers `acts_for` admits; a back-end applies it in one atomic step.
    """
    candidates = {role_id(who), *(role_id(holder) for holder in policy.publish_for.get(who, ()))}
    if producer is not None:
        candidates &= {producer}
    return frozenset(c for c in candidates if acts_for(policy, who, c))


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
    backend_errors: Counter  # label operation: lookup | publish | withdraw | status | maintain

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
            backend_errors=m.counter("kvsp_is_backend_errors", "Requests and steps the index back-end failed",
                                     ("operation",)),
        )


class StoreCollector(Collector):
    """Values the stores own, read at scrape time so that no request path has to update them.

    With the index in Redis, ``kvsp_is_replicas`` is the count last read (`RedisIndex.count`), and
    expirations are Redis's own (not counted); ``kvsp_is_instances`` is this process's board.
    """

    def __init__(self, backend: IndexBackend, board: StatusBoard) -> None:
        self.backend = backend
        self.board = board

    def collect(self) -> Iterable[Metric]:
        backend = self.backend
        if isinstance(backend, MemoryBackend):
            yield GaugeMetricFamily("kvsp_is_replicas", "Replica records held (live until swept)",
                                    value=len(backend.index))
            yield CounterMetricFamily("kvsp_is_expirations", "Replica records removed at expiry",
                                      value=backend.index.stats.expired)
        else:
            replicas = backend.facts().get("replicas")
            yield GaugeMetricFamily("kvsp_is_replicas", "Replica records held (live until swept)",
                                    value=float(replicas) if isinstance(replicas, int | float) else 0.0)
        yield GaugeMetricFamily("kvsp_is_instances", "Instances with an unexpired-until-swept status",
                                value=len(self.board))


# -- handlers -------------------------------------------------------------------------------------
class IndexService:
    """The IS request handlers, bound to their stores, policy, clock and metrics."""

    def __init__(self, backend: IndexBackend, board: StatusBoard, *, policy: Policy, settings: IndexSettings,
                 clock: Clock, metrics: IndexMetrics) -> None:
        self.backend = backend
        self.board = board
        # This process's board when it is not the back-end's own (Redis): what a PC here feeds, read as
        # a fallback for estimates and swept here.  None when the memory back-end holds it.
        self.local_board = None if isinstance(backend, MemoryBackend) and backend.board is board else board
        self.policy = policy
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.body_limit = policy.quotas.body_limit_octets
        self._mirrors: set[asyncio.Task[None]] = set()

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
        try:
            stored = await self.backend.put(record, holder_id)
        except BackendUnavailable as exc:
            raise self._unavailable(exc) from exc
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
        try:
            removed = await self.backend.withdraw(holder_id, block_key, withdrawable(policy, who, producer))
        except BackendUnavailable as exc:
            raise self._unavailable(exc) from exc
        if removed:
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
        try:
            matches = await self.backend.lookup(body.scope_id, body.compat_id, body.block_keys)
            targets = await self._estimates(body, matches) if body.targets else ()
        except BackendUnavailable as exc:
            raise self._unavailable(exc) from exc
        self.metrics.lookups.inc()
        self.metrics.keys_requested.inc(len(body.block_keys))
        self.metrics.keys_matched.inc(matches.matched)
        return web.Response(body=answer_json(matches.matched, matches.replicas_text(), targets),
                            content_type=JSON_MEDIA_TYPE)

    async def _estimates(self, body: LookupRequest, matches: Matches) -> tuple[TargetEstimate, ...]:
        """section 6.4 estimates for each target whose status is known; the others are omitted."""
        known = await self.backend.statuses(body.targets)
        if self.local_board is not None:  # a PC here may have accepted a status not yet mirrored
            board, now = self.local_board, self.clock()
            known.update({t: s for t in body.targets if t not in known and (s := board.get(t, now))})
        return tuple(self._estimates_of(body, matches.groups(), known))

    def _estimates_of(self, body: LookupRequest, groups: Groups,
                      known: dict[str, InstanceStatus]) -> Iterable[TargetEstimate]:
        shape = self.settings.shape(body.compat_id)
        # Each replica's facts are derived once per lookup, not once per target.
        prepared = placement.PreparedBlocks(groups, layers=shape.layers if shape is not None else None)
        for target in body.targets:
            status = known.get(target)
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
        try:
            stored = await self.backend.put_status(status)
        except BackendUnavailable as exc:
            raise self._unavailable(exc) from exc
        self.metrics.statuses.inc()
        return json_response({"state": stored.state.value})

    def mirror(self, status: InstanceStatus) -> None:
        """A `StatusBoard` listener: what a PC in this process accepted also goes to the shared back-end."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # put outside the event loop (a test, a tool): nothing to mirror from here
            return
        task = loop.create_task(self._mirror(status), name="kvsp-is-mirror-status")
        self._mirrors.add(task)
        task.add_done_callback(self._mirrors.discard)

    async def _mirror(self, status: InstanceStatus) -> None:
        try:
            await self.backend.put_status(status)
        except BackendUnavailable as exc:
            self.metrics.backend_errors.labels(exc.operation).inc()
        except ProblemError as exc:  # another PC reported a newer epoch: the board keeps the newer
            log.debug("status of %s not mirrored: %s", status.instance, exc)

    def _unavailable(self, exc: BackendUnavailable) -> ProblemError:
        """503 for a request the back-end could not serve; the detail stays in the log and health facts."""
        self.metrics.backend_errors.labels(exc.operation).inc()
        return ProblemError(Problem.generic(503, "Service Unavailable", "the index back-end is unavailable"))


def _replica_path(request: web.Request) -> tuple[str, bytes]:
    """{holder-id} and {block_key} of the path, validated before the body is read."""
    holder_id = check_role_id(request.match_info["holder_id"], "holder-id")
    return holder_id, parse_hex(request.match_info["block_key"], 32, "block_key")


# -- background expiry and back-end upkeep ----------------------------------------------------------
async def _maintain_forever(service: IndexService) -> None:
    """Every ``sweep_interval_s``: the back-end's step (sweeps; with Redis, the count and a health probe)."""
    backend, board = service.backend, service.local_board
    while True:
        await asyncio.sleep(service.settings.sweep_interval_s)
        try:
            await backend.maintain()
        except BackendUnavailable as exc:
            service.metrics.backend_errors.labels(exc.operation).inc()
        if board is not None:
            board.sweep(service.clock())


def _maintainer(service: IndexService) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(_maintain_forever(service), name="kvsp-is-sweep")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await service.backend.close()
    return context


def make_backend(settings: IndexSettings, config: RoleConfig, board: StatusBoard, clock: Clock) -> IndexBackend:
    """The back-end that ``[is] backend`` names; Redis is only imported when it is the one (no I/O here)."""
    ttl_ms_max, capacity = config.policy.quotas.replica_ttl_ms_max, settings.max_replicas
    redis = settings.backend.redis
    if settings.backend.kind == "memory" or redis is None:
        return MemoryBackend(ReplicaIndex(ttl_ms_max=ttl_ms_max, capacity=capacity), board, clock,
                             settings.sweep_batch)
    from control.index.redis_store import RedisIndex  # noqa: PLC0415 - redis-py only for an IS that uses it

    return RedisIndex(connect(redis), redis, ttl_ms_max=ttl_ms_max, capacity=capacity)


def setup(app: web.Application, config: RoleConfig) -> None:
    """Add the IS routes, back-end, metrics and upkeep task to ``app`` (see ``control.serve``)."""
    settings = IndexSettings.from_section(config.section("is"), config.base_dir)
    board = status_board_of(app)
    clock = app.get(CLOCK, time.monotonic)
    backend = make_backend(settings, config, board, clock)
    app[INDEX_BACKEND] = backend
    if isinstance(backend, MemoryBackend):
        app[INDEX] = backend.index
    service = IndexService(backend, board, policy=config.policy, settings=settings, clock=clock,
                           metrics=IndexMetrics.of(app))
    if service.local_board is not None:
        board.listeners.append(service.mirror)  # statuses a PC here accepts reach every IS process
    metrics_of(app).registry.register(StoreCollector(backend, board))
    if HEALTH in app:
        app[HEALTH]["is"] = lambda app: backend.facts()
    base = config.server.base_path
    app.router.add_put(base + "replicas/{holder_id}/{block_key}", service.publish)
    app.router.add_delete(base + "replicas/{holder_id}/{block_key}", service.withdraw)
    app.router.add_post(base + "lookup", service.lookup)
    if "pc" not in config.roles:
        app.router.add_put(base + "instances/{instance_id}/status", service.put_status)
    app.cleanup_ctx.append(_maintainer(service))
