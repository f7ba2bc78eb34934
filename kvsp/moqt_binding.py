"""The KVSP binding to MOQT (decision D3): names, objects, per-layer checks, authorization, live blocks.

* A block is a track: namespace ``("kvsp", compat_id hex32, scope_id hex16, producer holder-id,
  block_key hex32)`` (`block_namespace`), name = the codec's registry name (`track_name`).
* Group 0 holds the block; object ``l`` is layer ``l``; its payload is the layer's K section followed
  by its V section, so SHA-256 of the payload is the layer digest. Codecs other than raw add Extension
  Header `K_LENGTH_EXTENSION` (0x4B56) = the K section length.
* Stored blocks are read with FETCH of ``(0, a) .. (0, b + 1)`` (`layer_window`); blocks being produced
  with SUBSCRIBE from ``(0, 0)`` to the end of group 0 (`LiveBlockPublisher` on the producing side).
* `BlockAssembly` (sans-I/O) checks each arriving layer against the record's ``layer_digests`` before it
  is handed out, assembles the layers into one buffer (each object is written once, into its final
  place) and, with every layer, checks the replica digest and yields the container.

Authorization (`kvsp_authorizer`, `kvsp_token_rule`): FETCH and SUBSCRIBE only for identities that may
read the namespace's scope (the policy's ``read`` list), or whose token names the scope or a prefix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from kvsp.client.ranking import full_range
from kvsp.client.verify import ReplicaDigestMismatchError, VerifiedBlock
from kvsp.container import (
    FIXED_HEADER_LENGTH,
    TABLE_ENTRY_LENGTH,
    Container,
    ContainerHeader,
    Geometry,
    LayerDigestMismatchError,
    LayerRange,
    LayerView,
)
from kvsp.errors import ContainerError, ValidationError
from kvsp.identifiers import TrackNamespace
from kvsp.records import ReplicaRecord
from kvsp.registry import Codec, codec_name
from moqt.auth import TokenClaims
from moqt.kinds import PublishDoneStatus
from moqt.tracks import Action, Authorizer, MoqtObject, TokenRule, TrackPublisher, TrackWriter
from moqt.wire import Bytes, KeyValuePair, Location, Namespace

K_LENGTH_EXTENSION: Final = 0x4B56
BLOCK_GROUP: Final = 0
_EMPTY: Final = np.empty(0, dtype=np.uint8)
REPR_DIGEST_NONE: Final = b""
"""`VerifiedBlock.repr_digest` of a block received over MOQT: there is no representation digest
(objects are verified one by one against the layer digests instead)."""


# -- names -------------------------------------------------------------------------------------------
def block_namespace(compat_id: bytes, scope_id: bytes, holder_id: str, block_key: bytes) -> Namespace:
    """The five Track Namespace fields of a block (D3); ``holder_id`` is the producer's role_id."""
    return TrackNamespace(compat_id, scope_id, holder_id, block_key).fields()


def track_name(codec: int) -> bytes:
    """The Track Name: ``raw``, or ``codec-XXXX`` (lowercase hex) for a codec without a name."""
    return codec_name(codec).encode("ascii")


def parse_namespace(namespace: Namespace) -> TrackNamespace | None:
    """The KVSP fields of a namespace, or None when it is not a KVSP block namespace."""
    try:
        return TrackNamespace.from_fields(namespace)
    except ValidationError:
        return None


def layer_window(layers: LayerRange) -> tuple[Location, Location]:
    """The FETCH range of layers ``a..b``: ``(0, a)`` to ``(0, b + 1)`` ("End Location plus 1")."""
    return Location(BLOCK_GROUP, layers.first), Location(BLOCK_GROUP, layers.last + 1)


def layer_range_of(start: Location, stop: Location, last_layer: int) -> LayerRange | None:
    """The layers of a block that a FETCH of ``[start, stop)`` covers (None: none)."""
    if start.group > BLOCK_GROUP or stop <= Location(BLOCK_GROUP, 0):
        return None
    first = start.object if start.group == BLOCK_GROUP else 0
    last = last_layer if stop.group > BLOCK_GROUP else min(last_layer, stop.object - 1)
    return LayerRange(first, last) if first <= last else None


