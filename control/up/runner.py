"""Runs a `Workload` against the front end's completions API and kills an instance mid-run.

Each chat runs its turns in order; ``concurrency`` chats run at once.  Every request streams
(server-sent events): the time to first token is measured from sending the request to the first
token's event, and the ``kvsp`` labels on the events say which instance served which token, so the
runner knows the sessions in flight on the instance it kills.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import IO

import aiohttp

from control.up.workload import Conversation, Workload, percentile

MAX_EVENT = 1 << 16
Killer = Callable[[str], str | None]  # instance URI -> the name of the process killed (None: not ours)


@dataclass
class RequestResult:
    id: str
    chat: str
    turn: int
    tenant: str
    prompt_tokens: int
    status: int = 0
    error: str | None = None
    ttft_s: float | None = None
    total_s: float | None = None
    started_s: float = 0.0  # since the run started
    tokens: list[int] = field(default_factory=list)
    indices_in_order: bool = True  # every event carried the next index, none repeated
    session: str | None = None
    instances: list[str] = field(default_factory=list)  # in the order they served tokens
    epochs: list[int] = field(default_factory=list)
    moves: int = 0
    resume_ms: list[float] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.finish_reason is not None


@dataclass
class KillRecord:
    name: str
    uri: str
    at_s: float
    sessions: list[str]  # requests (ids) streaming from it when it was killed


@dataclass
class RunResult:
    phase: str
    duration_s: float
    requests: list[RequestResult]
    kill: KillRecord | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


class Progress:
    """A one-line progress bar on a terminal; a line every 10 % otherwise."""

    def __init__(self, total: int, label: str, out: IO[str] | None = None, *, enabled: bool = True) -> None:
        self.total, self.label, self.out, self.enabled = total, label, out or sys.stderr, enabled
        self.tty = self.out.isatty()
        self._last_decile = -1
        self.note = ""

    def update(self, done: int, failed: int, ttfts: list[float]) -> None:
        if not self.enabled:
            return
        p50 = percentile(ttfts, 0.5)
        width = 30
        filled = width * done // max(self.total, 1)
        text = (f"{self.label:<9} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total}"
                f" failed {failed}" + (f"  ttft p50 {p50 * 1000:.0f} ms" if p50 is not None else "")
                + (f"  {self.note}" if self.note else ""))
        if self.tty:
            self.out.write("\r" + text[:160].ljust(100))
            if done >= self.total:
                self.out.write("\n")
        elif (decile := 10 * done // max(self.total, 1)) != self._last_decile:
            self._last_decile = decile
            self.out.write(text + "\n")
        self.out.flush()


class Runner:
    def __init__(self, url: str, model: str, workload: Workload, encode: Callable[[str], list[int]], *,
                 api_keys: Mapping[str, str] | None = None, killer: Killer | None = None,
                 progress: Progress | None = None, request_timeout_s: float = 120.0) -> None:
        self.url, self.model, self.workload, self.encode = url.rstrip("/"), model, workload, encode
        self.api_keys = dict(api_keys or {})
        self.killer = killer
        self.progress = progress
        self.request_timeout_s = request_timeout_s
        self.results: list[RequestResult] = []
        self.in_flight: dict[str, RequestResult] = {}
        self.kill: KillRecord | None = None
        self._t0 = 0.0

    async def run(self, phase: str) -> RunResult:
        self._t0 = time.monotonic()
        chats: asyncio.Queue[Conversation] = asyncio.Queue()
        for chat in self.workload.chats:
            chats.put_nowait(Conversation(chat, self.encode))
        spec = self.workload.spec
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.request_timeout_s)) as http:
            monitor = asyncio.create_task(self._monitor()) if self.killer and spec.kill_after is not None else None
            try:
                await asyncio.gather(*(self._worker(http, chats, k * spec.stagger_s) for k in range(spec.concurrency)))
            finally:
                if monitor is not None:
                    monitor.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await monitor
        self._show()
        return RunResult(phase, time.monotonic() - self._t0, self.results, self.kill)

    async def _worker(self, http: aiohttp.ClientSession, chats: asyncio.Queue[Conversation], delay_s: float) -> None:
        newline = self.encode("\n")
        await asyncio.sleep(delay_s)
        while not chats.empty():
            conv = chats.get_nowait()
            while not conv.done:
                prompt = conv.next_prompt()
                result = RequestResult(conv.request_id, conv.chat.name, conv.turn, conv.chat.tenant, len(prompt),
                                       started_s=time.monotonic() - self._t0)
                self.in_flight[result.id] = result
                try:
                    await self._request(http, conv.chat.tenant, prompt, result)
                finally:
                    del self.in_flight[result.id]
                    self.results.append(result)
                    self._show()
                if not result.ok:
                    break  # the chat cannot go on without its answer
                conv.answered(prompt, result.tokens, newline)

    async def _request(self, http: aiohttp.ClientSession, tenant: str, prompt: list[int],
                       result: RequestResult) -> None:
        body = {"model": self.model, "prompt": prompt, "max_tokens": self.workload.spec.max_tokens,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        headers = {"Authorization": f"Bearer {self.api_keys[tenant]}"} if tenant in self.api_keys else {}
        sent = time.monotonic()
        try:
            async with http.post(self.url + "/v1/completions", json=body, headers=headers) as resp:
                result.status = resp.status
                if resp.status != 200:
                    result.error = (await resp.text())[:300]
                    return
                async for raw in resp.content:
                    line = raw[:MAX_EVENT].strip()
                    if not line.startswith(b"data: "):
                        continue
                    data = line[6:]
                    if data == b"[DONE]":
                        break
                    self._event(json.loads(data), result, sent)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"[:300]
        result.total_s = time.monotonic() - sent

    def _event(self, event: dict[str, object], result: RequestResult, sent: float) -> None:
        if "error" in event:
            result.error = json.dumps(event["error"])[:300]
            return
        label = event.get("kvsp")
        choices = event.get("choices")
        finish = choices[0].get("finish_reason") if isinstance(choices, list) and choices else None
        if not isinstance(label, dict):
            return
        if finish is not None:
            result.finish_reason = str(finish)
            result.moves = int(label.get("moves", 0))
            result.resume_ms = [float(x) for x in label.get("resume_ms", [])]
            return
        if "instance" in label:
            result.session = str(label.get("session"))
            result.instances.append(str(label["instance"]))
            result.epochs.append(int(label["epoch"]))
        if result.ttft_s is None:
            result.ttft_s = time.monotonic() - sent
        if label.get("index") != len(result.tokens):
            result.indices_in_order = False
        result.tokens.append(int(label["token"]))

    async def _monitor(self) -> None:
        """Kill the instance serving a request in mid-stream once ``kill_after`` of the requests are done."""
        spec = self.workload.spec
        assert self.killer is not None and spec.kill_after is not None
        while self.kill is None:
            if len(self.results) >= spec.kill_after * spec.requests:
                # Half its tokens still to come: one that has seen its last few may already be finished at the
                # instance (the front end buffers ahead of this reader), and a kill then moves nothing.
                victim = next((r for r in self.in_flight.values()
                               if 2 <= len(r.tokens) <= spec.max_tokens // 2 and r.instances), None)
                if victim is not None:
                    uri = victim.instances[-1]
                    name = self.killer(uri)
                    if name is not None:
                        on_it = [r.id for r in self.in_flight.values() if r.instances and r.instances[-1] == uri]
                        self.kill = KillRecord(name, uri, time.monotonic() - self._t0, on_it)
                        if self.progress is not None:
                            self.progress.note = f"killed {name} (SIGKILL)"
                        return
            await asyncio.sleep(0.01)

    def _show(self) -> None:
        if self.progress is not None:
            failed = sum(1 for r in self.results if not r.ok)
            self.progress.update(len(self.results), failed, [r.ttft_s for r in self.results if r.ttft_s is not None])
