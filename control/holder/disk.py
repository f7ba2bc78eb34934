"""The holder's encrypted ``local-storage`` tier (decision D5).

`DiskTier` keeps one file per block, laid out so that a layer range is one
offset read, and encrypted at rest (spec section 10: holders SHOULD encrypt stored blocks):

    offset 0   the container header of the whole block (section 4.3), in plaintext:
               magic, version, flags, codec, first layer 0, layer count, token count, lengths table
    then       for each layer l in ascending order:
                   nonce (12 octets) || AES-256-GCM ciphertext of K||V (k_l + v_l octets) || tag (16)

Segment l starts at ``header_length + sum(k_i + v_i for i < l) + 28 * l``, so reading layers a..b is
one ``pread`` of a contiguous region, and only those layers are decrypted.  The associated data of
layer l binds it to its place: ``"KVSP-DISK-1" 0x00 || compat_id || scope_id || block_key ||
uint32(l) || SHA-256(header)``, so a segment moved to another layer, block or scope, or a header
changed on disk (codec, token count, lengths), fails authentication.  Nonces are random per segment
write; with at most a few writes per block per key that stays far inside GCM's 2^32 random-nonce
bound.  A failed tag or a short read raises `StorageCorruptError`: the holder then treats the
replica as lost and withdraws it.  Layers not on disk (not yet demoted, or promoted away) are holes.

Beside each file, ``<name>.kvsm`` is its commit record, sealed with the same key: stored-at time (wall
clock), the layers the file holds, the header digest, the Repr-Digest and the layer digests.  Files and
records are made under temporary names, fsynced and renamed; the record is replaced after the data is
on disk, so it never names layers that are not.  At startup `DiskTier.adopt` takes over complete,
intact files (a restart keeps the cache) and removes everything else named like ours; the holder
adopts the metadata only and checks the contents with `DiskTier.verify` in the background.

The key is 32 octets in ``encryption_key_file`` (raw, or 64 hex digits); it is generated with mode
0600 when absent.  ``read_mbit_per_s`` is measured, never configured: a calibration block is written,
dropped from the page cache and read back through the same path at startup, then every real read
updates an exponentially weighted average.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from control.holder.store import BlockId, BlockMeta
from kvsp.container import (
    DEFAULT_MAX_LAYERS,
    FIXED_HEADER_LENGTH,
    TABLE_ENTRY_LENGTH,
    ContainerHeader,
    LayerRange,
    parse_header,
    replica_digest,
)
from kvsp.errors import KvspError
from kvsp.registry import Codec, Tier

if TYPE_CHECKING:
    from typing_extensions import Buffer

from control.holder.files import KEY_OCTETS, fsync_dir, punch_holes, pwrite_all, write_new
from control.holder.tiers import RateMeter, StorageCorruptError, StorageMissingError, TierError

log = logging.getLogger("kvsp.holder.disk")


NONCE_OCTETS: Final = 12
TAG_OCTETS: Final = 16
SEGMENT_OVERHEAD: Final = NONCE_OCTETS + TAG_OCTETS
AD_LABEL: Final = b"KVSP-DISK-1\x00"
SUFFIX: Final = ".kvsb"
CALIBRATION_OCTETS: Final = 8 << 20
RECORD_SUFFIX: Final = ".kvsm"
RECORD_MAGIC: Final = b"KVSM\x01"
RECORD_AD_LABEL: Final = b"KVSP-RECORD-1\x00"
_RECORD: Final = struct.Struct(">dIII")  # stored_at (wall-clock s), first and last layer held, layer count
MAX_RECORD_OCTETS: Final = len(RECORD_MAGIC) + SEGMENT_OVERHEAD + _RECORD.size + 64 + 32 * DEFAULT_MAX_LAYERS
_STEM: Final = r"[0-9a-f]{64}\.[0-9a-f]{32}\.[0-9a-f]{64}"
_OWN_NAME: Final = re.compile(_STEM + r"\.kvs[bm](\.tmp[0-9a-f]{16})?")
_TEMP_NAME: Final = re.compile(_STEM + r"\.kvs[bm]\.tmp[0-9a-f]{16}")
_LAYER: Final = struct.Struct(">I")

# Why a block's files were removed at startup instead of adopted (kvsp_holder_adoption_drops_total).
DROP_PARTIAL: Final = "partial-write"  # a temporary file of a write a crash interrupted
DROP_ORPHAN: Final = "orphan"  # a block file without its commit record, or the reverse
DROP_TAMPERED: Final = "tampered"  # fails authentication or its digests
DROP_TRUNCATED: Final = "truncated"
DROP_INCOMPLETE: Final = "incomplete"  # some layers were in memory tiers, lost with the process
DROP_INCOMPATIBLE: Final = "incompatible"  # a compat (or geometry) this holder no longer stores
DROP_EXPIRED: Final = "expired"
DROP_UNREADABLE: Final = "unreadable"  # an I/O error


# -- rate measurement ------------------------------------------------------------------------------


# -- local storage ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where the segments of one block lie in its file."""

    header: bytes
    header_digest: bytes
    starts: tuple[int, ...]  # file offset of each segment, then the end

    @classmethod
    def of(cls, meta: BlockMeta) -> _Layout:
        header = meta.header.encode()
        starts = [len(header)]
        for k, v in meta.header.lengths:
            starts.append(starts[-1] + SEGMENT_OVERHEAD + k + v)
        return cls(header, hashlib.sha256(header).digest(), tuple(starts))


