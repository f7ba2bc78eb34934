"""Helpers for loopback tests with real mutual TLS: a dev PKI made at test time and role servers."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from kvsp.service.config import RoleConfig, ServerConfig
from kvsp.service.policy import Policy
from control.serve import serving
from kvsp.service.tls import TlsFiles, client_context
from kvsp.client.http import KvspSession
from kvsp.pki import RoleSpec, make_dev_pki


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class DevPki:
    """A CA and certificates for named roles; ``uri(name)`` is the role's identity."""

    dir: Path
    uris: dict[str, str]

    @classmethod
    def make(cls, directory: Path, names: list[str]) -> DevPki:
        uris = {name: f"https://127.0.0.1:{free_port()}/{name}/" for name in names}
        make_dev_pki(directory, [RoleSpec(n, u) for n, u in uris.items()])
        return cls(directory, uris)

    def add(self, name: str, uri: str | None = None) -> str:
        uri = uri or f"https://127.0.0.1:{free_port()}/{name}/"
        make_dev_pki(self.dir, [RoleSpec(name, uri)])
        self.uris[name] = uri
        return uri

    def uri(self, name: str) -> str:
        return self.uris[name]

    def files(self, name: str) -> TlsFiles:
        return TlsFiles(self.dir / f"{name}.pem", self.dir / f"{name}.key", self.dir / "ca.pem")

    def client_ssl(self, name: str) -> ssl.SSLContext:
        return client_context(self.files(name))

    def session(self, name: str) -> KvspSession:
        return KvspSession(self.client_ssl(name))


def role_config(pki: DevPki, name: str, roles: tuple[str, ...], policy: Policy,
                sections: dict[str, dict[str, object]] | None = None, base_dir: Path | None = None) -> RoleConfig:
    uri = pki.uri(name)
    port = int(uri.split(":")[2].split("/")[0])
    return RoleConfig(roles, ServerConfig(uri, "127.0.0.1", port), pki.files(name), policy,
                      base_dir or pki.dir, {k: dict(v) for k, v in (sections or {}).items()})


def running(config: RoleConfig, *, clock: Callable[[], float] | None = None,
            app: web.Application | None = None) -> AbstractAsyncContextManager[web.Application]:
    """Serve ``config``'s roles over mutual TLS on loopback for the duration of the block."""
    return serving(config, clock=clock or time.monotonic, app=app)


class FakeClock:
    """An injectable monotonic clock (seconds) for expiry tests without sleeps."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
