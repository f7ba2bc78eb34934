"""The ``[instance]`` table of a role configuration, validated once into a frozen record.

    [instance]
    pc = "https://127.0.0.1:7401/pc/"        # the PC: status, checkpoints (required); a list names every PC
                                             # of an active/standby group (the instance follows the leader)
    index = "https://127.0.0.1:7401/pc/"     # the IS: lookups before loading (required; or an array of
                                             # IS base URIs, tried in order)
    engine = "test"                          # DeterministicTestEngine; "hf:DIR" the reference HF model in DIR
    vocab_size = 32000                       # the test engine's vocabulary
    descriptors = ["model.json"]             # the one model served; absent: [holder] descriptors
    scope_keys = { "6d1c..." = "scope.key" } # Scope ID -> file with the hex Scope Key (>= 32 octets)
    status_ttl_ms = 3000                     # ttl_ms of status records, sent every ttl/3
    max_sessions = 64                        # admitted sessions (running + queued) at most
    batch_size = 8                           # sessions generating at once; the rest queue
    max_tokens_limit = 65536                 # the largest max_tokens accepted
    default_resume_max_tokens = 4096         # budget of a resume body without "max_tokens"
    release_batch = 1                        # non-deterministic sampler: tokens per checkpoint
    checkpoint_every = 64                    # at least every this many output tokens
    max_unreleased = 256                     # generation waits when this many tokens await an ack
    kv_capacity_tokens = 1048576             # for kv_utilization
    pc_timeout_ms = 5000                     # one status or checkpoint PUT
    load_timeout_ms = 10000                  # loading cached blocks for start / resume
    final_ack_timeout_ms = 30000             # waiting for the last checkpoint's ack
    finished_retention_ms = 300000           # a finished session's tokens stay readable this long
    prefetch_concurrency = 4                 # blocks loaded at once per directive
    fetch_concurrency = 8                    # blocks loaded at once when a session starts or resumes
    replicate_to = []                        # holders that also get every placed block (survival)
    peers = []                               # identities that may GET shards/{map} ("*": any)
    links = [{ holder = "https://h1/", mbit_per_s = 100000, rtt_us = 20 }]  # reported in status (6.4)
    memory_blocks_octets = 268435456         # block cache when no holder role runs in the process
    idle_for_s = 300.0                       # idle this long before asking to sleep
    max_maps = 64                            # shard maps held at once
    test_prefill_us_per_token = 0            # engine = "test": artificial cost per prefilled token
    test_decode_us_per_token = 0             # engine = "test": artificial cost per decoded token
    hf_chunk_tokens = 0                      # engine = "hf:DIR": compute prompts in chunks of this many tokens
                                             # (a multiple of block_tokens; 0: one pass). block_tokens makes a
                                             # loaded prefix give bit-identical logits to a full recompute
    layerwise = "auto"                       # true: load the cached prefix layer by layer, overlapped with
                                             # prefill; false: load, then prefill; "auto": overlap when there
                                             # is something to overlap (docs/instance.md)
    moqt_fetch = false                       # read moqt:// replicas over MOQT (certificate of [tls]), else HTTPS
    moqt_object_timeout_ms = 10000           # MOQT: the longest wait for one object (a stalled publisher)
    moqt_drafts = [16, 14]                   # optional, with moqt_fetch: MOQT drafts offered (default: every one)
    moqt_relay = "moqt://127.0.0.1:4443/relay"  # optional, with moqt_fetch: the own rack's relay; every moqt
                                             # replica is read through it (decision D4)
    publish_live = false                     # prefill: publish computed blocks layer by layer over the
                                             # holder's MOQT listener while later layers are computed

Unknown keys are refused, like the holder's, so a misspelt key fails at startup.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Final

from control.index.settings import parse_index_uris
from control.pc.endpoints import pc_uris
from kvsp.descriptor import CompatDescriptor
from kvsp.encoding import parse_hex
from kvsp.errors import ValidationError
from kvsp.keys import ScopeKey
from kvsp.reader import ObjectReader
from kvsp.records import Link
from kvsp.records.base import MAX_SAFE_INT, check_uri
from kvsp.service.config import RoleConfig
from kvsp.service.moqt_config import read_drafts
from kvsp.service.policy import ANY
from moqt.quic import MoqtUri

TEST_ENGINE: Final = "test"
HF_PREFIX: Final = "hf:"  # "hf:DIR": the Hugging Face adapter on the model directory DIR


@dataclass(frozen=True, slots=True)
class Limits:
    """The integer settings, with their defaults (minimums in `_MINIMUM`)."""

    vocab_size: int = 32_000
    status_ttl_ms: int = 3_000
    max_sessions: int = 64
    batch_size: int = 8
    max_tokens_limit: int = 65_536
    default_resume_max_tokens: int = 4_096
    release_batch: int = 1
    checkpoint_every: int = 64
    max_unreleased: int = 256
    kv_capacity_tokens: int = 1 << 20
    pc_timeout_ms: int = 5_000
    load_timeout_ms: int = 10_000
    final_ack_timeout_ms: int = 30_000
    finished_retention_ms: int = 300_000
    prefetch_concurrency: int = 4
    memory_blocks_octets: int = 256 << 20
    max_maps: int = 64
    test_prefill_us_per_token: int = 0
    test_decode_us_per_token: int = 0
    moqt_object_timeout_ms: int = 10_000
    fetch_concurrency: int = 8
    hf_chunk_tokens: int = 0


_MINIMUM: Final[Mapping[str, int]] = {"vocab_size": 2, "status_ttl_ms": 3, "finished_retention_ms": 0,
                                      "memory_blocks_octets": 0, "test_prefill_us_per_token": 0,
                                      "test_decode_us_per_token": 0, "hf_chunk_tokens": 0}
_INTS: Final = tuple(f.name for f in fields(Limits))
_FLAGS: Final = ("moqt_fetch", "publish_live")
KNOWN_KEYS: Final = frozenset({"pc", "index", "engine", "descriptors", "scope_keys", "replicate_to", "peers",
                               "idle_for_s", "links", "moqt_relay", "moqt_drafts", "layerwise", *_FLAGS,
                               *_INTS})
MAX_LINKS: Final = 256


class Layerwise(StrEnum):
    """``layerwise``: overlap loading the cached prefix with the prefill always, never, or when it can pay."""

    ON = "on"
    OFF = "off"
    AUTO = "auto"


def _layerwise(r: ObjectReader) -> Layerwise:
    value = r.optional("layerwise", r.raw)
    if value is None:
        return Layerwise.AUTO
    if isinstance(value, bool):
        return Layerwise.ON if value else Layerwise.OFF
    if value != Layerwise.AUTO.value:
        raise ValidationError(r.member("layerwise"), 'must be true, false or "auto"')
    return Layerwise.AUTO


@dataclass(frozen=True, slots=True)
class InstanceSettings:
    """Everything the instance reads from ``[instance]`` (see the module docstring for defaults)."""

    pc: tuple[str, ...]  # every PC of the group, the one to try first first
    index: str | tuple[str, ...]  # one IS base URI, or several to fail over between
    descriptor: CompatDescriptor
    scope_keys: Mapping[bytes, ScopeKey]
    engine: str = "test"
    replicate_to: tuple[str, ...] = ()
    peers: frozenset[str] = frozenset()
    idle_for_s: float = 300.0
    links: tuple[Link, ...] = ()
    limits: Limits = Limits()
    layerwise: Layerwise = Layerwise.AUTO
    moqt_fetch: bool = False
    publish_live: bool = False
    moqt_relay: str | None = None
    moqt_drafts: tuple[int, ...] | None = None  # None: offer every draft this build speaks, newest first

    def may_read_shards(self, identity: str) -> bool:
        return identity in self.peers or ANY in self.peers

    @classmethod
    def from_config(cls, config: RoleConfig) -> InstanceSettings:
        """Validate ``config.section("instance")``; errors name the member as ``instance.<key>``."""
        section = dict(config.section("instance"))
        for name in section:
            if name not in KNOWN_KEYS:
                raise ValidationError(f"instance.{name}", f"unknown key; known: {sorted(KNOWN_KEYS)}")
        r = ObjectReader(section, "instance")
        defaults = Limits()
        ints = {name: _int(r, name, getattr(defaults, name), _MINIMUM.get(name, 1)) for name in _INTS}
        engine = _engine(r, config)
        flags = {name: r.optional(name, r.bool) for name in _FLAGS}
        idle = r.optional("idle_for_s", lambda n: r.number(n, minimum=0.0, maximum=1e9))
        return cls(
            pc=pc_uris(r.raw("pc"), r.member("pc")),
            index=parse_index_uris(r.raw("index"), r.member("index")),
            descriptor=_descriptor(r, config),
            scope_keys=_scope_keys(r, config),
            engine=engine,
            replicate_to=_uris(r, "replicate_to"),
            peers=frozenset(_identities(r, "peers")),
            idle_for_s=300.0 if idle is None else idle,
            links=_links(r),
            limits=Limits(**ints),
            layerwise=_layerwise(r),
            moqt_fetch=flags["moqt_fetch"] is True,
            publish_live=flags["publish_live"] is True,
            moqt_relay=_moqt_relay(r, flags["moqt_fetch"] is True),
            moqt_drafts=_moqt_drafts(r, flags["moqt_fetch"] is True),
        )


def _moqt_drafts(r: ObjectReader, moqt_fetch: bool) -> tuple[int, ...] | None:
    if r.has("moqt_drafts") and not moqt_fetch:
        raise ValidationError(r.member("moqt_drafts"), "needs moqt_fetch = true")
    return read_drafts(r, "moqt_drafts", "instance")


def _moqt_relay(r: ObjectReader, moqt_fetch: bool) -> str | None:
    uri = r.optional("moqt_relay", lambda n: r.str(n, max_length=2048))
    if uri is None:
        return None
    if not moqt_fetch:
        raise ValidationError(r.member("moqt_relay"), "needs moqt_fetch = true (the relay is reached over MOQT)")
    try:
        MoqtUri.parse(uri)
    except ValueError as exc:
        raise ValidationError(r.member("moqt_relay"), str(exc)) from exc
    return uri


def _engine(r: ObjectReader, config: RoleConfig) -> str:
    """``test``, or ``hf:DIR`` with DIR resolved against the configuration's directory."""
    name = r.optional("engine", lambda n: r.str(n, max_length=4096))
    if name is None or name == TEST_ENGINE:
        return TEST_ENGINE
    if not name.startswith(HF_PREFIX) or len(name) == len(HF_PREFIX):
        raise ValidationError(r.member("engine"), f'must be "{TEST_ENGINE}" or "{HF_PREFIX}DIR"')
    directory = config.path(name[len(HF_PREFIX) :])
    if not (directory / "config.json").is_file():
        raise ValidationError(r.member("engine"), f"{directory} is not a model directory (no config.json)")
    return HF_PREFIX + str(directory)


