"""Print MOQT draft-16 wire vectors made by aiomoqt's own encoders, as JSON lines of hex.

Run with the interop virtual environment (aiomoqt 0.13.3 needs Python >= 3.12; ``bash .ci/interop-env``
builds it)::

    .venv-interop/bin/python interop/peers/aiomoqt_d16_vectors.py

Each line is ``{"name", "kind", "hex", "source"}``: the octets aiomoqt wrote for fields this script
chose. tests/test_moqt_draft16_vectors.py commits them (with "source: aiomoqt 0.13.3") beside the
message kvsp expects each to decode to; this script only makes them again, it is not run by the tests.
It imports aiomoqt alone (no kvsp), so it runs in the interop environment as it is.
"""

from __future__ import annotations

from functools import partial

import _vectors as vectors
from _vectors import emit
from _vectors import octets as _octets
from aiomoqt.context import PROFILES
from aiomoqt.messages import (
    ClientSetup,
    FetchCancel,
    FetchHeader,
    FetchObject,
    FetchOk,
    GoAway,
    MaxSubscribeId,
    Namespace,
    NamespaceDone,
    ObjectDatagram,
    Publish,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishOk,
    RequestError,
    RequestOk,
    RequestUpdate,
    ServerSetup,
    SubgroupHeader,
    Subscribe,
    SubscribeDone,
    SubscribeNamespace,
    SubscribeOk,
    SubscribesBlocked,
    TrackStatus,
    Unsubscribe,
)
from aiomoqt.messages.fetch import Fetch
from aiomoqt.types import GroupOrder, ObjectStatus

D16 = PROFILES[16]
NS = (b"kvsp", b"5ed5c2f2")
NAME = b"raw"

control = partial(vectors.control, prof=D16)


def control_vectors() -> None:
    control("client_setup", ClientSetup(versions=[], parameters={0x01: "/kvsp", 0x02: 100}))
    control("client_setup_token_authority_implementation", ClientSetup(
        versions=[], parameters={0x03: b"cwt", 0x05: "relay.example:4443", 0x07: "aiomoqt/0.13.3"}))
    control("server_setup", ServerSetup(parameters={0x02: 50}))
    control("goaway", GoAway(new_session_uri="moqt://relay.example:4443/kvsp"))
    control("max_request_id", MaxSubscribeId(request_id=201))
    control("requests_blocked", SubscribesBlocked(maximum_request_id=64))
    control("subscribe_absolute_range", Subscribe(
        request_id=2, track_namespace=NS, track_name=NAME, priority=32, group_order=GroupOrder.DESCENDING,
        forward=0, filter_type=4, start_group=5, start_object=1, end_group=9, parameters={0x02: 5000}))
    control("subscribe_largest_object", Subscribe(request_id=0, track_namespace=NS, track_name=NAME,
                                                  filter_type=2, parameters={}))
    control("subscribe_ok", SubscribeOk(request_id=0, track_alias=7, expires=60000,
                                        group_order=GroupOrder.DESCENDING, largest_group_id=3,
                                        largest_object_id=31, parameters={}, track_extensions={0x0E: 64}))
    control("request_ok_largest", RequestOk(request_id=8, parameters={0x09: bytes([0x01, 0x02])}))
    control("request_error", RequestError(request_id=0, error_code=0x10, retry_interval=1001,
                                          reason="no such track"))
    control("request_update", RequestUpdate(request_id=6, existing_request_id=0,
                                            parameters={0x10: 0, 0x20: 16, 0x21: bytes([0x03, 0x04, 0x00])}))
    control("unsubscribe", Unsubscribe(request_id=0))
    control("publish_done", SubscribeDone(request_id=0, status_code=2, stream_count=3, reason="track ended"))
    control("publish", Publish(request_id=1, track_namespace=NS, track_name=NAME, track_alias=2,
                               group_order=GroupOrder.ASCENDING, content_exists=1, largest_group_id=0,
                               largest_object_id=11, forward=1, parameters={}, track_extensions={}))
    control("publish_ok", PublishOk(request_id=1, forward=1, priority=128, group_order=GroupOrder.ASCENDING,
                                    filter_type=3, start_group=0, start_object=0, parameters={}))
    control("fetch_standalone", Fetch(fetch_type=1, request_id=2, subscriber_priority=1,
                                      group_order=GroupOrder.ASCENDING, namespace=NS, track_name=NAME,
                                      start_group=0, start_object=0, end_group=0, end_object=33, parameters={}))
    control("fetch_relative_joining", Fetch(fetch_type=2, request_id=4, subscriber_priority=128,
                                            group_order=GroupOrder.PUBLISHER_DEFAULT, joining_request_id=0,
                                            joining_start=2, parameters={}))
    control("fetch_ok", FetchOk(request_id=2, end_of_track=1, largest_group_id=0, largest_object_id=33,
                                parameters={}, track_extensions={}))
    control("fetch_cancel", FetchCancel(request_id=2))
    control("track_status", TrackStatus(request_id=8, track_namespace=NS, track_name=NAME, parameters={}))
    control("publish_namespace", PublishNamespace(request_id=3, namespace=NS, parameters={}))
    control("publish_namespace_done", PublishNamespaceDone(request_id=3))
    control("publish_namespace_cancel", PublishNamespaceCancel(request_id=3, error_code=0x1, reason="expired"))
    control("subscribe_namespace", SubscribeNamespace(request_id=10, namespace_prefix=NS[:1], subscribe_options=1,
                                                      parameters={}))
    control("namespace", Namespace(namespace_suffix=NS[1:]))
    control("namespace_done", NamespaceDone(namespace_suffix=NS[1:]))


