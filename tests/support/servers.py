"""Role servers in the test process over real mutual TLS on loopback, and an injectable clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from aiohttp import web

from control.deploy.pki import DevPki
from control.serve import serving
from kvsp.service.config import RoleConfig, ServerConfig
from kvsp.service.moqt_config import MoqtConfig
from kvsp.service.policy import Policy


def role_config(pki: DevPki, name: str, roles: tuple[str, ...], policy: Policy,
                sections: dict[str, dict[str, object]] | None = None, base_dir: Path | None = None,
                moqt: MoqtConfig | None = None) -> RoleConfig:
    return RoleConfig(roles, ServerConfig(pki.uri(name), "127.0.0.1", pki.port(name)), pki.files(name), policy,
                      base_dir or pki.dir, {k: dict(v) for k, v in (sections or {}).items()}, moqt or MoqtConfig())


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
