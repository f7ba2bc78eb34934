"""``kvsp serve ROLE[,ROLE...] --config FILE``: run one or more roles in one aiohttp process.

Each role module exposes ``setup(app, config)`` that adds its routes (below the base URI's path),
its state under typed `web.AppKey`s and its background tasks through ``app.cleanup_ctx``.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol

from aiohttp import web

from control.config import KNOWN_ROLES, RoleConfig
from control.http import json_response, make_app
from control.metrics import metrics_handler, metrics_of
from control.tls import server_context
from kvsp.errors import ValidationError

log = logging.getLogger("kvsp.serve")

ROLE_MODULES = {
    "is": "control.index.app",
    "holder": "control.holder.app",
    "pc": "control.pc.app",
    "instance": "control.instance.app",
    "relay": "relay.app",
    "frontend": "control.frontend.app",
}
Clock = Callable[[], float]
CLOCK: web.AppKey[Clock] = web.AppKey("kvsp.clock", Callable[[], float])  # type: ignore[arg-type]
CONFIG: web.AppKey[RoleConfig] = web.AppKey("kvsp.config", RoleConfig)
HealthFacts = Callable[[web.Application], dict[str, object]]
# Per-role facts for GET {base}health; a role adds a callable under its name in its `setup`.
HEALTH: web.AppKey[dict[str, HealthFacts]] = web.AppKey("kvsp.health", dict)
STARTED: web.AppKey[float] = web.AppKey("kvsp.started", float)


class RoleModule(Protocol):
    def setup(self, app: web.Application, config: RoleConfig) -> None: ...


def build_app(config: RoleConfig, *, clock: Clock = time.monotonic, allow_insecure: bool = False,
              roles: tuple[str, ...] | None = None) -> web.Application:
    """The aiohttp application for ``roles`` (default: those of the config)."""
    app = make_app(json_limit=config.policy.quotas.body_limit_octets, allow_insecure=allow_insecure)
    app[CLOCK] = clock
    app[CONFIG] = config
    metrics_of(app)
    app[HEALTH] = {}
    app[STARTED] = clock()
    app.router.add_get(config.server.base_path + "metrics", metrics_handler)
    app.router.add_get(config.server.base_path + "health", health_handler)
    for role in roles or config.roles:
        if role not in ROLE_MODULES:
            raise ValidationError("roles", f"unknown role {role!r}; known: {list(KNOWN_ROLES)}")
        try:
            module: RoleModule = importlib.import_module(ROLE_MODULES[role])
        except ModuleNotFoundError as exc:
            if exc.name != ROLE_MODULES[role]:
                raise
            raise ValidationError("roles", f"role {role!r} is not available in this version of kvsp") from exc
        module.setup(app, config)
    return app


async def health_handler(request: web.Request) -> web.Response:
    """GET {base}health: 200 while the process serves, with each role's own facts (for supervisors, probes)."""
    app = request.app
    facts = {role: facts(app) for role, facts in app[HEALTH].items()}
    return json_response({"status": "ok", "roles": list(app[CONFIG].roles),
                          "uptime_s": round(app[CLOCK]() - app[STARTED], 3), **facts})


@asynccontextmanager
async def serving(config: RoleConfig, *, clock: Clock = time.monotonic, app: web.Application | None = None,
                  roles: tuple[str, ...] | None = None) -> AsyncIterator[web.Application]:
    """Serve ``config``'s roles over mutual TLS for the duration of the block (in this process)."""
    if config.tls is None:
        raise ValidationError("tls", "is required: every KVSP listener uses mutual TLS 1.3 (D1)")
    app = app if app is not None else build_app(config, clock=clock, roles=roles)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.server.host, config.server.port, ssl_context=server_context(config.tls))
        await site.start()
        yield app
    finally:
        await runner.cleanup()


async def serve(config: RoleConfig, roles: tuple[str, ...] | None = None) -> None:
    """Serve until SIGINT/SIGTERM, then shut down cleanly (cleanup contexts run, e.g. withdrawals)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with serving(config, roles=roles):
        log.info("serving %s at %s", ",".join(roles or config.roles), config.server.base_uri)
        await stop.wait()
