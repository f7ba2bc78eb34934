"""Instance state changes (spec section 6.3): the body of PUT state and of the PC's answer to a status PUT.

The PC accepts a request to sleep with ``{"state": "draining"}`` and refuses it with
``{"state": "active"}``; PUT state on an instance carries the same object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from kvsp._reader import ObjectReader
from kvsp.records._common import JsonRecord
from kvsp.registry import INSTANCE_STATES, InstanceState


@dataclass(frozen=True, slots=True)
class StateChange(JsonRecord):
    """``{"state": <instance state>}``."""

    state: InstanceState

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        return cls(InstanceState(r.choice("state", INSTANCE_STATES)))

    def to_json(self) -> dict[str, object]:
        return {"state": self.state.value}
