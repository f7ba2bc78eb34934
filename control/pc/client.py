"""The PC's outbound calls to inference instances (spec sections 6.3, 6.5, 6.8, 6.9 and the extension).

Every call goes over the PC's one mutual-TLS `KvspSession` (so the instance sees the PC's identity,
the only one allowed to send directives, section 9) and is bounded by ``timeout_s``.  Errors are those
of `KvspSession.request_json`: `ProblemError` for an answer outside ``ok``, `TransportError` when the
instance could not be reached or did not answer in time; both are `KvspError`s.
"""

from __future__ import annotations

from urllib.parse import quote, urljoin

from kvsp.client.http import KvspSession
from kvsp.errors import ValidationError
from kvsp.records import PrefetchDirective, ReshardMessage, ReshardPlan, StateChange
from kvsp.records.generation import ResumeRequest, StartSession

ACCEPTED = (200, 202)


class InstanceClient:
    """Directives from the PC to any instance, addressed by the instance's base URI."""

    __slots__ = ("session", "timeout_s")

    def __init__(self, session: KvspSession, *, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.session = session
        self.timeout_s = timeout_s

    @staticmethod
    def url(instance: str, path: str) -> str:
        return urljoin(instance if instance.endswith("/") else instance + "/", path)

    async def prefetch(self, instance: str, directive: PrefetchDirective) -> None:
        """POST prefetch (section 6.5); the instance answers 202 with the status resource's Location."""
        await self.session.request_json("POST", self.url(instance, "prefetch"), directive, ok=ACCEPTED,
                                        timeout_s=self.timeout_s)

    async def start(self, instance: str, start: StartSession) -> None:
        """POST sessions/{session}/start (extension): run a new session at ``start.epoch``."""
        await self.session.request_json("POST", self.url(instance, f"sessions/{quote(start.session)}/start"),
                                        start, ok=ACCEPTED, timeout_s=self.timeout_s)

    async def resume(self, instance: str, resume: ResumeRequest, *, timeout_s: float | None = None) -> None:
        """POST sessions/{session}/resume (section 6.8) with the checkpoint at its new epoch.

        ``max_tokens`` of the original request travels as an extension member (unknown members are
        ignored by the spec's rule), because the Session Checkpoint does not say when to stop.  The
        instance answers only after loading the checkpoint's prompt blocks, so the caller may give a
        longer bound than the call timeout.
        """
        url = self.url(instance, f"sessions/{quote(resume.checkpoint.session)}/resume")
        await self.session.request_json("POST", url, resume.to_json(), ok=ACCEPTED,
                                        timeout_s=timeout_s or self.timeout_s)

    async def reshard(self, instance: str, message: ReshardMessage) -> None:
        """POST reshard (section 6.9).  A plan is answered only after its fetches, so its wait is
        bounded by the plan's deadline plus the call timeout; a commit or abort by the call timeout."""
        timeout = self.timeout_s
        if isinstance(message, ReshardPlan):
            timeout += message.deadline_ms / 1000
        await self.session.request_json("POST", self.url(instance, "reshard"), message, ok=(200,),
                                        timeout_s=timeout)

    async def put_state(self, instance: str, change: StateChange) -> StateChange:
        """PUT state (section 6.3); the instance answers with its current state."""
        _, body = await self.session.request_json("PUT", self.url(instance, "state"), change, ok=(200,),
                                                  timeout_s=self.timeout_s)
        if body is None:
            raise ValidationError("state", "PUT state must be answered with a StateChange")
        return StateChange.from_json(body)
