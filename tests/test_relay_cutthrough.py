"""Cut-through forwarding: the session's begin-object + payload-part API (moqt.session, moqt.data) and
the relay's `CutThrough`, which passes an upstream FETCH's pieces downstream as they arrive.

Sessions are two real aioquic connections in memory (moqt.testing.MoqtPair); the relay end-to-end
(pieces of objects larger than a datagram, over real QUIC and mTLS) is in tests/test_relay.py."""

from __future__ import annotations

from typing import Any

import pytest

from moqt.api import MoqtObject
from moqt.data import (
    DataStreamParser,
    FetchHeader,
    FetchWriter,
    ObjectHeader,
    PayloadChunk,
    SubgroupHeader,
    SubgroupWriter,
)
from moqt.errors import LocalError
from moqt.events import (
    ControlMessageReceived,
    DataStreamEnded,
    ObjectChunkReceived,
    ObjectReceived,
    ObjectSource,
    SessionEstablished,
)
from moqt.kinds import GroupOrder, ObjectStatus
from moqt.messages import FetchOk, Subscribe
from moqt.profiles import Profile
from moqt.testing import MoqtPair
from moqt.tracks import RequestKind, RequestTracker
from moqt.wire import KeyValuePair, Location
from relay.cutthrough import CutThrough, ForwardingAssembler
from tests.support.drafts import PROFILE_PARAMS

NS = (b"relay", b"cut", b"through")


@pytest.fixture(params=PROFILE_PARAMS)
def pair(request: pytest.FixtureRequest) -> MoqtPair:
    profile: Profile = request.param
    p = MoqtPair(client_options={"path": "/r"}, server_options={"path": "/r"}, profile=profile)
    assert any(isinstance(e, SessionEstablished) for e in p.client.take())
    assert any(isinstance(e, SessionEstablished) for e in p.server.take())
    return p


def _fetch(pair: MoqtPair, end: int = 4) -> int:
    rid = pair.client.moqt.fetch(NS, b"raw", Location(0, 0), Location(0, end), group_order=GroupOrder.ASCENDING)
    pair.pump()
    assert [e.message for e in pair.server.take() if isinstance(e, ControlMessageReceived)] != []
    return rid


def _objects(events: list[Any]) -> list[tuple[int, bytes]]:
    return [(e.object_id, bytes(e.payload)) for e in events if isinstance(e, ObjectReceived)]


# -- the writers (moqt.data) -------------------------------------------------------------------------------

def test_parts_encode_exactly_like_a_whole_object() -> None:
    payload = bytes(range(256)) * 40
    whole, parted = FetchWriter(FetchHeader(3)), FetchWriter(FetchHeader(3))
    ext = (KeyValuePair(0x4B56, 7),)
    expected = b"".join(bytes(p) for p in whole.encode_object(0, 0, 5, payload, publisher_priority=9, extensions=ext))
    head = parted.encode_object_header(0, 0, 5, len(payload), publisher_priority=9, extensions=ext)
    parts = [parted.payload_part(payload[i : i + 1000]) for i in range(0, len(payload), 1000)]
    assert head + b"".join(bytes(p) for p in parts) == expected
    assert parted.remaining == 0
    sub_whole, sub_parted = SubgroupWriter(SubgroupHeader.create(1, 0)), SubgroupWriter(SubgroupHeader.create(1, 0))
    expected = b"".join(bytes(p) for p in sub_whole.encode_object(2, payload))
    head = sub_parted.encode_object_header(2, len(payload))
    assert head + bytes(sub_parted.payload_part(payload[:10])) + bytes(sub_parted.payload_part(payload[10:])) \
        == expected


def test_writer_refuses_overlong_parts_and_a_new_object_before_the_last_is_complete() -> None:
    writer = SubgroupWriter(SubgroupHeader.create(1, 0))
    writer.encode_object_header(0, 10)
    with pytest.raises(ValueError, match="exceeds"):
        writer.payload_part(b"x" * 11)
    writer.payload_part(b"x" * 4)
    assert writer.remaining == 6
    with pytest.raises(ValueError, match="still owes 6"):
        writer.encode_object_header(1, 3)
    with pytest.raises(ValueError, match="still owes 6"):
        writer.encode_object(1, b"abc")
    writer.payload_part(memoryview(b"y" * 6))
    writer.encode_object_header(1, 0, status=ObjectStatus.END_OF_GROUP)
    with pytest.raises(ValueError, match="only a Normal object"):
        writer.encode_object_header(2, 5, status=ObjectStatus.END_OF_GROUP)


