"""Leases (spec section 6.6): a holder's promise not to evict some replicas for a while (sans-I/O).

`LeaseTable` decides grants, renewals, releases and expiry with ``now`` passed in, and answers the
store's one question, `is_leased(block_key, now)`.  Quotas are per client identity (spec section 9,
decision D2): a request whose ``ttl_ms`` exceeds ``lease_ttl_ms_max``, or that would bring the
client's leased octets above ``lease_octets_per_client``, is refused with kvsp-lease-quota (429)
rather than silently trimmed, so a client never believes it holds more than it does.  The holder
passes that quota resolved against its capacity (control/holder/quota.py); unset, the table knows
no capacity and allows `LEASE_OCTETS_CEILING`.

A lease belongs to the client that created it: for any other identity it does not exist (404), which
also keeps lease identifiers from being probed.  Identifiers are 256-bit random url-safe tokens.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Final

from kvsp.problems import Problem, ProblemError, ProblemType
from kvsp.records import Lease, LeaseRenewal, LeaseRequest
from kvsp.service.policy import LEASE_OCTETS_CEILING, Quotas

QUOTA_TTL: Final = "ttl"
QUOTA_OCTETS: Final = "octets"


class LeaseQuotaError(ProblemError):
    """kvsp-lease-quota (429); ``reason`` (``ttl`` or ``octets``) labels the rejection metric."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(Problem.of(ProblemType.LEASE_QUOTA, detail))
        self.reason = reason


def lease_not_found(lease_id: str) -> ProblemError:
    return ProblemError.of(ProblemType.NOT_FOUND, f"no lease {lease_id} for this client")


def new_lease_id() -> str:
    """32 characters of ``[A-Za-z0-9_-]``: a path segment without escaping, unguessable."""
    return secrets.token_urlsafe(24)


@dataclass(frozen=True, slots=True)
class LeaseState:
    """One granted lease.  ``octets`` is what it counts against its client's quota."""

    lease_id: str
    client: str
    block_keys: tuple[bytes, ...]
    octets: int
    ttl_ms: int
    expires_at: float

    def live(self, now: float) -> bool:
        return now < self.expires_at

    def to_record(self) -> Lease:
        return Lease(self.lease_id, self.block_keys, self.ttl_ms)


class LeaseTable:
    """Leases by identifier, with an index by block key for the store's pin checks."""

    __slots__ = ("_by_id", "_by_key", "_new_id", "_quotas")

    def __init__(self, quotas: Quotas, *, new_id: Callable[[], str] = new_lease_id) -> None:
        self._quotas = quotas
        self._new_id = new_id
        self._by_id: dict[str, LeaseState] = {}
        self._by_key: dict[bytes, set[str]] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    @property
    def octets_per_client(self) -> int:
        """The quota each client's live leases are held to."""
        configured = self._quotas.lease_octets_per_client
        return LEASE_OCTETS_CEILING if configured is None else configured

    def __iter__(self) -> Iterator[LeaseState]:
        return iter(list(self._by_id.values()))

    # -- the store's question --------------------------------------------------------------------
    def is_leased(self, block_key: bytes, now: float) -> bool:
        return any(self._by_id[i].live(now) for i in self._by_key.get(block_key, ()))

    # -- quota -----------------------------------------------------------------------------------
    def leased_octets(self, client: str, now: float, *, excluding: str | None = None) -> int:
        return sum(s.octets for s in self._by_id.values()
                   if s.client == client and s.live(now) and s.lease_id != excluding)

    def _check_ttl(self, ttl_ms: int) -> None:
        if ttl_ms > self._quotas.lease_ttl_ms_max:
            raise LeaseQuotaError(QUOTA_TTL, f"ttl_ms {ttl_ms} exceeds the maximum of "
                                             f"{self._quotas.lease_ttl_ms_max}")

    def _check_octets(self, client: str, octets: int, now: float, excluding: str | None = None) -> None:
        held = self.leased_octets(client, now, excluding=excluding)
        limit = self.octets_per_client
        if held + octets > limit:
            raise LeaseQuotaError(QUOTA_OCTETS, f"{octets} more leased octets would bring this client to "
                                                f"{held + octets}, above its quota of {limit}")

    # -- operations ------------------------------------------------------------------------------
    def grant(self, client: str, request: LeaseRequest, sizes: Mapping[bytes, int], now: float) -> LeaseState:
        """Create a lease on keys the holder has; ``sizes`` maps each held key to its octets.

        A key missing from ``sizes`` (not held, or not visible to this client) is kvsp-not-found:
        a holder leases only replicas it has.
        """
        self._check_ttl(request.ttl_ms)
        missing = [k.hex() for k in request.block_keys if k not in sizes]
        if missing:
            raise ProblemError.of(ProblemType.NOT_FOUND, f"no replica held for block key(s) {', '.join(missing)}")
        octets = sum(sizes[k] for k in request.block_keys)
        self._check_octets(client, octets, now)
        state = LeaseState(self._new_id(), client, request.block_keys, octets, request.ttl_ms,
                           now + request.ttl_ms / 1000)
        self._by_id[state.lease_id] = state
        for key in state.block_keys:
            self._by_key.setdefault(key, set()).add(state.lease_id)
        return state

    def renew(self, client: str, lease_id: str, renewal: LeaseRenewal, now: float) -> LeaseState:
        """Extend a live lease to ``ttl_ms`` from now (the quota on TTL applies again)."""
        state = self._own(client, lease_id, now)
        self._check_ttl(renewal.ttl_ms)
        renewed = replace(state, ttl_ms=renewal.ttl_ms, expires_at=now + renewal.ttl_ms / 1000)
        self._by_id[lease_id] = renewed
        return renewed

    def release(self, client: str, lease_id: str, now: float) -> LeaseState:
        state = self._own(client, lease_id, now)
        self._drop(state)
        return state

    def expire(self, now: float) -> list[LeaseState]:
        """Forget leases that have run out; returns them (for metrics and logs)."""
        gone = [s for s in self._by_id.values() if not s.live(now)]
        for state in gone:
            self._drop(state)
        return gone

    def _own(self, client: str, lease_id: str, now: float) -> LeaseState:
        state = self._by_id.get(lease_id)
        if state is None or state.client != client or not state.live(now):
            raise lease_not_found(lease_id)
        return state

    def _drop(self, state: LeaseState) -> None:
        del self._by_id[state.lease_id]
        for key in state.block_keys:
            ids = self._by_key.get(key)
            if ids is not None:
                ids.discard(state.lease_id)
                if not ids:
                    del self._by_key[key]
