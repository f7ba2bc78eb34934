"""The aiohttp application keys that every role of one service process shares.

They live below the roles so that the relay, the HTTPS roles and `kvsp serve` agree on them without
importing one another: `CONFIG` (the process's role config), `CLOCK` (the injected clock), `STARTED`
and `HEALTH` (per-role facts served at ``GET {base}health``; a role adds a callable under its name).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from kvsp.service.config import RoleConfig

Clock = Callable[[], float]
CLOCK: web.AppKey[Clock] = web.AppKey("kvsp.clock", Callable[[], float])  # type: ignore[arg-type]
CONFIG: web.AppKey[RoleConfig] = web.AppKey("kvsp.config", RoleConfig)
HealthFacts = Callable[[web.Application], dict[str, object]]
HEALTH: web.AppKey[dict[str, HealthFacts]] = web.AppKey("kvsp.health", dict)
STARTED: web.AppKey[float] = web.AppKey("kvsp.started", float)