def test_parser_reads_a_parted_object_as_one() -> None:
    writer = FetchWriter(FetchHeader(0))
    wire = writer.encode_header() + writer.encode_object_header(0, 0, 0, 6)
    wire += bytes(writer.payload_part(b"abc")) + bytes(writer.payload_part(b"def"))
    events = DataStreamParser().feed(wire, True)
    [header] = [e for e in events if isinstance(e, ObjectHeader)]
    assert header.payload_length == 6
    assert b"".join(bytes(e.data) for e in events if isinstance(e, PayloadChunk)) == b"abcdef"


# -- the session (moqt.session) ----------------------------------------------------------------------------

def test_fetch_object_sent_in_parts_arrives_whole(pair: MoqtPair) -> None:
    client, server = pair.client.moqt, pair.server.moqt
    rid = _fetch(pair)
    server.fetch_ok(rid, Location(0, 2))
    stream = server.open_fetch_stream(rid)
    server.begin_fetch_object(stream, 0, 0, 0, 9, publisher_priority=3)
    assert server.payload_owed(stream) == 9
    server.send_payload(stream, b"abc")
    pair.pump()  # a part on the wire before the rest exists
    server.send_payload(stream, memoryview(b"defghi"))
    server.send_fetch_object(stream, 0, 0, 1, b"whole", end_of_stream=True)
    pair.pump()
    events = pair.client.take()
    assert _objects(events) == [(0, b"abcdefghi"), (1, b"whole")]
    assert any(isinstance(e, DataStreamEnded) for e in events)
    with pytest.raises(LocalError):
        client.fetch_cancel(rid)  # the fetch is over


def test_subgroup_object_in_parts_and_fin_only_when_complete(pair: MoqtPair) -> None:
    client, server = pair.client.moqt, pair.server.moqt
    rid = client.subscribe(NS, b"raw")
    pair.pump()
    assert any(isinstance(e, ControlMessageReceived) and isinstance(e.message, Subscribe) for e in pair.server.take())
    server.subscribe_ok(rid)
    stream = server.open_subgroup(rid, 0, extensions_present=True)
    server.begin_object(stream, 0, 4, extensions=(KeyValuePair(0x10, 1),))
    server.send_payload(stream, b"ab")
    with pytest.raises(LocalError, match="owes 2"):
        server.send_payload(stream, b"c", end_of_stream=True)  # a FIN here would cut the object
    with pytest.raises(LocalError, match="owes"):
        server.finish_stream(stream)
    with pytest.raises(LocalError, match="exceeds"):
        server.send_payload(stream, b"xyz")
    with pytest.raises(LocalError, match="use begin_object"):
        server.begin_fetch_object(stream, 0, 0, 1, 1)
    server.send_payload(stream, b"cd", end_of_stream=False)
    server.send_payload(stream, b"", end_of_stream=True)
    pair.pump()
    objs = [e for e in pair.client.take() if isinstance(e, ObjectReceived)]
    assert [(o.object_id, bytes(o.payload), o.extensions) for o in objs] == [(0, b"abcd", (KeyValuePair(0x10, 1),))]


def test_partial_delivery_can_be_switched_on_before_data(pair: MoqtPair) -> None:
    client, server = pair.client.moqt, pair.server.moqt
    assert not client.deliver_partial_objects
    client.deliver_partial_objects = True
    rid = _fetch(pair)
    stream = server.open_fetch_stream(rid)
    server.begin_fetch_object(stream, 0, 0, 0, 4)
    server.send_payload(stream, b"ab")
    pair.pump()
    server.send_payload(stream, b"cd", end_of_stream=True)
    pair.pump()
    chunks = [e for e in pair.client.take() if isinstance(e, ObjectChunkReceived)]
    assert [(c.offset, bytes(c.data), c.end_of_object) for c in chunks] == [(0, b"ab", False), (2, b"cd", True)]


# -- the relay's CutThrough ----------------------------------------------------------------------------------

