"""The ``[holder]`` table of a role configuration, validated once into a frozen record.

    [holder]
    index = "https://127.0.0.1:7401/is/"     # the Index Service; absent: serve without publishing
                                             #   (or an array of IS base URIs: failed over in order)
    descriptors = ["model.json"]             # the Compatibility Descriptors this holder stores
    replica_ttl_ms = 120000                  # ttl_ms of published records, refreshed every ttl/3
    retention_ms = 3600000                   # a block is deleted this long after it was stored
    host_capacity_octets = 8589934592        # host tier; 0 disables it
    storage_dir = "blocks"                   # local-storage tier; absent disables it
    storage_capacity_octets = 107374182400
    encryption_key_file = "storage.key"      # AES-256-GCM key of local-storage (made if absent)
    verify_stored = true                     # after startup, read and check every adopted block (background)
    withdraw_timeout_ms = 2000               # how long an eviction waits for the IS to confirm
    moqt_listen = "127.0.0.1:4433"           # optional: also serve blocks over MOQT (UDP, decision D3)
    moqt_uri = "moqt://127.0.0.1:4433/holder"  # the holder of the MOQT records; required with moqt_listen
    moqt_token_keys = ["issuer.pub.pem"]     # optional: keys that sign AUTHORIZATION_TOKENs (ES256)
    moqt_relay = "moqt://127.0.0.1:4443/relay"  # optional: publish through the rack relay (records name it)
    moqt_max_datagram_size = 1452            # optional: UDP payload to non-loopback MOQT peers (8952: jumbo)
    moqt_max_connections_per_client = 256      # optional: concurrent MOQT (QUIC) connections from one IP address
    moqt_drafts = [16, 14]                   # optional: MOQT drafts the listener accepts (default: every one)
    torch_tiers = false                      # host tier as torch uint8 tensors (pinned with CUDA)
    device_capacity_octets = 0               # device tier (CUDA memory); absent without CUDA
    device = "cuda"                          # the torch device of the device tier
    fast_layers = 0                          # > 0: the first N layers of a block on the fastest tier,
                                             #   the rest on the next (spec section 4.4 split)

Unknown keys are refused, so that a misspelt capacity fails at startup instead of silently taking
the default.  Relative paths resolve against the configuration file's folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE

from control.index.settings import parse_index_uris
from kvsp.descriptor import CompatDescriptor
from kvsp.errors import ValidationError
from kvsp.numbers import parse_decimal
from kvsp.reader import ObjectReader
from kvsp.records.base import MAX_SAFE_INT
from kvsp.service.config import RoleConfig
from kvsp.service.moqt_config import read_drafts
from moqt.quic import MAX_DATAGRAM_SIZE, MoqtUri, QuicSettings

DEFAULT_REPLICA_TTL_MS: Final = 120_000
DEFAULT_RETENTION_MS: Final = 3_600_000
DEFAULT_HOST_CAPACITY: Final = 1 << 30
DEFAULT_STORAGE_CAPACITY: Final = 16 << 30
DEFAULT_WITHDRAW_TIMEOUT_MS: Final = 2_000
DEFAULT_KEY_FILE: Final = "holder-storage.key"
DEFAULT_MOQT_DATAGRAM_SIZE: Final = QuicSettings().max_datagram_size
DEFAULT_MOQT_CONNECTIONS_PER_CLIENT: Final = QuicSettings().max_connections_per_client or 256
KNOWN_KEYS: Final = frozenset({
    "index", "descriptors", "replica_ttl_ms", "retention_ms", "host_capacity_octets", "storage_dir",
    "storage_capacity_octets", "encryption_key_file", "verify_stored", "withdraw_timeout_ms",
    "moqt_listen", "moqt_uri", "moqt_token_keys", "moqt_relay", "moqt_max_datagram_size",
    "moqt_max_connections_per_client", "moqt_drafts",
    "torch_tiers", "device_capacity_octets", "device", "fast_layers",
})


@dataclass(frozen=True, slots=True)
class HolderSettings:
    """Everything the holder reads from ``[holder]``, with descriptors loaded and keyed by compat_id."""

    index: str | tuple[str, ...] | None  # one IS base URI, or several (IndexClient fails over)
    descriptors: Mapping[bytes, CompatDescriptor]
    replica_ttl_ms: int = DEFAULT_REPLICA_TTL_MS
    retention_ms: int = DEFAULT_RETENTION_MS
    host_capacity_octets: int = DEFAULT_HOST_CAPACITY
    storage_dir: Path | None = None
    storage_capacity_octets: int = DEFAULT_STORAGE_CAPACITY
    encryption_key_file: Path | None = None
    verify_stored: bool = True
    withdraw_timeout_ms: int = DEFAULT_WITHDRAW_TIMEOUT_MS
    moqt: MoqtSettings | None = None
    torch_tiers: bool = False
    device_capacity_octets: int = 0
    device: str = "cuda"
    fast_layers: int = 0

    @classmethod
    def from_config(cls, config: RoleConfig) -> HolderSettings:
        """Validate ``config.section("holder")``; errors name the member as ``holder.<key>``."""
        section = dict(config.section("holder"))
        for name in section:
            if name not in KNOWN_KEYS:
                raise ValidationError(f"holder.{name}", f"unknown key; known: {sorted(KNOWN_KEYS)}")
        r = ObjectReader(section, "holder")
        index = r.optional("index", lambda n: parse_index_uris(r.raw(n), r.member(n)))
        storage = r.optional("storage_dir", lambda n: config.path(r.str(n, max_length=4096)))
        key_file = r.optional("encryption_key_file", lambda n: config.path(r.str(n, max_length=4096)))
        if storage is not None and key_file is None:
            key_file = config.path(DEFAULT_KEY_FILE)
        settings = cls(
            index=index,
            descriptors=_descriptors(r, config),
            replica_ttl_ms=_int(r, "replica_ttl_ms", DEFAULT_REPLICA_TTL_MS, minimum=3),
            retention_ms=_int(r, "retention_ms", DEFAULT_RETENTION_MS, minimum=1),
            host_capacity_octets=_int(r, "host_capacity_octets", DEFAULT_HOST_CAPACITY, minimum=0),
            storage_dir=storage,
            storage_capacity_octets=_int(r, "storage_capacity_octets", DEFAULT_STORAGE_CAPACITY, minimum=1),
            encryption_key_file=key_file,
            verify_stored=r.optional("verify_stored", r.bool) is not False,
            withdraw_timeout_ms=_int(r, "withdraw_timeout_ms", DEFAULT_WITHDRAW_TIMEOUT_MS, minimum=1),
            moqt=_moqt(r, config),
            torch_tiers=bool(r.optional("torch_tiers", r.bool)),
            device_capacity_octets=_int(r, "device_capacity_octets", 0, minimum=0),
            device=r.optional("device", lambda n: r.str(n, max_length=64)) or "cuda",
            fast_layers=_int(r, "fast_layers", 0, minimum=0),
        )
        if settings.host_capacity_octets == 0 and storage is None:
            raise ValidationError("holder", "needs a tier: host_capacity_octets > 0 or storage_dir")
        return settings


@dataclass(frozen=True, slots=True)
class MoqtSettings:
    """``moqt_listen``, ``moqt_uri`` and ``moqt_token_keys`` of ``[holder]`` (see docs/moqt.md)."""

    host: str
    port: int
    uri: str
    token_keys: tuple[Path, ...] = ()
    relay: str | None = None  # moqt_relay: publish through this (rack) relay; records then name it
    max_datagram_size: int = DEFAULT_MOQT_DATAGRAM_SIZE  # to non-loopback peers (loopback: 64 KiB)
    max_connections_per_client: int = DEFAULT_MOQT_CONNECTIONS_PER_CLIENT  # concurrent QUIC connections per IP
    drafts: tuple[int, ...] | None = None  # moqt_drafts: the MOQT drafts accepted (None: every one we speak)


def _moqt(r: ObjectReader, config: RoleConfig) -> MoqtSettings | None:
    listen = r.optional("moqt_listen", lambda n: r.str(n, max_length=300))
    uri = r.optional("moqt_uri", lambda n: r.str(n, max_length=2048))
    if listen is None and uri is None:
        for name in ("moqt_token_keys", "moqt_max_datagram_size", "moqt_max_connections_per_client", "moqt_drafts"):
            if r.has(name):
                raise ValidationError(f"holder.{name}", "needs moqt_listen and moqt_uri")
        return None
    if listen is None or uri is None:
        raise ValidationError("holder.moqt_listen", "moqt_listen and moqt_uri go together")
    host, sep, port = listen.rpartition(":")
    if not sep:
        raise ValidationError("holder.moqt_listen", "must be HOST:PORT")
    port_number = parse_decimal(port, "holder.moqt_listen", maximum=65535)
    try:
        MoqtUri.parse(uri)
    except ValueError as exc:
        raise ValidationError("holder.moqt_uri", str(exc)) from exc
    keys: list[Path] = []
    if r.has("moqt_token_keys"):
        for member, value in r.items("moqt_token_keys", max_items=64):
            if not isinstance(value, str):
                raise ValidationError(member, "must be a PEM public key file path")
            keys.append(config.path(value))
    config.moqt.check_listener("holder.moqt_token_keys", bool(keys))
    relay = r.optional("moqt_relay", lambda n: r.str(n, max_length=2048))
    if relay is not None:
        try:
            MoqtUri.parse(relay)
        except ValueError as exc:
            raise ValidationError("holder.moqt_relay", str(exc)) from exc
        config.moqt.check_dialler("holder.moqt_relay")
    datagram = r.optional("moqt_max_datagram_size",
                          lambda n: r.int(n, minimum=SMALLEST_MAX_DATAGRAM_SIZE, maximum=MAX_DATAGRAM_SIZE))
    cap = _int(r, "moqt_max_connections_per_client", DEFAULT_MOQT_CONNECTIONS_PER_CLIENT, minimum=1)
    return MoqtSettings(host.strip("[]") or "127.0.0.1", port_number, uri, tuple(keys), relay,
                        DEFAULT_MOQT_DATAGRAM_SIZE if datagram is None else datagram, cap,
                        read_drafts(r, "moqt_drafts", "holder"))


def _int(r: ObjectReader, name: str, default: int, *, minimum: int) -> int:
    value = r.optional(name, lambda n: r.int(n, minimum=minimum, maximum=MAX_SAFE_INT))
    return default if value is None else value


def _descriptors(r: ObjectReader, config: RoleConfig) -> dict[bytes, CompatDescriptor]:
    """Load each descriptor file; the holder stores only blocks of these Compatibility IDs."""
    out: dict[bytes, CompatDescriptor] = {}
    if not r.has("descriptors"):
        return out
    for member, value in r.items("descriptors", max_items=1024):
        if not isinstance(value, str):
            raise ValidationError(member, "must be a descriptor file path")
        path = config.path(value)
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise ValidationError(member, f"cannot read {path}: {exc.strerror}") from exc
        descriptor = CompatDescriptor.from_bytes(text)
        out[descriptor.compat_id] = descriptor
    return out
