"""Block verification without sockets (spec sections 4.3, 6.7): Repr-Digest fields, the push-fed verifier
fed one octet at a time and in random splits, the whole-buffer check, and the offloaded Repr-Digest."""

from __future__ import annotations

import base64
import hashlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvsp.client.verify as verify_module
from kvsp.client.verify import (
    BlockCheck,
    BlockVerifier,
    ReplicaDigestMismatchError,
    ReprDigestMismatchError,
    ReprDigestMissingError,
    SpanHasher,
    UnexpectedBlockError,
    format_repr_digest,
    parse_repr_digest,
    verify_block_bytes,
)
from kvsp.container import (
    Geometry,
    LayerDigestMismatchError,
    LayerRange,
    decode_container,
    encode_container,
    replica_digest,
)
from kvsp.errors import ContainerError, DigestMismatchError
from tests.support.client_doubles import LAYERS, TOKENS, key_of, make_container, make_record

HOLDER = "https://h.example/kvsp/"
DATA = make_container(0)
RECORD = make_record(HOLDER, key_of(0), DATA)
SHA = hashlib.sha256(DATA).digest()


@pytest.fixture(scope="module")
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as pool:
        yield pool


# -- Repr-Digest (RFC 9530) --------------------------------------------------------------------------------


def test_rfc9530_example() -> None:
    # RFC 9530 section 2: the representation {"hello": "world"} with both algorithms.
    value = ("sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:, sha-512=:WZDPaVn/7XgHaAy8pmojAkGWoRx2"
             "UFChF41A2svX+TaPm+AbwAgBWnrIiYllu7BNNyealdVLvRwEmTHWXvJwew==:")
    assert parse_repr_digest([value]) == hashlib.sha256(b'{"hello": "world"}').digest()
    assert format_repr_digest(hashlib.sha256(b'{"hello": "world"}').digest()) == value.split(",", maxsplit=1)[0]


@pytest.mark.parametrize("lines", [
    [format_repr_digest(SHA)],
    ["sha-512=:" + base64.b64encode(bytes(64)).decode() + ":", format_repr_digest(SHA)],  # two field lines
    [format_repr_digest(bytes(32)) + "," + format_repr_digest(SHA)],  # last member wins (RFC 8941)
    [format_repr_digest(SHA) + ";param=1"],
    ["sha-256=:" + base64.b64encode(SHA).decode().rstrip("=") + ":"],  # padding may be left out
])
def test_parse_repr_digest(lines: list[str]) -> None:
    assert parse_repr_digest(lines) == SHA


@pytest.mark.parametrize("lines", [
    [], [""], ["sha-512=:" + base64.b64encode(bytes(64)).decode() + ":"], ["sha-256"], ["sha-256=abc"],
    ["sha-256=:" + base64.b64encode(bytes(16)).decode() + ":"], ["sha-256=:not base64!:"], ["SHA-256=:x:"],
    ["sha-256=" + SHA.hex()],
])
def test_unusable_repr_digest_is_missing(lines: list[str]) -> None:
    with pytest.raises(ReprDigestMissingError):
        parse_repr_digest(lines)


# -- the push-fed verifier ------------------------------------------------------------------------------


def feed_all(verifier: BlockVerifier, data: bytes, splits: list[int]) -> list[int]:
    layers = []
    pos = 0
    for cut in [*sorted(splits), len(data)]:
        for view in verifier.feed(data[pos:cut]):
            layers.append(view.layer)
        pos = cut
    return layers


def test_octet_at_a_time_yields_each_layer_with_its_last_octet() -> None:
    verifier = BlockVerifier(BlockCheck.for_replica(RECORD), SHA)
    container = decode_container(DATA)
    ends = {}
    end = container.header_length
    for view in container.layers:
        end += view.nbytes
        ends[end] = view.layer
    for i in range(len(DATA)):
        got = [v.layer for v in verifier.feed(DATA[i : i + 1])]
        assert got == ([ends[i + 1]] if i + 1 in ends else [])
    block = verifier.verify_sync()
    assert block.replica_verified and block.layer_digests == RECORD.layer_digests
    assert block.repr_digest == SHA and block.size == len(DATA)


