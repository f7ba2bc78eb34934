"""Tiers: host views, the encrypted local-storage format (round trip, offset reads that decrypt only the
requested layers, tamper detection, binding to the block), key files and read-rate measurement."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from control.holder.disk import AD_LABEL, NONCE_OCTETS, SEGMENT_OVERHEAD, DiskTier
from control.holder.files import load_or_create_key
from control.holder.store import BlockId, BlockMeta
from control.holder.tiers import HostTier, RateMeter, StorageCorruptError, StorageMissingError, TierError
from kvsp.container import LayerRange, decode_container
from tests.support.holder import block_id, container, descriptor, meta_of

D = descriptor(layers=6, kv_heads=2, head_dim=8, block_tokens=4)
KEY = bytes(range(32))


def block(n: int = 1) -> tuple[BlockMeta, bytes]:
    body = container(D, n)
    return meta_of(block_id(D, n), body, D), body


def data_of(body: bytes, first: int, last: int) -> bytes:
    c = decode_container(body)
    return bytes(c.slice(first, last)[1])


class CountingAead:
    """Wraps AESGCM to count which segments are decrypted."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.decrypted: list[int] = []

    def encrypt_into(self, *args: object) -> int:
        return self.inner.encrypt_into(*args)  # type: ignore[attr-defined, no-any-return]

    def decrypt_into(self, nonce: bytes, data: memoryview, ad: bytes, buf: memoryview) -> int:
        self.decrypted.append(int.from_bytes(ad[len(AD_LABEL) + 80 : len(AD_LABEL) + 84], "big"))
        return self.inner.decrypt_into(nonce, data, ad, buf)  # type: ignore[attr-defined, no-any-return]


@pytest.fixture
def disk(tmp_path: Path) -> DiskTier:
    tier = DiskTier(tmp_path / "blocks", KEY)
    tier.prepare()
    return tier


# -- host --------------------------------------------------------------------------------------------


def test_host_tier_serves_views_without_copying() -> None:
    meta, body = block()
    source = memoryview(body)
    host = HostTier()
    host.put(meta, source)
    whole = host.whole(meta)
    assert whole is not None and whole.obj is body  # the stored octets themselves
    part = host.read(meta, LayerRange(2, 3))
    assert part is not None and part.obj is body and bytes(part) == data_of(body, 2, 3)
    host.keep(meta, 2)  # after demoting layers 3..5: a prefix copy, the rest freed
    assert host.whole(meta) is None and host.read(meta, LayerRange(3, 3)) is None
    kept = host.read(meta, LayerRange(0, 2))
    assert kept is not None and kept.obj is not body and bytes(kept) == data_of(body, 0, 2)
    host.keep(meta, None)
    assert meta.block not in host and len(host) == 0


def test_host_tier_refuses_a_buffer_of_the_wrong_size() -> None:
    meta, body = block()
    with pytest.raises(TierError):
        HostTier().put(meta, memoryview(body)[:-1])


# -- local storage -----------------------------------------------------------------------------------


def test_disk_round_trip_full_and_ranges(disk: DiskTier) -> None:
    meta, body = block()
    disk.write(meta, meta.layers, data_of(body, 0, 5))
    assert bytes(disk.read(meta, meta.layers)) == data_of(body, 0, 5)
    for first, last in ((0, 0), (2, 4), (5, 5), (1, 5)):
        assert bytes(disk.read(meta, LayerRange(first, last))) == data_of(body, first, last)
    path = disk.path(meta.block)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    raw = path.read_bytes()
    assert raw.startswith(meta.header.encode())  # plaintext container header and lengths table
    assert len(raw) == meta.size + SEGMENT_OVERHEAD * 6
    assert data_of(body, 0, 0)[:64] not in raw  # encrypted at rest


def test_layer_range_read_decrypts_only_that_range(disk: DiskTier) -> None:
    meta, body = block()
    disk.write(meta, meta.layers, data_of(body, 0, 5))
    counting = CountingAead(disk._aead)
    disk._aead = counting  # type: ignore[assignment]
    assert bytes(disk.read(meta, LayerRange(2, 3))) == data_of(body, 2, 3)
    assert counting.decrypted == [2, 3]
    # Layers outside the range may even be damaged: they are never read.
    path = disk.path(meta.block)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01  # last octet of layer 5's tag
    path.write_bytes(bytes(raw))
    assert bytes(disk.read(meta, LayerRange(0, 4))) == data_of(body, 0, 4)
    with pytest.raises(StorageCorruptError):
        disk.read(meta, LayerRange(5, 5))


@pytest.mark.parametrize("where", ["ciphertext", "nonce", "tag", "header"])
def test_tampering_is_detected(disk: DiskTier, where: str) -> None:
    meta, body = block()
    disk.write(meta, meta.layers, data_of(body, 0, 5))
    path = disk.path(meta.block)
    raw = bytearray(path.read_bytes())
    start = meta.header.header_length  # layer 0's segment
    offset = {"nonce": start + 3, "ciphertext": start + NONCE_OCTETS + 10,
              "tag": start + SEGMENT_OVERHEAD + meta.octets(LayerRange(0, 0)) - 1, "header": 18}[where]
    raw[offset] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.raises(StorageCorruptError) as info:
        disk.read(meta, meta.layers)
    assert info.value.block == meta.block


