"""Verification of received blocks (spec sections 4.3, 6.7 and 7): Repr-Digest, layer and replica digests.

Why it looks like this:

* A client MUST verify ``Repr-Digest`` (SHA-256 of the whole container) and, when it received the
  replica's codec, every layer against the record's ``layer_digests`` and, with all layers, the replica
  digest.  That is two SHA-256 computations over the same octets, and SHA-256 states cannot be shared.
  The wall-time cost stays near one pass by running them on two cores: the layer digests, which gate
  handing a layer to the engine, run on the caller's thread the moment a layer completes; the
  Repr-Digest, needed only at the end, runs on a worker thread over views of the same buffer, by one
  job at a time that keeps taking what arrives until nothing waits (so the number of thread hand-offs
  adapts to the arrival rate; a streamed block waits for 1/32 of itself before a new job, since each
  hand-off costs the receiving thread more than the Python work of a layer).  hashlib releases the
  GIL for buffers over 2 KiB.  Layer digests are hashed straight from the offsets (`Container.layer_digests`)
  and compared in one step when they all match.
* `BlockVerifier` is sans-I/O: chunks in, verified `LayerView`s out; the asyncio adapter in
  `kvsp.client.holder` only moves bytes.  `verify_block_bytes` is the same check on a buffer that is
  already complete (a holder checking a PUT body, a block read from disk), decoded without a copy.
* Each failure is its own type, because the fetcher reacts differently: a digest mismatch is evidence
  of bad data (withdraw the replica, section 7); a missing Repr-Digest or an unexpected container is a
  misbehaving holder (fall back, nothing to withdraw).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import operator
import re
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from kvsp.container import (
    Container,
    ContainerHeader,
    Geometry,
    LayerDigestMismatchError,
    LayerRange,
    LayerView,
    as_octets,
    decode_container,
)
from kvsp.container_stream import DEFAULT_MAX_SIZE, ContainerReader, HeaderReceived, LayerReady
from kvsp.errors import ContainerError, DigestMismatchError, KvspError

if TYPE_CHECKING:
    from kvsp.container import BufferLike
    from kvsp.records import ReplicaRecord

REPR_DIGEST_FIELD: Final = "Repr-Digest"
# Below these container sizes a thread hand-off (tens of microseconds, plus waiting for the GIL) costs
# more than the hash it would overlap.  Measured on 2 cores (benchmarks/bench_client.py): streaming
# breaks even near 512 KiB, a complete buffer (one hand-off) near 200 KiB.
DEFAULT_OFFLOAD_MIN: Final = 1 << 20
BUFFER_OFFLOAD_MIN: Final = 256 << 10
# A streamed block hands its Repr-Digest to the worker in at most about this many jobs: fewer hand-offs
# cost this thread less, larger last jobs leave the worker a longer tail after the last octet.
_SPANS_PER_BLOCK: Final = 32

_SF_KEY: Final = re.compile(r"[a-z*][a-z0-9_\-.*]*")
_DIGEST: Final = operator.methodcaller("digest")


class ReprDigestMissingError(KvspError):
    """The holder sent no usable ``sha-256`` Repr-Digest (a MUST of section 6.7): not proof of bad data."""


class ReprDigestMismatchError(DigestMismatchError):
    """The container does not hash to the Repr-Digest the holder sent with it."""

    def __init__(self, expected: bytes, actual: bytes) -> None:
        super().__init__(f"Repr-Digest mismatch: received {actual.hex()}, holder said {expected.hex()}")
        self.expected = expected
        self.actual = actual


class ReplicaDigestMismatchError(DigestMismatchError):
    """The layers received do not chain to the replica digest of the Replica Record."""

    def __init__(self, expected: bytes, actual: bytes) -> None:
        super().__init__(f"replica digest mismatch: received {actual.hex()}, record says {expected.hex()}")
        self.expected = expected
        self.actual = actual


class UnexpectedBlockError(ContainerError):
    """A well-formed container that is not the one asked for (other layers, token count or codec)."""


# -- Repr-Digest (RFC 9530) ------------------------------------------------------------------------


def format_repr_digest(digest: bytes) -> str:
    """``sha-256=:<base64>:``, the RFC 9530 Dictionary member for one SHA-256 digest."""
    return f"sha-256=:{base64.b64encode(digest).decode('ascii')}:"


def parse_repr_digest(field_lines: Iterable[str]) -> bytes:
    """The ``sha-256`` member of a Repr-Digest Dictionary (RFC 9530, RFC 8941), as 32 raw octets.

    Several field lines combine as one comma-separated list; members for other algorithms are ignored
    and a repeated key keeps its last value (RFC 8941 dictionary semantics).  Anything unparsable, or
    no ``sha-256`` member, raises `ReprDigestMissingError`: without it the block cannot be trusted.
    """
    found: bytes | None = None
    for line in field_lines:
        for raw_member in line.split(","):
            member = raw_member.strip(" \t")
            key, eq, rest = member.partition("=")
            if not _SF_KEY.fullmatch(key):
                raise ReprDigestMissingError(f"malformed Repr-Digest member {member[:80]!r}")
            if key == "sha-256":
                found = _parse_byte_sequence(rest.split(";", 1)[0] if eq else "")
    if found is None:
        raise ReprDigestMissingError("the response has no sha-256 Repr-Digest")
    return found


def _parse_byte_sequence(value: str) -> bytes:
    if len(value) < 2 or value[0] != ":" or value[-1] != ":":
        raise ReprDigestMissingError("the sha-256 Repr-Digest is not a byte sequence (:base64:)")
    text = value[1:-1]
    try:
        digest = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ReprDigestMissingError("the sha-256 Repr-Digest is not valid base64") from exc
    if len(digest) != 32:
        raise ReprDigestMissingError(f"the sha-256 Repr-Digest has {len(digest)} octets, not 32")
    return digest


# -- what a block must match ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockCheck:
    """What one received container must match, beyond its Repr-Digest.

    ``layer_digests`` is indexed by absolute layer number; they (and the replica digest) apply only
    when the container's codec is ``replica_codec`` (section 6.7: a transcoded representation is
    protected by Repr-Digest alone).  ``all_layers`` is the replica's full layer range, so the replica
    digest is checked exactly "when all layers were retrieved".
    """

    layers: LayerRange | None = None  # requested range; None: the whole replica
    codec: int | None = None  # the codec asked for with codec=n (None: the replica's)
    replica_codec: int | None = None
    layer_digests: tuple[bytes, ...] = ()
    replica_digest: bytes | None = None
    all_layers: LayerRange | None = None
    token_count: int | None = None
    geometry: Geometry | None = None
    max_size: int = DEFAULT_MAX_SIZE

    @classmethod
    def for_replica(cls, record: ReplicaRecord, *, layers: LayerRange | None = None, codec: int | None = None,
                    token_count: int | None = None, geometry: Geometry | None = None,
                    max_size: int = DEFAULT_MAX_SIZE) -> BlockCheck:
        """The checks section 6.7 requires for a GET of ``record`` (optionally a range, or another codec)."""
        if record.layer_digests:
            full: LayerRange | None = LayerRange(0, len(record.layer_digests) - 1)
        else:
            held = record.layers_held()
            full = LayerRange(*held[0]) if len(held) == 1 else None
        return cls(layers=layers, codec=codec, replica_codec=record.codec,
                   layer_digests=record.layer_digests, replica_digest=record.digest, all_layers=full,
                   token_count=token_count, geometry=geometry, max_size=max_size)

    @property
    def accepted_codecs(self) -> frozenset[int]:
        """The codec asked for and the replica's: a holder MAY transcode (section 6.7), or may not."""
        return frozenset(c for c in (self.codec, self.replica_codec) if c is not None)

    @property
    def codec_required(self) -> int | None:
        """The one acceptable codec, for the parser to enforce before any layer octet; None: several or any."""
        accepted = self.accepted_codecs
        return next(iter(accepted)) if len(accepted) == 1 else None

    @property
    def expected_range(self) -> LayerRange | None:
        """The layer range the container must cover: the requested one, else the replica's."""
        return self.layers if self.layers is not None else self.all_layers

    def hashes_layers(self, header: ContainerHeader) -> bool:
        """Whether layer digests are computed for this container (the replica's codec was returned)."""
        return self.replica_codec is not None and header.codec == self.replica_codec \
            and (bool(self.layer_digests) or self.replica_digest is not None)

    def check_header(self, header: ContainerHeader) -> None:
        accepted = self.accepted_codecs
        if accepted and header.codec not in accepted:
            raise UnexpectedBlockError(f"container has codec 0x{header.codec:04x}, expected one of "
                                       f"{sorted(accepted)}")
        expected = self.expected_range
        if expected is not None and header.layer_range != expected:
            raise UnexpectedBlockError(f"container holds layers {header.layer_range}, expected {expected}")
        if self.token_count is not None and header.token_count != self.token_count:
            raise UnexpectedBlockError(f"container holds {header.token_count} tokens, expected {self.token_count}")

    def check_layer(self, view: LayerView, actual: bytes) -> None:
        if not self.layer_digests:
            return  # only the replica digest will vouch for these layers
        want = self.layer_digests[view.layer] if view.layer < len(self.layer_digests) else None
        if want != actual:
            raise LayerDigestMismatchError(view.layer, want, actual)

    def check_layers(self, first_layer: int, digests: Sequence[bytes]) -> None:
        """`check_layer` for consecutive layers from ``first_layer``: one comparison when all match."""
        if not self.layer_digests:
            return
        if tuple(self.layer_digests[first_layer : first_layer + len(digests)]) == tuple(digests):
            return
        for layer, actual in enumerate(digests, first_layer):
            want = self.layer_digests[layer] if layer < len(self.layer_digests) else None
            if want != actual:
                raise LayerDigestMismatchError(layer, want, actual)

    def checks_replica(self, header: ContainerHeader) -> bool:
        return self.hashes_layers(header) and self.replica_digest is not None \
            and self.all_layers is not None and header.layer_range == self.all_layers


