"""Which completion may start: caps per client address and per tenant in front of the global one (sans-I/O).

``max_concurrent`` alone is one pool: one client holding every slot (64 unread streams) made every
other tenant's request a 429.  A request now needs a slot of its client address
(``max_concurrent_per_client``), of its tenant (``max_concurrent_per_tenant``; the anonymous tenant is
one tenant, so its clients share it) and of the whole front end, checked in that order; the refusal
names the first that is full.  With the derived defaults one tenant takes at most half of the pool and
one address a quarter, so another tenant always finds room unless several are busy at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

CLIENT: Final = "client"
TENANT: Final = "tenant"
GLOBAL: Final = "global"
LIMITS: Final = (CLIENT, TENANT, GLOBAL)


@dataclass(frozen=True, slots=True)
class Caps:
    total: int
    per_tenant: int
    per_client: int

    @classmethod
    def derived(cls, total: int, per_tenant: int | None = None, per_client: int | None = None) -> Caps:
        """The caps, each unset one derived from ``total`` (half of it per tenant, a quarter per client)."""
        return cls(total, per_tenant if per_tenant is not None else max(1, total // 2),
                   per_client if per_client is not None else max(1, total // 4))


@dataclass(frozen=True, slots=True)
class Refusal:
    limit: str  # one of LIMITS: the first cap that is full
    held: int
    cap: int

    @property
    def detail(self) -> str:
        who = {CLIENT: "this client address has", TENANT: "this tenant has", GLOBAL: "the server has"}[self.limit]
        return f"{who} {self.held} requests in flight (at most {self.cap}); try again later"


class Admission:
    """Requests in flight, by tenant and by client address."""

    __slots__ = ("_clients", "_tenants", "caps", "in_flight")

    def __init__(self, caps: Caps) -> None:
        self.caps = caps
        self.in_flight = 0
        self._tenants: dict[str, int] = {}
        self._clients: dict[str, int] = {}

    def acquire(self, tenant: str, client: str) -> Refusal | None:
        """Count one more request of ``tenant`` from ``client``, or say which cap refuses it (nothing counted)."""
        held_client, held_tenant = self._clients.get(client, 0), self._tenants.get(tenant, 0)
        if held_client >= self.caps.per_client:
            return Refusal(CLIENT, held_client, self.caps.per_client)
        if held_tenant >= self.caps.per_tenant:
            return Refusal(TENANT, held_tenant, self.caps.per_tenant)
        if self.in_flight >= self.caps.total:
            return Refusal(GLOBAL, self.in_flight, self.caps.total)
        self._clients[client] = held_client + 1
        self._tenants[tenant] = held_tenant + 1
        self.in_flight += 1
        return None

    def release(self, tenant: str, client: str) -> None:
        """One request `acquire` admitted has ended."""
        _decrement(self._clients, client)
        _decrement(self._tenants, tenant)
        self.in_flight = max(0, self.in_flight - 1)

    def of_tenant(self, tenant: str) -> int:
        return self._tenants.get(tenant, 0)

    def of_client(self, client: str) -> int:
        return self._clients.get(client, 0)


def _decrement(counts: dict[str, int], key: str) -> None:
    held = counts.get(key, 0)
    if held <= 1:
        counts.pop(key, None)  # an address seen once is not remembered: the table stays as small as the load
    else:
        counts[key] = held - 1
