"""A dev PKI of named roles on loopback (decision D1), made with `kvsp.pki`, with clients by identity."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from control.deploy.ports import free_port, port_of
from kvsp.client.http import KvspSession
from kvsp.pki import RoleSpec, make_dev_pki
from kvsp.service.tls import TlsFiles, client_context


def loopback_uri(name: str) -> str:
    """A base URI for role ``name`` on a free loopback port."""
    return f"https://127.0.0.1:{free_port()}/{name}/"


@dataclass
class DevPki:
    """A CA and certificates for named roles; ``uri(name)`` is the role's identity."""

    dir: Path
    uris: dict[str, str]

    @classmethod
    def make(cls, directory: Path, names: list[str]) -> DevPki:
        uris = {name: loopback_uri(name) for name in names}
        make_dev_pki(directory, [RoleSpec(n, u) for n, u in uris.items()])
        return cls(directory, uris)

    def add(self, name: str, uri: str | None = None) -> str:
        uri = uri or loopback_uri(name)
        make_dev_pki(self.dir, [RoleSpec(name, uri)])
        self.uris[name] = uri
        return uri

    def uri(self, name: str) -> str:
        return self.uris[name]

    def port(self, name: str) -> int:
        return port_of(self.uris[name])

    def files(self, name: str) -> TlsFiles:
        return TlsFiles(self.dir / f"{name}.pem", self.dir / f"{name}.key", self.dir / "ca.pem")

    def client_ssl(self, name: str) -> ssl.SSLContext:
        return client_context(self.files(name))

    def session(self, name: str) -> KvspSession:
        return KvspSession(self.client_ssl(name))
