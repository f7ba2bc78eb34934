"""Index Service client: publish, refresh and withdraw replicas; longest-prefix lookup (spec 6.1, 6.2)."""

from __future__ import annotations

from urllib.parse import urlencode, urljoin

from kvsp.client.http import KvspSession
from kvsp.identifiers import check_role_id, role_id
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import LookupRequest, LookupResponse, ReplicaRecord


class IndexClient:
    def __init__(self, session: KvspSession, base_uri: str) -> None:
        self.session = session
        self.base_uri = base_uri if base_uri.endswith("/") else base_uri + "/"

    def _replica_url(self, holder: str, block_key: bytes) -> str:
        return urljoin(self.base_uri, f"replicas/{role_id(holder)}/{block_key.hex()}")

    async def publish(self, record: ReplicaRecord) -> ReplicaRecord:
        """PUT the record; the same call refreshes it (idempotent).

        Returns the record as the IS stored it: its ``ttl_ms`` is the effective TTL after the IS's cap,
        which is the one to schedule refreshes by (at most a third of it, section 8).
        """
        _, body = await self.session.request_json("PUT", self._replica_url(record.holder, record.block_key),
                                                  record, ok=(200, 201))
        return ReplicaRecord.from_json(body)

    async def withdraw(self, holder: str, block_key: bytes, *, producer: str | None = None) -> bool:
        """DELETE the caller's records of ``block_key`` at ``holder``; False when the IS had none.

        ``producer`` (a holder-id, `ReplicaRecord.producer_id`) limits the withdrawal to that producer's
        record, which matters at a relay's URI, where many producers' records share one path.  Without
        it the IS removes the records of every producer the caller may publish for.
        """
        url = self._replica_url(holder, block_key)
        if producer is not None:
            url += "?" + urlencode({"producer": check_role_id(producer, "producer")})
        try:
            await self.session.request_json("DELETE", url)
        except ProblemError as exc:
            if exc.problem.kind is ProblemType.NOT_FOUND:
                return False
            raise
        return True

    async def lookup(self, request: LookupRequest) -> LookupResponse:
        _, body = await self.session.request_json("POST", urljoin(self.base_uri, "lookup"), request)
        # matched never exceeds the keys asked for; the IS's quota may be above the parser's default.
        response = LookupResponse.from_json(body, max_keys=len(request.block_keys))
        response.check_request(request)
        return response
