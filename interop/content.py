"""The block both sides of the interop suite agree on, computed independently on each side.

A KVSP-style block as decision D3 maps it onto MOQT: one track (namespace of five fields, track name
``raw``), group 0, object ID l = layer l, payload = the layer's K section followed by its V section.
Every octet is a function of (namespace, track name, layer), so the aiomoqt peers (Python 3.12 venv,
no kvsp installed) and kvsp's side (3.11+) produce and check the same bytes without exchanging them.

Standard library only: ``interop/peers/*.py`` import this module by path.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

_COUNTER_OCTETS = 4


def layer_section(seed: bytes, layer: int, section: bytes, size: int) -> bytes:
    """``size`` pseudo-random octets: SHA-256 in counter mode over (seed, layer, section, counter)."""
    prefix = hashlib.sha256(seed).digest() + layer.to_bytes(4, "big") + section
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(prefix + counter.to_bytes(_COUNTER_OCTETS, "big")).digest()
        counter += 1
    return bytes(out[:size])


@dataclass(frozen=True, slots=True)
class BlockSpec:
    """What a publisher serves and a subscriber expects: the track and its layers' sizes."""

    namespace: tuple[bytes, ...]
    track: bytes
    layers: int
    k_size: int
    v_size: int

    def __post_init__(self) -> None:
        if not self.namespace or self.layers <= 0 or min(self.k_size, self.v_size) < 0:
            raise ValueError("a block needs a namespace, at least one layer and non-negative sections")

    @property
    def seed(self) -> bytes:
        return b"\x00".join((*self.namespace, self.track))

    def payload(self, layer: int) -> bytes:
        """Object ``layer`` of group 0: the K section, then the V section."""
        if not 0 <= layer < self.layers:
            raise ValueError(f"layer {layer} outside 0..{self.layers - 1}")
        return (layer_section(self.seed, layer, b"K", self.k_size)
                + layer_section(self.seed, layer, b"V", self.v_size))

    def layer_digest(self, layer: int) -> bytes:
        """SHA-256 of the payload: D3 makes it the record's ``layer_digests[l]``."""
        return hashlib.sha256(self.payload(layer)).digest()

    # -- command-line form, shared by the peers and the harness ----------------------------------
    def to_args(self) -> list[str]:
        return ["--namespace", ",".join(f.hex() for f in self.namespace), "--track", self.track.decode(),
                "--layers", str(self.layers), "--k-size", str(self.k_size), "--v-size", str(self.v_size)]

    @classmethod
    def from_args(cls, namespace: str, track: str, layers: int, k_size: int, v_size: int) -> BlockSpec:
        fields = tuple(bytes.fromhex(f) for f in namespace.split(","))
        return cls(fields, track.encode(), layers, k_size, v_size)

    def track_arg(self) -> str:
        """``HEX,HEX,.../TRACK``: the full track name in one argument (the sizes travel separately)."""
        return ",".join(f.hex() for f in self.namespace) + "/" + self.track.decode()

    def with_track_arg(self, arg: str) -> BlockSpec:
        """The block named by a :meth:`track_arg` string, with this block's sizes."""
        namespace, _, track = arg.rpartition("/")
        return BlockSpec.from_args(namespace, track, self.layers, self.k_size, self.v_size)