@given(st.lists(st.integers(0, len(DATA)), max_size=12))
def test_any_split_verifies_the_same(splits: list[int]) -> None:
    verifier = BlockVerifier(BlockCheck.for_replica(RECORD), SHA)
    assert feed_all(verifier, DATA, splits) == list(range(LAYERS))
    assert verifier.verify_sync().layer_digests == RECORD.layer_digests


@given(st.integers(0, len(DATA) - 1), st.integers(1, 255))
def test_any_flipped_octet_is_caught(position: int, flip: int) -> None:
    bad = bytearray(DATA)
    bad[position] ^= flip
    bad_sha = hashlib.sha256(bad).digest()  # the holder hashes what it sends: Repr-Digest alone passes
    # The record carries no token count: the caller's B (or the geometry) pins it.
    verifier = BlockVerifier(BlockCheck.for_replica(RECORD, token_count=TOKENS), bad_sha)
    with pytest.raises((ContainerError, DigestMismatchError)):
        feed_all(verifier, bytes(bad), [])
        verifier.verify_sync()


def test_token_count_is_pinned_by_b_or_geometry() -> None:
    bad = bytearray(DATA)
    bad[19] = TOKENS * 2  # 64-octet sections still divide evenly: structurally valid
    sha = hashlib.sha256(bad).digest()
    loose = BlockVerifier(BlockCheck.for_replica(RECORD), sha)
    loose.feed(bytes(bad))
    assert loose.verify_sync().container.token_count == TOKENS * 2
    with pytest.raises(UnexpectedBlockError):
        BlockVerifier(BlockCheck.for_replica(RECORD, token_count=TOKENS), sha).feed(bytes(bad))
    with pytest.raises(ContainerError):
        BlockVerifier(BlockCheck.for_replica(RECORD, geometry=Geometry(2, 4, 2)), sha).feed(bytes(bad))


def test_corrupt_layer_fails_at_that_layer_before_later_ones() -> None:
    bad = bytearray(DATA)
    bad[decode_container(DATA).header_length + 3] ^= 1  # layer 0
    verifier = BlockVerifier(BlockCheck.for_replica(RECORD), hashlib.sha256(bad).digest())
    with pytest.raises(LayerDigestMismatchError) as info:
        feed_all(verifier, bytes(bad), [])
    assert info.value.layer == 0


def test_wrong_repr_digest_fails_at_the_end() -> None:
    verifier = BlockVerifier(BlockCheck.for_replica(RECORD), bytes(32))
    assert feed_all(verifier, DATA, [100, 300]) == list(range(LAYERS))  # the layers themselves are right
    with pytest.raises(ReprDigestMismatchError):
        verifier.verify_sync()


def test_replica_digest_checked_without_layer_digests() -> None:
    record = make_record(HOLDER, key_of(0), DATA, layer_digests=False)
    assert BlockVerifier(BlockCheck.for_replica(record), SHA).feed(DATA)
    good = BlockVerifier(BlockCheck.for_replica(record), SHA)
    good.feed(DATA)
    assert good.verify_sync().replica_verified
    other = make_container(1)
    wrong = BlockVerifier(BlockCheck.for_replica(record), hashlib.sha256(other).digest())
    wrong.feed(other)
    with pytest.raises(ReplicaDigestMismatchError):
        wrong.verify_sync()


def test_layer_range_checks_only_its_layers() -> None:
    container = decode_container(DATA)
    part = container.slice_bytes(1, 2)
    check = BlockCheck.for_replica(RECORD, layers=LayerRange(1, 2))
    verifier = BlockVerifier(check, hashlib.sha256(part).digest())
    assert [v.layer for v in verifier.feed(part)] == [1, 2]
    block = verifier.verify_sync()
    assert block.layer_digests == RECORD.layer_digests[1:3] and not block.replica_verified
    with pytest.raises(UnexpectedBlockError):  # the whole block where 1-2 was asked for
        BlockVerifier(check, SHA).feed(DATA)


def test_transcoded_container_is_protected_by_repr_digest_only() -> None:
    container = decode_container(DATA)
    other = encode_container(0xFF01, 0, TOKENS, [(v.k, v.v) for v in container.layers])
    check = BlockCheck.for_replica(RECORD, codec=0xFF01)
    verifier = BlockVerifier(check, hashlib.sha256(other).digest())
    verifier.feed(other)
    block = verifier.verify_sync()
    assert block.layer_digests == () and not block.replica_verified
    with pytest.raises(ContainerError, match="required"):  # not the codec asked for
        BlockVerifier(BlockCheck.for_replica(RECORD), SHA).feed(other)
    with pytest.raises(UnexpectedBlockError, match="codec"):  # neither the one asked for nor the replica's
        BlockVerifier(BlockCheck.for_replica(RECORD, codec=0xFF02), SHA).feed(other)


