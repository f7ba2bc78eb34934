"""Where the PC keeps its durable state and its leader lease (decision D7).

`PcStore` is the interface (`control.pc.store.base`); `MemoryStore` is the embedded default and
`RedisStore` (``control.pc.store.redis``, loaded only by PCs configured for it) the shared one that
lets PC processes run active/standby.  The rules both apply are in `control.pc.core.durable`.
"""

from control.pc.store.base import Fence, LeaseView, PcStore, StoreUnavailable, make_holder
from control.pc.store.memory import MemoryStore

__all__ = ["Fence", "LeaseView", "MemoryStore", "PcStore", "StoreUnavailable", "make_holder"]
