"""The ``[is]`` table of a role configuration (decision D1), validated once at start-up.

    [is]
    sweep_interval_s = 2.0          # how often expired replicas and statuses are swept
    sweep_batch = 10000             # heap items per sweep step; the loop yields between steps
    max_replicas = 10000000         # live records the index holds at most (507 beyond)
    block_tokens = 16               # B for compat_ids without a descriptor (recompute_us estimates)
    descriptors = ["model.json"]    # Compatibility Descriptors: B and layer count per compat_id
    backend = "memory"              # or "redis": the index shared by every IS process (docs/scale.md)
    [is.redis]                      # only with backend = "redis" (control/backend.py reads it)
    url = "redis://127.0.0.1:6379/0"  # rediss:// for TLS; for a Redis Cluster, any node's URL
    cluster = false                 # true: Redis Cluster, records partitioned by Block Key over the slots
    password_file = "redis.pass"    # optional; also username, ca, cert, key (TLS), key_prefix
    timeout_ms = 500                # bound on each Redis call: past it the request gets a 503

The TTL cap is the policy quota ``replica_ttl_ms_max`` and the lookup size the quota
``keys_per_lookup`` (decision D2), so every role reads its limits from the same file.
The IS cannot derive B from a compat_id (it is a hash), which is why estimates of recompute time need
either a descriptor or a default ``block_tokens``; without one, ``recompute_us`` is null.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from control.backend import BackendConfig, backend_of
from kvsp.descriptor import CompatDescriptor
from kvsp.errors import KvspError, ValidationError
from kvsp.records.base import check_uri

KNOWN_KEYS = frozenset({"sweep_interval_s", "sweep_batch", "max_replicas", "block_tokens", "descriptors",
                        "backend", "redis"})
MAX_INDEX_URIS = 64  # IS base URIs a client role may list


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the cost model needs to know about a compat_id: block size B and, if known, layer count."""

    block_tokens: int
    layers: int | None = None


@dataclass(frozen=True, slots=True)
class IndexSettings:
    sweep_interval_s: float = 2.0
    sweep_batch: int = 10_000
    max_replicas: int = 10_000_000
    block_tokens: int | None = None
    shapes: Mapping[bytes, ModelShape] = field(default_factory=lambda: MappingProxyType({}))
    backend: BackendConfig = field(default_factory=BackendConfig)

    def shape(self, compat_id: bytes) -> ModelShape | None:
        """The shape for ``compat_id``: from its descriptor, else the default B, else None."""
        known = self.shapes.get(compat_id)
        if known is not None:
            return known
        return None if self.block_tokens is None else ModelShape(self.block_tokens)

    @classmethod
    def from_section(cls, section: Mapping[str, object], base_dir: Path | None = None) -> IndexSettings:
        """Validate the ``[is]`` table; relative descriptor paths resolve against ``base_dir``."""
        unknown = set(section) - KNOWN_KEYS
        if unknown:
            raise ValidationError(f"is.{sorted(unknown)[0]}", f"unknown key; known: {sorted(KNOWN_KEYS)}")
        interval = section.get("sweep_interval_s", 2.0)
        if isinstance(interval, bool) or not isinstance(interval, int | float) \
                or not math.isfinite(interval) or interval <= 0:
            raise ValidationError("is.sweep_interval_s", "must be a positive number of seconds")
        block_tokens = section.get("block_tokens")
        return cls(
            sweep_interval_s=float(interval),
            sweep_batch=_positive(section, "sweep_batch", 10_000),
            max_replicas=_positive(section, "max_replicas", 10_000_000),
            block_tokens=None if block_tokens is None else _positive(section, "block_tokens", 0),
            shapes=MappingProxyType(_shapes(section.get("descriptors", []), base_dir or Path("."))),
            backend=backend_of(section, "is", base_dir or Path(".")),
        )


def parse_index_uris(value: object, member: str) -> str | tuple[str, ...]:
    """A client role's ``index`` setting (holder, PC): one IS base URI, kept a string as before, or a
    non-empty array of them, which ``kvsp.client.index.IndexClient`` fails over between in order."""
    if isinstance(value, str):
        return check_uri(value, member)
    if not isinstance(value, list) or not value or len(value) > MAX_INDEX_URIS:
        raise ValidationError(member, f"must be an IS base URI or an array of 1 to {MAX_INDEX_URIS} of them")
    uris = tuple(check_uri(v, f"{member}[{i}]") for i, v in enumerate(value))
    if len(set(uris)) != len(uris):
        raise ValidationError(member, "lists an IS base URI twice")
    return uris


def _positive(section: Mapping[str, object], name: str, default: int) -> int:
    value = section.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValidationError(f"is.{name}", "must be a positive integer")
    return value


def _shapes(value: object, base_dir: Path) -> dict[bytes, ModelShape]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationError("is.descriptors", "must be an array of descriptor file paths")
    shapes: dict[bytes, ModelShape] = {}
    for i, name in enumerate(value):
        path = Path(name) if Path(name).is_absolute() else base_dir / name
        try:
            descriptor = CompatDescriptor.from_bytes(path.read_bytes())
        except OSError as exc:
            raise ValidationError(f"is.descriptors[{i}]", f"cannot read {path} ({exc.strerror})") from exc
        except KvspError as exc:
            raise ValidationError(f"is.descriptors[{i}]", f"{path} is not a valid descriptor ({exc})") from exc
        shapes[descriptor.compat_id] = ModelShape(descriptor.block_tokens, descriptor.layers)
    return shapes