def data_vectors() -> None:
    header = SubgroupHeader(track_alias=2, group_id=0, subgroup_id=0, publisher_priority=0, prof=D16)
    octets = _octets(header.serialize()) + _octets(header.next_object(b"abcd")) + _octets(header.next_object(b"efgh"))
    emit("subgroup_explicit_id", "subgroup_stream", octets,
         "aiomoqt.messages.data.SubgroupHeader(prof=PROFILES[16]).serialize + next_object")
    header = SubgroupHeader(track_alias=5, group_id=0, subgroup_id=0, extensions_present=True, end_of_group=True,
                            subgroup_id_mode=0, default_priority=True, prof=D16)
    octets = _octets(header.serialize())
    octets += _octets(header.next_object(b"KKKVVV", extensions={0x4B56: 3, 0x4D: b"trace"}))
    octets += _octets(header.next_object(b"layer1"))
    octets += _octets(header.next_object(b"", status=ObjectStatus.END_OF_GROUP, object_id=5))
    emit("subgroup_default_priority_extensions", "subgroup_stream", octets,
         "aiomoqt.messages.data.SubgroupHeader(prof=PROFILES[16], default_priority=True).serialize + next_object")
    fetch = _octets(FetchHeader(request_id=2).serialize(prof=D16))
    for obj in (FetchObject(group_id=0, subgroup_id=0, object_id=0, payload=b"layer0"),
                FetchObject(group_id=0, subgroup_id=0, object_id=1, extensions={0x4B56: 2}, payload=b"kkvv"),
                FetchObject(group_id=0, object_id=4, end_of_range=0x8C),
                FetchObject(group_id=0, subgroup_id=0, object_id=5, payload=b"")):
        fetch += _octets(obj.serialize(prof=D16))
    emit("fetch_stream", "fetch_stream", fetch,
         "aiomoqt.messages.data.FetchHeader.serialize + FetchObject.serialize(prof=PROFILES[16])")
    for name, datagram in (
            ("datagram_object_id_zero", ObjectDatagram(track_alias=4, group_id=1, object_id=0, payload=b"hello")),
            ("datagram_eog_extensions", ObjectDatagram(track_alias=4, group_id=1, object_id=6, publisher_priority=9,
                                                       extensions={0x3C: 2}, payload=b"bye", end_of_group=True)),
            ("datagram_status", ObjectDatagram(track_alias=4, group_id=2, object_id=3,
                                               status=ObjectStatus.END_OF_TRACK))):
        emit(name, "datagram", _octets(datagram.serialize(prof=D16)),
             "aiomoqt.messages.data.ObjectDatagram.serialize(prof=PROFILES[16])")


if __name__ == "__main__":
    control_vectors()
    data_vectors()
