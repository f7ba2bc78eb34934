"""The holder's quotas against its capacity: what one client may pin, and what the policy got wrong (sans-I/O).

A lease keeps a block from being evicted, not from being demoted (control/holder/store.py), so leased
data can fill every tier the holder has: its **pinnable capacity** is the sum of its tiers' capacities
(device, host, local storage).  When the policy does not set ``lease_octets_per_client``, one client
may lease `LEASE_SHARE` of that (a quarter), and never more than `LEASE_OCTETS_CEILING` (4 GiB): a
holder of `kvsp up` (64 MiB host, 1 GiB local storage) allows 272 MiB per client, not the 4 GiB that
would let one client pin all of it.  A value the policy sets is used as it is, with a warning when it
lets one client pin the whole holder.

``block_body_limit_octets`` is checked too: a body larger than the largest block the tiers can take
(the largest tier, or with ``fast_layers`` two adjacent tiers together) is uploaded only to be refused
with 507.  The other quotas (docs/policy.md) have no capacity to compare with: TTLs, key counts and
JSON body sizes bound one request, ``pending_directives_per_instance`` bounds the PC, not a client.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

from kvsp.registry import Tier
from kvsp.service.policy import LEASE_OCTETS_CEILING, Quotas

LEASE_SHARE: Final = Fraction(1, 4)
SOURCE_POLICY: Final = "policy"
SOURCE_DERIVED: Final = "derived"
DEFAULT: Final = Quotas()


@dataclass(frozen=True, slots=True)
class QuotaReport:
    """The effective lease quota of one holder, where it came from, and the startup warnings."""

    pinnable_octets: int  # what leased data can occupy: every tier together
    storable_block_octets: int  # the largest block the tiers can take
    lease_octets_per_client: int
    lease_quota_source: str  # SOURCE_POLICY or SOURCE_DERIVED
    warnings: tuple[str, ...] = ()

    def facts(self) -> dict[str, object]:
        """The holder's ``GET {base}health`` member."""
        return {"pinnable_octets": self.pinnable_octets, "lease_octets_per_client": self.lease_octets_per_client,
                "lease_quota_source": self.lease_quota_source, "quota_warnings": list(self.warnings)}


def derived_lease_octets(pinnable_octets: int) -> int:
    """The per-client lease quota of a holder whose policy sets none: a share of what can be pinned."""
    return max(1, min(LEASE_OCTETS_CEILING, int(pinnable_octets * LEASE_SHARE)))


def storable_block_octets(capacities: Mapping[Tier, int], fast_layers: int) -> int:
    """The largest block ``capacities`` (fastest first) can take: one tier's, or two adjacent ones' with a split."""
    sizes = list(capacities.values())
    largest = max(sizes, default=0)
    if fast_layers > 0 and len(sizes) > 1:
        largest = max(largest, *(a + b for a, b in itertools.pairwise(sizes)))
    return largest


def holder_quotas(quotas: Quotas, capacities: Mapping[Tier, int], *, fast_layers: int = 0) -> QuotaReport:
    """Resolve ``lease_octets_per_client`` against ``capacities`` and say what lets one client pin too much."""
    pinnable = sum(capacities.values())
    storable = storable_block_octets(capacities, fast_layers)
    warnings: list[str] = []
    configured = quotas.lease_octets_per_client
    if configured is None:
        octets, source = derived_lease_octets(pinnable), SOURCE_DERIVED
    else:
        octets, source = configured, SOURCE_POLICY
        if configured >= pinnable:
            warnings.append(f"quotas.lease_octets_per_client = {configured} is not below this holder's pinnable "
                            f"capacity of {pinnable} octets (all tiers): one client can pin the whole holder; "
                            f"leave it unset for {derived_lease_octets(pinnable)} (a quarter)")
    if quotas.block_body_limit_octets > storable and quotas.block_body_limit_octets != DEFAULT.block_body_limit_octets:
        warnings.append(f"quotas.block_body_limit_octets = {quotas.block_body_limit_octets} is above the largest "
                        f"block this holder can store ({storable} octets): such uploads are refused with 507 "
                        f"only after their body arrived")
    return QuotaReport(pinnable, storable, octets, source, tuple(warnings))
