"""Holder client (spec sections 6.6 and 6.7): leases, block GET with streaming verification, block PUT.

Why it looks like this:

* A block can be tens of MiB and the container puts layers in ascending order so that an engine can
  use layer l while layer l+1 is on the wire.  `HolderClient.open_block` therefore hands out a
  `BlockStream` whose ``layers()`` yields each layer as soon as its last octet has arrived and its
  layer digest has been checked; `HolderClient.get_block` is the whole-block convenience on top.
* Verification is `kvsp.client.verify.BlockVerifier` (sans-I/O); this module only moves bytes, maps
  aiohttp's exceptions to `TransportError` once, and turns a 404 into a `BlockMiss` *value*: the index
  is advisory (section 6.1), so a miss is an expected answer, not a failure to be caught.
* Every request runs under timeouts: connect, gap between body chunks (a stalled holder), and total.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import os
import threading
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final
from urllib.parse import urljoin

import aiohttp

from kvsp.client.http import KvspSession, TransportError, problem_from, read_capped
from kvsp.client.verify import (
    DEFAULT_OFFLOAD_MIN,
    REPR_DIGEST_FIELD,
    BlockCheck,
    BlockVerifier,
    VerifiedBlock,
    format_repr_digest,
    parse_repr_digest,
)
from kvsp.container import MEDIA_TYPE as BLOCK_MEDIA_TYPE
from kvsp.container import ContainerHeader, LayerRange, LayerView, as_octets
from kvsp.container_stream import DEFAULT_MAX_SIZE
from kvsp.errors import ContainerError
from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.records import Lease, LeaseRenewal, LeaseRequest, ReplicaRecord

if TYPE_CHECKING:
    from kvsp.container import BufferLike

PROBLEM_BODY_LIMIT: Final = 64 << 10

_executor_lock = threading.Lock()
_default_executor: ThreadPoolExecutor | None = None


def default_digest_executor() -> ThreadPoolExecutor:
    """The process-wide worker pool for Repr-Digest hashing (hashlib releases the GIL there)."""
    global _default_executor  # noqa: PLW0603 - one lazily created pool per process, like asyncio's
    with _executor_lock:
        if _default_executor is None:
            workers = max(1, min(4, os.cpu_count() or 1))
            _default_executor = ThreadPoolExecutor(workers, thread_name_prefix="kvsp-digest")
        return _default_executor


class MissReason(enum.Enum):
    """Why a holder answered 404 for a block (section 6.7)."""

    NOT_FOUND = "kvsp-not-found"
    LAYERS_UNAVAILABLE = "kvsp-layers-unavailable"


@dataclass(frozen=True, slots=True)
class BlockMiss:
    """The holder does not have the block (or the requested layers): continue with another replica."""

    holder: str
    reason: MissReason
    detail: str | None = None


class StoreOutcome(enum.Enum):
    """Result of PUT with ``If-None-Match: *``: stored now, or the holder already had a replica (412)."""

    STORED = "stored"
    ALREADY_PRESENT = "already-present"


@dataclass(frozen=True, slots=True)
class HolderOptions:
    """Limits and timeouts of block transfers.

    ``read_timeout_s`` bounds the silence between two body chunks, so a stalled holder fails fast
    even when the block is large; ``block_timeout_s`` bounds a whole GET or PUT; ``control_timeout_s``
    bounds a lease exchange, so a frozen holder (TCP accepted by its kernel, no TLS answer) costs
    seconds, not the session's default.
    """

    read_timeout_s: float = 10.0
    control_timeout_s: float = 5.0
    block_timeout_s: float = 120.0
    max_block_size: int = DEFAULT_MAX_SIZE
    offload_min: int = DEFAULT_OFFLOAD_MIN


def base_of(uri: str) -> str:
    return uri if uri.endswith("/") else uri + "/"


def block_url(holder_uri: str, compat_id: bytes, scope_id: bytes, block_key: bytes) -> str:
    """blocks/{compat}/{scope}/{block_key} below the holder's base URI (section 6.7)."""
    return urljoin(base_of(holder_uri), f"blocks/{compat_id.hex()}/{scope_id.hex()}/{block_key.hex()}")


def _range_of(layers: LayerRange | tuple[int, int] | None) -> LayerRange | None:
    if layers is None or isinstance(layers, LayerRange):
        return layers
    return LayerRange(*layers)


