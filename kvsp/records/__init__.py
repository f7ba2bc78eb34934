"""Typed KVSP records (spec sections 4.4 and 6): decoded once at the boundary, then passed around as types.

Every record is a frozen, slotted dataclass with ``from_json(value)``, ``from_bytes(data)``,
``to_json()`` and ``to_bytes()`` (canonical JSON, RFC 8785).  Parsing is the validation boundary: bad
input raises only `kvsp.errors.ValidationError`, whose ``member`` is the JSON path of the offending
member (``"residency[1].layers"``); unknown members are ignored.  Binary identifiers are ``bytes``
(Block Keys and Compatibility IDs 32 octets, Scope IDs 16 octets, digests 32 raw octets).
"""

from kvsp.records.base import DEFAULT_MAX_KEYS, JsonRecord, KeyedRecord, LayerRange, TokenRange
from kvsp.records.generation import (
    GenerateRequest,
    ResumeRequest,
    SessionInfo,
    SessionState,
    StartSession,
    StreamEnd,
    StreamLine,
    TokenEvent,
    parse_stream_line,
)
from kvsp.records.lease import Lease, LeaseRenewal, LeaseRequest, LeaseResponse
from kvsp.records.lifecycle import StateChange
from kvsp.records.lookup import LookupRequest, LookupResponse, TargetEstimate
from kvsp.records.prefetch import PrefetchBlock, PrefetchDirective, PrefetchState, PrefetchStatus
from kvsp.records.replica import STORAGE_TIERS, ReplicaRecord, Residency, digest_of_layers
from kvsp.records.session import ParamValue, Sampler, SessionCheckpoint
from kvsp.records.shard import (
    ReshardAbort,
    ReshardCommit,
    ReshardMessage,
    ReshardPlan,
    Shard,
    ShardFetch,
    ShardMap,
    parse_reshard_message,
    plan_reshard,
)
from kvsp.records.status import InstanceStatus, Link

__all__ = [
    "DEFAULT_MAX_KEYS",
    "STORAGE_TIERS",
    "GenerateRequest",
    "InstanceStatus",
    "JsonRecord",
    "KeyedRecord",
    "LayerRange",
    "Lease",
    "LeaseRenewal",
    "LeaseRequest",
    "LeaseResponse",
    "Link",
    "LookupRequest",
    "LookupResponse",
    "ParamValue",
    "PrefetchBlock",
    "PrefetchDirective",
    "PrefetchState",
    "PrefetchStatus",
    "ReplicaRecord",
    "ReshardAbort",
    "ReshardCommit",
    "ReshardMessage",
    "ReshardPlan",
    "Residency",
    "ResumeRequest",
    "Sampler",
    "SessionCheckpoint",
    "SessionInfo",
    "SessionState",
    "Shard",
    "ShardFetch",
    "ShardMap",
    "StartSession",
    "StateChange",
    "StreamEnd",
    "StreamLine",
    "TargetEstimate",
    "TokenEvent",
    "TokenRange",
    "digest_of_layers",
    "parse_reshard_message",
    "parse_stream_line",
    "plan_reshard",
]