# -- objects -----------------------------------------------------------------------------------------
def layer_object(layer: int, payload: Bytes, k_length: int, codec: int) -> MoqtObject:
    """The object of one layer (a view of ``payload``; K length as an extension unless raw)."""
    view = payload if isinstance(payload, memoryview) else memoryview(payload)
    extensions = () if codec == Codec.RAW else (KeyValuePair(K_LENGTH_EXTENSION, k_length),)
    return MoqtObject(BLOCK_GROUP, layer, view, extensions)


def k_length_of(obj: MoqtObject, codec: int) -> int:
    """The K section length of a layer object: half of a raw payload, else extension 0x4B56."""
    size = obj.payload.nbytes
    if codec == Codec.RAW:
        if size % 2:
            raise ContainerError(f"layer {obj.object_id}: a raw payload of {size} octets cannot split into K and V")
        return size // 2
    value = obj.extension(K_LENGTH_EXTENSION)
    if not isinstance(value, int) or value > size:
        raise ContainerError(f"layer {obj.object_id}: no valid K length extension (0x{K_LENGTH_EXTENSION:x})")
    return value


def tokens_from_geometry(k_length: int, geometry: Geometry) -> int:
    """Token count of a raw K section of ``k_length`` octets."""
    per_token = geometry.section_length(1)
    if k_length % per_token:
        raise ContainerError(f"a raw K section of {k_length} octets is not a whole number of tokens")
    return k_length // per_token


# -- receiving a block ---------------------------------------------------------------------------------
@dataclass(slots=True, eq=False)
class LayerCheck:
    """The layers of one block arriving as objects, checked one by one before use (sans-I/O).

    Objects must be layers ``layers.first`` .. ``layers.last`` of group 0 in ascending order; each
    must split into K and V (`k_length_of`), match the geometry (raw) and hash to its layer digest.
    ``layer_digests`` is indexed by absolute layer; empty means nothing to check against yet (a live
    block before its record exists): the digests are still computed, for the record made later.
    """

    codec: int
    layers: LayerRange
    layer_digests: tuple[bytes, ...] = ()
    token_count: int | None = None
    geometry: Geometry | None = None
    digests: list[bytes] = field(default_factory=list, init=False)
    lengths: list[tuple[int, int]] = field(default_factory=list, init=False)

    @property
    def expected(self) -> int | None:
        """The layer (object ID) expected next; None when all have arrived."""
        following = self.layers.first + len(self.digests)
        return following if following <= self.layers.last else None

    def check(self, obj: MoqtObject) -> LayerView:
        """The object's layer view, once it passed every check; raises ContainerError/DigestMismatchError."""
        if obj.group != BLOCK_GROUP or obj.object_id != self.expected:
            raise ContainerError(f"object {obj.group}/{obj.object_id} where layer {self.expected} was expected")
        k_length = k_length_of(obj, self.codec)
        token_count = self._check_size(obj.object_id, k_length, obj.payload.nbytes)
        view = LayerView(obj.object_id, obj.payload, k_length)
        actual = view.digest()
        if self.layer_digests:
            want = self.layer_digests[view.layer] if view.layer < len(self.layer_digests) else None
            if want != actual:
                raise LayerDigestMismatchError(view.layer, want, actual)
        # Only a layer that passed every check changes the state: a refused one leaves the next try as it was.
        self.token_count = token_count
        self.digests.append(actual)
        self.lengths.append((k_length, obj.payload.nbytes - k_length))
        return view

    def _check_size(self, layer: int, k_length: int, size: int) -> int | None:
        """The token count after this layer (a raw block's first layer gives it when it was unknown)."""
        if self.codec != Codec.RAW or self.geometry is None:
            return self.token_count
        token_count = self.token_count
        if token_count is None:
            token_count = tokens_from_geometry(k_length, self.geometry)
        want = 2 * self.geometry.section_length(token_count)
        if size != want:
            raise ContainerError(f"layer {layer}: {size} octets, the geometry says {want}")
        return token_count

    def replica_digest(self) -> bytes:
        """SHA-256 of the layer digests received, in order (section 4.3)."""
        return hashlib.sha256(b"".join(self.digests)).digest()


