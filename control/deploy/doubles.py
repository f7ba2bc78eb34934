"""In-process stand-ins for roles, for deployments that test or measure one role without the others."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

from control.deploy.pki import DevPki
from kvsp.problems import Problem, ProblemType
from kvsp.records import InstanceStatus, SessionCheckpoint
from kvsp.service.tls import server_context


# -- the PC double -----------------------------------------------------------------------------------
@dataclass
class PcDouble:
    """Accepts status PUTs and checkpoint PUTs like the PC of the contract, and records them."""

    statuses: list[tuple[float, InstanceStatus]] = field(default_factory=list)
    checkpoints: list[SessionCheckpoint] = field(default_factory=list)
    epochs: dict[str, int] = field(default_factory=dict)  # the current epoch of each session, as the PC sees it
    acks: list[tuple[float, int]] = field(default_factory=list)  # (when sent, output_offset)
    release: asyncio.Event = field(default_factory=asyncio.Event)  # acks wait until this is set
    hold_above: int | None = None  # acks of checkpoints beyond this output_offset never come
    grant_sleep: bool = False
    sleep_requests: int = 0

    def __post_init__(self) -> None:
        self.release.set()

    def offsets(self, session: str) -> list[int]:
        return [c.output_offset for c in self.checkpoints if c.session == session]

    async def status(self, request: web.Request) -> web.Response:
        status = InstanceStatus.from_bytes(await request.read())
        self.statuses.append((time.monotonic(), status))
        state = status.state.value
        if status.requested_state is not None:
            self.sleep_requests += 1
            state = "draining" if self.grant_sleep else "active"
        return web.json_response({"state": state}, content_type="application/kvsp+json")

    async def checkpoint(self, request: web.Request) -> web.Response:
        checkpoint = SessionCheckpoint.from_bytes(await request.read())
        current = self.epochs.setdefault(checkpoint.session, checkpoint.epoch)
        if checkpoint.epoch < current:
            problem = Problem.of(ProblemType.STALE_EPOCH, f"epoch {checkpoint.epoch} < {current}")
            return web.Response(status=409, body=problem.to_bytes(), content_type="application/problem+json")
        self.checkpoints.append(checkpoint)
        if self.hold_above is not None and checkpoint.output_offset > self.hold_above:
            await asyncio.Event().wait()  # recorded, never acknowledged (until the connection goes)
        await self.release.wait()
        self.acks.append((time.monotonic(), checkpoint.output_offset))
        body = {"session": checkpoint.session, "epoch": checkpoint.epoch, "output_offset": checkpoint.output_offset}
        return web.json_response(body, content_type="application/kvsp+json")


@asynccontextmanager
async def pc_double(pki: DevPki) -> AsyncIterator[PcDouble]:
    double = PcDouble()
    uri = pki.uri("pc")
    port = int(uri.split(":")[2].split("/")[0])
    path = "/" + uri.split("/", 3)[3]
    app = web.Application()
    app.router.add_put(path + "instances/{iid}/status", double.status)
    app.router.add_put(path + "sessions/{sid}/checkpoint", double.checkpoint)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_context(pki.files("pc")))
    await site.start()
    try:
        yield double
    finally:
        double.release.set()
        await runner.cleanup()
