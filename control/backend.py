"""Where a role keeps its shared state (decision D7): ``memory`` (the embedded default) or Redis.

A role's TOML section names it with ``backend``; a Redis back-end has its own table::

    [is]
    backend = "redis"                 # or "memory" (default)
    [is.redis]
    url = "redis://127.0.0.1:6379/0"  # rediss:// for TLS; for a cluster, any node's URL
    cluster = false                   # true: Redis Cluster (keys partitioned over the slots)
    password_file = "redis.pass"      # optional; the password never sits in the TOML
    username = "kvsp"                 # optional (Redis ACL user)
    ca = "redis-ca.pem"               # optional, rediss:// only: CA of the server's certificate
    cert = "me.pem"  key = "me.key"   # optional, rediss:// only: client certificate (mutual TLS)
    timeout_ms = 500                  # per command: an unreachable Redis is an error within this bound
    key_prefix = "kvsp:"              # namespace of every key this role writes

Typed once here (style principle 4); `connect` makes the redis-py asyncio client.  Paths resolve
against the role's config folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import urlsplit

from kvsp.errors import ValidationError
from kvsp.reader import ObjectReader

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

BACKENDS: Final = ("memory", "redis")
Backend = Literal["memory", "redis"]


@dataclass(frozen=True, slots=True)
class RedisConfig:
    url: str
    cluster: bool = False
    password: str | None = None
    username: str | None = None
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    timeout_ms: int = 500
    key_prefix: str = "kvsp:"

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "rediss"


@dataclass(frozen=True, slots=True)
class BackendConfig:
    kind: Backend = "memory"
    redis: RedisConfig | None = None


def backend_of(section: Mapping[str, object], where: str, base_dir: Path) -> BackendConfig:
    """``backend`` and ``redis`` of a role section (``where`` names it in errors, e.g. ``"is"``)."""
    kind = section.get("backend", "memory")
    if kind not in BACKENDS:
        raise ValidationError(f"{where}.backend", f"must be one of {list(BACKENDS)}")
    if kind == "memory":
        if "redis" in section:
            raise ValidationError(f"{where}.redis", 'is only read with backend = "redis"')
        return BackendConfig()
    raw = section.get("redis")
    if not isinstance(raw, dict):
        raise ValidationError(f"{where}.redis", 'backend = "redis" needs a [redis] table with a url')
    return BackendConfig("redis", redis_config(raw, f"{where}.redis", base_dir))


def redis_config(raw: Mapping[str, object], where: str, base_dir: Path) -> RedisConfig:
    r = ObjectReader(dict(raw), where)
    url = r.str("url")
    scheme = urlsplit(url).scheme
    if scheme not in ("redis", "rediss"):
        raise ValidationError(r.member("url"), "must be a redis:// or rediss:// URL")
    password = None
    if (name := r.optional("password_file", r.str)) is not None:
        path = base_dir / name
        try:
            password = path.read_text().strip()
        except OSError as exc:
            raise ValidationError(r.member("password_file"), f"cannot read {path}: {exc.strerror}") from exc
    files = {n: base_dir / v for n in ("ca", "cert", "key") if (v := r.optional(n, r.str)) is not None}
    if files and scheme != "rediss":
        raise ValidationError(r.member(next(iter(files))), "TLS files need a rediss:// URL")
    if ("cert" in files) != ("key" in files):
        raise ValidationError(r.member("cert"), "cert and key go together")
    timeout = r.int("timeout_ms", minimum=1, maximum=60_000) if r.has("timeout_ms") else 500
    return RedisConfig(url=url, cluster=r.bool("cluster") if r.has("cluster") else False, password=password,
                       username=r.optional("username", r.str), ca=files.get("ca"), cert=files.get("cert"),
                       key=files.get("key"), timeout_ms=timeout,
                       key_prefix=r.optional("key_prefix", r.str) or "kvsp:")


def connect(config: RedisConfig) -> Redis | RedisCluster:
    """The redis-py asyncio client for ``config`` (no I/O until the first command)."""
    from redis.asyncio import Redis  # noqa: PLC0415 - redis-py only for roles that use it
    from redis.asyncio.cluster import RedisCluster  # noqa: PLC0415 - as above

    timeout = config.timeout_ms / 1000
    options: dict[str, Any] = {"password": config.password, "username": config.username,
                                  "socket_timeout": timeout, "socket_connect_timeout": timeout}
    if config.tls:
        options.update(ssl_ca_certs=None if config.ca is None else str(config.ca),
                       ssl_certfile=None if config.cert is None else str(config.cert),
                       ssl_keyfile=None if config.key is None else str(config.key), ssl_min_version=None)
    if config.cluster:
        return RedisCluster.from_url(config.url, **options)
    client: Redis = Redis.from_url(config.url, **options)
    return client
