"""The ``[pc]`` table of a role configuration, validated once at start-up into a frozen record.

    [pc]
    index = "https://127.0.0.1:7401/pc/"   # the IS; default: this process when it also runs "is"
                                           #   (or an array of IS base URIs: failed over in order)
    scope_keys = { "6d1c6481cd428737da312c089db3832a" = "scope.key" }   # files: hex, >= 32 octets
    descriptors = ["model.json"]           # Compatibility Descriptors the PC places requests for
    min_active = 1                         # sleep policy: a sleep request keeps this many others active
    status_check_interval_ms = 250         # how often expiry, reshard deadlines and retries are checked
    mean_service_ms = 0.0                  # mean service time per queued request (wait_us of section 6.4)
    call_timeout_ms = 5000                 # bound on every call to an instance or the IS
    resume_timeout_ms = 15000              # bound on a resume: > the instance's load_timeout_ms (it loads first)
    reshard_deadline_ms = 2000             # deadline_ms of reshard plans (POST maps/{map} may override)
    operators = ["https://ops.example/"]   # identities besides the PC's own that may POST maps/{map}
    instances = ["https://ii1.example/"]   # optional: only these of the policy's instances (D2) are admitted
    deterministic_methods = ["greedy"]     # samplers whose output every eligible instance reproduces
    backend = "memory"                     # or "redis": state in Redis, PC processes active/standby
    lease_ttl_ms = 2000                    # backend = "redis": the leader lease (renewed every ttl/3)
    [pc.redis]                             # backend = "redis" (control/backend.py): url, cluster, password_file,
    url = "redis://127.0.0.1:6379/0"       # username, ca, cert, key, timeout_ms, key_prefix

Which identities are instances is the policy's ``instances`` (D2); ``[pc] instances`` can only narrow
it, so a PC configuration never admits an identity the policy does not name.  Unknown keys are
refused, so that a misspelt key fails at start-up instead of silently taking the default.  Relative
paths resolve against the configuration file's folder.  A Scope Key file is read
here and nowhere else; its contents never appear in an error message or a log line (decision D2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from control.backend import BackendConfig, backend_of
from control.index.settings import parse_index_uris
from kvsp.descriptor import CompatDescriptor
from kvsp.encoding import parse_hex
from kvsp.errors import KvspError, ValidationError
from kvsp.keys import ScopeKey
from kvsp.reader import ObjectReader
from kvsp.records.base import MAX_SAFE_INT, check_uri
from kvsp.records.session import MAX_PARAM_STRING
from kvsp.service.config import RoleConfig

DEFAULT_CHECK_INTERVAL_MS: Final = 250
DEFAULT_CALL_TIMEOUT_MS: Final = 5_000
# An instance answers a resume only after loading the checkpoint's prompt blocks, bounded by its
# ``load_timeout_ms`` (10 s by default) plus about a second of lookup: the PC waits longer than that.
DEFAULT_RESUME_TIMEOUT_MS: Final = 15_000
DEFAULT_RESHARD_DEADLINE_MS: Final = 2_000
DEFAULT_LEASE_TTL_MS: Final = 2_000
MIN_LEASE_TTL_MS: Final = 30  # a renewal goes out every ttl/3: shorter would be all renewals
MAX_LIST: Final = 1024
KNOWN_KEYS: Final = frozenset({
    "index", "scope_keys", "descriptors", "min_active", "status_check_interval_ms", "mean_service_ms",
    "call_timeout_ms", "resume_timeout_ms", "reshard_deadline_ms", "operators", "instances",
    "deterministic_methods", "backend", "redis", "lease_ttl_ms",
})
IDENTITY_SCHEMES: Final = frozenset({"https", "moqt"})
EMBEDDED: Final = BackendConfig()  # backend = "memory"


@dataclass(frozen=True, slots=True)
class PcSettings:
    """Everything the PC reads from ``[pc]``, with keys and descriptors loaded."""

    index: str | tuple[str, ...] | None  # one IS base URI, or several (IndexClient fails over)
    scope_keys: Mapping[bytes, ScopeKey] = field(default_factory=lambda: MappingProxyType({}))
    descriptors: Mapping[bytes, CompatDescriptor] = field(default_factory=lambda: MappingProxyType({}))
    min_active: int = 1
    status_check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS
    mean_service_ms: float = 0.0
    call_timeout_ms: int = DEFAULT_CALL_TIMEOUT_MS
    resume_timeout_ms: int = DEFAULT_RESUME_TIMEOUT_MS
    reshard_deadline_ms: int = DEFAULT_RESHARD_DEADLINE_MS
    operators: frozenset[str] = frozenset()
    instances: frozenset[str] | None = None
    deterministic_methods: frozenset[str] = frozenset({"greedy"})
    backend: BackendConfig = EMBEDDED
    lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS

    @property
    def check_interval_s(self) -> float:
        return self.status_check_interval_ms / 1000

    @property
    def call_timeout_s(self) -> float:
        return self.call_timeout_ms / 1000

    @property
    def resume_timeout_s(self) -> float:
        return self.resume_timeout_ms / 1000

    @classmethod
    def from_config(cls, config: RoleConfig) -> PcSettings:
        """Validate ``config.section("pc")``; errors name the member as ``pc.<key>``."""
        section = dict(config.section("pc"))
        for name in section:
            if name not in KNOWN_KEYS:
                raise ValidationError(f"pc.{name}", f"unknown key; known: {sorted(KNOWN_KEYS)}")
        r = ObjectReader(section, "pc")
        index = r.optional("index", lambda n: parse_index_uris(r.raw(n), r.member(n)))
        if index is None and "is" in config.roles:
            index = config.server.base_uri  # combined PC + IS: look up at ourselves
        instances = r.optional("instances", lambda n: _identities(r, n))
        return cls(
            index=index,
            scope_keys=MappingProxyType(_scope_keys(r, config)),
            descriptors=MappingProxyType(_descriptors(r, config)),
            min_active=_int(r, "min_active", 1, minimum=0),
            status_check_interval_ms=_int(r, "status_check_interval_ms", DEFAULT_CHECK_INTERVAL_MS, minimum=1),
            mean_service_ms=r.optional("mean_service_ms", lambda n: r.number(n, maximum=1e9)) or 0.0,
            call_timeout_ms=_int(r, "call_timeout_ms", DEFAULT_CALL_TIMEOUT_MS, minimum=1),
            resume_timeout_ms=_int(r, "resume_timeout_ms", DEFAULT_RESUME_TIMEOUT_MS, minimum=1),
            reshard_deadline_ms=_int(r, "reshard_deadline_ms", DEFAULT_RESHARD_DEADLINE_MS, minimum=1),
            operators=r.optional("operators", lambda n: _identities(r, n)) or frozenset(),
            instances=instances,
            deterministic_methods=r.optional("deterministic_methods", lambda n: _names(r, n))
            or frozenset({"greedy"}),
            backend=backend_of(section, "pc", config.base_dir),
            lease_ttl_ms=_int(r, "lease_ttl_ms", DEFAULT_LEASE_TTL_MS, minimum=MIN_LEASE_TTL_MS),
        )


def _int(r: ObjectReader, name: str, default: int, *, minimum: int) -> int:
    value = r.optional(name, lambda n: r.int(n, minimum=minimum, maximum=MAX_SAFE_INT))
    return default if value is None else value


def _identities(r: ObjectReader, name: str) -> frozenset[str]:
    return frozenset(check_uri(v, p, IDENTITY_SCHEMES) for p, v in r.items(name, max_items=MAX_LIST))


def _names(r: ObjectReader, name: str) -> frozenset[str]:
    out: set[str] = set()
    for member, value in r.items(name, max_items=MAX_LIST):
        if not isinstance(value, str) or not value or len(value) > MAX_PARAM_STRING:
            raise ValidationError(member, "must be a sampler method name")
        out.add(value)
    return frozenset(out)


def _scope_keys(r: ObjectReader, config: RoleConfig) -> dict[bytes, ScopeKey]:
    """``{scope_id_hex: key file}``; each file holds the key in hex, and must match its scope ID."""
    if not r.has("scope_keys"):
        return {}
    table = r.raw("scope_keys")
    if not isinstance(table, dict):
        raise ValidationError("pc.scope_keys", "must be a table of scope_id = key file path")
    out: dict[bytes, ScopeKey] = {}
    for sid_hex, path_value in table.items():
        member = f"pc.scope_keys.{sid_hex}"
        sid = parse_hex(sid_hex, 16, member)
        if not isinstance(path_value, str) or not path_value:
            raise ValidationError(member, "must be a key file path")
        path = config.path(path_value)
        try:
            text = path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            raise ValidationError(member, f"cannot read the key file {path}") from None
        try:
            key = ScopeKey.from_hex(text)
        except ValidationError as exc:
            raise ValidationError(member, f"{path}: {exc.rule}") from None
        if key.scope_id != sid:
            raise ValidationError(member, f"the key in {path} belongs to scope {key.scope_id.hex()}")
        out[sid] = key
    return out


def _descriptors(r: ObjectReader, config: RoleConfig) -> dict[bytes, CompatDescriptor]:
    out: dict[bytes, CompatDescriptor] = {}
    if not r.has("descriptors"):
        return out
    for member, value in r.items("descriptors", max_items=MAX_LIST):
        if not isinstance(value, str):
            raise ValidationError(member, "must be a descriptor file path")
        path = config.path(value)
        try:
            descriptor = CompatDescriptor.from_bytes(path.read_bytes())
        except OSError as exc:
            raise ValidationError(member, f"cannot read {path}: {exc.strerror}") from exc
        except KvspError as exc:
            raise ValidationError(member, f"{path} is not a valid descriptor ({exc})") from exc
        out[descriptor.compat_id] = descriptor
    return out