def test_truncated_file_is_corrupt_and_missing_file_is_a_miss(disk: DiskTier) -> None:
    meta, body = block()
    disk.write(meta, meta.layers, data_of(body, 0, 5))
    path = disk.path(meta.block)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(StorageCorruptError, match="truncated"):
        disk.read(meta, meta.layers)
    disk.delete(meta.block)
    with pytest.raises(StorageMissingError):
        disk.read(meta, meta.layers)


def test_segments_are_bound_to_their_block_and_scope(disk: DiskTier) -> None:
    meta, body = block()
    disk.write(meta, meta.layers, data_of(body, 0, 5))
    other = BlockMeta(BlockId(meta.block.compat_id, bytes(16), meta.block.block_key), meta.header,
                      meta.layer_digests, meta.digest, meta.repr_digest)
    disk.path(other.block).parent.mkdir(exist_ok=True)
    disk.path(meta.block).rename(disk.path(other.block))  # same octets, claimed for another scope
    with pytest.raises(StorageCorruptError):
        disk.read(other, other.layers)


def test_layer_segments_cannot_be_swapped(disk: DiskTier) -> None:
    meta, body = block()
    disk.write(meta, meta.layers, data_of(body, 0, 5))
    path = disk.path(meta.block)
    raw = bytearray(path.read_bytes())
    seg = SEGMENT_OVERHEAD + meta.octets(LayerRange(0, 0))
    h = meta.header.header_length
    raw[h : h + seg], raw[h + seg : h + 2 * seg] = raw[h + seg : h + 2 * seg], raw[h : h + seg]
    path.write_bytes(bytes(raw))
    with pytest.raises(StorageCorruptError, match="layer 0"):
        disk.read(meta, LayerRange(0, 1))


def test_partial_writes_fill_a_sparse_file(disk: DiskTier) -> None:
    """Demotion writes the top layers first, the rest later, each at its own offset."""
    meta, body = block()
    disk.write(meta, LayerRange(4, 5), data_of(body, 4, 5))
    assert bytes(disk.read(meta, LayerRange(4, 5))) == data_of(body, 4, 5)
    assert disk.held(meta.block) == LayerRange(4, 5)
    with pytest.raises(StorageMissingError):
        disk.read(meta, LayerRange(3, 4))  # layer 3 is a hole this tier does not claim: a miss, not a fault
    disk.write(meta, LayerRange(0, 3), data_of(body, 0, 3))
    assert bytes(disk.read(meta, meta.layers)) == data_of(body, 0, 5)


def test_write_checks_the_data_length(disk: DiskTier) -> None:
    meta, body = block()
    with pytest.raises(TierError):
        disk.write(meta, LayerRange(0, 1), data_of(body, 0, 2))


def test_a_different_key_cannot_read(disk: DiskTier, tmp_path: Path) -> None:
    meta, body = block()
    disk.write(meta, meta.layers, data_of(body, 0, 5))
    with pytest.raises(StorageCorruptError):
        DiskTier(disk.directory, bytes(32)).read(meta, meta.layers)


def test_prepare_makes_a_private_folder_and_keeps_what_is_there(tmp_path: Path) -> None:
    meta, body = block()
    first = DiskTier(tmp_path / "blocks", KEY)
    first.prepare()
    first.write(meta, meta.layers, data_of(body, 0, 5))
    DiskTier(tmp_path / "blocks", KEY).prepare()  # a restart: files are adopted, never wiped by prepare
    assert first.exists(meta.block)
    assert stat.S_IMODE((tmp_path / "blocks").stat().st_mode) == 0o700


def test_calibration_measures_a_real_read(disk: DiskTier) -> None:
    assert disk.rate.mbit_per_s is None
    rate = disk.calibrate(1 << 20)
    assert rate > 0 and disk.rate.mbit_per_s is not None
    assert list(disk.directory.rglob("*.kvs*")) == []  # the calibration block and its record are gone


def test_rate_meter_is_an_ewma_of_samples() -> None:
    meter = RateMeter()
    meter.record(1_000_000, 1.0)  # 8 Mbit/s
    assert meter.mbit_per_s == pytest.approx(8.0)
    meter.record(2_000_000, 1.0)  # 16 Mbit/s
    assert meter.mbit_per_s == pytest.approx(0.8 * 8 + 0.2 * 16)
    meter.record(0, 1.0)
    meter.record(10, 0.0)
    assert meter.mbit_per_s == pytest.approx(9.6)


# -- key file ----------------------------------------------------------------------------------------


def test_key_is_generated_with_mode_0600_and_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "storage.key"
    key = load_or_create_key(path)
    assert len(key) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == key.hex()
    assert load_or_create_key(path) == key


def test_key_file_may_be_raw_or_hex(tmp_path: Path) -> None:
    raw = tmp_path / "raw.key"
    raw.write_bytes(KEY)
    assert load_or_create_key(raw) == KEY
    hexed = tmp_path / "hex.key"
    hexed.write_text(hashlib.sha256(b"x").hexdigest().upper() + "\n")
    assert load_or_create_key(hexed) == hashlib.sha256(b"x").digest()
    bad = tmp_path / "bad.key"
    bad.write_text("not a key")
    with pytest.raises(TierError):
        load_or_create_key(bad)
    with pytest.raises(TierError):
        DiskTier(tmp_path, os.urandom(16))