class BlockStream:
    """The body of one block GET while it arrives.  Read it once: `layers` or `read`.

    Layers are yielded verified against the record's layer digests (when the caller gave a record);
    the Repr-Digest and the replica digest are only known after the last octet, so `block` exists
    once the iteration has finished without error.  If it raises, discard every layer it yielded.
    """

    def __init__(self, holder: str, resp: aiohttp.ClientResponse, verifier: BlockVerifier) -> None:
        self.holder = holder
        self._resp = resp
        self._verifier = verifier
        self._started = False
        self._block: VerifiedBlock | None = None

    @property
    def header(self) -> ContainerHeader | None:
        """The container header, once it has arrived."""
        return self._verifier.header

    @property
    def block(self) -> VerifiedBlock:
        if self._block is None:
            raise RuntimeError("the block is not complete: iterate layers() to the end first")
        return self._block

    async def layers(self) -> AsyncIterator[LayerView]:
        """Each layer as soon as it has arrived and passed its layer digest, in ascending order."""
        if self._started:
            raise RuntimeError("a block body can be read only once")
        self._started = True
        verifier = self._verifier
        try:
            async for data, _ in self._resp.content.iter_chunks():
                for view in verifier.feed(data):
                    yield view
            try:
                pending = verifier.end()
            except ContainerError as exc:
                raise TransportError(f"{self.holder}: block body ended early: {exc}") from exc
            actual = await asyncio.wrap_future(pending)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransportError(f"{self.holder}: block transfer failed after {verifier.received} "
                                 f"octets: {exc!r}") from exc
        self._block = verifier.complete(actual)

    async def read(self) -> VerifiedBlock:
        """Receive the rest of the body and return the verified block."""
        async for _ in self.layers():
            pass
        return self.block


class HolderClient:
    """Client of the holder resources: leases (section 6.6) and blocks (section 6.7).

    Shares one `KvspSession` (mutual TLS, pooled connections) with the other clients of the process.
    Problems other than a block 404 raise `ProblemError`; transport failures raise `TransportError`.
    """

    def __init__(self, session: KvspSession, options: HolderOptions | None = None, *,
                 executor: Executor | None = None) -> None:
        self.session = session
        self.options = options or HolderOptions()
        self._executor = executor

    @property
    def executor(self) -> Executor:
        return self._executor if self._executor is not None else default_digest_executor()

    def _timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.options.block_timeout_s, sock_read=self.options.read_timeout_s,
                                     sock_connect=self.session.options.connect_timeout_s)

    # -- leases ------------------------------------------------------------------------------------
    async def lease(self, holder_uri: str, block_keys: Sequence[bytes], ttl_ms: int) -> Lease:
        """POST leases: the holder will not evict these blocks for the granted TTL (may be capped)."""
        url = urljoin(base_of(holder_uri), "leases")
        _, body = await self.session.request_json("POST", url, LeaseRequest(tuple(block_keys), ttl_ms),
                                                 timeout_s=self.options.control_timeout_s)
        return Lease.from_json(body)

    async def renew(self, holder_uri: str, lease_id: str, ttl_ms: int) -> Lease:
        """PUT leases/{id}: extend the lease by ``ttl_ms`` from now."""
        url = urljoin(base_of(holder_uri), f"leases/{lease_id}")
        _, body = await self.session.request_json("PUT", url, LeaseRenewal(ttl_ms),
                                                 timeout_s=self.options.control_timeout_s)
        return Lease.from_json(body)

    async def release(self, holder_uri: str, lease_id: str) -> bool:
        """DELETE leases/{id}; False when the holder no longer knew it (expired)."""
        url = urljoin(base_of(holder_uri), f"leases/{lease_id}")
        try:
            await self.session.request_json("DELETE", url, timeout_s=self.options.control_timeout_s)
        except ProblemError as exc:
            if exc.problem.status == 404:
                return False
            raise
        return True

    # -- blocks ------------------------------------------------------------------------------------
    @asynccontextmanager
    async def open_block(self, holder_uri: str, compat_id: bytes, scope_id: bytes, block_key: bytes, *,
                         layers: LayerRange | tuple[int, int] | None = None, codec: int | None = None,
                         expect: ReplicaRecord | BlockCheck | None = None) -> AsyncIterator[BlockStream | BlockMiss]:
        """GET the block; yields a `BlockStream` to read, or a `BlockMiss` for a 404.

        ``expect`` is the Replica Record the caller looked up (its layer and replica digests are then
        verified) or a prepared `BlockCheck`; without it only Repr-Digest protects the block.
        """
        check = self._check_for(expect, _range_of(layers), codec)
        params = {}
        if check.layers is not None:
            params["layers"] = str(check.layers)
        if codec is not None:
            params["codec"] = str(codec)
        url = block_url(holder_uri, compat_id, scope_id, block_key)
        try:
            resp = await self.session.http.get(url, params=params, timeout=self._timeout(), allow_redirects=False)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransportError(f"GET {url}: {exc!r}") from exc
        try:
            yield await self._answer(holder_uri, resp, check)
        except BaseException:
            resp.close()  # an unread body cannot go back to the pool
            raise
        else:
            resp.release()

    def _check_for(self, expect: ReplicaRecord | BlockCheck | None, layers: LayerRange | None,
                   codec: int | None) -> BlockCheck:
        limit = self.options.max_block_size
        if isinstance(expect, BlockCheck):
            if layers is not None and layers != expect.layers:
                raise ValueError(f"layers {layers} and the check's layers {expect.layers} disagree")
            return expect
        if expect is None:
            return BlockCheck(layers=layers, codec=codec, max_size=limit)
        return BlockCheck.for_replica(expect, layers=layers, codec=codec, max_size=limit)

    async def _answer(self, holder: str, resp: aiohttp.ClientResponse,
                      check: BlockCheck) -> BlockStream | BlockMiss:
        if resp.status == 404:
            return await _miss(holder, resp)
        if not 200 <= resp.status < 300:
            raise problem_from(resp.status, resp.content_type,
                               await _read_problem(resp, f"{holder}: block GET"))
        if resp.content_type != BLOCK_MEDIA_TYPE:
            raise ContainerError(f"{holder}: block answered with media type {resp.content_type!r}")
        if resp.content_length is not None and resp.content_length > check.max_size:
            raise ContainerError(f"{holder}: block of {resp.content_length} octets exceeds the limit "
                                 f"of {check.max_size}")
        expected = parse_repr_digest(resp.headers.getall(REPR_DIGEST_FIELD, ()))
        verifier = BlockVerifier(check, expected, executor=self.executor, offload_min=self.options.offload_min)
        return BlockStream(holder, resp, verifier)

    async def get_block(self, holder_uri: str, compat_id: bytes, scope_id: bytes, block_key: bytes, *,
                        layers: LayerRange | tuple[int, int] | None = None, codec: int | None = None,
                        expect: ReplicaRecord | BlockCheck | None = None) -> VerifiedBlock | BlockMiss:
        """The whole block, verified, or a `BlockMiss`; `open_block` to use layers as they arrive."""
        async with self.open_block(holder_uri, compat_id, scope_id, block_key, layers=layers, codec=codec,
                                   expect=expect) as answer:
            if isinstance(answer, BlockMiss):
                return answer
            return await answer.read()

    async def put_block(self, holder_uri: str, compat_id: bytes, scope_id: bytes, block_key: bytes,
                        container: BufferLike | Sequence[BufferLike]) -> StoreOutcome:
        """PUT a container with ``If-None-Match: *`` and its Repr-Digest (section 6.7).

        ``container`` is one buffer or the parts of `kvsp.container.encode_parts` (sent without joining).
        A holder that already has a replica for the key answers 412 and keeps its copy: ALREADY_PRESENT.
        """
        parts = _parts_of(container)
        total = sum(part.nbytes for part in parts)
        if total >= self.options.offload_min:
            digest = await asyncio.get_running_loop().run_in_executor(self.executor, _sha256_parts, parts)
        else:
            digest = _sha256_parts(parts)
        headers = {"Content-Type": BLOCK_MEDIA_TYPE, "If-None-Match": "*",
                   REPR_DIGEST_FIELD: format_repr_digest(digest), "Content-Length": str(total)}
        url = block_url(holder_uri, compat_id, scope_id, block_key)
        data: memoryview | AsyncIterator[memoryview] = parts[0] if len(parts) == 1 else _iterate(parts)
        try:
            async with self.session.http.put(url, data=data, headers=headers, timeout=self._timeout(),
                                             allow_redirects=False) as resp:
                status = resp.status
                if status == 412:
                    return StoreOutcome.ALREADY_PRESENT
                if not 200 <= status < 300:
                    raise problem_from(status, resp.content_type, await _read_problem(resp, f"PUT {url}"))
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransportError(f"PUT {url}: {exc!r}") from exc
        return StoreOutcome.STORED


