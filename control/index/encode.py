"""JSON text of lookup answers, written straight from the stored records.

A lookup answer is mostly Replica Records (64 per prompt of 64 blocks, more with several holders).
Going through ``record.to_json()`` and a generic encoder costs about 6 us per record, which is more
than the rest of the request together; writing each record with one format string costs a fraction of
that and needs no cache, so memory per stored record stays as it is.

Members are written in JCS order (sorted by name), with the same values as ``ReplicaRecord.to_json``;
residency arrays and holder URIs, which records share, go through RFC 8785 once per distinct value.
``tests/test_index_store.py`` checks the output against ``to_json`` and fails when ReplicaRecord
gains a member this module does not write.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Final

from kvsp.encoding import canonical_json
from kvsp.records import ReplicaRecord, Residency, TargetEstimate

# Every member of ReplicaRecord that `record_json` writes; a new member must be added there too.
WRITTEN_MEMBERS: Final = frozenset({"block_key", "codec", "compat_id", "digest", "holder", "layer_digests",
                                    "moqt_namespace", "residency", "scope_id", "size", "ttl_ms"})


@functools.lru_cache(maxsize=4096)
def _residency(residency: tuple[Residency, ...]) -> str:
    return canonical_json([entry.to_json() for entry in residency]).decode()


@functools.lru_cache(maxsize=4096)
def _string(value: str) -> str:
    return canonical_json(value).decode()


def record_json(r: ReplicaRecord) -> str:
    """``r.to_json()`` as JSON text, members in JCS order."""
    head = (f'{{"block_key":"{r.block_key.hex()}","codec":{r.codec},"compat_id":"{r.compat_id.hex()}",'
            f'"digest":"sha-256:{r.digest.hex()}","holder":{_string(r.holder)}')
    optional = ""
    if r.layer_digests:
        optional = ',"layer_digests":["' + '","'.join([d.hex() for d in r.layer_digests]) + '"]'
    if r.moqt_namespace is not None:
        optional += f',"moqt_namespace":"{r.moqt_namespace.encode()}"'
    return (f'{head}{optional},"residency":{_residency(r.residency)},"scope_id":"{r.scope_id.hex()}",'
            f'"size":{r.size},"ttl_ms":{r.ttl_ms}}}')


def lookup_json(groups: Sequence[Sequence[ReplicaRecord]], targets: Sequence[TargetEstimate]) -> bytes:
    """The body of a lookup answer: ``LookupResponse(groups, targets).to_json()`` as UTF-8 JSON."""
    replicas = ",".join(["[" + ",".join([record_json(r) for r in group]) + "]" for group in groups])
    return answer_json(len(groups), replicas, targets)


def answer_json(matched: int, replicas: str, targets: Sequence[TargetEstimate]) -> bytes:
    """A lookup answer from the text of its ``replicas`` members (``[r,r],[r]``), as a store may hold it.

    Redis keeps each record's canonical JSON (what `record_json` writes), so its answers are spliced
    in without being parsed; the members stay in JCS order because ``matched`` < ``replicas`` < ``targets``.
    """
    tail = ""
    if targets:
        tail = ',"targets":' + json.dumps([t.to_json() for t in targets], separators=(",", ":"), allow_nan=False)
    return f'{{"matched":{matched},"replicas":[{replicas}]{tail}}}'.encode()
