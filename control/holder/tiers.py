"""The holder's storage tiers (decision D5): ``host`` memory and encrypted ``local-storage`` files.

`HostTier` keeps each block as the octets that arrived and hands out views of them: serving from
memory copies nothing.  `DiskTier` keeps one file per block, laid out so that a layer range is one
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
replica as lost and withdraws it.  Files whose layers have not yet been demoted are sparse there.

The key is 32 octets in ``encryption_key_file`` (raw, or 64 hex digits); it is generated with mode
0600 when absent.  ``read_mbit_per_s`` is measured, never configured: a calibration block is written,
dropped from the page cache and read back through the same path at startup, then every real read
updates an exponentially weighted average.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from control.holder.store import BlockId, BlockMeta
from kvsp.container import ContainerHeader, LayerRange
from kvsp.errors import KvspError
from kvsp.registry import Codec, Tier

if TYPE_CHECKING:
    from typing_extensions import Buffer

log = logging.getLogger("kvsp.holder.tiers")

KEY_OCTETS: Final = 32
NONCE_OCTETS: Final = 12
TAG_OCTETS: Final = 16
SEGMENT_OVERHEAD: Final = NONCE_OCTETS + TAG_OCTETS
AD_LABEL: Final = b"KVSP-DISK-1\x00"
SUFFIX: Final = ".kvsb"
CALIBRATION_OCTETS: Final = 8 << 20
EWMA_WEIGHT: Final = 0.2
_FILE_NAME: Final = re.compile(r"[0-9a-f]{64}\.[0-9a-f]{32}\.[0-9a-f]{64}\.kvsb")
_LAYER: Final = struct.Struct(">I")


class TierError(KvspError):
    """A tier cannot do what was asked."""


class StorageCorruptError(TierError):
    """Stored octets fail authentication or are truncated: the replica is lost (not merely absent)."""

    def __init__(self, block: BlockId, detail: str) -> None:
        super().__init__(f"stored block {block}: {detail}")
        self.block = block


class StorageMissingError(TierError):
    """The block's file is gone (evicted while a read was starting): a cache miss, not corruption."""


# -- key file --------------------------------------------------------------------------------------


