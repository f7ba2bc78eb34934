"""The KVSP registries (spec section 11.2) as Python types."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final


class Codec(enum.IntEnum):
    """KVSP Codecs registry (16-bit values)."""

    RESERVED = 0x0000
    RAW = 0x0001


PRIVATE_CODEC_MIN: Final = 0xFF00
PRIVATE_CODEC_MAX: Final = 0xFFFF
CODEC_NAMES: Final[dict[int, str]] = {Codec.RAW: "raw"}


def codec_name(codec: int) -> str:
    """Registry name of a codec, or ``codec-XXXX`` (lowercase hex) when it has none (decision D3)."""
    return CODEC_NAMES.get(codec, f"codec-{codec:04x}")


@dataclass(frozen=True, slots=True)
class ElementType:
    name: str
    size: int  # octets per element
    description: str


ELEMENT_TYPES: Final[dict[str, ElementType]] = {
    e.name: e
    for e in (
        ElementType("bf16", 2, "bfloat16"),
        ElementType("fp16", 2, "IEEE 754 binary16"),
        ElementType("fp32", 4, "IEEE 754 binary32"),
        ElementType("fp8-e4m3", 1, "8-bit floating point, 4-bit exponent"),
        ElementType("fp8-e5m2", 1, "8-bit floating point, 5-bit exponent"),
    )
}

POSITIONAL_ENCODINGS: Final = frozenset({"rope", "none"})
LAYOUTS: Final = frozenset({"kvsp-layout-1"})


class Tier(enum.StrEnum):
    """KVSP Storage Tiers registry."""

    DEVICE = "device"
    HOST = "host"
    LOCAL_STORAGE = "local-storage"
    REMOTE_MEMORY = "remote-memory"
    REMOTE_STORAGE = "remote-storage"


class InstanceState(enum.StrEnum):
    """KVSP Instance States registry."""

    ACTIVE = "active"
    DRAINING = "draining"
    SLEEPING = "sleeping"
    FAILED = "failed"


TIERS: Final = frozenset(t.value for t in Tier)
INSTANCE_STATES: Final = frozenset(s.value for s in InstanceState)