def test_holder_that_does_not_transcode_is_verified_fully() -> None:
    """codec=n asked, the replica's codec served (transcoding is a MAY): layer digests apply again."""
    check = BlockCheck.for_replica(RECORD, codec=0xFF01)
    assert check.accepted_codecs == {1, 0xFF01} and check.codec_required is None
    verifier = BlockVerifier(check, SHA)
    verifier.feed(DATA)
    block = verifier.verify_sync()
    assert block.layer_digests == RECORD.layer_digests and block.replica_verified


def test_truncated_body_fails_at_end() -> None:
    verifier = BlockVerifier(BlockCheck.for_replica(RECORD), SHA)
    verifier.feed(DATA[:-1])
    with pytest.raises(ContainerError, match="incomplete"):
        verifier.end()


def test_geometry_and_size_limit_apply() -> None:
    with pytest.raises(ContainerError, match="exceeds the limit"):
        BlockVerifier(BlockCheck(max_size=len(DATA) - 1), SHA).feed(DATA)
    with pytest.raises(ContainerError):
        BlockVerifier(BlockCheck(geometry=Geometry(3, 4, 2)), SHA).feed(DATA)


def test_layer_beyond_record_digests_fails_closed() -> None:
    longer = make_container(0, layers=LAYERS + 1)
    verifier = BlockVerifier(BlockCheck(codec=1, replica_codec=1, layer_digests=RECORD.layer_digests), SHA)
    with pytest.raises(LayerDigestMismatchError) as info:
        verifier.feed(longer)
    assert info.value.layer == LAYERS and info.value.expected is None


# -- offloaded Repr-Digest and the whole-buffer check -------------------------------------------------------


BIG = make_container(2, layers=8, tokens=4096)  # 8 layers x 256 KiB
BIG_RECORD = make_record(HOLDER, key_of(2), BIG)
BIG_SHA = hashlib.sha256(BIG).digest()


@pytest.mark.parametrize("chunk", [1 << 10, 64 << 10, len(BIG)])
def test_offloaded_verifier_matches_inline(executor: ThreadPoolExecutor, chunk: int) -> None:
    verifier = BlockVerifier(BlockCheck.for_replica(BIG_RECORD), BIG_SHA, executor=executor, offload_min=1)
    splits = list(range(chunk, len(BIG), chunk))
    assert feed_all(verifier, BIG, splits) == list(range(8))
    block = verifier.verify_sync()
    assert block.replica_verified and block.repr_digest == BIG_SHA
    with pytest.raises(ReprDigestMismatchError):
        wrong = BlockVerifier(BlockCheck.for_replica(BIG_RECORD), bytes(32), executor=executor, offload_min=1)
        feed_all(wrong, BIG, splits)
        wrong.verify_sync()


@pytest.mark.parametrize("offload_min", [0, 1 << 40])
def test_verify_block_bytes(executor: ThreadPoolExecutor, offload_min: int) -> None:
    block = verify_block_bytes(BIG, BIG_SHA, BlockCheck.for_replica(BIG_RECORD), executor=executor,
                               offload_min=offload_min)
    assert block.replica_verified and block.layer_digests == BIG_RECORD.layer_digests
    assert block.container.data.obj is BIG  # decoded in place, no copy
    with pytest.raises(ReprDigestMismatchError):
        verify_block_bytes(BIG, bytes(32), executor=executor, offload_min=offload_min)
    bad = bytearray(BIG)
    bad[-1] ^= 1
    with pytest.raises(LayerDigestMismatchError):
        verify_block_bytes(bad, hashlib.sha256(bad).digest(), BlockCheck.for_replica(BIG_RECORD),
                           executor=executor, offload_min=offload_min)
    assert verify_block_bytes(DATA, SHA).repr_digest == SHA  # no record: Repr-Digest only
    with pytest.raises(ContainerError, match="exceeds"):
        verify_block_bytes(DATA, SHA, BlockCheck(max_size=10))