def _int(r: ObjectReader, name: str, default: int, minimum: int) -> int:
    value = r.optional(name, lambda n: r.int(n, minimum=minimum, maximum=MAX_SAFE_INT))
    return default if value is None else value


def _uris(r: ObjectReader, name: str) -> tuple[str, ...]:
    if not r.has(name):
        return ()
    return tuple(check_uri(v, p) for p, v in r.items(name, max_items=64))


def _links(r: ObjectReader) -> tuple[Link, ...]:
    """The paths to holders the status reports (section 6.4 prices fetches only over reported links)."""
    if not r.has("links"):
        return ()
    return tuple(Link.from_reader(item) for item in r.objects("links", max_items=MAX_LINKS))


def _identities(r: ObjectReader, name: str) -> tuple[str, ...]:
    if not r.has(name):
        return ()
    return tuple(v if v == ANY else check_uri(v, p) for p, v in r.items(name, max_items=4096))


def _read_descriptor(member: str, path_text: object, config: RoleConfig) -> CompatDescriptor:
    if not isinstance(path_text, str):
        raise ValidationError(member, "must be a descriptor file path")
    path = config.path(path_text)
    try:
        return CompatDescriptor.from_bytes(path.read_bytes())
    except OSError as exc:
        raise ValidationError(member, f"cannot read {path}: {exc.strerror}") from exc


