"""Role configuration (decision D1): one TOML file per process, roles may be combined.

    roles = ["is", "holder"]
    policy = "policy.toml"            # D2; relative paths resolve against this file's folder

    [server]
    base_uri = "https://127.0.0.1:8443/kvsp/"   # the identity; must match the certificate URI SAN
    listen = "127.0.0.1:8443"                   # optional: defaults to the base URI's host and port
    header_timeout_ms = 10000                   # optional: the listener's limits (`ListenerLimits`)

    [tls]
    cert = "pki/h1.pem"
    key = "pki/h1.key"
    ca = "pki/ca.pem"

    [moqt]                             # optional: the QUIC back-end and token (kvsp/service/moqt_config.py)
    quic = "aioquic"

    [holder]                           # one table per role, read by that role
    ...
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

from kvsp.errors import ValidationError
from kvsp.identifiers import check_base_uri
from kvsp.numbers import parse_decimal
from kvsp.reader import ObjectReader
from kvsp.service.moqt_config import MoqtConfig, read_moqt
from kvsp.service.policy import Policy
from kvsp.service.tls import TlsFiles

KNOWN_ROLES = ("is", "holder", "pc", "instance", "relay", "frontend")
MAX_LIMIT = 1 << 31  # any larger timeout (about 25 days) or count is a typo, not a choice


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    """What one connection may take of a listener (control/listener, docs/hardening.md).

    Each is a ``[server]`` key of the same name.  The defaults are for production: a client that is
    merely slow gets through, one that trickles or holds connections open without progress does not.
    """

    handshake_timeout_ms: int = 10_000  # TCP accept to the end of the TLS handshake
    header_timeout_ms: int = 10_000  # a request's first octet (a new connection: its start) to its last header
    body_timeout_ms: int = 30_000  # the longest wait for the next body octet while the body is read
    body_min_octets_per_s: int = 1024  # past body_timeout_ms, a body must average at least this rate
    idle_timeout_ms: int = 75_000  # a kept-alive connection without a request
    send_timeout_ms: int = 60_000  # an answer the client does not read: no octet drained for this long
    # Concurrent connections from one client address; the next one is closed at once.  Generous for
    # roles: a front end keeps up to 512 connections to one instance, and on one host every role
    # connects from the same loopback address.  The public front end listener has its own (lower) cap.
    max_connections_per_client: int = 1024


LIMIT_KEYS = tuple(f.name for f in fields(ListenerLimits))
SERVER_KEYS = frozenset({"base_uri", "listen", *LIMIT_KEYS})


@dataclass(frozen=True, slots=True)
class ServerConfig:
    base_uri: str
    host: str
    port: int
    limits: ListenerLimits = ListenerLimits()

    @property
    def base_path(self) -> str:
        """The path prefix of every resource of this role (spec section 5: relative to the base URI)."""
        path = urlsplit(self.base_uri).path or "/"
        return path if path.endswith("/") else path + "/"


@dataclass(frozen=True, slots=True)
class RoleConfig:
    roles: tuple[str, ...]
    server: ServerConfig
    tls: TlsFiles | None
    policy: Policy
    base_dir: Path
    sections: Mapping[str, Mapping[str, object]] = field(default_factory=lambda: MappingProxyType({}))
    moqt: MoqtConfig = field(default_factory=MoqtConfig)

    def section(self, role: str) -> Mapping[str, object]:
        return self.sections.get(role, MappingProxyType({}))

    def path(self, value: str) -> Path:
        p = Path(value)
        return p if p.is_absolute() else self.base_dir / p

    @classmethod
    def load(cls, path: Path) -> RoleConfig:
        try:
            doc = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ValidationError(str(path), f"malformed TOML ({exc})") from exc
        return cls.from_mapping(doc, path.parent)

    @classmethod
    def from_mapping(cls, doc: Mapping[str, object], base_dir: Path) -> RoleConfig:
        roles = doc.get("roles")
        if not isinstance(roles, list) or not roles or not all(r in KNOWN_ROLES for r in roles):
            raise ValidationError("roles", f"must be a non-empty array of {list(KNOWN_ROLES)}")
        server = _server(doc.get("server"))
        tls = _tls(doc.get("tls"), base_dir)
        policy_path = doc.get("policy")
        if policy_path is None:
            policy = Policy()
        elif isinstance(policy_path, str):
            p = Path(policy_path)
            policy = Policy.load(p if p.is_absolute() else base_dir / p)
        else:
            raise ValidationError("policy", "must be a file path")
        sections = {name: MappingProxyType(dict(value)) for name, value in doc.items()
                    if name in KNOWN_ROLES and isinstance(value, dict)}
        return cls(tuple(roles), server, tls, policy, base_dir, MappingProxyType(sections),
                   read_moqt(doc.get("moqt"), base_dir))


def _server(value: object) -> ServerConfig:
    if not isinstance(value, dict) or not isinstance(value.get("base_uri"), str):
        raise ValidationError("server.base_uri", "is required")
    for name in value:
        if name not in SERVER_KEYS:
            raise ValidationError(f"server.{str(name)[:64]}", f"unknown key; known: {sorted(SERVER_KEYS)}")
    base = check_base_uri(value["base_uri"], "server.base_uri")
    parts = urlsplit(base)
    limits = listener_limits(ObjectReader(value, "server"))
    listen = value.get("listen")
    if listen is None:
        return ServerConfig(base, parts.hostname or "127.0.0.1", parts.port or 443, limits)
    if not isinstance(listen, str):
        raise ValidationError("server.listen", "must be HOST:PORT")
    host, sep, port = listen.rpartition(":")
    if not sep:
        raise ValidationError("server.listen", "must be HOST:PORT")
    return ServerConfig(base, host.strip("[]") or "127.0.0.1", parse_decimal(port, "server.listen", maximum=65535),
                        limits)


def listener_limits(r: ObjectReader) -> ListenerLimits:
    """The `ListenerLimits` keys present in ``r`` (positive integers), the others at their defaults."""
    given = {name: r.int(name, minimum=1, maximum=MAX_LIMIT) for name in LIMIT_KEYS if r.get(name) is not None}
    return replace(ListenerLimits(), **given)


def _tls(value: object, base_dir: Path) -> TlsFiles | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(value.get(k), str) for k in ("cert", "key", "ca")):
        raise ValidationError("tls", "must have cert, key and ca file paths")

    def resolve(name: str) -> Path:
        p = Path(value[name])
        return p if p.is_absolute() else base_dir / p

    return TlsFiles(resolve("cert"), resolve("key"), resolve("ca"))