class _Link:
    """Only what CutThrough asks of a link."""

    def __init__(self) -> None:
        self.transmits = 0

    def transmit_soon(self) -> None:
        self.transmits += 1


class _Downstream:
    """The downstream end of a relay: the server session of a MoqtPair, as an `Endpoint` looks to CutThrough."""

    def __init__(self, pair: MoqtPair) -> None:
        self.session = pair.server.moqt
        self.link = _Link()


def _chunk(object_id: int, length: int, offset: int, data: bytes) -> ObjectChunkReceived:
    return ObjectChunkReceived(ObjectSource.FETCH, 99, None, 3, 0, 0, object_id, 128, (), ObjectStatus.NORMAL, length,
                               offset, memoryview(data), offset + len(data) == length)


def _cut(pair: MoqtPair, rid: int) -> tuple[CutThrough, ForwardingAssembler, RequestTracker]:
    cut = CutThrough(_Downstream(pair), rid)  # type: ignore[arg-type]  # the session and link suffice
    tracker = cut.upstream = RequestTracker(RequestKind.FETCH)
    return cut, ForwardingAssembler(cut), tracker


def test_cut_through_passes_pieces_on_before_the_object_is_complete(pair: MoqtPair) -> None:
    rid = _fetch(pair)
    cut, assembler, tracker = _cut(pair, rid)
    tracker.on_ok(FetchOk(rid, Location(0, 2), GroupOrder.ASCENDING, True))
    assert assembler.chunk(_chunk(0, 6, 0, b"abc")) is None
    pair.pump()
    events = pair.client.take()  # FETCH_OK and the first half, before the upstream sent the rest
    assert [e.message for e in events if isinstance(e, ControlMessageReceived)] == [
        FetchOk(rid, Location(0, 2), GroupOrder.ASCENDING, True)]
    assert not _objects(events)
    obj = assembler.chunk(_chunk(0, 6, 3, b"def"))
    assert obj is not None and bytes(obj.payload) == b"abcdef"  # assembled for the cache as well
    assert cut.stream is not None
    pair.server.moqt.finish_stream(cut.stream)
    pair.pump()
    assert _objects(pair.client.take()) == [(0, b"abcdef")]
    assert cut.forwarded_objects == 1 and cut.error is None


def test_objects_that_overtook_fetch_ok_are_sent_whole_in_order(pair: MoqtPair) -> None:
    rid = _fetch(pair)
    cut, assembler, tracker = _cut(pair, rid)
    assembler.chunk(_chunk(0, 2, 0, b"aa"))  # before the upstream FETCH_OK: held
    assembler.chunk(_chunk(1, 4, 0, b"bb"))  # begun before it too
    ok = FetchOk(rid, Location(0, 3), GroupOrder.ASCENDING, False)
    tracker.on_ok(ok)
    assert cut.stream is None
    stream = cut.open(ok)  # the relay's task, once it saw FETCH_OK: object 0 goes out now
    assert cut.open(ok) == stream  # once only
    assembler.chunk(_chunk(1, 4, 2, b"cc"))  # object 1 completes: sent whole
    assembler.chunk(_chunk(2, 2, 0, b"dd"))  # object 2: passed on piece by piece
    pair.server.moqt.finish_stream(stream)
    pair.pump()
    assert _objects(pair.client.take()) == [(0, b"aa"), (1, b"bbcc"), (2, b"dd")]
    assert cut.forwarded_objects == 1


def test_a_failed_downstream_write_stops_forwarding(pair: MoqtPair) -> None:
    rid = _fetch(pair)
    cut, assembler, tracker = _cut(pair, rid)
    tracker.on_ok(FetchOk(rid, Location(0, 2), GroupOrder.ASCENDING, False))
    assembler.chunk(_chunk(0, 4, 0, b"ab"))
    assert cut.stream is not None
    pair.pump()
    pair.client.moqt.fetch_cancel(rid)  # the subscriber gave up: the session resets the fetch stream
    pair.pump()
    obj = assembler.chunk(_chunk(0, 4, 2, b"cd"))
    assert isinstance(obj, MoqtObject)  # still assembled: the upstream side is not disturbed
    assert isinstance(cut.error, LocalError)
    assembler.chunk(_chunk(1, 1, 0, b"e"))
    assert cut.forwarded_objects == 0

