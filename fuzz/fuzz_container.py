"""Fuzz target ``container``: the KV Block Container decoder (spec section 4.3, kvsp/container/).

Input: one octet choosing the decode rules (geometry, required codec, layer bound), then the octets
of a container.  Contract: ``decode_container`` returns a container or raises ``ContainerError``,
nothing else; ``parse_header`` agrees with it (a header it refuses, the decoder refuses too); an
accepted container is exactly its header's encoding followed by its data, its layer views tile the
data in order, its digests verify against themselves, and every slice decodes back to the same layers.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import check, fuzz_main
from kvsp.container import (
    Container,
    DecodeRules,
    Geometry,
    decode_container,
    encode_container,
    parse_header,
    replica_digest,
    verify_layers,
)
from kvsp.errors import ContainerError

TARGET = "container"
INSTRUMENT = ("kvsp.container", "kvsp.errors")
# A geometry small enough that the fuzzer can build exact raw sections (4 octets a token), and the
# spec's Appendix A geometry (2,048 octets a token, 32 layers).
SMALL = Geometry(kv_heads=1, head_dim=2, element_size=2, layers=4)
APPENDIX_A = Geometry(kv_heads=8, head_dim=128, element_size=2, layers=32)
GEOMETRIES = (None, SMALL, APPENDIX_A, Geometry(1, 1, 1))
APPENDIX_A_HEADER = bytes.fromhex(
    "4b564231010000010000000000000002000000040000000000002000000000000000200000000000000020000000000000002000")


def rules_of(selector: int) -> DecodeRules:
    geometry = GEOMETRIES[selector & 0x3]
    codec_required = 1 if selector & 0x4 else None
    max_layers = 8 if selector & 0x8 else 4096
    return DecodeRules(geometry, codec_required, max_layers)


def decode(rules: DecodeRules, octets: bytes) -> Container:
    return decode_container(octets, geometry=rules.geometry, codec_required=rules.codec_required,
                            max_layers=rules.max_layers)


def check_container(container: Container, octets: bytes, rules: DecodeRules) -> None:
    header = container.header
    check(header.encode() + bytes(container.data) == octets, "an accepted container is not header + data")
    check(parse_header(octets, geometry=rules.geometry, codec_required=rules.codec_required,
                       max_layers=rules.max_layers) == header, "parse_header disagrees with decode_container")
    offset = 0
    for view, (k, v) in zip(container.layers, header.lengths, strict=True):
        check(view.k_length == k and view.nbytes == k + v, f"layer {view.layer} view has the wrong size")
        check(bytes(view.payload) == bytes(container.data[offset : offset + k + v]), "layer views do not tile")
        offset += k + v
    digests = container.layer_digests()
    check(digests == tuple(view.digest() for view in container.layers), "layer_digests differs from the views")
    check(verify_layers(container, digests, first_layer=container.first_layer) == digests, "digests do not verify")
    replica_digest(digests)
    first, last = container.first_layer, container.last_layer
    mid = (first + last) // 2
    for lo, hi in ((first, last), (first, mid), (mid, last)):
        part = decode(rules, container.slice_bytes(lo, hi))
        check([bytes(v.payload) for v in part.layers] == [bytes(container.layer(i).payload) for i in range(lo, hi + 1)],
              f"slice {lo}-{hi} does not decode to the same layers")


def test_one_input(data: bytes) -> None:
    if not data:
        return
    rules = rules_of(data[0])
    octets = data[1:]
    try:
        header_ok = True
        parse_header(octets, geometry=rules.geometry, codec_required=rules.codec_required,
                     max_layers=rules.max_layers)
    except ContainerError:
        header_ok = False
    try:
        container = decode(rules, octets)
    except ContainerError:
        return
    check(header_ok, "decode_container accepted a container whose header parse_header refused")
    check_container(container, octets, rules)


def seeds() -> list[bytes]:
    out = [bytes([0]) + APPENDIX_A_HEADER, bytes([2]) + APPENDIX_A_HEADER + bytes(4 * 8192)]
    for selector in (0, 1, 5, 9):
        geometry = rules_of(selector).geometry
        per_token = geometry.section_length(1) if geometry is not None else 4
        for first, layers, tokens in ((0, 1, 1), (1, 3, 2), (0, 4, 3)):
            size = per_token * tokens
            sections = [(bytes([i]) * size, bytes([0x80 | i]) * size) for i in range(layers)]
            out.append(bytes([selector]) + encode_container(1, first, tokens, sections, geometry=geometry))
    out.append(bytes([0]) + encode_container(0xFF01, 7, 5, [(b"k", b"vv"), (b"", b"x" * 9)]))  # private codec
    return out


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT)