def load_or_create_key(path: Path) -> bytes:
    """The 32-octet storage key from ``path`` (raw or hex), generating it with mode 0600 if absent."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return _create_key(path)
    except OSError as exc:
        raise TierError(f"cannot read encryption_key_file {path}: {exc.strerror}") from exc
    if path.stat().st_mode & 0o077:
        log.warning("encryption_key_file %s is readable by group or others; use mode 0600", path)
    if len(data) == KEY_OCTETS:
        return data
    text = data.strip()
    if len(text) == 2 * KEY_OCTETS and re.fullmatch(rb"[0-9a-fA-F]+", text):
        return bytes.fromhex(text.decode("ascii"))
    raise TierError(f"encryption_key_file {path} must hold 32 raw octets or 64 hex digits")


def _create_key(path: Path) -> bytes:
    key = os.urandom(KEY_OCTETS)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: use theirs
        return load_or_create_key(path)
    with os.fdopen(fd, "wb") as f:
        f.write(key.hex().encode("ascii") + b"\n")
    log.info("generated a new storage encryption key in %s", path)
    return key


# -- rate measurement ------------------------------------------------------------------------------


class RateMeter:
    """Read rate in Mbit/s: a measured first value, then an EWMA of real reads (thread-safe)."""

    __slots__ = ("_lock", "_rate")

    def __init__(self) -> None:
        self._rate: float | None = None
        self._lock = threading.Lock()

    @property
    def mbit_per_s(self) -> float | None:
        return self._rate

    def record(self, octets: int, seconds: float) -> None:
        if octets <= 0 or seconds <= 0:
            return
        sample = octets * 8 / 1e6 / seconds
        with self._lock:
            self._rate = sample if self._rate is None else (1 - EWMA_WEIGHT) * self._rate + EWMA_WEIGHT * sample


# -- memory tiers ----------------------------------------------------------------------------------


class MemoryTier(Protocol):
    """A tier in process or accelerator memory: `HostTier` (plain octets), and the torch tiers of
    `control.holder.torch_tiers` (host tensors, pinned with CUDA; the CUDA device tier).

    A tier holds one contiguous layer range of each block.  Not thread-safe: called from the event
    loop, except the copies of tiers whose ``copies_on_read`` is true, which the holder runs in a worker
    thread (torch releases the GIL while it copies).
    """

    @property
    def tier(self) -> Tier: ...

    @property
    def rate(self) -> RateMeter | None:
        """The measured read rate, or None for a tier that only hands out views (nothing to measure)."""
        ...

    @property
    def copies_on_read(self) -> bool:
        """True when `read` copies (device memory): call it in a worker thread."""
        ...

    def __contains__(self, block: object) -> bool: ...

    def __len__(self) -> int: ...

    def put(self, meta: BlockMeta, container: memoryview) -> None:
        """Keep the whole block; ``container`` is the full container as received."""
        ...

    def put_layers(self, meta: BlockMeta, layers: LayerRange, data: Buffer) -> None:
        """Add ``layers`` (their K||V data, contiguous), adjacent to what is held of the block."""
        ...

    def held(self, block: BlockId) -> LayerRange | None: ...

    def whole(self, meta: BlockMeta) -> memoryview | None:
        """The full container as stored, when every layer is here and it is addressable memory."""
        ...

    def read(self, meta: BlockMeta, layers: LayerRange) -> memoryview | None:
        """The data of ``layers`` (contiguous), or None when not all of them are here."""
        ...

    def retain(self, meta: BlockMeta, layers: LayerRange | None) -> None:
        """Keep only ``layers`` (a sub-range of what is held, copied so the rest is freed), or nothing."""
        ...

    def drop(self, block: BlockId) -> None: ...


def joined_range(held: LayerRange | None, layers: LayerRange) -> LayerRange:
    """The range after adding ``layers`` to ``held``; they must be adjacent (a tier holds one range)."""
    if held is None:
        return layers
    if layers.last + 1 == held.first:
        return LayerRange(layers.first, held.last)
    if held.last + 1 == layers.first:
        return LayerRange(held.first, layers.last)
    raise TierError(f"layers {layers} are not adjacent to the held layers {held}")


def remaining_range(held: LayerRange, moved: LayerRange) -> LayerRange | None:
    """What is left of ``held`` once ``moved`` (its bottom or its top) has gone."""
    if moved.first <= held.first and moved.last >= held.last:
        return None
    if moved.first <= held.first:
        return LayerRange(moved.last + 1, held.last)
    if moved.last >= held.last:
        return LayerRange(held.first, moved.first - 1)
    raise TierError(f"layers {moved} are inside {held}: a tier keeps one contiguous range")


@dataclass(frozen=True, slots=True)
class _HostBlock:
    data: memoryview  # the layer data of ``layers``, from layer ``layers.first``
    layers: LayerRange  # the layers held: one contiguous range
    whole: memoryview | None  # the full container as received, while every layer is here


class HostTier:
    """Blocks in process memory as plain octets, viewed in place.  Not thread-safe: event loop only."""

    tier: Final = Tier.HOST
    rate: Final[RateMeter | None] = None  # views only: serving copies nothing, so there is no rate to state
    copies_on_read: Final = False

    def __init__(self) -> None:
        self._blocks: dict[BlockId, _HostBlock] = {}

    def __contains__(self, block: object) -> bool:
        return block in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def put(self, meta: BlockMeta, container: memoryview) -> None:
        """Keep the full container ``container`` (its octets are not copied)."""
        if container.nbytes != meta.size:
            raise TierError(f"container of {container.nbytes} octets, the block has {meta.size}")
        data = container[meta.header.header_length :]
        self._blocks[meta.block] = _HostBlock(data, meta.layers, container)

    def put_layers(self, meta: BlockMeta, layers: LayerRange, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        if view.nbytes != meta.octets(layers):
            raise TierError(f"layers {layers}: {view.nbytes} octets given, {meta.octets(layers)} expected")
        held = self._blocks.get(meta.block)
        joined = joined_range(None if held is None else held.layers, layers)
        if held is None:
            merged = bytes(view)
        elif layers.first < held.layers.first:
            merged = b"".join((view, held.data))
        else:
            merged = b"".join((held.data, view))
        self._blocks[meta.block] = _HostBlock(memoryview(merged), joined, None)

    def held(self, block: BlockId) -> LayerRange | None:
        held = self._blocks.get(block)
        return None if held is None else held.layers

    def whole(self, meta: BlockMeta) -> memoryview | None:
        """The full container as stored, when every layer is here."""
        held = self._blocks.get(meta.block)
        return None if held is None else held.whole

    def read(self, meta: BlockMeta, layers: LayerRange) -> memoryview | None:
        """A view of the data of ``layers`` (contiguous), or None when not all of them are here."""
        held = self._blocks.get(meta.block)
        if held is None or layers.first < held.layers.first or layers.last > held.layers.last:
            return None
        base = meta.offset(held.layers.first)
        return held.data[meta.offset(layers.first) - base : meta.offset(layers.last + 1) - base]

    def retain(self, meta: BlockMeta, layers: LayerRange | None) -> None:
        held = self._blocks.get(meta.block)
        if held is None:
            return
        if layers is None:
            del self._blocks[meta.block]
            return
        if layers == held.layers:
            return
        view = self.read(meta, layers)
        if view is None:
            raise TierError(f"layers {layers} of {meta.block} are not all held here")
        self._blocks[meta.block] = _HostBlock(memoryview(bytes(view)), layers, None)

    def keep(self, meta: BlockMeta, last: int | None) -> None:
        """After a demotion: keep only the held layers up to ``last`` (copied, so the rest is freed)."""
        held = self._blocks.get(meta.block)
        if held is None:
            return
        keep = None if last is None or last < held.layers.first else LayerRange(held.layers.first, last)
        self.retain(meta, keep)

    def drop(self, block: BlockId) -> None:
        self._blocks.pop(block, None)


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


class DiskTier:
    """One encrypted file per block under ``directory`` (see the module docstring for the format).

    Methods do blocking file I/O; the holder calls them from worker threads.  Each call opens the
    file itself, so concurrent reads need no lock, and a file unlinked during a read stays readable.
    """

    tier: Final = Tier.LOCAL_STORAGE

    def __init__(self, directory: Path, key: bytes) -> None:
        if len(key) != KEY_OCTETS:
            raise TierError(f"the storage key must be {KEY_OCTETS} octets")
        self.directory = directory
        self._aead = AESGCM(key)
        self.rate = RateMeter()

    # -- housekeeping ----------------------------------------------------------------------------
    def prepare(self) -> int:
        """Create the directory (0700) and delete block files left by an earlier process.

        The index of what is stored lives in memory, so files from a previous run are orphans.  Only
        files named like ours are touched, so a misconfigured directory loses nothing else.
        """
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        removed = 0
        for path in self._block_files():
            path.unlink(missing_ok=True)
            removed += 1
        return removed

    def _block_files(self) -> Iterator[Path]:
        for sub in self.directory.iterdir():
            if sub.is_dir() and re.fullmatch(r"[0-9a-f]{2}", sub.name):
                yield from (p for p in sub.iterdir() if _FILE_NAME.fullmatch(p.name))

    def path(self, block: BlockId) -> Path:
        key = block.block_key.hex()
        return self.directory / key[:2] / f"{block.compat_id.hex()}.{block.scope_id.hex()}.{key}{SUFFIX}"

    def delete(self, block: BlockId) -> None:
        self.path(block).unlink(missing_ok=True)

    def exists(self, block: BlockId) -> bool:
        return self.path(block).is_file()

    # -- data ------------------------------------------------------------------------------------
    def _ad(self, meta: BlockMeta, layout: _Layout, layer: int) -> bytes:
        b = meta.block
        return AD_LABEL + b.compat_id + b.scope_id + b.block_key + _LAYER.pack(layer) + layout.header_digest

    def write(self, meta: BlockMeta, layers: LayerRange, data: Buffer) -> None:
        """Encrypt and write ``layers`` whose plaintext (K||V of each, in order) is ``data``."""
        plain = memoryview(data).cast("B")
        if plain.nbytes != meta.octets(layers):
            raise TierError(f"layers {layers}: {plain.nbytes} octets given, {meta.octets(layers)} expected")
        layout = _Layout.of(meta)
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
        path = self.path(meta.block)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            _pwrite_all(fd, layout.header, 0)
            _pwrite_all(fd, view, base)
        finally:
            os.close(fd)

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
        if header != layout.header:
            raise StorageCorruptError(meta.block, "the file header differs from the stored block's")
        if got != len(sealed):
            raise StorageCorruptError(meta.block, f"file truncated: {got} of {len(sealed)} octets read")
        plain = self._open(meta, layout, layers, memoryview(sealed))
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
                os.fsync(fd)
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            began = time.perf_counter()
            self.read(meta, meta.layers)
            elapsed = time.perf_counter() - began
        finally:
            path.unlink(missing_ok=True)
        rate = meta.data_octets * 8 / 1e6 / max(elapsed, 1e-9)
        log.info("local-storage read rate %.0f Mbit/s (calibration of %d octets)", rate, meta.data_octets)
        return rate


def _pwrite_all(fd: int, data: Buffer, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view.nbytes:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n
