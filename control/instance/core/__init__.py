"""Sans-I/O cores of the inference instance: every method takes ``now`` and returns typed values.

- `InstanceLifecycle` (section 6.3): own state, admission, sleep requests, the PC's state changes,
  moved through the same table as the PC (`kvsp.records.lifecycle`);
- `PrefetchTracker` (section 6.5): who may send directives, the pending quota, per-directive state;
- `OutputGate` (section 6.8): token labels, checkpoints, release (reassembly is `kvsp.output`);
- `ShardStore` (section 6.9): KV by token range, plan, acknowledge, commit or abort.

What each returned action asks the HTTP adapter to do is said in `control.instance.core.events`.
"""

from control.instance.core.events import (
    Aborted,
    AckPlan,
    CancelFetches,
    CancelLoads,
    Committed,
    FetchRange,
    LoadBlock,
    OutputToken,
    PlanFailed,
    PrefetchAction,
    ReportStatus,
    ShardAction,
)
from control.instance.core.generation import OutputGate
from control.instance.core.lifecycle import InstanceLifecycle
from control.instance.core.prefetch import DirectiveForbidden, DirectiveQuotaExceeded, PrefetchTracker
from control.instance.core.shards import Segment, ShardStore

__all__ = [
    "Aborted",
    "AckPlan",
    "CancelFetches",
    "CancelLoads",
    "Committed",
    "DirectiveForbidden",
    "DirectiveQuotaExceeded",
    "FetchRange",
    "InstanceLifecycle",
    "LoadBlock",
    "OutputGate",
    "OutputToken",
    "PlanFailed",
    "PrefetchAction",
    "PrefetchTracker",
    "ReportStatus",
    "Segment",
    "ShardAction",
    "ShardStore",
]
