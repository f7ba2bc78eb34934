"""The callers' side of an active/standby group of PCs (decision D7): instances and front ends are
configured with every PC base URI and follow the leader.

`PcEndpoints.request_json` sends one request in one bounded pass over the group: first to the PC that
answered last time, and then:

- a **421** from a standby names the leader (Problem Details member ``"leader"``, control/pc/app.py):
  the request goes there next, if that URI is one of the configured PCs (a name outside the list is
  not followed: the list is what the operator trusts);
- a **503** with the member ``"leader": null`` (no leader known, the PC is loading its state) or a
  transport failure moves on to the next PC of the list (a 503 without the member is the leader's own
  answer, e.g. no instance to place a request on);
- any other answer is the leader's and is returned or raised as usual (`ProblemError`).

When no PC answered as the leader in one pass, `LeaderUnavailable` is raised if some PC answered
(421 or 503: the group is up but electing), else `TransportError` (none could be reached).  Both are
`TransportError`s, so callers that already retry an unreachable PC (the status loop, the checkpoint
sender, the front end's session follower) retry them the same way; an election ends within a lease
ttl, so they may retry `LeaderUnavailable` sooner than their backoff would.  Requests a standby answers were not
acted on, so sending them again to the leader is safe; a request that timed out at a PC that was
frozen or dying may or may not have been, which the PC's own rules make harmless (a checkpoint PUT is
idempotent; a repeated placement is a second session, and the first one ends unread).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urljoin

import aiohttp

from kvsp.client.http import JSON_MEDIA_TYPE, KvspSession, TransportError, problem_from, read_capped
from kvsp.encoding import canonical_json, parse_json
from kvsp.errors import ValidationError
from kvsp.records.base import check_uri

LEADER_MEMBER = "leader"
MAX_PCS = 16


class LeaderUnavailable(TransportError):
    """No PC of the group answered as the leader in one pass (an election, or every PC unreachable)."""


def pc_uris(value: object, member: str) -> tuple[str, ...]:
    """A role setting naming the PC: one base URI, or a list of every PC of an active/standby group."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_PCS:
        raise ValidationError(member, f"must be a PC base URI or a list of 1..{MAX_PCS} of them")
    uris = tuple(check_uri(v, f"{member}[{i}]" if not isinstance(value, str) else member)
                 for i, v in enumerate(items))
    if len(set(uris)) != len(uris):
        raise ValidationError(member, "must not repeat a PC")
    return uris


def _base(uri: str) -> str:
    return uri if uri.endswith("/") else uri + "/"


class PcEndpoints:
    """Every PC of the group; remembers which one answered as the leader."""

    __slots__ = ("_current", "uris")

    def __init__(self, uris: Sequence[str] | str) -> None:
        listed = (uris,) if isinstance(uris, str) else tuple(uris)
        if not listed:
            raise ValueError("at least one PC base URI is needed")
        self.uris = tuple(_base(u) for u in listed)
        self._current = 0

    @property
    def leader(self) -> str:
        """The PC the next request goes to first: the last one that answered as the leader."""
        return self.uris[self._current]

    def url(self, path: str) -> str:
        return urljoin(self.leader, path)

    async def request_json(self, session: KvspSession, method: str, path: str, body: object | None = None, *,
                           ok: tuple[int, ...] = (200,), timeout_s: float) -> tuple[int, object | None]:
        """Send ``body`` to ``path`` (relative to a PC's base URI) at the leader; (status, parsed JSON).

        Each attempt is bounded by ``timeout_s``; a pass makes at most one attempt per PC, plus one
        for a leader named by a 421."""
        data = None if body is None else (canonical_json(body) if isinstance(body, dict) else body.to_bytes())  # type: ignore[attr-defined]
        order = [(self._current + k) % len(self.uris) for k in range(len(self.uris))]
        tried: set[int] = set()
        failures: list[str] = []
        answered = False  # some PC answered 421 or 503: the group is up, electing
        while order:
            index = order.pop(0)
            if index in tried:
                continue
            tried.add(index)
            outcome = await self._attempt(session, method, urljoin(self.uris[index], path), data, ok=ok,
                                          timeout_s=timeout_s)
            if isinstance(outcome, tuple):
                self._current = index
                return outcome
            failures.append(f"{self.uris[index]}: {outcome.reason}")
            answered = answered or outcome.answered
            if outcome.leader is not None and outcome.leader in self.uris:
                named = self.uris.index(outcome.leader)
                if named not in tried:
                    order.insert(0, named)
            self._current = (index + 1) % len(self.uris)
        error = LeaderUnavailable if answered else TransportError
        raise error(f"{method} {path}: no PC answered as the leader ({'; '.join(failures)})")

    async def _attempt(self, session: KvspSession, method: str, url: str, data: bytes | None, *,
                       ok: tuple[int, ...], timeout_s: float) -> tuple[int, object | None] | _NotHere:
        headers = {"Content-Type": JSON_MEDIA_TYPE} if data is not None else {}
        try:
            async with session.http.request(method, url, data=data, headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                raw = await read_capped(resp, session.options.max_json_response)
                status, ctype = resp.status, resp.content_type
        except (aiohttp.ClientError, TimeoutError, TransportError) as exc:
            return _NotHere(f"unreachable ({type(exc).__name__})", answered=False)
        if status in ok:
            return status, (parse_json(raw) if raw else None)
        if status == 421:
            return _NotHere("a standby", _leader_of(raw)[1])
        if status == 503 and _leader_of(raw)[0]:
            return _NotHere("no leader there (503)")
        raise problem_from(status, ctype, raw)


class _NotHere:
    """An attempt that did not reach the leader: why, whether the PC answered, the leader a 421 named."""

    __slots__ = ("answered", "leader", "reason")

    def __init__(self, reason: str, leader: str | None = None, *, answered: bool = True) -> None:
        self.reason = reason
        self.leader = leader
        self.answered = answered


def _leader_of(raw: bytes) -> tuple[bool, str | None]:
    """Whether a problem body carries the ``leader`` member, and the base URI it names."""
    try:
        doc = parse_json(raw)
    except ValidationError:
        return False, None
    if not isinstance(doc, dict) or LEADER_MEMBER not in doc:
        return False, None
    leader = doc[LEADER_MEMBER]
    return True, (_base(leader) if isinstance(leader, str) and leader else None)
