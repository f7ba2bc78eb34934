"""``kvsp serve ROLE[,ROLE...] --config FILE``: run one or more roles in one aiohttp process.

Each role module exposes ``setup(app, config)`` that adds its routes (below the base URI's path),
its state under typed `web.AppKey`s and its background tasks through ``app.cleanup_ctx``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol

from aiohttp import web

from control.http import json_response, make_app
from control.listener.site import GuardedSite
from kvsp.errors import ValidationError
from kvsp.service.app import CLOCK, CONFIG, HEALTH, STARTED, Clock
from kvsp.service.config import KNOWN_ROLES, RoleConfig
from kvsp.service.metrics import metrics_handler, metrics_of
from kvsp.service.tls import check_identity, server_context

log = logging.getLogger("kvsp.serve")


class RoleModule(Protocol):
    def setup(self, app: web.Application, config: RoleConfig) -> None: ...


# Each role's module is imported only when a process serves that role (an IS never loads torch), but
# by a plain import statement, so that the layer contract (D9) sees every dependency.
def _index() -> RoleModule:
    from control.index import app  # noqa: PLC0415

    return app


def _holder() -> RoleModule:
    from control.holder import app  # noqa: PLC0415

    return app


def _pc() -> RoleModule:
    from control.pc import app  # noqa: PLC0415

    return app


def _instance() -> RoleModule:
    from control.instance import app  # noqa: PLC0415

    return app


def _relay() -> RoleModule:
    from relay import app  # noqa: PLC0415

    return app


def _frontend() -> RoleModule:
    from control.frontend import app  # noqa: PLC0415

    return app


ROLE_MODULES: dict[str, Callable[[], RoleModule]] = {
    "is": _index, "holder": _holder, "pc": _pc, "instance": _instance, "relay": _relay, "frontend": _frontend,
}


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
        ROLE_MODULES[role]().setup(app, config)
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
    """Serve ``config``'s roles over mutual TLS for the duration of the block (in this process), on a
    listener guarded by ``[server]``'s limits (control/listener)."""
    if config.tls is None:
        raise ValidationError("tls", "is required: every KVSP listener uses mutual TLS 1.3 (D1)")
    app = app if app is not None else build_app(config, clock=clock, roles=roles)  # each role's table first
    check_identity(config.tls, config.server.base_uri, config.policy.pc if "pc" in (roles or config.roles) else None)
    metrics = metrics_of(app)  # before the app is frozen: an app of a test's own may have none yet
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = GuardedSite(runner, config.server.host, config.server.port, limits=config.server.limits,
                           metrics=metrics, name="mtls", ssl_context=server_context(config.tls))
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
