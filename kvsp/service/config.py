"""Role configuration (decision D1): one TOML file per process, roles may be combined.

    roles = ["is", "holder"]
    policy = "policy.toml"            # D2; relative paths resolve against this file's folder

    [server]
    base_uri = "https://127.0.0.1:8443/kvsp/"   # the identity; must match the certificate URI SAN
    listen = "127.0.0.1:8443"                   # optional: defaults to the base URI's host and port

    [tls]
    cert = "pki/h1.pem"
    key = "pki/h1.key"
    ca = "pki/ca.pem"

    [holder]                           # one table per role, read by that role
    ...
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

from kvsp.errors import ValidationError
from kvsp.identifiers import check_base_uri
from kvsp.numbers import parse_decimal
from kvsp.service.policy import Policy
from kvsp.service.tls import TlsFiles

KNOWN_ROLES = ("is", "holder", "pc", "instance", "relay", "frontend")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    base_uri: str
    host: str
    port: int

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
        return cls(tuple(roles), server, tls, policy, base_dir, MappingProxyType(sections))


def _server(value: object) -> ServerConfig:
    if not isinstance(value, dict) or not isinstance(value.get("base_uri"), str):
        raise ValidationError("server.base_uri", "is required")
    base = check_base_uri(value["base_uri"], "server.base_uri")
    parts = urlsplit(base)
    listen = value.get("listen")
    if listen is None:
        return ServerConfig(base, parts.hostname or "127.0.0.1", parts.port or 443)
    if not isinstance(listen, str):
        raise ValidationError("server.listen", "must be HOST:PORT")
    host, sep, port = listen.rpartition(":")
    if not sep:
        raise ValidationError("server.listen", "must be HOST:PORT")
    return ServerConfig(base, host.strip("[]") or "127.0.0.1", parse_decimal(port, "server.listen", maximum=65535))


def _tls(value: object, base_dir: Path) -> TlsFiles | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(value.get(k), str) for k in ("cert", "key", "ca")):
        raise ValidationError("tls", "must have cert, key and ca file paths")

    def resolve(name: str) -> Path:
        p = Path(value[name])
        return p if p.is_absolute() else base_dir / p

    return TlsFiles(resolve("cert"), resolve("key"), resolve("ca"))