@dataclass(frozen=True, slots=True)
class _Record:
    """The commit record of a block file (the ``.kvsm`` beside it), sealed with the storage key.

    It holds what the file's plaintext header does not: when the block was stored (wall clock, for
    retention across restarts), which layers the file holds, and the digests the replica record needs.
    """

    stored_at: float
    held: LayerRange
    header_digest: bytes
    repr_digest: bytes
    layer_digests: tuple[bytes, ...]

    def encode(self) -> bytes:
        return b"".join((_RECORD.pack(self.stored_at, self.held.first, self.held.last, len(self.layer_digests)),
                         self.header_digest, self.repr_digest, *self.layer_digests))

    @classmethod
    def decode(cls, data: bytes) -> _Record:
        stored_at, first, last, count = _RECORD.unpack_from(data)
        body = data[_RECORD.size :]
        if len(body) != 64 + 32 * count or not 0 <= first <= last < count or not math.isfinite(stored_at):
            raise ValueError("malformed commit record")
        digests = tuple(body[64 + 32 * i : 96 + 32 * i] for i in range(count))
        return cls(stored_at, LayerRange(first, last), body[:32], body[32:64], digests)


@dataclass(frozen=True, slots=True)
class Adopted:
    """A block found complete and intact in local storage at startup."""

    meta: BlockMeta
    stored_at: float  # wall-clock seconds (``time.time``) when it was first stored


@dataclass(frozen=True, slots=True)
class Adoption:
    """What `DiskTier.adopt` kept, and how many blocks' files it removed, by reason."""

    adopted: tuple[Adopted, ...]
    dropped: Mapping[str, int]
    removed: tuple[BlockId, ...] = ()  # blocks whose files were removed (an earlier run may have published them)


Accepts = Callable[[BlockId, ContainerHeader], bool]


class _Rejected(TierError):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class VerifyError(StorageCorruptError):
    """A stored block failed `DiskTier.verify`; ``reason`` is one of the DROP_* values."""

    def __init__(self, block: BlockId, reason: str, detail: str) -> None:
        super().__init__(block, detail)
        self.reason = reason


