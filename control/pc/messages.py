"""The kvsp extension records between front end, PC and instance: one definition, shared with the instance.

They live in `kvsp.records.generation` (docs/pc-instance-protocol.md); this module names the ones the
PC uses, for the PC's code and its tests.
"""

from kvsp.records.generation import (
    SAMPLER_METHODS,
    GenerateRequest,
    ResumeRequest,
    SessionInfo,
    SessionState,
    StartSession,
)

__all__ = ["SAMPLER_METHODS", "GenerateRequest", "ResumeRequest", "SessionInfo", "SessionState", "StartSession"]
