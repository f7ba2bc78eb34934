"""Sequence shards and resharding at the instance (spec section 6.9), around `ShardStore`.

`ShardStore` (sans-I/O) decides what is retained, fetched, committed and discarded; `ShardHost`
keeps one store per map and carries out its actions: `FetchRange` becomes a GET of the kvsp extension
resource ``shards/{map}?tokens=a-b&version=v`` on the source instance, the answer to the plan's POST
waits until `AckPlan` (200) or `PlanFailed` (502) or the deadline (504, and the store discards what
was fetched), and commits and aborts are answered at once.  Retained ranges never move: the bytes
moved (a metric) count only fetched octets.

The KV a member holds in a version comes from its engine (`put`) or, over the network, from the kvsp
extension ``PUT shards/{map}?tokens=a-b&version=v`` (`put_range`: a prefill worker or the PC placing a
range, the write side of the GET that plans fetch with).  Metrics say what is held, what is staged for
an uncommitted version, and what was fetched and then discarded (abort, deadline).

KV of a token range travels as a kvsp-layout-1 container (spec section 4.3) whose Token Count is the
range's length, all layers, with a Repr-Digest.  In the store a range is one token-major buffer: for
each token, for each layer, its K row then its V row (kv_heads x head_dim elements each), so that a
sub-range is a slice (`ShardStore` never copies).  The container is built from that layout and back.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urljoin

import aiohttp
import numpy as np

from control.instance.core import (
    Aborted,
    AckPlan,
    CancelFetches,
    Committed,
    FetchRange,
    PlanFailed,
    ShardAction,
    ShardStore,
)
from control.instance.metrics import InstanceMetrics
from kvsp.client.http import KvspSession, TransportError, problem_from, read_capped
from kvsp.client.verify import REPR_DIGEST_FIELD, ReprDigestMissingError, parse_repr_digest
from kvsp.container import MEDIA_TYPE as BLOCK_MEDIA_TYPE
from kvsp.container import Geometry, decode_container, encode_parts
from kvsp.errors import ContainerError, DigestMismatchError
from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.records import ReshardCommit, ReshardMessage, ReshardPlan, TokenRange
from kvsp.registry import Codec

log = logging.getLogger("kvsp.instance.reshard")

HEADER_SLACK: Final = 1 << 16


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """Octets of one token's KV and how they map to container sections."""

    layers: int
    row: int  # octets of one K (or V) row of one token and layer: kv_heads x head_dim x element size

    @classmethod
    def of(cls, geometry: Geometry) -> ShardLayout:
        return cls(geometry.layers or 1, geometry.section_length(1))

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.row

    def to_container(self, tokens: int, data: list[memoryview]) -> list[bytes | memoryview]:
        """Container parts of token-major ``data`` (CPU: in a worker thread for large ranges)."""
        joined = np.frombuffer(b"".join(data), dtype=np.uint8).reshape(tokens, self.layers, 2, self.row)
        sections = [(np.ascontiguousarray(joined[:, layer, 0]).data.cast("B"),
                     np.ascontiguousarray(joined[:, layer, 1]).data.cast("B")) for layer in range(self.layers)]
        return encode_parts(Codec.RAW, 0, tokens, sections)

    def from_container(self, body: bytes, geometry: Geometry, tokens: int) -> bytes:
        """The token-major buffer of a received container (all layers, ``tokens`` tokens)."""
        container = decode_container(body, geometry=geometry)
        if container.first_layer != 0 or container.layer_count != self.layers or container.token_count != tokens:
            raise ContainerError(f"expected layers 0-{self.layers - 1} of {tokens} tokens, got "
                                 f"{container.layer_range} of {container.token_count}")
        out = np.empty((tokens, self.layers, 2, self.row), dtype=np.uint8)
        for view in container.layers:
            out[:, view.layer, 0] = np.frombuffer(view.k, dtype=np.uint8).reshape(tokens, self.row)
            out[:, view.layer, 1] = np.frombuffer(view.v, dtype=np.uint8).reshape(tokens, self.row)
        return out.tobytes()


@dataclass(slots=True)
class _Plan:
    """The answer a plan's POST waits for, and its fetches."""

    answer: asyncio.Future[ShardAction]
    fetches: dict[TokenRange, asyncio.Task[None]] = field(default_factory=dict)