class DiskTier:
    """One encrypted file per block under ``directory`` (see the module docstring for the format).

    Methods do blocking file I/O; the holder calls them from worker threads.  Each call opens the
    file itself, so concurrent reads need no lock, and a file unlinked during a read stays readable.
    Writes, `retain` and `delete` come one at a time (the holder's store lock).
    """

    tier: Final = Tier.LOCAL_STORAGE

    def __init__(self, directory: Path, key: bytes) -> None:
        if len(key) != KEY_OCTETS:
            raise TierError(f"the storage key must be {KEY_OCTETS} octets")
        self.directory = directory
        self._aead = AESGCM(key)
        self.rate = RateMeter()
        self._held: dict[BlockId, tuple[LayerRange, float]] = {}  # committed layers, first stored (wall s)

    # -- housekeeping ----------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create the directory (0700)."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    def path(self, block: BlockId) -> Path:
        key = block.block_key.hex()
        return self.directory / key[:2] / f"{block.compat_id.hex()}.{block.scope_id.hex()}.{key}{SUFFIX}"

    def _record_path(self, block: BlockId) -> Path:
        return self.path(block).with_suffix(RECORD_SUFFIX)

    def held(self, block: BlockId) -> LayerRange | None:
        """The layers committed to the block's file, None when it has none."""
        held = self._held.get(block)
        return None if held is None else held[0]

    def delete(self, block: BlockId) -> None:
        self._held.pop(block, None)
        self._record_path(block).unlink(missing_ok=True)  # the commit record first: a crash leaves an orphan
        self.path(block).unlink(missing_ok=True)

    def exists(self, block: BlockId) -> bool:
        return self.path(block).is_file()

    # -- data ------------------------------------------------------------------------------------
    def _ad(self, meta: BlockMeta, layout: _Layout, layer: int) -> bytes:
        b = meta.block
        return AD_LABEL + b.compat_id + b.scope_id + b.block_key + _LAYER.pack(layer) + layout.header_digest

    def write(self, meta: BlockMeta, layers: LayerRange, data: Buffer, stored_at: float | None = None) -> None:
        """Encrypt and write ``layers`` whose plaintext (K||V of each, in order) is ``data``, then commit.

        A block's first write makes its file under a temporary name (fsync, rename); later writes add
        layers in place (fsync).  Either way the commit record is replaced last, atomically, so a crash
        leaves a file whose record does not name the new layers, never a record naming missing ones.
        ``stored_at`` (wall-clock seconds) is kept from the first write; default now.
        """
        plain = memoryview(data).cast("B")
        if plain.nbytes != meta.octets(layers):
            raise TierError(f"layers {layers}: {plain.nbytes} octets given, {meta.octets(layers)} expected")
        layout = _Layout.of(meta)
        sealed = self._seal(meta, layout, layers, plain)
        base = layout.starts[layers.first]
        path = self.path(meta.block)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        held = self._held.get(meta.block)
        if held is None:
            self._record_path(meta.block).unlink(missing_ok=True)
            write_new(path, ((layout.header, 0), (sealed, base)))
            self._commit(meta, layout, layers, time.time() if stored_at is None else stored_at)
            return
        fd = os.open(path, os.O_RDWR)
        try:
            pwrite_all(fd, sealed, base)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._commit(meta, layout, _union(held[0], layers), held[1])

    def _seal(self, meta: BlockMeta, layout: _Layout, layers: LayerRange, plain: memoryview) -> bytearray:
        base = layout.starts[layers.first]
        out = bytearray(layout.starts[layers.last + 1] - base)
        view = memoryview(out)
        for layer in layers:
            at = layout.starts[layer] - base
            src = meta.offset(layer) - meta.offset(layers.first)
            length = meta.offset(layer + 1) - meta.offset(layer)
            nonce = os.urandom(NONCE_OCTETS)
            view[at : at + NONCE_OCTETS] = nonce
            self._aead.encrypt_into(nonce, plain[src : src + length], self._ad(meta, layout, layer),
                                    view[at + NONCE_OCTETS : at + SEGMENT_OVERHEAD + length])
        return out

    def _commit(self, meta: BlockMeta, layout: _Layout, held: LayerRange, stored_at: float) -> None:
        """Replace the block's commit record (temporary name, fsync, rename, fsync of the folder)."""
        record = _Record(stored_at, held, layout.header_digest, meta.repr_digest, meta.layer_digests)
        nonce = os.urandom(NONCE_OCTETS)
        sealed = self._aead.encrypt(nonce, record.encode(), self._record_ad(meta.block))
        path = self._record_path(meta.block)
        write_new(path, ((RECORD_MAGIC + nonce + sealed, 0),))
        fsync_dir(path.parent)
        self._held[meta.block] = (held, stored_at)

    def _record_ad(self, block: BlockId) -> bytes:
        return RECORD_AD_LABEL + block.compat_id + block.scope_id + block.block_key + RECORD_MAGIC

    def retain(self, meta: BlockMeta, layers: LayerRange | None) -> None:
        """Keep only ``layers`` (the rest moved to a faster tier), or nothing, and free the rest.

        The record shrinks first, so a crash leaves unreferenced octets, never a record naming freed
        layers.  The freed segments become holes (``fallocate`` punching, in place, nothing copied);
        where the file system cannot punch, the file is rewritten with only the kept segments.
        """
        held = self._held.get(meta.block)
        if held is None:
            return
        if layers is None:
            self.delete(meta.block)
            return
        if layers == held[0]:
            return
        layout = _Layout.of(meta)
        self._commit(meta, layout, layers, held[1])
        freed = [(layout.starts[r.first], layout.starts[r.last + 1]) for r in _outside(held[0], layers)]
        path = self.path(meta.block)
        if punch_holes(path, freed):
            return
        start, end = layout.starts[layers.first], layout.starts[layers.last + 1]
        fd = os.open(path, os.O_RDONLY)
        try:
            kept = os.pread(fd, end - start, start)
        finally:
            os.close(fd)
        write_new(path, ((layout.header, 0), (kept, start)))

    def read(self, meta: BlockMeta, layers: LayerRange) -> memoryview:
        """Read and decrypt only ``layers``: their plaintext K||V sections, contiguous."""
        layout = _Layout.of(meta)
        start, end = layout.starts[layers.first], layout.starts[layers.last + 1]
        began = time.perf_counter()
        try:
            fd = os.open(self.path(meta.block), os.O_RDONLY)
        except FileNotFoundError as exc:
            raise StorageMissingError(f"stored block {meta.block} is gone") from exc
        try:
            header = os.pread(fd, len(layout.header), 0)
            sealed = bytearray(end - start)
            got = os.preadv(fd, [sealed], start)
        finally:
            os.close(fd)
        try:
            if header != layout.header:
                raise StorageCorruptError(meta.block, "the file header differs from the stored block's")
            if got != len(sealed):
                raise StorageCorruptError(meta.block, f"file truncated: {got} of {len(sealed)} octets read")
            plain = self._open(meta, layout, layers, memoryview(sealed))
        except StorageCorruptError:
            held = self.held(meta.block)
            if held is not None and (layers.first < held.first or layers.last > held.last):
                # moved to a faster tier (and freed here) while this read ran: a miss, not a fault
                raise StorageMissingError(f"layers {layers} of {meta.block} left local storage") from None
            raise
        self.rate.record(len(sealed), time.perf_counter() - began)
        return plain

    def _open(self, meta: BlockMeta, layout: _Layout, layers: LayerRange, sealed: memoryview) -> memoryview:
        plain = memoryview(bytearray(meta.octets(layers)))
        base, origin = layout.starts[layers.first], meta.offset(layers.first)
        for layer in layers:
            at = layout.starts[layer] - base
            dst = meta.offset(layer) - origin
            length = meta.offset(layer + 1) - meta.offset(layer)
            try:
                self._aead.decrypt_into(sealed[at : at + NONCE_OCTETS],
                                        sealed[at + NONCE_OCTETS : at + SEGMENT_OVERHEAD + length],
                                        self._ad(meta, layout, layer), plain[dst : dst + length])
            except InvalidTag:
                raise StorageCorruptError(meta.block, f"layer {layer} fails authentication") from None
        return plain

    # -- adoption --------------------------------------------------------------------------------
    def adopt(self, accepts: Accepts, retention_s: float, now: float, *, verify: bool = True) -> Adoption:
        """Take over the blocks an earlier process left (restart, upgrade, crash); remove the rest.

        A block is adopted when its commit record authenticates, the file's header matches it,
        ``accepts`` takes its compat and geometry, every layer is in the file, its retention (from
        ``stored_at``, wall clock ``now``) has not run out, the file is long enough, and (``verify``)
        every segment authenticates and hashes to its layer digest.  Anything else named like ours
        (temporary files of interrupted writes, files without their record, records without their
        file) is removed and counted by reason.  With ``verify`` every adopted file is read once (the
        cost of a large cache's restart); without, a damaged segment is found by the read that meets
        it (every read authenticates) and the block is then lost.  Blocking: run it in a worker thread.
        """
        self.prepare()
        dropped: Counter[str] = Counter()
        stems: dict[Path, set[str]] = {}
        for path in self._own_files():
            if _TEMP_NAME.fullmatch(path.name):
                path.unlink(missing_ok=True)
                dropped[DROP_PARTIAL] += 1
            else:
                stems.setdefault(path.with_suffix(""), set()).add(path.suffix)
        adopted: list[Adopted] = []
        removed: list[BlockId] = []
        for stem, suffixes in sorted(stems.items()):
            try:
                if suffixes != {SUFFIX, RECORD_SUFFIX}:
                    raise _Rejected(DROP_ORPHAN, "a block file without its commit record, or the reverse")
                adopted.append(self._adopt_one(stem, accepts, retention_s, now, verify))
            except (_Rejected, OSError) as exc:
                reason = exc.reason if isinstance(exc, _Rejected) else DROP_UNREADABLE
                log.warning("local storage: removing %s (%s): %s", stem.name, reason, exc)
                for suffix in (RECORD_SUFFIX, SUFFIX):
                    stem.with_name(stem.name + suffix).unlink(missing_ok=True)
                dropped[reason] += 1
                removed.append(BlockId(*(bytes.fromhex(part) for part in stem.name.split("."))))
        return Adoption(tuple(adopted), dict(dropped), tuple(removed))

    def _own_files(self) -> Iterator[Path]:
        for sub in self.directory.iterdir():
            if sub.is_dir() and re.fullmatch(r"[0-9a-f]{2}", sub.name):
                yield from (p for p in sub.iterdir() if _OWN_NAME.fullmatch(p.name) and p.is_file())

    def _adopt_one(self, stem: Path, accepts: Accepts, retention_s: float, now: float, verify: bool) -> Adopted:
        block = BlockId(*(bytes.fromhex(part) for part in stem.name.split(".")))
        if self.path(block) != stem.with_name(stem.name + SUFFIX):
            raise _Rejected(DROP_TAMPERED, "in the folder of another key")
        record = self._load_record(block)
        fd = os.open(self.path(block), os.O_RDONLY)
        try:
            raw = os.pread(fd, FIXED_HEADER_LENGTH + TABLE_ENTRY_LENGTH * len(record.layer_digests), 0)
            if hashlib.sha256(raw).digest() != record.header_digest:
                raise _Rejected(DROP_TAMPERED, "the file header does not match its commit record")
            try:
                header = parse_header(raw)
                meta = BlockMeta(block, header, record.layer_digests, replica_digest(record.layer_digests),
                                 record.repr_digest)
            except (KvspError, ValueError) as exc:
                raise _Rejected(DROP_TAMPERED, f"unusable header: {exc}") from exc
            if not accepts(block, header):
                raise _Rejected(DROP_INCOMPATIBLE, "compat or geometry not configured")
            if record.held != meta.layers:
                raise _Rejected(DROP_INCOMPLETE, f"only layers {record.held} were on disk")
            if now - record.stored_at >= retention_s:
                raise _Rejected(DROP_EXPIRED, "retention ran out")
            layout = _Layout.of(meta)
            if os.fstat(fd).st_size < layout.starts[-1]:
                raise _Rejected(DROP_TRUNCATED, f"{os.fstat(fd).st_size} of {layout.starts[-1]} octets")
            if verify:
                self._verify(fd, meta, layout)
        finally:
            os.close(fd)
        self._held[block] = (meta.layers, record.stored_at)
        return Adopted(meta, record.stored_at)

    def verify(self, meta: BlockMeta) -> None:
        """Check an adopted block's file in full, as ``adopt(verify=True)`` does (the holder's background
        verification after a restart).  Raises `VerifyError` (a `StorageCorruptError` with the drop
        reason) when a segment fails authentication or its digest, `StorageMissingError` when the
        file is gone.  Blocking: run it in a worker thread."""
        try:
            fd = os.open(self.path(meta.block), os.O_RDONLY)
        except FileNotFoundError as exc:
            raise StorageMissingError(f"stored block {meta.block} is gone") from exc
        try:
            layout = _Layout.of(meta)
            if os.pread(fd, len(layout.header), 0) != layout.header:
                raise VerifyError(meta.block, DROP_TAMPERED, "the file header differs from its record")
            self._verify(fd, meta, layout)
        except _Rejected as exc:
            raise VerifyError(meta.block, exc.reason, str(exc).removeprefix(f"stored block {meta.block}: ")) from exc
        finally:
            os.close(fd)

    def _load_record(self, block: BlockId) -> _Record:
        with self._record_path(block).open("rb") as f:
            blob = f.read(MAX_RECORD_OCTETS + 1)
        start = len(RECORD_MAGIC) + NONCE_OCTETS
        if len(blob) > MAX_RECORD_OCTETS or len(blob) < start + TAG_OCTETS or not blob.startswith(RECORD_MAGIC):
            raise _Rejected(DROP_TAMPERED, "malformed commit record")
        try:
            return _Record.decode(self._aead.decrypt(blob[len(RECORD_MAGIC) : start], blob[start:],
                                                     self._record_ad(block)))
        except InvalidTag:
            raise _Rejected(DROP_TAMPERED, "the commit record fails authentication") from None
        except (ValueError, struct.error) as exc:
            raise _Rejected(DROP_TAMPERED, str(exc)) from exc

    def _verify(self, fd: int, meta: BlockMeta, layout: _Layout) -> None:
        """Every segment authenticates and hashes to its layer digest; the whole to the Repr-Digest."""
        whole = hashlib.sha256(layout.header)
        for layer in meta.layers:
            sealed = bytearray(layout.starts[layer + 1] - layout.starts[layer])
            if os.preadv(fd, [sealed], layout.starts[layer]) != len(sealed):
                raise _Rejected(DROP_TRUNCATED, f"layer {layer} is cut short")
            try:
                plain = self._open(meta, layout, LayerRange(layer, layer), memoryview(sealed))
            except StorageCorruptError as exc:
                raise _Rejected(DROP_TAMPERED, str(exc)) from exc
            if hashlib.sha256(plain).digest() != meta.layer_digests[layer]:
                raise _Rejected(DROP_TAMPERED, f"layer {layer} does not match its digest")
            whole.update(plain)
        if whole.digest() != meta.repr_digest:
            raise _Rejected(DROP_TAMPERED, "the container does not match its digest")

    # -- calibration -----------------------------------------------------------------------------
    def calibrate(self, octets: int = CALIBRATION_OCTETS) -> float:
        """Measure the cold read rate: write a block, drop it from the page cache, read it back."""
        layers = 16
        section = max(1, octets // (2 * layers))
        header = ContainerHeader(Codec.RAW, 0, 1, ((section, section),) * layers)
        block = BlockId(b"\xff" * 32, b"\xff" * 16, b"\xff" * 32)  # never a real key: no real file clashes
        meta = BlockMeta(block, header, (bytes(32),) * layers, bytes(32), bytes(32))
        self.write(meta, meta.layers, os.urandom(meta.data_octets))
        path = self.path(block)
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            began = time.perf_counter()
            self.read(meta, meta.layers)
            elapsed = time.perf_counter() - began
        finally:
            self.delete(block)
        rate = meta.data_octets * 8 / 1e6 / max(elapsed, 1e-9)
        log.info("local-storage read rate %.0f Mbit/s (calibration of %d octets)", rate, meta.data_octets)
        return rate


def _union(held: LayerRange, layers: LayerRange) -> LayerRange:
    """The committed range after writing ``layers``; a gap would leave ``held`` unreachable, so it is
    forgotten (the store keeps one contiguous range per tier: this does not happen)."""
    if layers.first > held.last + 1 or layers.last + 1 < held.first:
        return layers
    return LayerRange(min(held.first, layers.first), max(held.last, layers.last))


def _outside(held: LayerRange, keep: LayerRange) -> list[LayerRange]:
    out = []
    if keep.first > held.first:
        out.append(LayerRange(held.first, keep.first - 1))
    if keep.last < held.last:
        out.append(LayerRange(keep.last + 1, held.last))
    return out