@dataclass(slots=True, eq=False)
class BlockAssembly:
    """A stored block fetched over MOQT: `LayerCheck` plus one buffer that every layer is written into
    once, in its final place, so that the finished block is a `Container` of views (sans-I/O).

    ``allocate`` is the subscriber's allocator (``moqt.api.Allocator``): the next layer's slot, or None
    for an object that is not the next layer. `finish` checks completeness and the replica digest.
    """

    check: LayerCheck
    capacity: int
    replica_digest: bytes | None = None
    all_layers: LayerRange | None = None
    _buffer: npt.NDArray[np.uint8] = field(init=False, repr=False)
    _view: memoryview = field(init=False, repr=False)
    _cursor: int = field(default=0, init=False)  # end of the layers accepted
    _allocated: int = field(default=0, init=False)  # end of the slots handed out (objects may arrive ahead)
    _next_slot: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.check.token_count is None and (self.check.codec != Codec.RAW or self.check.geometry is None):
            raise ValueError("a token count is needed (or the geometry, for raw blocks)")
        self._buffer = _EMPTY
        self._view = _EMPTY.data
        self._next_slot = self.check.layers.first

    def reserve(self) -> None:
        """Allocate the block buffer, not zeroed: every octet of it that a `Container` exposes was written
        by a layer that passed its digest check (zeroing 2 MiB cost ~75 us a fetch, 16 MiB ~1 ms, and
        with 8 fetches at once delayed every first layer)."""
        if self._buffer.nbytes != self.capacity:
            self._buffer = np.empty(self.capacity, dtype=np.uint8)
            self._view = self._buffer.data

    @classmethod
    def for_replica(cls, record: ReplicaRecord, layers: LayerRange, *, token_count: int | None = None,
                    geometry: Geometry | None = None, max_size: int | None = None) -> BlockAssembly:
        """The checks of section 6.7 for ``layers`` of ``record`` (its digests; its size bounds the buffer)."""
        full = full_range(record)
        held = full.count if full is not None else record.layer_count()
        capacity = record.size - FIXED_HEADER_LENGTH - TABLE_ENTRY_LENGTH * held
        if token_count is not None and geometry is not None and record.codec == Codec.RAW:
            capacity = min(capacity, 2 * geometry.section_length(token_count) * layers.count)
        if capacity < 0 or (max_size is not None and capacity > max_size):
            raise ContainerError(f"a replica of {record.size} octets is outside the limits")
        check = LayerCheck(record.codec, layers, record.layer_digests, token_count, geometry)
        return cls(check, capacity, record.digest, full)

    def allocate(self, group: int, object_id: int, length: int) -> memoryview | None:
        """The slot of the next layer to arrive (arrival runs ahead of `accept`), or None to refuse."""
        self.reserve()
        start = self._allocated
        if group != BLOCK_GROUP or object_id != self._next_slot or object_id > self.check.layers.last \
                or start + length > self.capacity:
            return None
        self._allocated += length
        self._next_slot += 1
        return self._view[start : start + length]

    def accept(self, obj: MoqtObject) -> LayerView:
        """Check the object of the next layer; its view (in the block buffer), verified."""
        size = obj.payload.nbytes
        if self._cursor + size > self.capacity:
            raise ContainerError(f"the layers exceed the replica's {self.capacity} octets")
        self.reserve()
        slot = self._view[self._cursor : self._cursor + size]
        copied = obj.payload.obj is not self._view.obj
        if copied:  # not assembled in place (a caller's own object): copy it
            slot[:] = obj.payload
        view = self.check.check(MoqtObject(obj.group, obj.object_id, slot, obj.extensions, obj.subgroup, obj.status))
        if copied:  # only once it passed: a refused object must not move the allocator past its slot
            self._allocated = max(self._allocated, self._cursor + size)
            self._next_slot = max(self._next_slot, obj.object_id + 1)
        self._cursor += size
        return view

    def finish(self) -> VerifiedBlock:
        """Every layer arrived: the container (views of the one buffer), the replica digest checked."""
        check = self.check
        if check.expected is not None:
            raise ContainerError(f"the block ended before layer {check.expected} (layers {check.layers} asked for)")
        assert check.token_count is not None  # given, or set from the geometry by the first raw layer
        self.reserve()  # a block of zero layers octets never allocated
        header = ContainerHeader(check.codec, check.layers.first, check.token_count, tuple(check.lengths))
        container = Container(header, self._view[: self._cursor])
        verified = self.all_layers is not None and check.layers == self.all_layers and bool(check.layer_digests)
        if verified and self.replica_digest is not None:
            actual = check.replica_digest()
            if actual != self.replica_digest:
                raise ReplicaDigestMismatchError(self.replica_digest, actual)
        return VerifiedBlock(container, REPR_DIGEST_NONE, tuple(check.digests), verified)


