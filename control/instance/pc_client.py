"""The instance's client of the PC: status PUTs (section 6.3) and checkpoint PUTs (section 6.8)."""

from __future__ import annotations

from urllib.parse import urljoin

from control.instance.records import CheckpointAck
from kvsp.client.http import KvspSession
from kvsp.errors import KvspError
from kvsp.identifiers import role_id
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import InstanceStatus, SessionCheckpoint, StateChange


class Fenced(KvspError):
    """The PC no longer takes this instance's word for the session: a newer epoch exists (kvsp-stale-epoch)
    or another instance owns it (403).  The session must stop here at once (section 6.8, section 9)."""


class PcClient:
    def __init__(self, session: KvspSession, pc: str, instance: str, *, timeout_s: float) -> None:
        self.session = session
        self.base = pc if pc.endswith("/") else pc + "/"
        self.instance = instance
        self.timeout_s = timeout_s

    async def status(self, status: InstanceStatus, *, timeout_s: float | None = None) -> StateChange:
        """PUT instances/{instance-id}/status; the answer is the state the PC holds for us."""
        url = urljoin(self.base, f"instances/{role_id(self.instance)}/status")
        _, body = await self.session.request_json("PUT", url, status, ok=(200,),
                                                  timeout_s=timeout_s or self.timeout_s)
        return StateChange.from_json(body)

    async def checkpoint(self, checkpoint: SessionCheckpoint) -> CheckpointAck:
        """PUT sessions/{session}/checkpoint; raises `Fenced` when the PC refuses this epoch or owner."""
        url = urljoin(self.base, f"sessions/{checkpoint.session}/checkpoint")
        try:
            _, body = await self.session.request_json("PUT", url, checkpoint, ok=(200,), timeout_s=self.timeout_s)
        except ProblemError as exc:
            if exc.problem.kind is ProblemType.STALE_EPOCH or exc.problem.status == 403:
                raise Fenced(f"session {checkpoint.session} epoch {checkpoint.epoch}: {exc}") from exc
            raise
        ack = CheckpointAck.from_json(body)
        if ack.session != checkpoint.session:
            raise ProblemError.of(ProblemType.NOT_FOUND, f"the PC acknowledged session {ack.session}, "
                                                         f"not {checkpoint.session}")
        return ack
