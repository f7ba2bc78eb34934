"""The connector's I/O: one asyncio loop on a daemon thread, the mTLS session and the kvsp clients.

vLLM calls the connector from its scheduler loop and its model runner, neither of which may wait on the
network.  Everything that talks to the IS or a holder runs as a coroutine on this loop; the vLLM side
submits it and gets a `concurrent.futures.Future`, which it polls (scheduler) or waits on with a
deadline (worker, per layer).  Counters (section 8) are plain integers here and Prometheus counters
beside them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, fields
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, start_http_server

from kvsp.client.fetch import BlockFetcher, ClientStats, FetchOptions
from kvsp.client.holder import HolderClient, HolderOptions
from kvsp.client.http import ClientOptions, KvspSession
from kvsp.client.index import IndexClient
from kvsp.container import Geometry
from kvsp.service.tls import client_context
from kvsp.vllm.config import ConnectorConfig

T = TypeVar("T")


@dataclass(slots=True)
class ConnectorStats:
    """Cumulative counters of one connector (both sides add to the same object in one process)."""

    lookups: int = 0
    lookup_failures: int = 0
    hit_tokens: int = 0  # tokens the scheduler side planned to load
    loaded_tokens: int = 0  # tokens copied into the paged cache from verified blocks
    recomputed_tokens: int = 0  # planned tokens that failed to load (vLLM recomputed them)
    blocks_https: int = 0  # loaded blocks by transport: GET from a holder
    blocks_moqt: int = 0  # FETCH over MOQT (from a publisher, or through the rack relay)
    bytes_in: int = 0
    bytes_out: int = 0
    stored_blocks: int = 0
    store_conflicts: int = 0  # 412: a holder already had the block
    store_errors: int = 0
    digest_failures: int = 0
    load_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Runtime:
    """The loop thread, the clients, the counters.  One per connector instance; `close` stops it."""

    def __init__(self, config: ConnectorConfig, geometry: Geometry) -> None:
        self.config = config
        self.stats = ConnectorStats()
        self.client_stats = ClientStats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kvsp-connector", daemon=True)
        self._thread.start()
        self._lock = threading.Lock()
        self._pending: set[concurrent.futures.Future[None]] = set()
        self.registry = CollectorRegistry()
        self._prom = {name: Counter(f"kvsp_vllm_{name}", f"kvsp connector: {name.replace('_', ' ')}",
                                    registry=self.registry) for name in self.stats.as_dict()}
        if config.metrics_listen is not None:
            host, _, port = config.metrics_listen.rpartition(":")
            start_http_server(int(port), addr=host or "127.0.0.1", registry=self.registry)
        self.session, self.fetcher, self.holder = self.run(self._clients(geometry), timeout=30.0)
        _PROCESS.append(self)

    async def _clients(self, geometry: Geometry) -> tuple[KvspSession, BlockFetcher, HolderClient]:
        c = self.config
        options = ClientOptions(connect_timeout_s=min(c.lookup_timeout_s, 5.0), request_timeout_s=c.load_timeout_s)
        session = KvspSession(client_context(c.tls), options)
        holder = HolderClient(session, HolderOptions(read_timeout_s=min(c.load_timeout_s, 5.0),
                                                     block_timeout_s=c.load_timeout_s))
        moqt = None
        if c.moqt.fetch:
            from kvsp.client.moqt import MoqtBlockClient  # noqa: PLC0415 - aioquic only when asked for
            moqt = MoqtBlockClient.from_files(c.tls.cert, c.tls.key, c.tls.ca)
        fetcher = BlockFetcher(session, IndexClient(session, c.index), holder=holder, moqt=moqt,
                               options=FetchOptions(lease_ms=c.lease_ms, geometry=geometry,
                                                    deadline_s=c.load_timeout_s, local_relay=c.moqt.relay),
                               stats=self.client_stats)
        return session, fetcher, holder

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)
                if value:
                    self._prom[name].inc(value)

    def submit(self, work: Coroutine[object, object, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(work, self._loop)

    def run(self, work: Coroutine[object, object, T], timeout: float) -> T:
        return self.submit(work).result(timeout)

    def track(self, future: concurrent.futures.Future[None]) -> None:
        """A store in flight: `drain` waits for it."""
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)

    def drain(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) for the stores in flight; True when none is left."""
        with self._lock:
            pending = list(self._pending)
        _, left = concurrent.futures.wait(pending, timeout=timeout)
        return not left

    def close(self) -> None:
        if not self._loop.is_running():
            return
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):  # closing anyway
            self.run(self.session.close(), timeout=5.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)


_PROCESS: list[Runtime] = []


def process_runtimes() -> list[Runtime]:
    """The runtimes of this process (scripts and tests that run vLLM in-process read their counters)."""
    return list(_PROCESS)
