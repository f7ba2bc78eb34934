"""What the instance cores return: actions and events, as frozen slotted dataclasses.

The cores never load, send or wait; the HTTP adapter carries out what they return.  The docstring of
each action says what the adapter does with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsp.records import TokenRange
from kvsp.records.generation import TokenEvent

# -- lifecycle (section 6.3) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReportStatus:
    """Adapter: send a status record now instead of at the next interval (the state changed)."""

    reason: str


# -- prefetch (section 6.5) -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadBlock:
    """Adapter: lease ``block_key`` for ``lease_ms`` at one of ``sources`` (in order), GET it, verify its
    digests, place it in the tiers and publish the replica; then call `PrefetchTracker.loaded`, or
    `load_failed` when no source worked.  Blocks are listed in prefix order; load them in that order
    first, because only the leading loaded blocks count."""

    directive: str
    index: int  # position in the directive's blocks
    block_key: bytes
    sources: tuple[str, ...]
    lease_ms: int


@dataclass(frozen=True, slots=True)
class CancelLoads:
    """Adapter: stop loading these blocks of ``directive`` and release their leases (deadline passed,
    or an earlier block failed so that these could no longer extend the loaded prefix)."""

    directive: str
    block_keys: tuple[bytes, ...]


PrefetchAction = LoadBlock | CancelLoads

# -- generation (section 6.8) ---------------------------------------------------------------------


# One output token as the front end receives it (index in the output, session epoch, token): the
# shared extension record, so that the gate, the stream and the front end's assembler agree on it.
OutputToken = TokenEvent


# -- resharding (section 6.9) ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchRange:
    """Adapter: load the KV of ``tokens`` from ``source`` (which serves it from version ``version - 1``)
    and call `ShardStore.fetched`, or `fetch_failed`."""

    map: str
    version: int
    tokens: TokenRange
    source: str


@dataclass(frozen=True, slots=True)
class AckPlan:
    """Every fetch range is loaded.  Adapter: answer the plan's POST reshard with 200."""

    map: str
    version: int


@dataclass(frozen=True, slots=True)
class PlanFailed:
    """A range could not be loaded.  Adapter: answer the plan's POST with an error (the PC will abort)."""

    map: str
    version: int
    tokens: TokenRange
    reason: str


@dataclass(frozen=True, slots=True)
class CancelFetches:
    """Adapter: stop these transfers; the data, if it still arrives, is not wanted."""

    map: str
    version: int
    ranges: tuple[TokenRange, ...]


@dataclass(frozen=True, slots=True)
class Committed:
    """Version ``version`` is in force; ``released`` ranges were freed (``released_bytes`` octets)."""

    map: str
    version: int
    released: tuple[TokenRange, ...]
    released_bytes: int


@dataclass(frozen=True, slots=True)
class Aborted:
    """The move to ``version`` was abandoned; ``discarded_bytes`` fetched octets were dropped."""

    map: str
    version: int
    discarded_bytes: int


ShardAction = FetchRange | AckPlan | PlanFailed | CancelFetches | Committed | Aborted
