"""Benchmarks of the holder's tiers (decision D5): what reading a layer range costs in each tier.

* host read: a layer range (half the layers) out of the torch host tier, and out of the plain-octets
  host tier, against one memcpy of the same octets (``bytes(view)``).  Both tiers hand out views of
  their storage, so the goal is a read at no more than 1% of a copy (ratio <= 0.01): the cost must not
  grow with the range.
* local-storage: an offset read of a quarter of the layers (one ``pread``, only those layers
  decrypted) against the whole block through the same path; goal <= 0.4 (the read scales with the
  range, not with the block).  The whole block through `DiskTier` (read and AES-256-GCM decrypt) is
  also reported against a plain read of the same file, which is what encryption at rest costs.  The
  file is in the page cache after the first read: these are warm reads (the cold rate is what the
  holder's startup calibration measures and publishes).
* restart: `DiskTier.adopt` re-reading, decrypting and hashing every stored block of a cache left by
  an earlier process (what ``verify_stored`` costs; the holder now serves while it runs in the
  background), against a plain read of the same files; the write path (temporary name, fsync, rename,
  commit record) is reported beside it.  Reported, with the rate in MiB/s: the background check of a
  large cache takes its size over this rate.
* host -> device and device -> host: with CUDA, the pinned host tier's copy of a block to the device
  (`TorchHostTier.to_device`) against the same copy from pageable memory (goal: pinned at least as
  fast, ratio >= 1.0), and the device tier's read into pinned memory; rates in Gbit/s beside the
  times.  Without CUDA these rows are recorded as skipped, with the reason.

Run: ``python -m benchmarks --only bench_tiers`` or ``python -m benchmarks.bench_tiers [--quick]``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.timing import Sample, case, measure
from control.holder.disk import DiskTier
from control.holder.store import BlockId, BlockMeta
from control.holder.tiers import HostTier
from control.holder.torch_tiers import DeviceTier, TorchHostTier, cuda_available
from kvsp.container import LayerRange, decode_container, encode_container, replica_digest
from kvsp.registry import Codec

MiB = 1 << 20
LAYERS = 32


def _block(octets: int) -> tuple[BlockMeta, bytes]:
    section = octets // (2 * LAYERS)
    rng = np.random.default_rng(7)
    payload = rng.bytes(2 * LAYERS * section)
    view = memoryview(payload)
    layers = [(view[2 * i * section : (2 * i + 1) * section], view[(2 * i + 1) * section : (2 * i + 2) * section])
              for i in range(LAYERS)]
    body = encode_container(Codec.RAW, 0, 16, layers)
    c = decode_container(body)
    digests = c.layer_digests()
    block = BlockId(b"\x01" * 32, b"\x02" * 16, b"\x03" * 32)
    return BlockMeta(block, c.header, digests, replica_digest(digests), hashlib.sha256(body).digest()), body


def _gbit_per_s(octets: int, sample: Sample) -> float:
    return round(octets * 8 / 1e9 / sample.median_s, 2)


def _host_cases(meta: BlockMeta, body: bytes, reps: int) -> list[dict[str, object]]:
    half = LayerRange(0, LAYERS // 2 - 1)
    octets = meta.octets(half)
    torch_host, plain = TorchHostTier(pin=False), HostTier()
    torch_host.put(meta, memoryview(body))
    plain.put(meta, memoryview(body))
    view = plain.read(meta, half)
    assert view is not None
    copy = measure(lambda: bytes(view), reps=reps)
    rows = []
    for name, tier in (("torch host tier", torch_host), ("plain host tier", plain)):
        read = measure(lambda t=tier: t.read(meta, half), reps=reps, inner=100)  # type: ignore[misc]
        rows.append(case(f"{name}: read layers 0-{half.last} ({octets // MiB} MiB)", read, copy,
                         "a view, not a copy: <= 1% of one memcpy of the range (ratio <= 0.01)",
                         goal_max_ratio=0.01) | {"memcpy_gbit_per_s": _gbit_per_s(octets, copy)})
    return rows


def _disk_cases(meta: BlockMeta, reps: int) -> list[dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="kvsp-bench-tiers-") as tmp:
        disk = DiskTier(Path(tmp) / "blocks", os.urandom(32))
        disk.prepare()
        data = memoryview(os.urandom(meta.data_octets))
        disk.write(meta, meta.layers, data)
        quarter = LayerRange(LAYERS - LAYERS // 4, LAYERS - 1)
        path = disk.path(meta.block)
        size = path.stat().st_size

        def plain_read() -> bytes:
            fd = os.open(path, os.O_RDONLY)
            try:
                return os.pread(fd, size, 0)
            finally:
                os.close(fd)

        whole = measure(lambda: disk.read(meta, meta.layers), reps=reps)
        part = measure(lambda: disk.read(meta, quarter), reps=reps)
        plain = measure(plain_read, reps=reps)
    return [
        case(f"local-storage: offset read of layers {quarter} (a quarter)", part, whole,
             "scales with the range: <= 0.4 of the whole block through the same path (ratio <= 0.4)",
             goal_max_ratio=0.4) | {"gbit_per_s": _gbit_per_s(meta.octets(quarter), part)},
        case("local-storage: whole block read + decrypt vs plain file read", whole, plain,
             "reported: the cost of AES-256-GCM at rest on warm (page-cached) reads")
        | {"gbit_per_s": _gbit_per_s(meta.data_octets, whole), "plain_gbit_per_s": _gbit_per_s(size, plain)},
    ]


def _device_cases(meta: BlockMeta, body: bytes, reps: int) -> list[dict[str, object]]:
    names = ("host -> device: pinned host tier vs pageable memory", "device tier read into pinned host memory")
    if not cuda_available():
        reason = "no CUDA device on this machine"
        return [{"case": name, "unit": "s", "value": None, "goal": "with CUDA only", "skipped": reason}
                for name in names]
    host, device = TorchHostTier(), DeviceTier()
    host.put(meta, memoryview(body))
    device.put(meta, memoryview(body))
    pageable = torch.frombuffer(bytearray(meta.data_octets), dtype=torch.uint8)

    def pageable_copy() -> None:
        pageable.to("cuda")
        torch.cuda.synchronize()

    pinned = measure(lambda: host.to_device(meta, meta.layers), reps=reps)
    baseline = measure(pageable_copy, reps=reps)
    read = measure(lambda: device.read(meta, meta.layers), reps=reps)
    octets = meta.data_octets
    return [
        case(names[0], pinned, baseline, "pinned at least as fast as pageable (ratio >= 1.0)",
             higher_is_better=True, goal_min_ratio=1.0)
        | {"gbit_per_s": _gbit_per_s(octets, pinned), "pageable_gbit_per_s": _gbit_per_s(octets, baseline)},
        case(names[1], read, None, "reported: the device tier's read_mbit_per_s")
        | {"gbit_per_s": _gbit_per_s(octets, read), "device": torch.cuda.get_device_name()},
    ]


def _restart_cases(meta: BlockMeta, body: bytes, blocks: int, reps: int) -> list[dict[str, object]]:
    """Adoption of ``blocks`` copies of the block (distinct keys) by a new DiskTier on the same folder."""
    key = os.urandom(32)
    data = memoryview(body)[len(body) - meta.data_octets :]  # the layers, so that verification passes
    metas = [BlockMeta(BlockId(meta.block.compat_id, meta.block.scope_id, hashlib.sha256(bytes([i])).digest()),
                       meta.header, meta.layer_digests, meta.digest, meta.repr_digest) for i in range(blocks)]
    with tempfile.TemporaryDirectory(prefix="kvsp-bench-adopt-") as tmp:
        folder = Path(tmp) / "blocks"
        writer = DiskTier(folder, key)
        writer.prepare()
        start = time.perf_counter()
        for m in metas:
            writer.write(m, m.layers, data)
        write_s = time.perf_counter() - start

        def adopt() -> object:
            adoption = DiskTier(folder, key).adopt(lambda block, header: True, 3600.0, time.time())
            assert len(adoption.adopted) == blocks, "every intact block is adopted"
            return adoption

        def plain() -> None:
            for path in folder.rglob("*"):
                if path.is_file():
                    path.read_bytes()

        adopted = measure(adopt, reps=reps, warmup=1)
        baseline = measure(plain, reps=reps, warmup=1)
    total = blocks * meta.data_octets
    return [case(f"restart: adopt {blocks} stored blocks (verify) vs plain read of the files", adopted, baseline,
                 "reported: background verification of a restarted cache takes its size / this rate")
            | {"adopt_mib_per_s": round(total / MiB / adopted.median_s), "write_fsync_mib_per_s":
               round(total / MiB / write_s)}]


def run(quick: bool = False) -> dict[str, object]:
    octets = (16 if quick else 64) * MiB
    reps = 5 if quick else 9
    meta, body = _block(octets)
    cases = (_host_cases(meta, body, reps) + _disk_cases(meta, reps) + _restart_cases(meta, body, 2 if quick else 4, 3)
             + _device_cases(meta, body, reps))
    return {"name": "tiers", "params": {"block_octets": meta.data_octets, "layers": LAYERS,
                                        "cuda": cuda_available()}, "cases": cases}


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
