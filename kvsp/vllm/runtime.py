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
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TypeVar

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

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
        self.registry.register(_Collector(self))
        self.roles: set[str] = set()  # the connector sides ("scheduler", "worker") of this process using it
        self._metrics_served = False
        self.shared = shared_counters_dir(config)
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

    def serve_metrics(self) -> None:
        """Start the Prometheus endpoint (``metrics_listen``), once; the scheduler side calls it.  Under
        ``vllm serve`` the scheduler and the workers are separate processes, each with its runtime: a
        second bind of the port would stop vLLM, and vLLM hands the workers' stats to the scheduler only
        with the next step (an idle server would never show its last stores).  So a worker process writes
        its counters to a file in `shared` after every change, and the endpoint adds them at scrape time."""
        if self.config.metrics_listen is None or self._metrics_served:
            return
        if self.shared is not None:
            _forget_dead(self.shared)
        host, _, port = self.config.metrics_listen.rpartition(":")
        start_http_server(int(port), addr=host or "127.0.0.1", registry=self.registry)
        self._metrics_served = True

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)
            snapshot = self.stats.as_dict()
        if self.shared is not None and "worker" in self.roles and "scheduler" not in self.roles:
            _write_counters(self.shared, snapshot)

    def counters(self) -> dict[str, int]:
        """This process's counters plus those the worker processes of this connector wrote (see above)."""
        with self._lock:
            total = self.stats.as_dict()
        if self.shared is not None and "scheduler" in self.roles:
            for other in _read_counters(self.shared):
                for name, value in other.items():
                    if name in total:
                        total[name] += value
        return total

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


class _Collector(Collector):
    """``kvsp_vllm_<name>_total`` counters, read at scrape time (`Runtime.counters`)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterable[Metric]:
        for name, value in self.runtime.counters().items():
            family = CounterMetricFamily(f"kvsp_vllm_{name}", f"kvsp connector: {name.replace('_', ' ')}")
            family.add_metric([], value)
            yield family


def shared_counters_dir(config: ConnectorConfig) -> Path | None:
    """Where the worker processes of one connector configuration leave their counters for the endpoint:
    one folder per (config file, metrics_listen), so two vLLM servers on one host never mix."""
    if config.metrics_listen is None or config.source is None:
        return None
    name = hashlib.sha256(f"{config.source.resolve()}|{config.metrics_listen}".encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "kvsp-vllm-counters" / name


def _write_counters(folder: Path, counts: dict[str, int]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{os.getpid()}.tmp"
    tmp.write_text(json.dumps(counts))
    os.replace(tmp, folder / f"{os.getpid()}.json")  # atomic: a scrape never reads half a file


def _read_counters(folder: Path) -> list[dict[str, int]]:
    out = []
    for path in folder.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            if isinstance(data, dict):
                out.append({str(k): int(v) for k, v in data.items() if isinstance(v, int)})
    return out


def _forget_dead(folder: Path) -> None:
    """Files of processes that no longer run belong to an earlier server on the same config: drop them."""
    for path in folder.glob("*.json"):
        pid = int(path.stem) if path.stem.isdigit() else None
        if pid is None or not _alive(pid):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_runtimes() -> list[Runtime]:
    """The runtimes of this process (scripts and tests that run vLLM in-process read their counters)."""
    return list(_PROCESS)
