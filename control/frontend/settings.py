"""The ``[frontend]`` table of a role configuration, validated once at start-up.

    [frontend]
    pc = "https://127.0.0.1:7401/pc/"      # required: the Placement Controller; a list names every PC
                                           # of an active/standby group (the front end follows the leader)
    listen = "127.0.0.1:8000"              # the public API (plain HTTP unless public_tls is set)
    public_tls = { cert = "fe-public.pem", key = "fe-public.key" }   # optional: HTTPS, no client certs
    model = "kvsp-test"                    # the name clients pass as "model"
    descriptor = "model.json"              # its Compatibility Descriptor (the compat_id of requests)
    tokenizer = "bytes"                    # "bytes" (UTF-8 octets as token ids) or a tokenizer.json file
    tenants = { public = "6d1c6481cd428737da312c089db3832a" }   # tenant name -> Scope ID (hex)
    api_keys = { acme = "acme.apikey" }    # optional: tenant -> file holding its bearer key
    anonymous_tenant = "public"            # optional: the tenant of requests without Authorization
    max_prompt_tokens = 8192
    max_tokens_limit = 4096                # the largest "max_tokens" accepted
    max_concurrent = 64                    # requests in flight; more get 429
    max_concurrent_per_tenant = 32         # of them, one tenant's (default: half of max_concurrent)
    max_concurrent_per_client = 16         # of them, one client address's (default: a quarter)
    max_connections_per_client = 256       # open connections to the public listener from one address
    body_limit_octets = 1048576
    stall_ms = 1000                        # no line for this long: ask the PC whether the owner changed
    request_timeout_ms = 300000            # one request, end to end
    stranded_retry_ms = 5000               # a session stranded this long without output is submitted again

The public listener has the timeouts of ``[server]`` (`kvsp.service.config.ListenerLimits`) and its own
per-address connection cap.  Unknown keys are refused.  Relative paths resolve against the configuration
file's folder.  API key files are read here and nowhere else; keys never appear in errors or logs.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final

from control.frontend.admission import Caps
from control.pc.endpoints import pc_uris
from kvsp.descriptor import CompatDescriptor
from kvsp.encoding import parse_hex
from kvsp.errors import KvspError, ValidationError
from kvsp.numbers import parse_decimal
from kvsp.reader import ObjectReader
from kvsp.records.base import MAX_SAFE_INT
from kvsp.service.config import RoleConfig

KNOWN_KEYS: Final = frozenset({
    "pc", "listen", "public_tls", "model", "descriptor", "tokenizer", "tenants", "api_keys", "anonymous_tenant",
    "max_prompt_tokens", "max_tokens_limit", "max_concurrent", "body_limit_octets", "stall_ms",
    "request_timeout_ms", "stranded_retry_ms", "max_concurrent_per_tenant", "max_concurrent_per_client",
    "max_connections_per_client",
})
MAX_TENANTS: Final = 1024
MAX_NAME: Final = 128
MIN_API_KEY_OCTETS: Final = 16


@dataclass(frozen=True, slots=True)
class PublicTls:
    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class FrontendSettings:
    pc: tuple[str, ...]  # every PC of the group
    host: str
    port: int
    model: str
    descriptor: CompatDescriptor
    tokenizer: str  # "bytes" or an absolute path to a tokenizer.json
    tenants: Mapping[str, bytes]  # name -> Scope ID
    api_keys: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}))  # tenant -> key
    anonymous_tenant: str | None = None
    public_tls: PublicTls | None = None
    max_prompt_tokens: int = 8192
    max_tokens_limit: int = 4096
    max_concurrent: int = 64
    body_limit_octets: int = 1 << 20
    stall_ms: int = 1000
    request_timeout_ms: int = 300_000
    stranded_retry_ms: int = 5000
    max_concurrent_per_tenant: int | None = None  # None: derived from max_concurrent (`Caps.derived`)
    max_concurrent_per_client: int | None = None
    max_connections_per_client: int = 256  # the public listener's cap; [server]'s is the mutual-TLS one's

    @property
    def caps(self) -> Caps:
        return Caps.derived(self.max_concurrent, self.max_concurrent_per_tenant, self.max_concurrent_per_client)

    def tenant_of_key(self, presented: bytes) -> str | None:
        """The tenant whose API key is ``presented`` (constant time per key)."""
        found = None
        for tenant, key in self.api_keys.items():
            if hmac.compare_digest(key, presented):
                found = tenant
        return found

    @classmethod
    def from_config(cls, config: RoleConfig) -> FrontendSettings:
        section = dict(config.section("frontend"))
        for name in section:
            if name not in KNOWN_KEYS:
                raise ValidationError(f"frontend.{name}", f"unknown key; known: {sorted(KNOWN_KEYS)}")
        r = ObjectReader(section, "frontend")
        host, port = _listen(r)
        tenants = _tenants(r)
        anonymous = r.optional("anonymous_tenant", lambda n: r.str(n, max_length=MAX_NAME))
        if anonymous is not None and anonymous not in tenants:
            raise ValidationError("frontend.anonymous_tenant", "must name one of the tenants")
        return cls(
            pc=pc_uris(r.raw("pc"), "frontend.pc"),
            host=host, port=port,
            model=r.optional("model", lambda n: r.str(n, max_length=MAX_NAME)) or "kvsp-test",
            descriptor=_descriptor(r, config),
            tokenizer=_tokenizer(r, config),
            tenants=MappingProxyType(tenants),
            api_keys=MappingProxyType(_api_keys(r, config, tenants)),
            anonymous_tenant=anonymous,
            public_tls=_public_tls(r, config),
            max_prompt_tokens=_int(r, "max_prompt_tokens", 8192),
            max_tokens_limit=_int(r, "max_tokens_limit", 4096),
            max_concurrent=_int(r, "max_concurrent", 64),
            body_limit_octets=_int(r, "body_limit_octets", 1 << 20),
            stall_ms=_int(r, "stall_ms", 1000),
            request_timeout_ms=_int(r, "request_timeout_ms", 300_000),
            stranded_retry_ms=_int(r, "stranded_retry_ms", 5000),
            max_concurrent_per_tenant=_optional_int(r, "max_concurrent_per_tenant"),
            max_concurrent_per_client=_optional_int(r, "max_concurrent_per_client"),
            max_connections_per_client=_int(r, "max_connections_per_client", 256),
        )


def _int(r: ObjectReader, name: str, default: int) -> int:
    value = _optional_int(r, name)
    return default if value is None else value


def _optional_int(r: ObjectReader, name: str) -> int | None:
    return r.optional(name, lambda n: r.int(n, minimum=1, maximum=MAX_SAFE_INT))


def _listen(r: ObjectReader) -> tuple[str, int]:
    text = r.optional("listen", lambda n: r.str(n, max_length=300)) or "127.0.0.1:8000"
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ValidationError("frontend.listen", "must be HOST:PORT")
    return host.strip("[]") or "127.0.0.1", parse_decimal(port, "frontend.listen", maximum=65535)


def _tenants(r: ObjectReader) -> dict[str, bytes]:
    raw = r.raw("tenants") if r.has("tenants") else None
    if not isinstance(raw, dict) or not raw or len(raw) > MAX_TENANTS:
        raise ValidationError("frontend.tenants", "must be a non-empty table of tenant name = Scope ID (hex)")
    out: dict[str, bytes] = {}
    for name, sid in raw.items():
        if not name or len(name) > MAX_NAME or not isinstance(sid, str):
            raise ValidationError(f"frontend.tenants.{name[:MAX_NAME]}", "must be a Scope ID in hex")
        out[name] = parse_hex(sid, 16, f"frontend.tenants.{name}")
    return out


def _api_keys(r: ObjectReader, config: RoleConfig, tenants: Mapping[str, bytes]) -> dict[str, bytes]:
    if not r.has("api_keys"):
        return {}
    raw = r.raw("api_keys")
    if not isinstance(raw, dict):
        raise ValidationError("frontend.api_keys", "must be a table of tenant = key file path")
    out: dict[str, bytes] = {}
    for tenant, path in raw.items():
        member = f"frontend.api_keys.{tenant[:MAX_NAME]}"
        if tenant not in tenants:
            raise ValidationError(member, "must name one of the tenants")
        if not isinstance(path, str) or not path:
            raise ValidationError(member, "must be a file path")
        try:
            key = config.path(path).read_bytes().strip()
        except OSError as exc:
            raise ValidationError(member, f"cannot read the key file ({exc.strerror})") from exc
        if len(key) < MIN_API_KEY_OCTETS:  # the key itself is never echoed
            raise ValidationError(member, f"the key must be at least {MIN_API_KEY_OCTETS} octets")
        out[tenant] = key
    return out


def _descriptor(r: ObjectReader, config: RoleConfig) -> CompatDescriptor:
    path = config.path(r.str("descriptor", max_length=4096))
    try:
        return CompatDescriptor.from_bytes(path.read_bytes())
    except OSError as exc:
        raise ValidationError("frontend.descriptor", f"cannot read {path} ({exc.strerror})") from exc
    except KvspError as exc:
        raise ValidationError("frontend.descriptor", f"{path}: {exc}") from exc


def _tokenizer(r: ObjectReader, config: RoleConfig) -> str:
    value = r.optional("tokenizer", lambda n: r.str(n, max_length=4096)) or "bytes"
    if value == "bytes":
        return value
    path = config.path(value)
    if not path.is_file():
        raise ValidationError("frontend.tokenizer", f"{path} is not a file (use \"bytes\" or a tokenizer.json)")
    return str(path)


def _public_tls(r: ObjectReader, config: RoleConfig) -> PublicTls | None:
    if not r.has("public_tls"):
        return None
    t = r.object("public_tls")
    return PublicTls(config.path(t.str("cert", max_length=4096)), config.path(t.str("key", max_length=4096)))
