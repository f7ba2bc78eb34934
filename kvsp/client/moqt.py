"""Block client over MOQT (decision D3): stored blocks by FETCH, blocks being produced by SUBSCRIBE.

Why it looks like this:

* A replica whose record names a ``moqt://`` holder is a track (``kvsp.moqt_binding``). `open_block`
  FETCHes layers ``a..b`` as objects ``(0, a) .. (0, b + 1)``; each object is assembled straight into
  its place in one block buffer (``BlockAssembly.allocate``), checked against ``layer_digests[l]`` and
  only then yielded, so an engine can load layer ``l`` while ``l + 1`` is on the wire. With every
  layer, the replica digest is checked and the block is a `VerifiedBlock` like the HTTPS client's
  (its ``repr_digest`` is empty: MOQT has no representation digest; the layer digests stand in).
* `subscribe_block` reads a block that is still being computed (a `LiveBlockPublisher` upstream):
  layers are yielded as views of the received octets, checked when layer digests are known, and the
  digests of what arrived are kept for the record that the producer publishes at the end.
* One session per ``moqt://`` URI, reused and replaced when it breaks. The API's errors are mapped
  once, here: a refusal becomes `MoqtRefusedError` (``not_found`` for a miss: `fetch_block` then
  answers `BlockMiss`, as the HTTPS client does for a 404), a broken transfer `TransportError`, bad
  objects `ContainerError`; digest failures stay `DigestMismatchError`. `kvsp.client.fetch` falls back
  to the next replica (or HTTPS, or recompute) on any of them.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kvsp.client.holder import BlockMiss, MissReason
from kvsp.client.http import TransportError
from kvsp.client.ranking import full_range
from kvsp.client.verify import VerifiedBlock
from kvsp.container import Geometry, LayerRange, LayerView
from kvsp.container_stream import DEFAULT_MAX_SIZE
from kvsp.errors import ContainerError, KvspError
from kvsp.identifiers import TrackNamespace
from kvsp.moqt_binding import BLOCK_GROUP, BlockAssembly, LayerCheck, layer_window, track_name
from kvsp.records import ReplicaRecord
from moqt.api import (
    FetchRefused,
    MalformedTrackError,
    ObjectStream,
    RequestRefused,
    SetupRefused,
    Subscriber,
    TokenSource,
    TransferError,
)
from moqt.errors import MoqtError
from moqt.kinds import RequestError
from moqt.quic import EndpointConfig, QuicSettings
from moqt.wire import Location


class MoqtRefusedError(KvspError):
    """The MOQT peer refused the session or the request; ``error`` names the MOQT error (the code
    itself where the draft's profile names none)."""

    def __init__(self, uri: str, error: enum.Enum | int, reason: str, *, not_found: bool = False,
                 layers_unavailable: bool = False) -> None:
        why = error.name if isinstance(error, enum.Enum) else f"code 0x{error:x}"
        super().__init__(f"{uri}: refused ({why}): {reason}")
        self.uri = uri
        self.error = error
        self.not_found = not_found
        self.layers_unavailable = layers_unavailable


BLOCK_CLIENT_QUIC: Final = QuicSettings(recv_batch=16, ack_delay_s=0.005)
REQUEST_ID_POLL_S: Final = 0.002  # how often a session out of request IDs is checked for new ones
"""QUIC settings for block clients: the adapter hands received objects to the consumer after each
batch of datagrams, so a smaller batch than the default 64 brings a block's first layer sooner at no
measured cost in throughput (benchmarks/bench_moqt.py, docs/moqt.md). ACKs held back up to 5 ms
instead of 1 ms: a block client mostly receives, and each ACK wakes the sender to process it; fewer
of them cut the CPU per block by 10-20 % on both ends (docs/moqt-performance.md)."""


@dataclass(frozen=True, slots=True)
class MoqtClientOptions:
    """``object_timeout_s`` bounds the wait for FETCH_OK and each object; ``stall_timeout_s`` (None:
    off) bounds a FETCH whose layers have started to arrive: no octet for that long (a relay or holder
    killed mid-block) gives it up as a `TransportError`, and `kvsp.client.fetch` falls back to the next
    replica at once instead of after the object timeout. Blocks being produced (`subscribe_block`)
    have no stall bound: the producer computes between layers."""

    connect_timeout_s: float = 5.0
    object_timeout_s: float = 10.0
    stall_timeout_s: float | None = 0.5
    max_block_size: int = DEFAULT_MAX_SIZE


@contextmanager
def _mapped(uri: str) -> Iterator[None]:
    """The API's exceptions as the KVSP client's (see the module docstring)."""
    try:
        yield
    except RequestRefused as exc:
        layers = isinstance(exc, FetchRefused) and exc.error in (RequestError.INVALID_RANGE, RequestError.NO_OBJECTS)
        raise MoqtRefusedError(uri, exc.error, exc.reason, not_found=getattr(exc, "not_found", False),
                               layers_unavailable=layers) from exc
    except SetupRefused as exc:
        raise MoqtRefusedError(uri, exc.error, exc.reason) from exc
    except MalformedTrackError as exc:
        raise ContainerError(f"{uri}: {exc}") from exc
    except (TransferError, ConnectionError, TimeoutError) as exc:
        raise TransportError(f"{uri}: {exc or type(exc).__name__}") from exc
    except MoqtError as exc:  # certificate or token failures at connect, a local request limit
        raise TransportError(f"{uri}: {exc}") from exc


class MoqtBlockStream:
    """One stored block arriving over FETCH. Read it once: `layers` or `read`.

    If iteration raises, discard every layer it yielded (as with the HTTPS `BlockStream`).
    """

    def __init__(self, uri: str, objects: ObjectStream, assembly: BlockAssembly) -> None:
        self.uri = uri
        self._objects = objects
        self._assembly = assembly
        self._started = False
        self._block: VerifiedBlock | None = None

    @property
    def block(self) -> VerifiedBlock:
        if self._block is None:
            raise RuntimeError("the block is not complete: iterate layers() to the end first")
        return self._block

    async def layers(self) -> AsyncIterator[LayerView]:
        """Each layer as soon as it has arrived and matched its layer digest, in ascending order."""
        if self._started:
            raise RuntimeError("a block can be read only once")
        self._started = True
        with _mapped(self.uri):
            async for obj in self._objects:
                yield self._assembly.accept(obj)
        self._block = self._assembly.finish()

    async def read(self) -> VerifiedBlock:
        async for _ in self.layers():
            pass
        return self.block


class LiveBlockStream:
    """A block arriving over SUBSCRIBE while it is produced; layers are views of the received octets."""

    def __init__(self, uri: str, objects: ObjectStream, check: LayerCheck) -> None:
        self.uri = uri
        self._objects = objects
        self.check = check

    @property
    def complete(self) -> bool:
        return self.check.expected is None

    @property
    def layer_digests(self) -> tuple[bytes, ...]:
        """The digests of the layers received so far (for comparison with the record made later)."""
        return tuple(self.check.digests)

    async def layers(self) -> AsyncIterator[LayerView]:
        """Each layer as soon as the producer published it (verified if layer digests were given)."""
        with _mapped(self.uri):
            async for obj in self._objects:
                yield self.check.check(obj)
        if not self.complete:
            raise TransportError(f"{self.uri}: the block ended before layer {self.check.expected}")


class MoqtBlockClient:
    """Fetches blocks from ``moqt://`` holders and relays (see the module docstring).

    ``config`` holds the client certificate (or none, with ``token``) and the deployment CA; ``token`` is
    octets or a callable read at each connect (``[moqt] token``, required over picoquic).
    """

    def __init__(self, config: EndpointConfig, *, token: TokenSource = None,
                 options: MoqtClientOptions | None = None) -> None:
        self.config = config
        self.token = token
        self.options = options or MoqtClientOptions()
        self._subscribers: dict[str, Subscriber] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @classmethod
    def from_files(cls, cert: Path | None, key: Path | None, ca: Path, *, token: TokenSource = None,
                   options: MoqtClientOptions | None = None,
                   settings: QuicSettings = BLOCK_CLIENT_QUIC) -> MoqtBlockClient:
        """A client with the role's PEM certificate and key (as ``kvsp certs`` writes them; None with a
        token instead) and the deployment CA."""
        return cls(EndpointConfig.from_files(cert, key, ca, settings), token=token, options=options)

    def adopt(self, uri: str, subscriber: Subscriber) -> None:
        """Use an established session for ``uri`` (one made elsewhere: an in-memory pair in tests,
        or a custom transport), at whatever draft it speaks; a broken one is replaced as usual."""
        self._subscribers[uri] = subscriber

    async def subscriber(self, uri: str) -> Subscriber:
        """The session to ``uri``: the open one, or a new one."""
        current = self._subscribers.get(uri)
        if current is not None and await self._ready(current):
            return current
        async with self._locks.setdefault(uri, asyncio.Lock()):
            current = self._subscribers.get(uri)
            if current is not None and await self._ready(current):
                return current
            if current is not None:
                await current.close()
            with _mapped(uri):
                async with asyncio.timeout(self.options.connect_timeout_s):
                    token = self.token() if callable(self.token) else self.token  # a rotated file: read anew
                    current = await Subscriber.connect(uri, self.config, token=token,
                                                       timeout_s=self.options.object_timeout_s,
                                                       setup_timeout_s=self.options.connect_timeout_s,
                                                       max_inbox_octets=self.options.max_block_size)
            self._subscribers[uri] = current
            return current

    async def _ready(self, subscriber: Subscriber) -> bool:
        """True once ``subscriber`` may send a request; False if its session is broken.

        A live session that has used up the publisher's request IDs is not broken: the publisher
        raises MAX_REQUEST_ID as earlier requests finish, so wait for that (up to the object timeout)
        instead of closing the session under the fetches still in flight on it."""
        if subscriber.usable:
            return True
        deadline = asyncio.get_running_loop().time() + self.options.object_timeout_s
        while subscriber.endpoint.usable and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(REQUEST_ID_POLL_S)
            if subscriber.usable:
                return True
        return False

    @asynccontextmanager
    async def open_block(self, record: ReplicaRecord, *, layers: LayerRange | None = None,
                         token_count: int | None = None,
                         geometry: Geometry | None = None) -> AsyncIterator[MoqtBlockStream]:
        """FETCH ``layers`` (default: all) of the replica ``record`` (a ``moqt`` holder)."""
        namespace = record.moqt_namespace
        if namespace is None:
            raise ValueError("the record names no moqt_namespace")
        wanted = layers if layers is not None else full_range(record)
        if wanted is None:
            raise ValueError("the replica holds no single contiguous layer range")
        assembly = BlockAssembly.for_replica(record, wanted, token_count=token_count, geometry=geometry,
                                             max_size=self.options.max_block_size)
        subscriber = await self.subscriber(record.holder)
        start, end = layer_window(wanted)
        with _mapped(record.holder):
            objects = subscriber.fetch(namespace.fields(), track_name(record.codec), start, end,
                                       allocate=assembly.allocate, stall_timeout_s=self.options.stall_timeout_s)
        async with objects:  # the block buffer is allocated (not zeroed) when the first object arrives
            yield MoqtBlockStream(record.holder, objects, assembly)

    async def fetch_block(self, record: ReplicaRecord, *, layers: LayerRange | None = None,
                          token_count: int | None = None,
                          geometry: Geometry | None = None) -> VerifiedBlock | BlockMiss:
        """The layers, verified, or a `BlockMiss` when the publisher has no such track or layers."""
        try:
            async with self.open_block(record, layers=layers, token_count=token_count, geometry=geometry) as stream:
                return await stream.read()
        except MoqtRefusedError as exc:
            if not exc.not_found:
                raise
            reason = MissReason.LAYERS_UNAVAILABLE if exc.layers_unavailable else MissReason.NOT_FOUND
            return BlockMiss(record.holder, reason, str(exc))

    @asynccontextmanager
    async def subscribe_block(self, uri: str, namespace: TrackNamespace, codec: int, *, layer_count: int,
                              layer_digests: tuple[bytes, ...] = (), token_count: int | None = None,
                              geometry: Geometry | None = None) -> AsyncIterator[LiveBlockStream]:
        """SUBSCRIBE to a block being produced: layers ``0 .. layer_count - 1`` of group 0."""
        check = LayerCheck(codec, LayerRange(0, layer_count - 1), layer_digests, token_count, geometry)
        subscriber = await self.subscriber(uri)
        with _mapped(uri):
            objects = subscriber.subscribe(namespace.fields(), track_name(codec), start=Location(BLOCK_GROUP, 0),
                                           end_group=BLOCK_GROUP)
        async with objects:
            yield LiveBlockStream(uri, objects, check)

    async def close(self) -> None:
        subscribers, self._subscribers = list(self._subscribers.values()), {}
        for subscriber in subscribers:
            await subscriber.close()