class ShardHost:
    """Shard stores by map id, the fetches of plans in progress, and the GET side for peers."""

    def __init__(self, instance: str, geometry: Geometry, session: Callable[[], KvspSession],
                 clock: Callable[[], float], metrics: InstanceMetrics, *, max_maps: int) -> None:
        self.instance = instance
        self.geometry = geometry
        self.layout = ShardLayout.of(geometry)
        self.session = session
        self.clock = clock
        self.metrics = metrics
        self.max_maps = max_maps
        self.stores: dict[str, ShardStore] = {}
        self._plans: dict[tuple[str, int], _Plan] = {}

    # -- the engine's side: KV this instance holds in the current version -------------------------
    def put(self, map_id: str, version: int, tokens: TokenRange, data: bytes | bytearray | memoryview) -> None:
        """Register KV of ``tokens`` (token-major layout, see the module) held in ``version`` of the map."""
        store = self._store(map_id, version)
        if store.version != version:
            raise ProblemError.of(ProblemType.PLAN_CONFLICT, f"map {map_id} is at version {store.version}")
        try:
            store.put(tokens, data)
        except ValueError as exc:
            raise ProblemError.of(ProblemType.PLAN_CONFLICT, f"map {map_id}: {exc}") from exc
        self._gauges()

    async def put_range(self, map_id: str, version: int, tokens: TokenRange, body: bytes) -> None:
        """PUT shards/{map}: register a container of ``tokens`` (all layers) as held in ``version``."""
        data = await asyncio.to_thread(self.layout.from_container, body, self.geometry, tokens[1] - tokens[0])
        self.put(map_id, version, tokens, data)

    def max_range_octets(self, tokens: TokenRange) -> int:
        """The largest container of ``tokens`` accepted (the KV plus a header)."""
        return (tokens[1] - tokens[0]) * self.layout.bytes_per_token + HEADER_SLACK

    def _gauges(self) -> None:
        self.metrics.shard_bytes_held.set(sum(s.held_bytes for s in self.stores.values()))
        self.metrics.shard_bytes_staged.set(sum(s.staged_bytes for s in self.stores.values()))

    def _store(self, map_id: str, version: int) -> ShardStore:
        store = self.stores.get(map_id)
        if store is None:
            if len(self.stores) >= self.max_maps:
                raise ProblemError(Problem.generic(503, "Service Unavailable", f"at most {self.max_maps} shard maps"))
            store = ShardStore(self.instance, map_id, version, bytes_per_token=self.layout.bytes_per_token)
            self.stores[map_id] = store
        return store

    # -- POST reshard -----------------------------------------------------------------------------
    async def handle(self, message: ReshardMessage) -> dict[str, object]:
        """Apply a plan, commit or abort; a plan is answered only once all its fetches arrived."""
        if isinstance(message, ReshardPlan):
            return await self._plan(message)
        store = self.stores.get(message.map)
        if store is None:
            raise ProblemError.of(ProblemType.PLAN_CONFLICT, f"map {message.map} is not held here")
        retained_before = store.bytes_retained
        actions = store.handle(message, self.clock())
        self._carry_out(message.map, actions)
        if isinstance(message, ReshardCommit):
            self.metrics.reshard_bytes_retained.inc(store.bytes_retained - retained_before)
            return {"map": message.map, "version": store.version}
        return {"map": message.map, "version": store.version, "aborted": message.abort}

    async def _plan(self, plan: ReshardPlan) -> dict[str, object]:
        store = self._store(plan.map, plan.from_version)
        key = (plan.map, plan.to_version)
        waiting = self._plans.get(key)
        actions = store.apply_plan(plan, self.clock())
        if waiting is None or waiting.answer.done():
            waiting = _Plan(asyncio.get_running_loop().create_future())
            self._plans[key] = waiting
        self._carry_out(plan.map, actions)
        try:
            async with asyncio.timeout(plan.deadline_ms / 1000):
                outcome = await asyncio.shield(waiting.answer)
        except TimeoutError:
            self._carry_out(plan.map, store.tick(self.clock() + plan.deadline_ms / 1000))
            self.metrics.reshard_plans.labels("expired").inc()
            detail = f"map {plan.map}: fetches for version {plan.to_version} missed the deadline"
            raise ProblemError(Problem.generic(504, "Gateway Timeout", detail)) from None
        if isinstance(outcome, PlanFailed):
            self.metrics.reshard_plans.labels("failed").inc()
            raise ProblemError(Problem.generic(502, "Bad Gateway", f"map {plan.map}: tokens {list(outcome.tokens)} "
                                                                   f"could not be loaded: {outcome.reason}"))
        self.metrics.reshard_plans.labels("acked").inc()
        return {"map": plan.map, "version": plan.to_version, "acknowledged": True}

    def _carry_out(self, map_id: str, actions: list[ShardAction]) -> None:
        for action in actions:
            match action:
                case FetchRange(_, version, tokens, source):
                    plan = self._plans.get((map_id, version))
                    if plan is not None and tokens not in plan.fetches:
                        plan.fetches[tokens] = asyncio.get_running_loop().create_task(
                            self._fetch(map_id, version, tokens, source))
                case AckPlan(_, version) | PlanFailed(_, version, _, _):
                    plan = self._plans.get((map_id, version))
                    if plan is not None and not plan.answer.done():
                        plan.answer.set_result(action)
                case CancelFetches(_, version, ranges):
                    plan = self._plans.get((map_id, version))
                    for tokens in ranges if plan is not None else ():
                        task = plan.fetches.get(tokens) if plan is not None else None
                        if task is not None and task is not asyncio.current_task():
                            task.cancel()
                case Committed(_, version, released, released_bytes):
                    self._plans.pop((map_id, version), None)
                    log.info("map %s: version %d in force; released %s (%d octets)", map_id, version,
                             released, released_bytes)
                case Aborted(_, version, discarded):
                    self._plans.pop((map_id, version), None)
                    self.metrics.reshard_bytes_discarded.inc(discarded)
                    log.info("map %s: version %d abandoned; %d fetched octets discarded", map_id, version, discarded)
        self._gauges()

    async def _fetch(self, map_id: str, version: int, tokens: TokenRange, source: str) -> None:
        store = self.stores[map_id]
        try:
            data = await self._get_range(map_id, version - 1, tokens, source)
        except (ProblemError, TransportError, ContainerError, DigestMismatchError, ReprDigestMissingError,
                TimeoutError) as exc:
            self._carry_out(map_id, store.fetch_failed(tokens, str(exc) or type(exc).__name__, self.clock()))
            return
        moved_before = store.bytes_moved
        self._carry_out(map_id, store.fetched(tokens, data, self.clock()))
        self.metrics.reshard_bytes_moved.inc(store.bytes_moved - moved_before)

    async def _get_range(self, map_id: str, version: int, tokens: TokenRange, source: str) -> bytes:
        url = urljoin(source if source.endswith("/") else source + "/", f"shards/{map_id}")
        count = tokens[1] - tokens[0]
        limit = count * self.layout.bytes_per_token + HEADER_SLACK
        params = {"tokens": f"{tokens[0]}-{tokens[1]}", "version": str(version)}
        try:
            async with self.session().http.get(url, params=params, allow_redirects=False) as resp:
                body = await read_capped(resp, limit)
                if resp.status != 200:
                    raise problem_from(resp.status, resp.content_type, body)
                if resp.content_type != BLOCK_MEDIA_TYPE:
                    raise ContainerError(f"{source}: shards answered with {resp.content_type!r}")
                expected = parse_repr_digest(resp.headers.getall(REPR_DIGEST_FIELD, ()))
        except aiohttp.ClientError as exc:
            raise TransportError(f"GET {url}: {exc!r}") from exc
        if hashlib.sha256(body).digest() != expected:
            raise DigestMismatchError(f"{source}: shard range {tokens} does not match its Repr-Digest")
        return await asyncio.to_thread(self.layout.from_container, body, self.geometry, count)

    # -- GET shards/{map}?tokens=a-b (a peer fetching from us) ------------------------------------
    def read(self, map_id: str, tokens: TokenRange, version: int | None) -> tuple[int, list[memoryview]]:
        """(token count, token-major views) of ``tokens`` in the authoritative version."""
        store = self.stores.get(map_id)
        if store is None:
            raise ProblemError.of(ProblemType.NOT_FOUND, f"map {map_id} is not held here")
        if version is not None and version != store.version:
            raise ProblemError.of(ProblemType.PLAN_CONFLICT, f"map {map_id} is at version {store.version}, "
                                                             f"not {version}")
        return tokens[1] - tokens[0], store.read(tokens)

    async def close(self) -> None:
        tasks = [t for plan in self._plans.values() for t in plan.fetches.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