def _descriptor(r: ObjectReader, config: RoleConfig) -> CompatDescriptor:
    """The one model this instance serves: ``[instance] descriptors``, else the holder's list."""
    if r.has("descriptors"):
        items = list(r.items("descriptors", max_items=1, nonempty=True))
    else:
        holder = ObjectReader(dict(config.section("holder")), "holder")
        if not holder.has("descriptors"):
            raise ValidationError("instance.descriptors", "is required (or [holder] descriptors with one entry)")
        items = list(holder.items("descriptors", max_items=1024, nonempty=True))
        if len(items) != 1:
            raise ValidationError("instance.descriptors", "is required when [holder] lists several models")
    member, value = items[0]
    return _read_descriptor(member, value, config)


def _scope_keys(r: ObjectReader, config: RoleConfig) -> dict[bytes, ScopeKey]:
    """Scope ID -> Scope Key, each read from its file (hex) and checked against its ID."""
    if not r.has("scope_keys"):
        return {}
    table = r.raw("scope_keys")
    if not isinstance(table, dict):
        raise ValidationError(r.member("scope_keys"), "must be a table of scope_id = key file")
    out: dict[bytes, ScopeKey] = {}
    for sid_hex, file in table.items():
        member = f"{r.member('scope_keys')}.{sid_hex}"
        sid = parse_hex(sid_hex, 16, member)
        if not isinstance(file, str):
            raise ValidationError(member, "must be a key file path")
        path = config.path(file)
        try:
            key = ScopeKey.from_hex(path.read_text().strip())
        except OSError as exc:
            raise ValidationError(member, f"cannot read {path}: {exc.strerror}") from exc
        if key.scope_id != sid:
            raise ValidationError(member, "the key in the file belongs to another scope")
        out[sid] = key
    return out
