"""Follows one generation across instances: ``POST requests`` at the PC, the token stream at the owner,
and on a break or stall the PC's ``GET sessions/{s}`` for the new owner and epoch (spec section 6.8).

Every line goes through `OutputAssembler` (the sans-I/O reassembly core): an index is delivered once
and in order, and a lower epoch never overrides a higher one, so the client sees neither a repeated nor
an altered token while the session moves.

The PC may be an active/standby group (decision D7): every call to it goes to the leader through
`PcEndpoints`.  While no PC leads (a takeover), a submission waits up to ``LEADER_WAIT_S`` for one, and
a stream that stalls keeps being read: the instance generates on, and only the PC is changing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field, replace

import aiohttp

from control.pc.endpoints import LeaderUnavailable, PcEndpoints
from kvsp.client.http import KvspSession, TransportError
from kvsp.errors import KvspError
from kvsp.output import OutputAssembler
from kvsp.problems import ProblemError
from kvsp.records.generation import GenerateRequest, SessionInfo, SessionState, StreamEnd, TokenEvent, parse_stream_line

log = logging.getLogger("kvsp.frontend")

MAX_LINE = 4096  # a token line is ~50 octets
MAX_BAD_LINES = 3
MAX_SUBMISSIONS = 3
MAX_FINISHED_TRIES = 3
POLL_S = 0.05
SAME_OWNER_RETRY_S = 1.0  # a stream that broke without a failover is reopened at the same owner after this
LEADER_WAIT_S = 30.0  # a submission waits this long for a PC to lead (a takeover takes about one lease ttl)
SUBMIT_TIMEOUT_S = 30.0  # one POST requests at one PC (placement includes a lookup and the instance's start)
INFO_TIMEOUT_S = 2.0  # one GET sessions/{s} at one PC


class FollowError(Exception):
    """The generation cannot go on: ``status`` is the HTTP status to give the client."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass
class FollowStats:
    """What happened to one request, for the client's final chunk and the report."""

    session: str = ""
    instance: str | None = None
    epoch: int = 0
    moves: int = 0  # owner or epoch changes seen
    submissions: int = 0
    resume_gaps_s: list[float] = field(default_factory=list)  # last token before a break -> first after
    end: StreamEnd | None = None
    duplicates: int = 0  # lines the assembler discarded (repeated indices, lower epochs)


Clock = Callable[[], float]


