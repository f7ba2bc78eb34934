"""Index Service client: publish, refresh and withdraw replicas; longest-prefix lookup (spec 6.1, 6.2).

An IS deployment may run several IS processes over one shared index (Redis, decision D7); a client
given all their base URIs fails over between them: a request that cannot reach one IS, or that one
answers with a 5xx, goes to the next, and the client stays with the IS that answered.  Every
request is safe to repeat: PUT is idempotent, lookup reads, and a DELETE repeated after one that
took effect but whose answer was lost reads as "none there" (False), which callers already handle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from urllib.parse import urlencode, urljoin

from kvsp.client.http import KvspSession, TransportError
from kvsp.identifiers import check_role_id, role_id
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import LookupRequest, LookupResponse, ReplicaRecord
from kvsp.service.policy import Quotas

# One IS base URI, or several in order of preference (configuration: a string or an array of strings).
IndexUris = str | Sequence[str]
DEFAULT_LOOKUP_KEYS = Quotas().keys_per_lookup  # the policy's default; roles pass their policy's value


def index_uris(value: IndexUris) -> tuple[str, ...]:
    """``value`` as a non-empty tuple of base URIs, each ending in "/"."""
    uris = (value,) if isinstance(value, str) else tuple(value)
    if not uris:
        raise ValueError("an Index Service client needs at least one base URI")
    return tuple(u if u.endswith("/") else u + "/" for u in uris)


class IndexClient:
    def __init__(self, session: KvspSession, base_uri: IndexUris, *,
                 max_lookup_keys: int = DEFAULT_LOOKUP_KEYS) -> None:
        self.session = session
        self.max_lookup_keys = max_lookup_keys  # the policy's keys_per_lookup: the IS refuses longer lookups
        self.base_uris = index_uris(base_uri)
        self._current = 0  # the IS that answered last: where the next request goes first

    @property
    def base_uri(self) -> str:
        """The base URI of the IS this client uses now."""
        return self.base_uris[self._current]

    def _replica_path(self, holder: str, block_key: bytes) -> str:
        return f"replicas/{role_id(holder)}/{block_key.hex()}"

    async def _request(self, method: str, path: str, body: object | None = None,
                       *, ok: tuple[int, ...] = (200, 201, 202, 204)) -> tuple[int, object | None]:
        """``request_json`` at each IS in turn, from the current one, until one answers below 500.

        The last IS's failure is the caller's (TransportError or ProblemError, as with one IS).
        """
        count = len(self.base_uris)
        for step in range(count):
            at = (self._current + step) % count
            try:
                answer = await self.session.request_json(method, urljoin(self.base_uris[at], path), body, ok=ok)
            except (TransportError, ProblemError) as exc:
                unreachable = isinstance(exc, TransportError) or exc.problem.status >= 500
                if unreachable and step < count - 1:
                    continue
                if not unreachable:
                    self._current = at  # it answered: a 4xx is that request's fault, not the IS's
                raise
            self._current = at
            return answer
        raise ValueError("no IS base URI")  # not reached: index_uris refuses an empty list

    async def publish(self, record: ReplicaRecord) -> ReplicaRecord:
        """PUT the record; the same call refreshes it (idempotent).

        Returns the record as the IS stored it: its ``ttl_ms`` is the effective TTL after the IS's cap,
        which is the one to schedule refreshes by (at most a third of it, section 8).
        """
        _, body = await self._request("PUT", self._replica_path(record.holder, record.block_key), record,
                                      ok=(200, 201))
        return ReplicaRecord.from_json(body)

    async def withdraw(self, holder: str, block_key: bytes, *, producer: str | None = None) -> bool:
        """DELETE the caller's records of ``block_key`` at ``holder``; False when the IS had none.

        ``producer`` (a holder-id, `ReplicaRecord.producer_id`) limits the withdrawal to that producer's
        record, which matters at a relay's URI, where many producers' records share one path.  Without
        it the IS removes the records of every producer the caller may publish for.
        """
        path = self._replica_path(holder, block_key)
        if producer is not None:
            path += "?" + urlencode({"producer": check_role_id(producer, "producer")})
        try:
            await self._request("DELETE", path)
        except ProblemError as exc:
            if exc.problem.kind is ProblemType.NOT_FOUND:
                return False
            raise
        return True

    async def lookup(self, request: LookupRequest) -> LookupResponse:
        """Longest-prefix lookup of at most ``max_lookup_keys`` leading keys: a longer context gets its
        prefix among those (the rest is computed), where the whole lookup would be refused."""
        if len(request.block_keys) > self.max_lookup_keys:
            request = dataclasses.replace(request, block_keys=request.block_keys[: self.max_lookup_keys])
        _, body = await self._request("POST", "lookup", request)
        # matched never exceeds the keys asked for; the IS's quota may be above the parser's default.
        response = LookupResponse.from_json(body, max_keys=len(request.block_keys))
        response.check_request(request)
        return response