@dataclass(frozen=True, slots=True, eq=False)
class VerifiedBlock:
    """A container that passed every check that applied to it; views of the receive buffer, no copy.

    ``layer_digests`` are the digests computed on receipt (empty when the codec was transcoded);
    ``replica_verified`` says whether the replica digest was checked (all layers, replica's codec).
    """

    container: Container
    repr_digest: bytes
    layer_digests: tuple[bytes, ...]
    replica_verified: bool

    @property
    def layers(self) -> tuple[LayerView, ...]:
        return self.container.layers

    @property
    def size(self) -> int:
        return self.container.header_length + self.container.data_length


# -- the Repr-Digest hasher ----------------------------------------------------------------------------


def _update_all(h: hashlib._Hash, parts: Sequence[bytes | memoryview]) -> None:
    for part in parts:
        h.update(part)


class SpanHasher:
    """SHA-256 over buffers appended in order: inline, or on ``executor`` by one draining job at a time.

    A job hashes everything pending and, before it ends, takes whatever was appended meanwhile, so a
    job runs for as long as data keeps coming: a receiver that outpaces the worker (or a loaded machine
    that runs it late) pays one hand-off for many layers instead of one per layer.  A new job is
    submitted only when none is running and at least ``min_span`` octets wait.  A worker needs the GIL
    to start; while this thread keeps it busy that can take up to the interpreter's switch interval,
    so `finish` takes back a job that never started and hashes its share here: offloading can then
    cost nothing, where otherwise it would add a whole pass.
    """

    __slots__ = ("_error", "_executor", "_h", "_job", "_lock", "_min_span", "_out", "_pending", "_pending_octets",
                 "_running")

    def __init__(self, executor: Executor | None = None, *, min_span: int = 64 << 10) -> None:
        self._h = hashlib.sha256()
        self._executor = executor
        self._min_span = min_span  # smaller jobs are not worth a hand-off; they wait for more
        self._lock = threading.Lock()  # guards the fields below, shared with the running job
        self._pending: list[bytes | memoryview] = []
        self._pending_octets = 0
        self._running = False  # a job is queued or hashing; it empties _pending before it ends
        self._job: Future[None] | None = None  # the latest job submitted
        self._out: Future[bytes] | None = None  # set by `finish` for the running job to complete
        self._error: BaseException | None = None  # what a job raised, for `finish` to hand on

    @property
    def offloaded(self) -> bool:
        return self._executor is not None

    @property
    def min_span(self) -> int:
        return self._min_span

    @min_span.setter
    def min_span(self, octets: int) -> None:
        """Octets that wait before a new job is worth its hand-off (the running job takes any amount)."""
        self._min_span = octets

    def inline(self) -> None:
        """Hash on the caller's thread from now on (small containers: a hand-off costs more than it saves)."""
        with self._lock:
            if not self._running and not self._pending:
                self._executor = None

    def add(self, parts: Iterable[bytes | memoryview]) -> None:
        executor = self._executor
        if executor is None:
            _update_all(self._h, list(parts))
            return
        with self._lock:
            for part in parts:
                self._pending.append(part)
                self._pending_octets += len(part)  # octets: parts are bytes or 1-D octet views
            if self._running or self._pending_octets < self._min_span:
                return
            self._running = True
        try:
            self._job = executor.submit(self._drain)
        except BaseException:  # e.g. a pool shut down: the data stays pending, for `finish` to hash here
            with self._lock:
                self._running = False
            raise

    def _drain(self) -> None:
        """The job: hash what is pending until nothing is; complete `finish`'s future if it is waiting."""
        try:
            while True:
                with self._lock:
                    batch, self._pending, self._pending_octets = self._pending, [], 0
                    if not batch:
                        self._running = False
                        out = self._out
                        break
                _update_all(self._h, batch)
        except BaseException as exc:  # handed to the waiting caller, not swallowed
            with self._lock:
                self._running = False
                self._error = exc
                out = self._out
            if out is not None:
                out.set_exception(exc)
            return
        if out is not None:
            out.set_result(self._h.digest())

    def finish(self) -> Future[bytes]:
        """The digest of everything added; a completed future when the rest was hashed here."""
        out: Future[bytes] = Future()
        with self._lock:
            if self._running:
                job = self._job
                if job is not None and job.cancel():  # never started: do its share on this thread
                    self._running = False
                else:  # the running job empties _pending, then completes `out`
                    self._out = out
                    return out
            rest, self._pending, self._pending_octets = self._pending, [], 0
            error = self._error
        if error is not None:
            out.set_exception(error)
            return out
        _update_all(self._h, rest)
        out.set_result(self._h.digest())
        return out