# -- authorization -----------------------------------------------------------------------------------
def kvsp_authorizer(may_read: Callable[[str, bytes], bool]) -> Authorizer:
    """FETCH, SUBSCRIBE (and learning of a namespace) only for readers of its scope (D2, D3)."""

    def authorize(identity: str, namespace: Namespace, action: Action) -> bool:
        fields = parse_namespace(namespace)
        return fields is not None and may_read(identity, fields.scope_id)

    return authorize


def kvsp_token_rule(claims: TokenClaims, namespace: Namespace) -> bool:
    """A token covers a block namespace when it names its scope ID or a prefix of the namespace."""
    if claims.allows_namespace(namespace):
        return True
    fields = parse_namespace(namespace)
    return fields is not None and claims.allows_scope(fields.scope_id)


KVSP_TOKEN_RULE: Final[TokenRule] = kvsp_token_rule


# -- producing a block --------------------------------------------------------------------------------
class LiveBlockPublisher:
    """Publish a block layer by layer while it is computed (layer-wise prefill, disaggregated P/D).

    Subscribers receive layer ``l`` as soon as `publish_layer` returns -- before layer ``l + 1``
    exists. The layer digests are computed as layers are published, for the record made at the end.
    """

    def __init__(self, publisher: TrackPublisher, namespace: TrackNamespace, codec: int = Codec.RAW) -> None:
        self.namespace = namespace
        self.codec = codec
        self.track: TrackWriter = publisher.track(namespace.fields(), track_name(codec),
                                                  extensions_present=codec != Codec.RAW)
        self._digests: list[bytes] = []

    @property
    def layer_digests(self) -> tuple[bytes, ...]:
        return tuple(self._digests)

    @property
    def replica_digest(self) -> bytes:
        return hashlib.sha256(b"".join(self._digests)).digest()

    def publish_layer(self, layer: int, payload: Bytes, k_length: int | None = None) -> None:
        """Layer ``layer`` (the next one) as K followed by V in one buffer (a view is kept, not a copy)."""
        if layer != len(self._digests):
            raise ValueError(f"layer {layer} published where layer {len(self._digests)} is next")
        view = payload if isinstance(payload, memoryview) else memoryview(payload)
        if k_length is None:
            if self.codec != Codec.RAW:
                raise ValueError("codecs other than raw need the K section length")
            k_length = view.nbytes // 2
        obj = layer_object(layer, view, k_length, self.codec)
        self.track.publish(BLOCK_GROUP, layer, obj.payload, obj.extensions)
        self._digests.append(hashlib.sha256(obj.payload).digest())

    def publish_view(self, view: LayerView) -> None:
        self.publish_layer(view.layer, view.payload, view.k_length)

    def finish(self) -> None:
        """All layers are out: group 0 ends, subscribers get PUBLISH_DONE after the last layer."""
        self.track.end_group()
        self.track.close()

    def abort(self, status: PublishDoneStatus | int = PublishDoneStatus.INTERNAL_ERROR) -> None:
        """Production failed: streams are reset and subscribers get PUBLISH_DONE with ``status``."""
        self.track.close(status)