class SessionFollower:
    """One request's run through the PC and the instances, yielding delivered tokens in order."""

    def __init__(self, http: KvspSession, pc: PcEndpoints | str, *, stall_s: float, stranded_retry_s: float,
                 clock: Clock = time.monotonic) -> None:
        self.http = http
        self.pc = pc if isinstance(pc, PcEndpoints) else PcEndpoints(pc)
        self.stall_s, self.stranded_retry_s = stall_s, stranded_retry_s
        self.clock = clock
        self.stats = FollowStats()
        self._assembler = OutputAssembler()
        self._delivered = 0  # across resubmissions
        self._broke_at: float | None = None
        self._last_token_at: float | None = None
        self._request: GenerateRequest | None = None
        self._info: SessionInfo | None = None

    async def start(self, request: GenerateRequest) -> SessionInfo:
        """Submit the request to the PC (a refusal raises `FollowError` before any token)."""
        self._request = request
        self._info = await self._submit(request)
        return self._info

    async def tokens(self) -> AsyncGenerator[TokenEvent, None]:
        """The delivered tokens, in index order, across moves; ``stats.end`` is set at the end."""
        request, info = self._request, self._info
        if request is None or info is None:
            raise RuntimeError("start() first")
        stranded_since: float | None = None
        finished_tries = 0
        while self.stats.end is None:
            if info.instance is not None and info.state is not SessionState.STRANDED:
                async for token in self._stream(info):
                    yield token
                if self.stats.end is not None:
                    return
                self._broke_at = self._broke_at or self.clock()
            if info.state is SessionState.FINISHED:
                if self._delivered >= request.max_tokens:
                    self.stats.end = StreamEnd("max_tokens", info.epoch)
                    return
                finished_tries += 1
                if finished_tries > MAX_FINISHED_TRIES:  # its owner is gone with the last tokens unread
                    raise FollowError(502, "the session finished on an instance that is gone before its last "
                                           "tokens were read")
            info, stranded_since = await self._next_owner(info, stranded_since)
            if stranded_since is not None and self.clock() - stranded_since > self.stranded_retry_s \
                    and info.output_offset == 0:
                # The PC could not move a session that has no checkpoint with output (no instance
                # could load it): the request is run again; indices already delivered are skipped.
                info, stranded_since = await self._submit(replace(request, session=None)), None

    async def _submit(self, request: GenerateRequest) -> SessionInfo:
        if self.stats.submissions >= MAX_SUBMISSIONS:
            raise FollowError(503, "the session could not be placed on any instance")
        self.stats.submissions += 1
        self._assembler = OutputAssembler()
        try:
            body = await self._submit_to_leader(request)
            info = SessionInfo.from_json(body)
        except ProblemError as exc:
            status = 503 if exc.problem.status in (429, 503) else 502
            raise FollowError(status, f"the placement controller refused the request: {exc.problem.title}"
                              f" ({exc.problem.detail or exc.problem.status})") from exc
        except (TransportError, KvspError) as exc:
            raise FollowError(502, f"the placement controller is unreachable ({exc})") from exc
        self._note(info)
        return info

    async def _submit_to_leader(self, request: GenerateRequest) -> object | None:
        """POST requests at the leader, waiting (bounded) while the PCs elect one."""
        deadline = self.clock() + LEADER_WAIT_S
        while True:
            try:
                _, body = await self.pc.request_json(self.http, "POST", "requests", request, ok=(200,),
                                                     timeout_s=SUBMIT_TIMEOUT_S)
                return body
            except LeaderUnavailable:
                if self.clock() >= deadline:
                    raise
            await asyncio.sleep(POLL_S)

    def _note(self, info: SessionInfo) -> None:
        s = self.stats
        if s.session and (info.instance, info.epoch) != (s.instance, s.epoch):
            s.moves += 1
        s.session, s.instance, s.epoch = info.session, info.instance, info.epoch

    async def _session_info(self, session: str) -> SessionInfo:
        try:
            _, body = await self.pc.request_json(self.http, "GET", f"sessions/{session}", ok=(200,),
                                                 timeout_s=INFO_TIMEOUT_S)
            return SessionInfo.from_json(body)
        except ProblemError as exc:
            raise FollowError(502, f"the session is no longer known to the placement controller "
                              f"({exc.problem.status} {exc.problem.title})") from exc

    async def _next_owner(self, was: SessionInfo, stranded_since: float | None) -> tuple[SessionInfo, float | None]:
        """Ask the PC until the session has a new owner or epoch (or the same one after a while)."""
        started = self.clock()
        while True:
            try:
                info = await self._session_info(was.session)
            except (TransportError, KvspError):
                info = was  # the PC itself may be restarting: keep asking
            if info.state is SessionState.STRANDED:
                stranded_since = stranded_since or self.clock()
                if self.clock() - stranded_since > self.stranded_retry_s and info.output_offset == 0:
                    return info, stranded_since
            else:
                stranded_since = None
                moved = (info.instance, info.epoch) != (was.instance, was.epoch)
                if info.instance is not None and (moved or self.clock() - started > SAME_OWNER_RETRY_S
                                                  or info.state is SessionState.FINISHED):
                    self._note(info)
                    return info, None
            await asyncio.sleep(POLL_S)

    async def _stream(self, info: SessionInfo) -> AsyncIterator[TokenEvent]:
        """Read one owner's stream until it ends, breaks, or stalls while the PC names another owner."""
        assert info.instance is not None
        url = info.instance + f"sessions/{info.session}/tokens?from={self._assembler.next_index}"
        bad = 0
        with contextlib.suppress(aiohttp.ClientError, ConnectionError, TransportError):
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=2.0)
            async with self.http.http.get(url, timeout=timeout) as resp:
                if resp.status != 200:
                    return
                while True:
                    try:
                        raw = await asyncio.wait_for(resp.content.readline(), self.stall_s)
                    except TimeoutError:
                        try:
                            now = await self._session_info(info.session)
                        except TransportError:
                            continue  # no PC leads right now: the instance may well be generating on
                        if (now.instance, now.epoch) != (info.instance, info.epoch):
                            self._broke_at = self.clock()
                            return  # this owner is gone or fenced: abandon its stream
                        continue
                    except ValueError:  # a line over aiohttp's limit
                        return
                    if not raw:
                        return
                    try:
                        line = parse_stream_line(raw[:MAX_LINE])
                    except KvspError:
                        bad += 1
                        if bad >= MAX_BAD_LINES:
                            return
                        continue
                    if isinstance(line, StreamEnd):
                        if line.epoch >= self._assembler.epoch:
                            self.stats.end = line
                        return
                    for token in self._deliver(line):
                        yield token

    def _deliver(self, line: TokenEvent) -> list[TokenEvent]:
        delivered = self._assembler.receive(line)
        if not delivered:
            self.stats.duplicates += 1
        out = []
        for token in delivered:
            if token.index < self._delivered:
                continue  # a resubmitted request repeats what was already delivered
            now = self.clock()
            if self._broke_at is not None:
                since = self._last_token_at if self._last_token_at is not None else self._broke_at
                self.stats.resume_gaps_s.append(now - since)
                self._broke_at = None
            self._last_token_at = now
            self._delivered += 1
            out.append(token)
        return out

    @property
    def delivered(self) -> int:
        return self._delivered
