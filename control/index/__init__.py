"""The Index Service role (spec sections 6.1-6.3): replica index, instance statuses, HTTPS adapter.

`ReplicaIndex` and `StatusBoard` are sans-I/O (``now`` passed in); ``control.index.app.setup`` puts
them behind the mutual-TLS HTTP routes.  A PC in the same process shares the board via `STATUS_BOARD`.
"""

from control.index.app import INDEX, STATUS_BOARD, IndexService, setup, status_board_of
from control.index.settings import IndexSettings, ModelShape
from control.index.status import BoardEntry, StatusBoard
from control.index.store import IndexStats, ReplicaIndex, Stored

__all__ = [
    "INDEX",
    "STATUS_BOARD",
    "BoardEntry",
    "IndexService",
    "IndexSettings",
    "IndexStats",
    "ModelShape",
    "ReplicaIndex",
    "StatusBoard",
    "Stored",
    "setup",
    "status_board_of",
]
