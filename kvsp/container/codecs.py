"""The KVSP Codecs registry (section 11.2): standard and private-use codecs with their section rules."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from kvsp.container.header import ContainerHeader, Geometry
from kvsp.errors import ContainerError
from kvsp.registry import (
    CODEC_NAMES,
    PRIVATE_CODEC_MAX,
    PRIVATE_CODEC_MIN,
    Codec,
    codec_name,
)

# -- codecs ------------------------------------------------------------------------------------------

_CODEC_NAME: Final = re.compile(r"[a-z0-9-]{1,32}")

SectionCheck = Callable[[ContainerHeader, "Geometry | None"], None]


@dataclass(frozen=True, slots=True)
class CodecSpec:
    """One entry of the KVSP Codecs registry (section 11.2), with the section rule the decoder enforces.

    ``check`` receives the validated header and the geometry (when the caller knows it) and raises
    `ContainerError` when the section lengths cannot be a valid encoding; None means no constraint.
    """

    value: int
    name: str
    description: str
    check: SectionCheck | None = None

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int) or not 1 <= self.value <= 0xFFFF:
            raise ValueError(f"codec value must be between 0x0001 and 0xffff, got {self.value!r}")
        if _CODEC_NAME.fullmatch(self.name) is None:
            raise ValueError(f"codec name {self.name!r} must be 1-32 of lowercase letters, digits and '-'")


def check_raw_sections(header: ContainerHeader, geometry: Geometry | None) -> None:
    """Codec raw (layout kvsp-layout-1): every K and V section holds the same token x head x dim grid.

    With a geometry the length is exact; without one, all sections must still be equal and a whole
    number of octets per token.
    """
    tokens = header.token_count
    if geometry is not None:
        expected = geometry.section_length(tokens)
    else:
        expected = header.lengths[0][0]
        if tokens and expected % tokens:
            raise ContainerError(f"raw section of {expected} octets is not a whole number of octets "
                                 f"for {tokens} tokens")
    if header._distinct == {expected}:  # the common case: one length for all sections
        return
    rule = ("all raw sections are equal" if geometry is None else
            f"{tokens} tokens x {geometry.kv_heads} heads x {geometry.head_dim} x {geometry.element_size} octets")
    for i, (k, v) in enumerate(header.lengths):
        if k != expected or v != expected:
            raise ContainerError(f"layer {header.first_layer + i}: raw K/V sections are {k}/{v} octets, "
                                 f"expected {expected} ({rule})")


RAW: Final = CodecSpec(Codec.RAW, CODEC_NAMES[Codec.RAW], 'uncompressed elements in layout "kvsp-layout-1"',
                       check_raw_sections)
STANDARD_CODECS: Final = (RAW,)


class CodecRegistry:
    """The codecs a process understands: the standard ones plus registered private-use codecs.

    Only values 0xFF00-0xFFFF can be registered at run time: anything else is assigned by IANA and
    must come with this library, so two peers never disagree about a standard value.
    """

    __slots__ = ("_by_value",)

    def __init__(self) -> None:
        self._by_value: dict[int, CodecSpec] = {spec.value: spec for spec in STANDARD_CODECS}

    def register(self, spec: CodecSpec) -> CodecSpec:
        if not PRIVATE_CODEC_MIN <= spec.value <= PRIVATE_CODEC_MAX:
            raise ValueError(f"codec 0x{spec.value:04x} is not in the private-use range "
                             f"0x{PRIVATE_CODEC_MIN:04x}-0x{PRIVATE_CODEC_MAX:04x}")
        if spec.value in self._by_value:
            raise ValueError(f"codec 0x{spec.value:04x} is already registered")
        if any(s.name == spec.name for s in self._by_value.values()):
            raise ValueError(f"codec name {spec.name!r} is already registered")
        self._by_value[spec.value] = spec
        return spec

    def get(self, value: int) -> CodecSpec | None:
        return self._by_value.get(value)

    def name(self, value: int) -> str:
        """Registry name, or ``codec-XXXX`` for a codec without one (decision D3)."""
        spec = self._by_value.get(value)
        return spec.name if spec is not None else codec_name(value)

    def __contains__(self, value: object) -> bool:
        return value in self._by_value

    def __iter__(self) -> Iterator[CodecSpec]:
        return iter(sorted(self._by_value.values(), key=lambda s: s.value))


DEFAULT_CODECS: Final = CodecRegistry()
_STANDARD_VALUES: Final = frozenset(spec.value for spec in STANDARD_CODECS)


def register_codec(spec: CodecSpec, registry: CodecRegistry | None = None) -> CodecSpec:
    """Register a private-use codec (0xFF00-0xFFFF) in ``registry`` (the process-wide default if None)."""
    return (DEFAULT_CODECS if registry is None else registry).register(spec)
