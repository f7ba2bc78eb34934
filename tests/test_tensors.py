"""KV sections as torch tensors (kvsp/tensors.py): dtypes, kvsp-layout-1, zero-copy views."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsp.container import Geometry, decode_container, encode_container, encode_into, encode_parts
from kvsp.errors import ContainerError
from kvsp.registry import ELEMENT_TYPES, Codec
from kvsp.tensors import (
    TORCH_DTYPES,
    CacheOctets,
    SectionError,
    container_tensor,
    copy_section,
    encode_cache_block_into,
    encode_sections,
    kv_dtype_of,
    layer_tensors,
    section_octets,
    section_view,
    torch_dtype,
)

# The octets of 1.0 and -2.0 in each registry type, little-endian, from the formats' definitions:
# binary16 1.0 = 0x3C00, bfloat16 1.0 = 0x3F80, binary32 1.0 = 0x3F800000, E4M3 1.0 = 0x38 (bias 7),
# E5M2 1.0 = 0x3C (bias 15); -2.0 sets the sign and adds one to the exponent.
ONE_MINUS_TWO = {
    "fp16": bytes.fromhex("003c" "00c0"),
    "bf16": bytes.fromhex("803f" "00c0"),
    "fp32": bytes.fromhex("0000803f" "000000c0"),
    "fp8-e4m3": bytes.fromhex("38" "c0"),
    "fp8-e5m2": bytes.fromhex("3c" "c0"),
}


def test_every_registry_element_type_has_its_d5_torch_dtype() -> None:
    assert set(TORCH_DTYPES) == set(ELEMENT_TYPES)
    assert TORCH_DTYPES["fp8-e4m3"] is torch.float8_e4m3fn and TORCH_DTYPES["fp8-e5m2"] is torch.float8_e5m2
    for name, dtype in TORCH_DTYPES.items():
        assert torch.empty((), dtype=dtype).element_size() == ELEMENT_TYPES[name].size
        assert kv_dtype_of(dtype) == name and torch_dtype(name) is dtype
    with pytest.raises(SectionError):
        torch_dtype("int4")
    with pytest.raises(SectionError):
        kv_dtype_of(torch.int8)


@pytest.mark.parametrize("kv_dtype", sorted(ONE_MINUS_TWO))
def test_elements_are_little_endian_octets_of_the_registry_type(kv_dtype: str) -> None:
    view = section_view(ONE_MINUS_TWO[kv_dtype], kv_dtype, 1, 2)
    assert view.dtype is TORCH_DTYPES[kv_dtype] and view.shape == (1, 1, 2)
    assert view.float().flatten().tolist() == [1.0, -2.0]
    tensor = torch.tensor([[[1.0, -2.0]]]).to(TORCH_DTYPES[kv_dtype])
    assert bytes(section_octets(tensor)) == ONE_MINUS_TWO[kv_dtype]


@pytest.mark.parametrize("kv_dtype", ["fp16", "fp32"])
def test_layout_is_token_slowest_dimension_fastest(kv_dtype: str) -> None:
    tokens, heads, dim = 3, 2, 4
    tensor = torch.arange(tokens * heads * dim, dtype=TORCH_DTYPES[kv_dtype]).reshape(tokens, heads, dim)
    octets = bytes(section_octets(tensor))
    fmt, size = ("<e", 2) if kv_dtype == "fp16" else ("<f", 4)
    for t in range(tokens):
        for h in range(heads):
            for d in range(dim):
                offset = ((t * heads + h) * dim + d) * size
                assert struct.unpack_from(fmt, octets, offset)[0] == tensor[t, h, d].item()


@pytest.mark.parametrize("kv_dtype", sorted(TORCH_DTYPES))
def test_round_trip_through_octets_is_bit_exact(kv_dtype: str) -> None:
    raw = np.random.default_rng(1).integers(0, 256, size=5 * 2 * 8 * ELEMENT_TYPES[kv_dtype].size, dtype=np.uint8)
    view = section_view(raw.tobytes(), kv_dtype, 2, 8)
    assert view.shape == (5, 2, 8)
    assert bytes(section_octets(view)) == raw.tobytes()  # no value is canonicalised, NaN payloads included
    clone = view.clone()
    assert bytes(section_octets(clone)) == raw.tobytes()


def test_receive_is_a_view_and_send_is_a_view() -> None:
    buffer = bytearray(ONE_MINUS_TWO["fp32"] * 4)  # 4 tokens x 1 head x 2 dims
    view = section_view(buffer, "fp32", 1, 2)
    buffer[0:4] = struct.pack("<f", 7.0)
    assert view[0, 0, 0].item() == 7.0  # shares the receive buffer
    tensor = torch.zeros(4, 1, 2)
    octets = section_octets(tensor)
    tensor[3, 0, 1] = 5.0
    assert struct.unpack_from("<f", octets, octets.nbytes - 4)[0] == 5.0  # shares the tensor's storage
    assert not octets.readonly


def test_read_only_buffers_are_viewed_without_a_warning(recwarn: pytest.WarningsRecorder) -> None:
    view = section_view(ONE_MINUS_TWO["fp16"], "fp16", 1, 2)
    assert view.float().flatten().tolist() == [1.0, -2.0]
    assert not [w for w in recwarn.list if issubclass(w.category, UserWarning)]


def test_non_contiguous_tensors_are_copied_once_into_layout() -> None:
    full = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(3, 2, 4)
    transposed = full.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    assert not transposed.is_contiguous()
    assert bytes(section_octets(transposed)) == bytes(section_octets(full))


def test_wrong_sizes_and_shapes_are_refused() -> None:
    with pytest.raises(SectionError):
        section_view(b"\x00" * 6, "fp16", 1, 2)  # 1.5 tokens
    with pytest.raises(SectionError):
        section_view(b"\x00" * 8, "fp16", 1, 2, tokens=1)
    with pytest.raises(SectionError):
        section_octets(torch.zeros(2, 2))
    with pytest.raises(SectionError):
        section_octets(torch.zeros(1, 1, 1, dtype=torch.int16))
    with pytest.raises(SectionError):
        layer_tensors(b"\x00" * 8, b"\x00" * 4, "fp16", 1, 2)  # K 2 tokens, V 1 token
    with pytest.raises(SectionError):
        copy_section(torch.zeros(2, 1, 2), b"\x00" * 4, "fp16")
    assert section_view(b"", "bf16", 2, 4).shape == (0, 2, 4)
    assert section_octets(torch.zeros(0, 2, 4)).nbytes == 0


def test_copy_into_a_cache_converts_once() -> None:
    cache = torch.zeros(2, 4, 1, 2, dtype=torch.float32)  # [K/V, tokens, heads, dim]
    copy_section(cache[0, 1:2], ONE_MINUS_TWO["bf16"], "bf16")
    assert cache[0, 1].flatten().tolist() == [1.0, -2.0] and cache.count_nonzero() == 2
    copy_section(cache[1, 2:3], torch.tensor([[[3.0, 4.0]]]), "fp32")
    assert cache[1, 2].flatten().tolist() == [3.0, 4.0]


def test_containers_are_encoded_from_tensors_and_decoded_to_tensor_views() -> None:
    generator = torch.Generator().manual_seed(3)
    layers = [(torch.randn(4, 2, 8, generator=generator).to(torch.bfloat16),
               torch.randn(4, 2, 8, generator=generator).to(torch.bfloat16)) for _ in range(3)]
    geometry = Geometry.for_dtype(2, 8, "bf16", 3)
    sections = encode_sections(layers)
    parts = encode_parts(Codec.RAW, 0, 4, sections, geometry=geometry)
    assert all(isinstance(part, memoryview) for part in parts[1:])  # no intermediate bytes for the data
    data = encode_container(Codec.RAW, 0, 4, sections, geometry=geometry)
    out = bytearray(len(data))
    assert encode_into(out, Codec.RAW, 0, 4, sections, geometry=geometry) == len(data) and bytes(out) == data
    container = decode_container(data, geometry=geometry)
    for view, (k, v) in zip(container.layers, layers, strict=True):
        kt, vt = layer_tensors(view.k, view.v, "bf16", 2, 8)
        assert torch.equal(kt, k) and torch.equal(vt, v)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(TORCH_DTYPES)), st.integers(0, 5), st.integers(1, 4), st.integers(1, 8),
       st.binary(min_size=0, max_size=4))
def test_any_section_round_trips(kv_dtype: str, tokens: int, heads: int, dim: int, salt: bytes) -> None:
    size = tokens * heads * dim * ELEMENT_TYPES[kv_dtype].size
    raw = (salt + bytes(range(256)) * (size // 256 + 1))[:size]
    view = section_view(raw, kv_dtype, heads, dim)
    assert view.shape == (tokens, heads, dim)
    assert bytes(section_octets(view)) == raw


def test_a_raw_container_is_one_tensor_view_of_all_its_layers() -> None:
    generator = torch.Generator().manual_seed(4)
    layers = [(torch.randn(4, 2, 8, generator=generator), torch.randn(4, 2, 8, generator=generator))
              for _ in range(3)]
    data = bytearray(encode_container(Codec.RAW, 5, 4, encode_sections(layers)))
    container = decode_container(data)
    block = container_tensor(container, "fp32", 2, 8)
    assert block.shape == (3, 2, 4, 2, 8)
    for i, (k, v) in enumerate(layers):
        assert torch.equal(block[i, 0], k) and torch.equal(block[i, 1], v)
    data[-4:] = struct.pack("<f", 9.0)  # a view of the received buffer
    assert block[2, 1, 3, 1, 7].item() == 9.0
    with pytest.raises(SectionError):
        container_tensor(container, "fp32", 2, 4)  # the sections are not 4 x 2 x 4 elements
    private = decode_container(encode_container(0xFF01, 0, 1, [(b"\x00", b"\x00")]))
    with pytest.raises(SectionError):
        container_tensor(private, "fp8-e4m3", 1, 1)


def test_cache_octets_are_views_of_the_cache_sections() -> None:
    cache = torch.arange(2 * 3 * 5 * 2 * 4, dtype=torch.float32).reshape(2, 3, 5, 2, 4).to(torch.float16)
    octets = CacheOctets(cache)
    for kind in (0, 1):
        for layer in range(3):
            assert bytes(octets.section(kind, layer, 1, 3)) == bytes(section_octets(cache[kind, layer, 1:4]))
    cache[1, 2, 4, 1, 3] = -1.0
    assert bytes(octets.section(1, 2, 4, 1)[-2:]) == bytes.fromhex("00bc")  # -1.0 in binary16
    with pytest.raises(SectionError):
        CacheOctets(cache[:, :, 1:])  # not contiguous
    with pytest.raises(SectionError):
        CacheOctets(torch.zeros(3, 1, 1, 1, 1))


@pytest.mark.parametrize("kv_dtype", sorted(TORCH_DTYPES))
def test_one_copy_block_encode_is_the_section_by_section_encode(kv_dtype: str) -> None:
    dtype = TORCH_DTYPES[kv_dtype]
    raw = torch.randint(0, 256, (2 * 4 * 6 * 3 * 8 * dtype.itemsize,), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(5))
    cache = raw.view(dtype).reshape(2, 4, 6, 3, 8)  # random octets: every bit pattern, NaNs included
    geometry = Geometry.for_dtype(3, 8, kv_dtype, 4)
    octets = CacheOctets(cache)
    for layers, first, tokens in (((0, 3), 0, 6), ((1, 2), 2, 3), ((3, 3), 5, 1), ((0, 1), 4, 0)):
        sections = [(octets.section(0, layer, first, tokens), octets.section(1, layer, first, tokens))
                    for layer in range(layers[0], layers[1] + 1)]
        expected = encode_container(Codec.RAW, layers[0], tokens, sections, geometry=geometry)
        out = bytearray(b"\xee" * (len(expected) + 7))
        assert encode_cache_block_into(out, cache, layers, first, tokens, geometry=geometry) == len(expected)
        assert out[: len(expected)] == expected and out[len(expected) :] == b"\xee" * 7
        # a cache that is not a contiguous host tensor takes the torch path: same octets
        strided = torch.zeros((2, 4, 7, 3, 8), dtype=dtype)
        strided.view(torch.uint8)[:, :, :6] = cache.view(torch.uint8)
        again = bytearray(len(expected))
        encode_cache_block_into(again, strided[:, :, :6], layers, first, tokens, geometry=geometry)
        assert again == expected


def test_one_copy_block_encode_refuses_what_does_not_fit() -> None:
    cache = torch.zeros(2, 2, 4, 1, 2, dtype=torch.float16)
    with pytest.raises(ContainerError):
        encode_cache_block_into(bytearray(10), cache, (0, 1), 0, 4)  # too small
    with pytest.raises(ContainerError):
        encode_cache_block_into(bytes(1000), cache, (0, 1), 0, 4)  # read-only
    with pytest.raises(ContainerError):
        encode_cache_block_into(bytearray(1000), cache, (0, 1), 0, 4, geometry=Geometry.for_dtype(1, 4, "fp16"))
    with pytest.raises(ContainerError):  # layer 1 is past a one-layer model
        encode_cache_block_into(bytearray(1000), cache, (0, 1), 0, 4, geometry=Geometry.for_dtype(1, 2, "fp16", 1))
    for layers, first, tokens in (((0, 2), 0, 1), ((1, 0), 0, 1), ((0, 0), 3, 2), ((0, 0), -1, 1)):
        with pytest.raises(SectionError):
            encode_cache_block_into(bytearray(1000), cache, layers, first, tokens)
    with pytest.raises(SectionError):
        encode_cache_block_into(bytearray(1000), torch.zeros(2, 2, 4, 2), (0, 0), 0, 1)
    with pytest.raises(SectionError):
        encode_cache_block_into(bytearray(1000), torch.zeros(2, 1, 1, 1, 1, dtype=torch.int32), (0, 0), 0, 1)