def _parts_of(container: BufferLike | Sequence[BufferLike]) -> list[memoryview]:
    if isinstance(container, bytes | bytearray | memoryview):
        return [as_octets(container)]
    if isinstance(container, Sequence):
        return [as_octets(part) for part in container]
    return [as_octets(container)]


def _sha256_parts(parts: Sequence[memoryview]) -> bytes:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.digest()


async def _iterate(parts: Sequence[memoryview]) -> AsyncIterator[memoryview]:
    for part in parts:
        yield part


async def _read_problem(resp: aiohttp.ClientResponse, what: str) -> bytes:
    try:
        return await read_capped(resp, PROBLEM_BODY_LIMIT)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise TransportError(f"{what}: {exc!r}") from exc
    except TransportError:
        return b""  # an oversized problem body: the status alone still says what happened


async def _miss(holder: str, resp: aiohttp.ClientResponse) -> BlockMiss:
    body = await _read_problem(resp, f"{holder}: block GET")
    error = problem_from(404, resp.content_type, body)
    problem: Problem = error.problem
    reason = (MissReason.LAYERS_UNAVAILABLE if problem.kind is ProblemType.LAYERS_UNAVAILABLE
              else MissReason.NOT_FOUND)
    return BlockMiss(holder, reason, problem.detail)
