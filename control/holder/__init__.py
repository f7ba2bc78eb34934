"""The holder role (spec sections 6.1, 6.6, 6.7; decision D5): stores and serves KV blocks from tiers.

Layers, from the wire inwards: `app` (HTTP routes) -> `service.Holder` (asyncio adapter) ->
`store.BlockStore` and `leases.LeaseTable` (sans-I/O decisions) and `tiers` (host memory; `disk`: encrypted
local storage; `torch_tiers` adds torch host/device tiers, imported only when configured, and
`tierset.TierSet` places and moves layer ranges across the tiers present).  `publisher` keeps the Index
Service informed.
"""

from control.holder.disk import DiskTier, load_or_create_key
from control.holder.leases import LeaseQuotaError, LeaseState, LeaseTable
from control.holder.publisher import Publisher, RefreshSchedule
from control.holder.service import Holder, Representation, StoreFullError
from control.holder.settings import HolderSettings
from control.holder.store import (
    ArrangeOutcome,
    BlockExistsError,
    BlockId,
    BlockMeta,
    BlockStore,
    Demote,
    Entry,
    Event,
    Evict,
    Move,
    Place,
    PlacementError,
    Publish,
    PutOutcome,
    Republish,
    Segment,
    Withdraw,
)
from control.holder.tiers import HostTier, RateMeter, StorageCorruptError, StorageMissingError, TierError
from control.holder.tierset import TierSet

__all__ = [
    "ArrangeOutcome",
    "BlockExistsError",
    "BlockId",
    "BlockMeta",
    "BlockStore",
    "Demote",
    "DiskTier",
    "Entry",
    "Event",
    "Evict",
    "Holder",
    "HolderSettings",
    "HostTier",
    "LeaseQuotaError",
    "LeaseState",
    "LeaseTable",
    "Move",
    "Place",
    "PlacementError",
    "Publish",
    "Publisher",
    "PutOutcome",
    "RateMeter",
    "RefreshSchedule",
    "Representation",
    "Republish",
    "Segment",
    "StorageCorruptError",
    "StorageMissingError",
    "StoreFullError",
    "TierError",
    "TierSet",
    "Withdraw",
    "load_or_create_key",
]