# -- incremental verification ------------------------------------------------------------------------


class BlockVerifier:
    """Push-fed checks of one block body: structure, layer digests per layer, Repr-Digest at the end.

    `feed` returns the layers that the new octets complete, each already verified against its layer
    digest.  Nothing is proven about the container as a whole until `complete` returns: a consumer that
    used early layers MUST discard them if `complete` (or a later `feed`) raises.
    """

    __slots__ = ("_check", "_digests", "_expected_repr", "_hashes", "_header", "_offload_min", "_reader",
                 "_repr")

    def __init__(self, check: BlockCheck, repr_digest: bytes, *, executor: Executor | None = None,
                 offload_min: int = DEFAULT_OFFLOAD_MIN) -> None:
        self._check = check
        self._expected_repr = repr_digest
        self._reader = ContainerReader(geometry=check.geometry, codec_required=check.codec_required,
                                       max_size=check.max_size)
        self._repr = SpanHasher(executor)
        self._offload_min = offload_min
        self._header: ContainerHeader | None = None
        self._hashes = False
        self._digests: list[bytes] = []

    @property
    def header(self) -> ContainerHeader | None:
        return self._header

    @property
    def received(self) -> int:
        return self._reader.received

    def feed(self, chunk: BufferLike) -> list[LayerView]:
        """Consume a chunk; return the layers it completed, verified.  Raises on the first failure."""
        views: list[LayerView] = []
        for event in self._reader.feed(chunk):
            if isinstance(event, HeaderReceived):
                self._on_header(event.header)
            elif isinstance(event, LayerReady):
                views.append(event.view)
        if views:
            # Hand the Repr-Digest its share first, so that the worker hashes while we hash the layers.
            self._repr.add([view.payload for view in views])
            if self._hashes:
                digests = list(map(_DIGEST, map(hashlib.sha256, [view.payload for view in views])))
                self._check.check_layers(views[0].layer, digests)
                self._digests += digests
        return views

    def _on_header(self, header: ContainerHeader) -> None:
        self._check.check_header(header)
        self._header = header
        self._hashes = self._check.hashes_layers(header)
        if header.container_length < self._offload_min:
            self._repr.inline()
        else:  # at most ~32 hand-offs per block: fewer help a loaded machine, larger last jobs cost a free one
            self._repr.min_span = max(self._repr.min_span, header.container_length // _SPANS_PER_BLOCK)
        self._repr.add([header.encode()])  # the header re-encodes to the octets received (fixed widths)

    def end(self) -> Future[bytes]:
        """Declare the end of the body (truncation raises `ContainerError`); the Repr-Digest computed."""
        self._reader.close()
        return self._repr.finish()

    def complete(self, actual_repr: bytes) -> VerifiedBlock:
        """Compare the Repr-Digest and the replica digest; the block, if everything holds."""
        if actual_repr != self._expected_repr:
            raise ReprDigestMismatchError(self._expected_repr, actual_repr)
        container = self._reader.container()
        return _finish_checks(self._check, container, actual_repr, tuple(self._digests))

    def verify_sync(self) -> VerifiedBlock:
        """`end` then `complete`, blocking the calling thread (for synchronous callers)."""
        return self.complete(self.end().result())


def _finish_checks(check: BlockCheck, container: Container, repr_digest: bytes,
                   digests: tuple[bytes, ...]) -> VerifiedBlock:
    replica = check.checks_replica(container.header)
    if replica and check.replica_digest is not None:
        actual = hashlib.sha256(b"".join(digests)).digest()
        if actual != check.replica_digest:
            raise ReplicaDigestMismatchError(check.replica_digest, actual)
    return VerifiedBlock(container, repr_digest, digests, replica)


def verify_block_bytes(buf: BufferLike, repr_digest: bytes, check: BlockCheck | None = None, *,
                       executor: Executor | None = None,
                       offload_min: int = BUFFER_OFFLOAD_MIN) -> VerifiedBlock:
    """Every check of section 6.7 on a complete container in ``buf``, decoded in place (no copy).

    With an ``executor`` and a container of at least ``offload_min`` octets, the Repr-Digest runs on a
    worker while this thread computes the layer digests, so the cost is close to one hash pass.
    """
    check = check or BlockCheck()
    octets = as_octets(buf)
    if octets.nbytes > check.max_size:
        raise ContainerError(f"container of {octets.nbytes} octets exceeds the limit of {check.max_size}")
    container = decode_container(octets, geometry=check.geometry, codec_required=check.codec_required)
    check.check_header(container.header)
    hasher = SpanHasher(executor if octets.nbytes >= offload_min else None)
    hasher.add([octets])  # on the worker, while this thread hashes the layers
    digests: tuple[bytes, ...] = ()
    if check.hashes_layers(container.header):
        digests = container.layer_digests()
        check.check_layers(container.first_layer, digests)
    actual_repr = hasher.finish().result()
    if actual_repr != repr_digest:
        raise ReprDigestMismatchError(repr_digest, actual_repr)
    return _finish_checks(check, container, actual_repr, digests)
