"""Fuzz target ``moqt_binding``: a KVSP block arriving over MOQT (kvsp/moqt_binding.py, decision D3): the
per-layer checks (``LayerCheck``) and the assembly into one buffer (``BlockAssembly``), fed the right
layers, wrong ones and arbitrary objects in any order, plus the namespace and range helpers.

Input: one octet of block shape (codec raw or private, layer count, requested range, whether the token
count is known), the layers' fill octets, then operations: the next layer as the subscriber delivers
it (into the slot ``allocate`` handed out, possibly ahead of ``accept``), the next layer as a caller's
own object, a damaged layer (a flipped octet, another object ID or group, a bad K length, a truncated
payload), an arbitrary ``allocate``, or ``finish``.

Contract: ``allocate`` returns a slot of the asked length or None, never raises; ``accept`` and
``finish`` return or raise ``KvspError`` (ContainerError, DigestMismatchError), nothing else; a refused
object changes nothing -- the same layers are still expected, with the same token count, and the right
layer is still accepted after it; every accepted layer is the layer sent; and ``finish`` after every
layer returns the block, the replica digest verified when all layers were asked for.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import Cursor, OpWriter, check, fuzz_main
from kvsp.container import Geometry, LayerRange
from kvsp.errors import KvspError
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.moqt_binding import (
    K_LENGTH_EXTENSION,
    BlockAssembly,
    block_namespace,
    layer_object,
    layer_range_of,
    layer_window,
    parse_namespace,
)
from kvsp.records import ReplicaRecord, Residency
from kvsp.registry import Codec, Tier
from moqt.tracks import MoqtObject
from moqt.wire import KeyValuePair, Location

TARGET = "moqt_binding"
INSTRUMENT = ("kvsp.moqt_binding", "kvsp.container", "kvsp.client.verify", "kvsp.client.ranking")
GEOMETRY: Final = Geometry(kv_heads=1, head_dim=2, element_size=2)  # 4 octets per token and section
PRIVATE: Final = 0xFF01
MAX_OPS: Final = 32
NEXT_IN_PLACE, NEXT_COPY, DAMAGED, ALLOCATE, FINISH, ALLOCATE_AHEAD, ACCEPT_AHEAD = range(7)
OPS: Final = 7


class Diverged(Exception):
    """The input took the assembly somewhere the harness's model of the block does not follow."""


@dataclass
class Block:
    codec: int
    layers: list[bytes]  # payload (K then V) of each layer
    k_lengths: list[int]
    wanted: LayerRange
    tokens: int
    ahead: list[MoqtObject] = field(default_factory=list)  # slots filled by the subscriber, not yet accepted
    accepted: int = 0

    def record(self) -> ReplicaRecord:
        digests = tuple(hashlib.sha256(p).digest() for p in self.layers)
        size = 20 + 16 * len(self.layers) + sum(map(len, self.layers))
        ns = TrackNamespace(bytes(32), bytes(16), role_id("https://h1.example/kvsp/"), bytes(32))
        return ReplicaRecord(bytes(32), bytes(32), bytes(16), "moqt://relay.example/kvsp", self.codec, size,
                             hashlib.sha256(b"".join(digests)).digest(),
                             (Residency(Tier.HOST, (0, len(self.layers) - 1)),), 1000, digests, ns)

    def obj(self, layer: int, payload: memoryview | None = None) -> MoqtObject:
        data = memoryview(self.layers[layer]) if payload is None else payload
        return layer_object(layer, data, self.k_lengths[layer], self.codec)


def make_block(cursor: Cursor) -> Block:
    shape = cursor.u8()
    codec = PRIVATE if shape & 1 else Codec.RAW
    count = 1 + (shape >> 1) % 4
    first = cursor.choice(count)
    last = first + cursor.choice(count - first)
    tokens = 1 + cursor.choice(3)
    layers, k_lengths = [], []
    for _ in range(count):
        fill = cursor.u8()
        if codec == Codec.RAW:
            k = v = GEOMETRY.section_length(tokens)
        else:
            k, v = fill % 7, (fill >> 3) % 9
        layers.append(bytes((fill + i) & 0xFF for i in range(k + v)))
        k_lengths.append(k)
    return Block(codec, layers, k_lengths, LayerRange(first, last), tokens)


def snapshot(assembly: BlockAssembly) -> tuple[object, ...]:
    c = assembly.check
    return (c.expected, c.token_count, tuple(c.digests), tuple(c.lengths), assembly._cursor)


def damaged(block: Block, layer: int, cursor: Cursor) -> MoqtObject:
    good = block.obj(layer)
    kind = cursor.choice(5)
    payload = bytearray(good.payload)
    if kind == 0 and payload:
        payload[cursor.u8() % len(payload)] ^= 1 + cursor.choice(255)
    elif kind == 1:
        return MoqtObject(0, (layer + 1 + cursor.choice(4)), good.payload, good.extensions)
    elif kind == 2:
        return MoqtObject(1 + cursor.choice(3), layer, good.payload, good.extensions)
    elif kind == 3:
        return MoqtObject(0, layer, good.payload, (KeyValuePair(K_LENGTH_EXTENSION, cursor.u8()),))
    else:
        del payload[cursor.u8() % (len(payload) + 1) :]
        payload += bytes(cursor.choice(3))
    return MoqtObject(0, layer, memoryview(bytes(payload)), good.extensions)


