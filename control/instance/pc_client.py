"""The instance's client of the PC: status PUTs (section 6.3) and checkpoint PUTs (section 6.8).

``[instance] pc`` names one PC or every PC of an active/standby group (decision D7); each PUT goes to
the leader, following a standby's 421 or moving on past a PC that is down (`control.pc.endpoints`).
`LeaderUnavailable` (no PC answered as the leader) is a `TransportError`: the status loop and the
checkpoint sender retry it like an unreachable PC.
"""

from __future__ import annotations

from collections.abc import Sequence

from control.instance.records import CheckpointAck
from control.pc.endpoints import PcEndpoints
from kvsp.client.http import KvspSession
from kvsp.errors import KvspError
from kvsp.identifiers import role_id
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import InstanceStatus, SessionCheckpoint, StateChange


class Fenced(KvspError):
    """The PC no longer takes this instance's word for the session: a newer epoch exists (kvsp-stale-epoch)
    or another instance owns it (403).  The session must stop here at once (section 6.8, section 9)."""


class PcClient:
    def __init__(self, session: KvspSession, pc: str | Sequence[str], instance: str, *, timeout_s: float) -> None:
        self.session = session
        self.endpoints = PcEndpoints(pc)
        self.instance = instance
        self.timeout_s = timeout_s

    @property
    def base(self) -> str:
        """The PC requests go to first (the leader, as far as this instance knows)."""
        return self.endpoints.leader

    async def status(self, status: InstanceStatus, *, timeout_s: float | None = None) -> StateChange:
        """PUT instances/{instance-id}/status; the answer is the state the PC holds for us."""
        _, body = await self.endpoints.request_json(self.session, "PUT", f"instances/{role_id(self.instance)}/status",
                                                    status, ok=(200,), timeout_s=timeout_s or self.timeout_s)
        return StateChange.from_json(body)

    async def checkpoint(self, checkpoint: SessionCheckpoint) -> CheckpointAck:
        """PUT sessions/{session}/checkpoint; raises `Fenced` when the PC refuses this epoch or owner."""
        try:
            _, body = await self.endpoints.request_json(self.session, "PUT",
                                                        f"sessions/{checkpoint.session}/checkpoint", checkpoint,
                                                        ok=(200,), timeout_s=self.timeout_s)
        except ProblemError as exc:
            if exc.problem.kind is ProblemType.STALE_EPOCH or exc.problem.status == 403:
                raise Fenced(f"session {checkpoint.session} epoch {checkpoint.epoch}: {exc}") from exc
            raise
        ack = CheckpointAck.from_json(body)
        if ack.session != checkpoint.session:
            raise ProblemError.of(ProblemType.NOT_FOUND, f"the PC acknowledged session {ack.session}, "
                                                         f"not {checkpoint.session}")
        return ack
