"""Generate third-party MOQT draft-14 wire vectors with aiomoqt's own encoders.

Run with the aiomoqt virtual environment (aiomoqt 0.13.3 needs Python >= 3.12)::

    /root/.pyenv/versions/3.12.1/bin/python -m venv /tmp/aiomoqt-venv
    /tmp/aiomoqt-venv/bin/pip install aiomoqt==0.13.3
    /tmp/aiomoqt-venv/bin/python tests/vectors/moqt/gen_aiomoqt_vectors.py

It writes ``aiomoqt_vectors.json`` beside itself: for each vector the hex octets, the fields handed to
aiomoqt (bytes as ``{"hex": ...}``), and the aiomoqt function that produced the octets. Our tests
(tests/test_moqt_messages.py, tests/test_moqt_data.py) decode every vector with kvsp's decoder and
compare the fields. Where aiomoqt's output and the draft-14 text disagree, the entry says so in
``disagreement`` and the draft wins in our tests.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

from aiomoqt.context import PROFILES
from aiomoqt.messages import (
    ClientSetup,
    FetchCancel,
    FetchError,
    FetchHeader,
    FetchObject,
    FetchOk,
    GoAway,
    MaxSubscribeId,
    ObjectDatagram,
    ObjectDatagramStatus,
    Publish,
    PublishError,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishNamespaceError,
    PublishNamespaceOk,
    PublishOk,
    ServerSetup,
    SubgroupHeader,
    Subscribe,
    SubscribeDone,
    SubscribeError,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
    SubscribeOk,
    SubscribesBlocked,
    SubscribeUpdate,
    TrackStatus,
    TrackStatusError,
    TrackStatusOk,
    Unsubscribe,
    UnsubscribeNamespace,
)
from aiomoqt.messages.fetch import Fetch
from aiomoqt.types import ContentExistsCode, GroupOrder, ObjectStatus

VERSION = importlib.metadata.version("aiomoqt")
D14 = PROFILES[14]
NS = (b"kvsp", b"5ed5c2f2", b"6d1c6481")
NAME = b"raw"


def _json(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return {"hex": bytes(value).hex()}
    if isinstance(value, tuple | list):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {(k if isinstance(k, str) else str(int(k))): _json(v) for k, v in value.items()}
    if hasattr(value, "value") and isinstance(value.value, int):  # an IntEnum
        return int(value)
    return value


def _octets(buf: Any) -> bytes:
    return bytes(buf.data) if hasattr(buf, "data") else bytes(buf)


VECTORS: list[dict[str, Any]] = []


def control(name: str, cls: type, fields: dict[str, Any], note: str = "", disagreement: str = "") -> None:
    message = cls(**fields)
    octets = _octets(message.serialize(prof=D14))
    entry: dict[str, Any] = {
        "name": name, "kind": "control", "aiomoqt_class": cls.__name__, "hex": octets.hex(),
        "fields": {k: _json(v) for k, v in fields.items()},
        "source": f"aiomoqt {VERSION}, {cls.__module__}.{cls.__qualname__}.serialize(prof=PROFILES[14])",
    }
    if note:
        entry["note"] = note
    if disagreement:
        entry["disagreement"] = disagreement
    VECTORS.append(entry)


def data(name: str, kind: str, octets: bytes, fields: dict[str, Any], source: str, note: str = "") -> None:
    entry: dict[str, Any] = {"name": name, "kind": kind, "hex": octets.hex(),
                             "fields": {k: _json(v) for k, v in fields.items()},
                             "source": f"aiomoqt {VERSION}, {source}"}
    if note:
        entry["note"] = note
    VECTORS.append(entry)


def control_vectors() -> None:
    control("client_setup", ClientSetup, {"versions": [0xFF00000E], "parameters": {0x01: "/kvsp", 0x02: 100}})
    control("client_setup_auth_token", ClientSetup, {"versions": [0xFF00000E], "parameters": {0x03: b"cwt-token"}},
            note="AUTHORIZATION TOKEN wrapped as Token {Alias Type USE_VALUE (3), Token Type 0, Value}")
    control("client_setup_authority_implementation", ClientSetup,
            {"versions": [0xFF00000E], "parameters": {0x07: "aiomoqt/0.13.3", 0x05: "relay.example:4443"}},
            disagreement="draft-14 section 9.3.2 gives MOQT_IMPLEMENTATION the type 0x05, the same number as "
                         "AUTHORITY; aiomoqt (and kvsp) use 0x07, the number draft-15 and later assign")
    control("server_setup", ServerSetup, {"selected_version": 0xFF00000E, "parameters": {0x02: 50}})
    control("goaway", GoAway, {"new_session_uri": "moqt://relay.example:4443/kvsp"})
    control("goaway_empty", GoAway, {"new_session_uri": ""})
    control("max_request_id", MaxSubscribeId, {"request_id": 201})
    control("requests_blocked", SubscribesBlocked, {"maximum_request_id": 64})
    base = {"track_namespace": NS, "track_name": NAME, "priority": 32, "group_order": 1, "forward": 1}
    control("subscribe_largest_object", Subscribe, {"request_id": 0, **base, "filter_type": 2, "parameters": {}})
    control("subscribe_absolute_range", Subscribe, {"request_id": 2, **base, "filter_type": 4, "start_group": 5,
                                                    "start_object": 1, "end_group": 9,
                                                    "parameters": {0x02: 5000}})
    control("subscribe_next_group_auth", Subscribe, {"request_id": 4, **base, "filter_type": 1,
                                                     "parameters": {0x03: b"tok"}})
    control("subscribe_ok_content", SubscribeOk, {"request_id": 0, "track_alias": 7, "expires": 0,
                                                  "group_order": GroupOrder.ASCENDING,
                                                  "content_exists": ContentExistsCode.EXISTS, "largest_group_id": 3,
                                                  "largest_object_id": 31, "parameters": {}})
    control("subscribe_ok_no_content", SubscribeOk, {"request_id": 2, "track_alias": 8, "expires": 60000,
                                                     "group_order": GroupOrder.DESCENDING,
                                                     "content_exists": ContentExistsCode.NO_CONTENT,
                                                     "parameters": {0x04: 30000}})
    control("subscribe_error", SubscribeError, {"request_id": 0, "error_code": 4, "reason": "no such track"})
    control("subscribe_update", SubscribeUpdate, {"request_id": 6, "subscription_request_id": 0, "start_group": 4,
                                                  "start_object": 0, "end_group": 10, "priority": 16, "forward": 1,
                                                  "parameters": {}},
            note="end_group is written as given: the draft's End Group is 'the end Group ID, plus 1' (10 = group 9)")
    control("unsubscribe", Unsubscribe, {"request_id": 0})
    control("publish_done", SubscribeDone, {"request_id": 0, "status_code": 2, "stream_count": 3,
                                            "reason": "track ended"})
    control("publish", Publish, {"request_id": 1, "track_namespace": NS, "track_name": NAME, "track_alias": 2,
                                 "group_order": 1, "content_exists": 1, "largest_group_id": 0,
                                 "largest_object_id": 11, "forward": 1, "parameters": {}})
    control("publish_ok", PublishOk, {"request_id": 1, "forward": 1, "priority": 128, "group_order": 1,
                                      "filter_type": 3, "start_group": 0, "start_object": 0, "parameters": {}})
    control("publish_error", PublishError, {"request_id": 1, "error_code": 4, "reason": "uninterested"})
    control("fetch_standalone", Fetch, {"fetch_type": 1, "request_id": 2, "subscriber_priority": 1,
                                        "group_order": 1, "namespace": NS, "track_name": NAME, "start_group": 0,
                                        "start_object": 0, "end_group": 0, "end_object": 33, "parameters": {}})
    control("fetch_relative_joining", Fetch, {"fetch_type": 2, "request_id": 4, "subscriber_priority": 128,
                                              "group_order": 0, "joining_request_id": 0, "joining_start": 2,
                                              "parameters": {}})
    control("fetch_absolute_joining", Fetch, {"fetch_type": 3, "request_id": 6, "subscriber_priority": 128,
                                              "group_order": 2, "joining_request_id": 0, "joining_start": 100,
                                              "parameters": {}})
    control("fetch_ok", FetchOk, {"request_id": 2, "group_order": 1, "end_of_track": 1, "largest_group_id": 0,
                                  "largest_object_id": 33, "parameters": {}})
    control("fetch_error", FetchError, {"request_id": 2, "error_code": 6, "reason": "no objects"})
    control("fetch_cancel", FetchCancel, {"request_id": 2})
    control("track_status", TrackStatus, {"request_id": 8, **base, "filter_type": 2, "parameters": {}})
    control("track_status_ok", TrackStatusOk, {"request_id": 8, "track_alias": 0, "expires": 0,
                                               "group_order": GroupOrder.ASCENDING,
                                               "content_exists": ContentExistsCode.EXISTS, "largest_group_id": 1,
                                               "largest_object_id": 2,
                                               "parameters": {}})
    control("track_status_error", TrackStatusError, {"request_id": 8, "error_code": 1, "reason": "unauthorized"})
    control("publish_namespace", PublishNamespace, {"request_id": 3, "namespace": NS, "parameters": {}})
    control("publish_namespace_ok", PublishNamespaceOk, {"request_id": 3})
    control("publish_namespace_error", PublishNamespaceError, {"request_id": 3, "error_code": 1, "reason": "no"})
    control("publish_namespace_done", PublishNamespaceDone, {"namespace": NS})
    control("publish_namespace_cancel", PublishNamespaceCancel, {"namespace": NS, "error_code": 0,
                                                                 "reason": "expired"})
    control("subscribe_namespace", SubscribeNamespace, {"request_id": 10, "namespace_prefix": NS[:1],
                                                        "parameters": {}})
    control("subscribe_namespace_ok", SubscribeNamespaceOk, {"request_id": 10})
    control("subscribe_namespace_error", SubscribeNamespaceError, {"request_id": 10, "error_code": 5,
                                                                   "reason": "overlap"})
    control("unsubscribe_namespace", UnsubscribeNamespace, {"namespace_prefix": NS[:1]})


def subgroup_vector(name: str, header: dict[str, Any], objects: list[dict[str, Any]], note: str = "") -> None:
    sg = SubgroupHeader(**header)
    octets = _octets(sg.serialize())
    for obj in objects:
        octets += _octets(sg.next_object(**obj))
    data(name, "subgroup_stream", octets, {"header": header, "objects": objects},
         "aiomoqt.messages.data.SubgroupHeader.serialize + SubgroupHeader.next_object", note)


def data_vectors() -> None:
    subgroup_vector("subgroup_explicit_id", {"track_alias": 2, "group_id": 0, "subgroup_id": 0,
                                             "publisher_priority": 0, "subgroup_id_mode": 2},
                    [{"payload": b"abcd", "object_id": 0}, {"payload": b"efgh", "object_id": 1}],
                    note="the first example of draft-14 section 10.5 (type 0x14)")
    subgroup_vector("subgroup_zero_id_eog_extensions", {"track_alias": 5, "group_id": 0, "subgroup_id": 0,
                                                        "publisher_priority": 128, "subgroup_id_mode": 0,
                                                        "extensions_present": True, "end_of_group": True},
                    [{"payload": b"K" * 3 + b"V" * 3, "object_id": 0, "extensions": {0x4B56: 3}},
                     {"payload": b"layer1", "object_id": 1},
                     {"payload": b"", "object_id": 5, "status": ObjectStatus.END_OF_GROUP}],
                    note="KVSP codec extension 0x4B56 (decision D3); a gap (delta 3) before the End of Group")
    subgroup_vector("subgroup_first_object_id", {"track_alias": 9, "group_id": 12, "subgroup_id": None,
                                                 "publisher_priority": 7, "subgroup_id_mode": 1},
                    [{"payload": b"x", "object_id": 3}, {"payload": b"", "object_id": 4}])
    subgroup_vector("subgroup_status_extensions_dropped",
                    {"track_alias": 1, "group_id": 0, "subgroup_id": 0, "subgroup_id_mode": 0,
                     "extensions_present": True},
                    [{"payload": b"", "object_id": 0, "extensions": {0x3C: 1}, "status": ObjectStatus.END_OF_GROUP}])
    VECTORS[-1]["disagreement"] = (
        "aiomoqt writes an empty Extension Headers block for every non-Normal object on a subgroup stream, "
        "dropping the extensions it was given; draft-14 section 10.2.1.2 forbids extensions only on "
        "'Object Does Not Exist' objects, so an End of Group object may carry them (aiomoqt's FetchObject "
        "keeps them). The octets decode, per the draft, to an End of Group object with no extensions.")
    fetch = _octets(FetchHeader(request_id=2).serialize(prof=D14))
    objects = [{"group_id": 0, "subgroup_id": 0, "object_id": 0, "publisher_priority": 128, "payload": b"layer0"},
               {"group_id": 0, "subgroup_id": 0, "object_id": 1, "publisher_priority": 128,
                "extensions": {0x4B56: 2, 0x4D: b"trace"}, "payload": b"kkvv"},
               {"group_id": 0, "subgroup_id": 0, "object_id": 2, "publisher_priority": 128, "payload": b"",
                "status": ObjectStatus.END_OF_TRACK}]
    for obj in objects:
        fetch += _octets(FetchObject(**obj).serialize(prof=D14))
    data("fetch_stream", "fetch_stream", fetch, {"request_id": 2, "objects": objects},
         "aiomoqt.messages.data.FetchHeader.serialize + FetchObject.serialize(prof=PROFILES[14])")
    for name, fields in (
            ("datagram_object_id_zero", {"track_alias": 4, "group_id": 1, "object_id": 0, "payload": b"hello"}),
            ("datagram_eog_extensions", {"track_alias": 4, "group_id": 1, "object_id": 6, "publisher_priority": 9,
                                         "extensions": {0x3C: 2}, "payload": b"bye", "end_of_group": True})):
        data(name, "datagram", _octets(ObjectDatagram(**fields).serialize(prof=D14)), fields,
             "aiomoqt.messages.data.ObjectDatagram.serialize(prof=PROFILES[14])")
    status = {"track_alias": 4, "group_id": 2, "object_id": 0, "publisher_priority": 128,
              "status": ObjectStatus.END_OF_TRACK}
    data("datagram_status", "datagram", _octets(ObjectDatagramStatus(**status).serialize(prof=D14)), status,
         "aiomoqt.messages.data.ObjectDatagramStatus.serialize(prof=PROFILES[14])")


def main() -> None:
    control_vectors()
    data_vectors()
    out = {
        "description": "MOQT draft-14 wire vectors produced by aiomoqt's encoders (third-party cross-check)",
        "generator": "tests/vectors/moqt/gen_aiomoqt_vectors.py",
        "aiomoqt_version": VERSION,
        "draft": 14,
        "vectors": VECTORS,
    }
    path = Path(__file__).with_name("aiomoqt_vectors.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {len(VECTORS)} vectors to {path}")


if __name__ == "__main__":
    main()