def accept(block: Block, assembly: BlockAssembly, obj: MoqtObject, *, good: bool) -> None:
    before = snapshot(assembly)
    try:
        view = assembly.accept(obj)
    except KvspError:
        check(not good or block.accepted + block.wanted.first > block.wanted.last,
              f"the right layer {obj.object_id} was refused")
        check(snapshot(assembly) == before, "a refused object changed the assembly")
        return
    layer = block.wanted.first + block.accepted
    check(view.layer == layer and bytes(view.payload) == block.layers[layer], "an accepted layer is not the one sent")
    block.accepted += 1


def finish(block: Block, assembly: BlockAssembly) -> None:
    try:
        verified = assembly.finish()
    except KvspError:
        check(block.wanted.first + block.accepted <= block.wanted.last, "finish refused a complete block")
        return
    check(block.wanted.first + block.accepted > block.wanted.last, "finish accepted an incomplete block")
    check([bytes(v.payload) for v in verified.layers] == block.layers[block.wanted.first : block.wanted.last + 1],
          "the finished block is not the layers sent")
    check(verified.replica_verified == (block.wanted == LayerRange(0, len(block.layers) - 1)),
          "the replica digest was (not) verified when it should (not) have been")


def step(block: Block, assembly: BlockAssembly, op: int, cursor: Cursor) -> None:
    layer = block.wanted.first + block.accepted
    has_next = layer <= block.wanted.last
    if op in (NEXT_IN_PLACE, ALLOCATE_AHEAD) and block.wanted.first + block.accepted + len(block.ahead) \
            <= block.wanted.last:
        ahead = block.wanted.first + block.accepted + len(block.ahead)
        slot = assembly.allocate(0, ahead, len(block.layers[ahead]))
        if slot is not None:
            check(slot.nbytes == len(block.layers[ahead]), "allocate handed out a slot of the wrong size")
            slot[:] = block.layers[ahead]
            block.ahead.append(block.obj(ahead, slot))
        if op == NEXT_IN_PLACE and block.ahead:
            accept(block, assembly, block.ahead.pop(0), good=True)
    elif op == ACCEPT_AHEAD and block.ahead:
        accept(block, assembly, block.ahead.pop(0), good=True)
    elif op == NEXT_COPY and has_next and not block.ahead:
        accept(block, assembly, block.obj(layer), good=True)
    elif op == DAMAGED and has_next and not block.ahead:
        accept(block, assembly, damaged(block, layer, cursor), good=False)
    elif op == ALLOCATE:
        before = (assembly._allocated, assembly._next_slot)
        length = cursor.u8()
        slot = assembly.allocate(cursor.choice(2), cursor.choice(6), length)
        if slot is None:
            check((assembly._allocated, assembly._next_slot) == before, "a refused allocate changed the allocator")
        else:
            check(slot.nbytes == length, "allocate handed out a slot of the wrong size")
            raise Diverged  # the slots are now handed out in the fuzzer's order: the model stops here
    elif op == FINISH:
        finish(block, assembly)


def helpers(cursor: Cursor) -> None:
    fields = tuple(cursor.chunk() for _ in range(cursor.choice(7)))
    parsed = parse_namespace(fields)
    if parsed is not None:
        check(block_namespace(parsed.compat_id, parsed.scope_id, parsed.holder_id, parsed.block_key) == fields,
              "a KVSP namespace does not re-encode to its fields")
    first, last = cursor.choice(8), cursor.choice(8)
    if first <= last:
        start, stop = layer_window(LayerRange(first, last))
        check(layer_range_of(start, stop, 7) == LayerRange(first, last), "layer_window and layer_range_of disagree")
    layer_range_of(Location(cursor.choice(3), cursor.u8()), Location(cursor.choice(3), cursor.u8()), cursor.u8())


def test_one_input(data: bytes) -> None:
    cursor = Cursor(data)
    if cursor.u8() & 0x80:
        helpers(cursor)
        return
    block = make_block(cursor)
    known_tokens = cursor.flag() or block.codec != Codec.RAW
    try:
        assembly = BlockAssembly.for_replica(block.record(), block.wanted, token_count=block.tokens if known_tokens
                                             else None, geometry=GEOMETRY if block.codec == Codec.RAW else None)
    except KvspError:
        return
    try:
        for _ in range(MAX_OPS):
            if not cursor.remaining:
                break
            step(block, assembly, cursor.choice(OPS), cursor)
    except Diverged:
        return


def seeds() -> list[bytes]:
    out = []
    for shape, first, last, tokens in ((6, 0, 3, 1), (7, 1, 1, 0), (2, 0, 1, 2), (5, 0, 2, 0)):
        w = OpWriter().u8(0).u8(shape).u8(first).u8(last).u8(tokens)
        for i in range(4):
            w.u8(0x31 * (i + 1))
        w.u8(shape & 1)
        for op in (NEXT_IN_PLACE, DAMAGED, NEXT_COPY, ALLOCATE_AHEAD, ALLOCATE_AHEAD, ACCEPT_AHEAD, ACCEPT_AHEAD,
                   FINISH):
            w.u8(op)
            if op == DAMAGED:
                w.u8(0).u8(3).u8(7)
        out.append(w.getvalue())
    ns = block_namespace(bytes(32), bytes(16), role_id("https://h1.example/kvsp/"), bytes(32))
    helper = OpWriter().u8(0x80).u8(5)
    for part in ns:
        helper.chunk(part)
    out.append(helper.u8(2).u8(5).u8(0).u8(3).u8(1).u8(0).u8(4).getvalue())
    return out


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT, max_len=512)
