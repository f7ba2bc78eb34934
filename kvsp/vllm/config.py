"""The connector's TOML configuration (``kv_connector_extra_config = {"kvsp_config": "PATH.toml"}``).

Typed once at the boundary (style principle 4); docs/vllm.md lists every key.  Paths are relative to the
TOML file.  Scope Keys are read from their files here and never logged (decision D2).

    index = "https://127.0.0.1:8443/is/"       # the Index Service (section 6.2)
    store_to = ["https://127.0.0.1:9443/h1/"]  # holders the blocks vLLM computes are stored at (section 6.7)
    block_tokens = 32                          # KVSP B: a multiple of vLLM's block size
    descriptor = "model.json"                  # optional: refuse to start unless the model gives this compat_id
    default_scope = "tenant-a"                 # optional: the scope of a request that names none
    [tls]  cert = "vllm-a.pem"  key = "vllm-a.key"  ca = "ca.pem"
    [scopes.tenant-a]  key_file = "a.key"  cache_salts = ["tenant-a"]
    [moqt] fetch = true  relay = "moqt://127.0.0.1:4433/relay"
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvsp.descriptor import CompatDescriptor
from kvsp.errors import ValidationError
from kvsp.keys import ScopeKey
from kvsp.reader import ObjectReader
from kvsp.service.tls import TlsFiles

CONFIG_KEY = "kvsp_config"  # the member of kv_connector_extra_config that names the TOML file
SCOPE_PARAM = "kvsp_scope"  # kv_transfer_params member naming a request's scope


@dataclass(frozen=True, slots=True)
class ScopeConfig:
    name: str
    key: ScopeKey
    cache_salts: tuple[str, ...] = ()

    @property
    def scope_id(self) -> bytes:
        return self.key.scope_id


@dataclass(frozen=True, slots=True)
class MoqtConfig:
    fetch: bool = False
    relay: str | None = None  # moqt:// URI of the local relay: moqt replicas are read through it


@dataclass(frozen=True, slots=True)
class ConnectorConfig:
    """What one vLLM process's connector needs; `load_config` reads it."""

    index: str
    store_to: tuple[str, ...]
    tls: TlsFiles
    scopes: Mapping[str, ScopeConfig]
    block_tokens: int
    default_scope: str | None = None
    descriptor: CompatDescriptor | None = None
    model: str | None = None  # the model name in the descriptor (default: the config's kvsp_model, ...)
    model_dir: Path | None = None  # default: vLLM's model directory
    kv_dtype: str | None = None  # default: vLLM's KV cache dtype
    lookup_timeout_s: float = 2.0
    load_timeout_s: float = 10.0
    store_timeout_s: float = 10.0
    lease_ms: int | None = 10_000
    store: bool = True
    load: bool = True
    moqt: MoqtConfig = MoqtConfig()
    metrics_listen: str | None = None  # host:port for a plain Prometheus text endpoint (loopback only)
    source: Path | None = None  # the TOML file it was read from

    def scope_for(self, cache_salt: str | None, params: Mapping[str, object] | None) -> ScopeConfig | None:
        """The request's scope: ``kv_transfer_params["kvsp_scope"]``, else its ``cache_salt``, else the default.

        A request that names a scope this process has no key for gets none (no lookup, no store): it can
        never be served another tenant's blocks (section 4.2).
        """
        named = (params or {}).get(SCOPE_PARAM)
        if isinstance(named, str):
            return self.scopes.get(named)
        if cache_salt is not None:
            return next((s for s in self.scopes.values() if cache_salt in s.cache_salts), None)
        return self.scopes.get(self.default_scope) if self.default_scope is not None else None


def load_config(path: Path | str) -> ConnectorConfig:
    """Read and check the TOML file; raises `ValidationError` naming the member."""
    file = Path(path)
    try:
        raw = tomllib.loads(file.read_text())
    except OSError as exc:
        raise ValidationError("kvsp_config", f"cannot read {file}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ValidationError("kvsp_config", f"{file} is not TOML: {exc}") from exc
    return dataclasses.replace(parse_config(raw, file.parent), source=file)


def parse_config(raw: Mapping[str, object], base: Path) -> ConnectorConfig:
    r = ObjectReader(dict(raw))
    tls = ObjectReader(r.raw("tls"), "tls")
    files = TlsFiles(cert=base / tls.str("cert"), key=base / tls.str("key"), ca=base / tls.str("ca"))
    scopes = {name: _scope(name, ObjectReader(value, f"scopes.{name}"), base)
              for name, value in _table(r, "scopes").items()}
    default = r.optional("default_scope", r.str)
    if default is not None and default not in scopes:
        raise ValidationError("default_scope", f"names no scope of [scopes] ({sorted(scopes)})")
    block_tokens = r.int("block_tokens", minimum=1, maximum=1 << 20)
    descriptor = None
    if (name := r.optional("descriptor", r.str)) is not None:
        try:
            descriptor = CompatDescriptor.from_bytes((base / name).read_bytes())
        except OSError as exc:
            raise ValidationError("descriptor", f"cannot read {base / name}: {exc.strerror}") from exc
        if descriptor.block_tokens != block_tokens:
            raise ValidationError("descriptor", f"has block_tokens {descriptor.block_tokens}, not {block_tokens}")
    moqt = MoqtConfig()
    if r.has("moqt"):
        m = ObjectReader(r.raw("moqt"), "moqt")
        moqt = MoqtConfig(fetch=m.bool("fetch") if m.has("fetch") else False, relay=m.optional("relay", m.str))
    model_dir = r.optional("model_dir", r.str)
    lease_ms = r.optional("lease_ms", lambda n: r.int(n, minimum=0, maximum=3_600_000))
    return ConnectorConfig(
        index=r.str("index"),
        store_to=tuple(str(v) for _, v in r.items("store_to")) if r.has("store_to") else (),
        tls=files, scopes=scopes, block_tokens=block_tokens, default_scope=default, descriptor=descriptor,
        model=r.optional("model", r.str), model_dir=None if model_dir is None else base / model_dir,
        kv_dtype=r.optional("kv_dtype", r.str),
        lookup_timeout_s=_seconds(r, "lookup_timeout_s", 2.0), load_timeout_s=_seconds(r, "load_timeout_s", 10.0),
        store_timeout_s=_seconds(r, "store_timeout_s", 10.0),
        lease_ms=None if lease_ms == 0 else (10_000 if lease_ms is None else lease_ms),
        store=r.bool("store") if r.has("store") else True, load=r.bool("load") if r.has("load") else True,
        moqt=moqt, metrics_listen=r.optional("metrics_listen", r.str))


def _table(r: ObjectReader, name: str) -> dict[str, object]:
    value = r.raw(name) if r.has(name) else {}
    if not isinstance(value, dict):
        raise ValidationError(name, "must be a table")
    return value


def _seconds(r: ObjectReader, name: str, default: float) -> float:
    return r.number(name, minimum=0.001, maximum=3600.0) if r.has(name) else default


def _scope(name: str, r: ObjectReader, base: Path) -> ScopeConfig:
    path = base / r.str("key_file")
    try:
        key = ScopeKey.from_hex(path.read_text().strip())
    except OSError as exc:
        raise ValidationError(r.member("key_file"), f"cannot read {path}: {exc.strerror}") from exc
    if r.has("scope_id") and r.hex("scope_id", 16) != key.scope_id:
        raise ValidationError(r.member("scope_id"), "the key in the file belongs to another scope")
    salts = tuple(str(v) for _, v in r.items("cache_salts")) if r.has("cache_salts") else ()
    return ScopeConfig(name, key, salts)