def test_span_hasher_is_order_preserving(executor: ThreadPoolExecutor) -> None:
    parts = [bytes([i]) * (1000 + i) for i in range(50)]
    hasher = SpanHasher(executor)
    for part in parts:
        hasher.add([memoryview(part)])
    assert hasher.finish().result() == hashlib.sha256(b"".join(parts)).digest()
    inline = SpanHasher()
    inline.add(parts)
    assert not inline.offloaded and inline.finish().result() == hashlib.sha256(b"".join(parts)).digest()


def test_replica_digest_is_sha256_of_layer_digests() -> None:
    assert RECORD.digest == replica_digest(RECORD.layer_digests)
    assert RECORD.digest == hashlib.sha256(b"".join(RECORD.layer_digests)).digest()


def test_a_job_that_never_started_is_taken_back() -> None:
    """The worker is busy elsewhere: finish() cancels the queued job and hashes it on this thread."""
    gate = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        blocker = pool.submit(gate.wait, 10)
        hasher = SpanHasher(pool)
        hasher.add([b"a" * 5000])
        hasher.add([b"b" * 5000])  # queued behind the first job: pending
        result = hasher.finish()
        assert result.done()  # computed here, not on the blocked worker
        assert result.result() == hashlib.sha256(b"a" * 5000 + b"b" * 5000).digest()
        gate.set()
        blocker.result()


def test_jobs_chain_in_order_on_a_busy_pool(executor: ThreadPoolExecutor) -> None:
    parts = [bytes([i]) * 300_000 for i in range(12)]
    hasher = SpanHasher(executor)
    for part in parts:
        hasher.add([part])
        time.sleep(0.0005)  # let some jobs start, so finish() chains after a running one
    assert hasher.finish().result() == hashlib.sha256(b"".join(parts)).digest()


class _CountingExecutor(ThreadPoolExecutor):
    """A pool that counts the jobs handed to it."""

    def __init__(self) -> None:
        super().__init__(1)
        self.jobs = 0

    def submit(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.jobs += 1
        return super().submit(*args, **kwargs)


def test_a_streamed_block_takes_few_hand_offs() -> None:
    """Each job drains what arrives meanwhile, and a streamed block waits for 1/32 of itself: at most ~32 jobs."""
    with _CountingExecutor() as pool:
        verifier = BlockVerifier(BlockCheck.for_replica(BIG_RECORD), BIG_SHA, executor=pool, offload_min=1)
        feed_all(verifier, BIG, list(range(16 << 10, len(BIG), 16 << 10)))  # 128 chunks
        assert verifier.verify_sync().repr_digest == BIG_SHA
        assert 1 <= pool.jobs <= 33  # 128 chunks of 16 KiB


def test_a_failing_job_reaches_finish(executor: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the worker raises is handed to the caller of finish(), whether the job ended before or after it."""
    hasher = SpanHasher(executor, min_span=1)
    hasher.add(["not a buffer"])  # type: ignore[list-item]  # hashlib refuses str on the worker
    time.sleep(0.05)  # the job has failed by now (or is about to): either way finish() hands the error on
    with pytest.raises(TypeError):
        hasher.finish().result(timeout=5)
    started, gate = threading.Event(), threading.Event()

    def blocked(h: object, parts: object) -> None:
        started.set()
        gate.wait(5)
        raise OSError("disk on fire")

    monkeypatch.setattr(verify_module, "_update_all", blocked)
    slow = SpanHasher(executor, min_span=1)
    slow.add([b"x"])
    assert started.wait(5)
    result = slow.finish()  # the job is running: it completes this future
    assert not result.done()
    gate.set()
    with pytest.raises(OSError, match="fire"):
        result.result(timeout=5)


def test_whole_buffer_reports_the_first_bad_layer(executor: ThreadPoolExecutor) -> None:
    bad = bytearray(BIG)
    start = len(BIG) - 3 * (len(BIG) - 20 - 16 * 8) // 8  # inside layer 5 of 8 equal layers
    bad[start + 10] ^= 1
    bad[-1] ^= 1  # layer 7 is bad too: layer 5 is reported
    with pytest.raises(LayerDigestMismatchError) as info:
        verify_block_bytes(bad, hashlib.sha256(bad).digest(), BlockCheck.for_replica(BIG_RECORD), executor=executor)
    assert info.value.layer == 5 and info.value.expected == BIG_RECORD.layer_digests[5]
