"""kvsp: the KV Cache Storage Protocol (KVSP) core and client library.

The protocol core is sans-I/O: descriptors, keys, containers and records take bytes and values in
and give bytes and values out.  See README.md for the public API and docs/architecture.md for roles.
"""

from kvsp.descriptor import CompatDescriptor
from kvsp.errors import ContainerError, DigestMismatchError, KvspError, ValidationError
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.keys import BlockKeyChain, ScopeKey, block_keys, scope_id
from kvsp.problems import Problem, ProblemError, ProblemType

__all__ = [
    "BlockKeyChain",
    "CompatDescriptor",
    "ContainerError",
    "DigestMismatchError",
    "KvspError",
    "Problem",
    "ProblemError",
    "ProblemType",
    "ScopeKey",
    "TrackNamespace",
    "ValidationError",
    "block_keys",
    "role_id",
    "scope_id",
]

__version__ = "0.1.0"
