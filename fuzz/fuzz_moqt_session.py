"""Fuzz target ``moqt_session``: the sans-I/O MOQT session (moqt/session/) fed arbitrary event sequences.

The session runs over ``moqt.testing.RecordingQuic`` (the in-memory stand-in for aioquic's connection
that the session tests use), so an input costs no handshake.  Input: one octet of session options
(role, whether setup has happened, partial-object delivery, deferred setup acceptance, a token cache,
small limits), then operations, each an octet and its fields: raw control-stream octets, a framed
control message of any draft-14 type with arbitrary payload, data-stream octets (with or without FIN)
on one of four peer streams, a datagram, a RESET_STREAM or STOP_SENDING, the control stream's FIN,
the clock moving (GOAWAY timeout), or a local call answering what the peer asked (SUBSCRIBE_OK,
FETCH_OK with a fetch stream, objects and datagrams on an accepted subscription, cancels, GOAWAY).
Before the operations, an established session has made a request of each kind of its own, so that
the peer's answers find requests in every state.

Contract (the session's own: moqt/session/connection.py): ``handle_event`` and ``handle_timer`` never
raise; the session either lives on or closes exactly once, with a draft Session Termination code that
is not INTERNAL_ERROR (which would be a bug of ours) and a ``SessionTerminated`` event naming the code
the QUIC connection was closed with; after the close, events yield nothing and nothing more is written
to the connection; a local call raises only ``LocalError`` (misuse and state the peer caused).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aioquic.quic.events import (
    ConnectionTerminated,
    DatagramFrameReceived,
    QuicEvent,
    StopSendingReceived,
    StreamDataReceived,
    StreamReset,
)

from fuzz.common import VARINT_EDGES, ContractViolation, Cursor, OpWriter, check, fuzz_main
from moqt import DRAFT_14, Location, MoqtEvent, MoqtSession, SessionError, SessionTerminated
from moqt.data import FetchHeader, FetchWriter, ObjectDatagram, SubgroupHeader, SubgroupWriter
from moqt.errors import LocalError
from moqt.events import ControlMessageReceived, SetupRequested
from moqt.kinds import FetchType, FilterType, GroupOrder, ObjectStatus
from moqt.messages import (
    ControlMessage,
    Fetch,
    FetchCancel,
    FetchOk,
    GoAway,
    JoiningFetch,
    MaxRequestId,
    Publish,
    PublishDone,
    PublishError,
    PublishNamespace,
    PublishNamespaceCancel,
    PublishNamespaceDone,
    PublishNamespaceOk,
    PublishOk,
    Subscribe,
    SubscribeNamespace,
    SubscribeNamespaceError,
    SubscribeNamespaceOk,
    SubscribeOk,
    SubscribeUpdate,
    TrackStatus,
    TrackStatusOk,
    Unsubscribe,
)
from moqt.params import AuthToken, SetupParameters
from moqt.session import SessionLimits
from moqt.testing import RecordingQuic, client_setup_bytes, recording_session, server_setup_bytes
from moqt.wire import VARINT_MAX, KeyValuePair, encode_varint

TARGET = "moqt_session"
INSTRUMENT = ("moqt",)
MESSAGE_TYPES = tuple(sorted(DRAFT_14.message_types.codes.values()))
BLOCK_NS: Final = (b"kvsp", b"5e" * 32, b"6d" * 16, b"h" * 43, b"9c" * 32)
TRACK: Final = b"raw"
MAX_OPS: Final = 48
SMALL_LIMITS: Final = SessionLimits(max_control_message_length=256, max_object_size=64, max_extensions_length=32,
                                    max_held_bytes=256, max_deferred_messages=2)
# The object bound of the default limits is 64 MiB, and an object spanning events is assembled into a
# buffer of its declared length: a fuzz input may declare several.  Harness limits keep that small.
DEFAULT_LIMITS: Final = SessionLimits(max_object_size=1 << 16)

# Operation codes (one octet each, taken modulo their count).
CONTROL, MESSAGE, STREAM, DATAGRAM, RESET, STOP, LOCAL, TIMER, CONTROL_FIN, TERMINATED, STRUCTURED = range(11)
OPS: Final = 11
# Field values a structured message draws from: small ones, so that IDs and locations meet the session's,
# and the edges of the varint range, which random octets reach only by luck (a SUBSCRIBE_OK whose
# Largest Location is the last Object ID of a group closed the session with INTERNAL_ERROR).
EDGES: Final = (VARINT_MAX, VARINT_MAX - 1, 2**32, 2**30 - 1, 2**30, 2**14, 63, 64, 255, 256)


@dataclass
class Harness:
    """One session under test and what the checks need to remember about it."""

    session: MoqtSession
    quic: RecordingQuic
    is_client: bool
    control_id: int = 0
    now: float = 0.0
    ends: int = 0
    remote_end: bool = False
    closed_writes: tuple[object, ...] | None = None
    finished: set[int] = field(default_factory=set)
    peer_requests: list[ControlMessage] = field(default_factory=list)
    local_requests: list[int] = field(default_factory=list)
    streams: dict[int, tuple[bool, int]] = field(default_factory=dict)  # our data stream -> (is fetch, next id)
    setup_pending: bool = False

    def peer_stream(self, index: int) -> int:
        """The peer's unidirectional streams: 3, 7, 11... from a server, 2, 6, 10... from a client."""
        return (3 if self.is_client else 2) + 4 * index

    def writes(self) -> tuple[object, ...]:
        q = self.quic
        return ({k: len(v) for k, v in q.stream_data.items()}, len(q.datagrams), dict(q.resets), dict(q.stops),
                set(q.finished))

    def observe(self, events: list[MoqtEvent]) -> None:
        """The contract, checked after every call into the session."""
        for event in events:
            if isinstance(event, SessionTerminated):
                self.ends += 1
                if event.remote:
                    self.remote_end = True
                else:
                    check(event.error is not SessionError.INTERNAL_ERROR, f"INTERNAL_ERROR: {event.reason_phrase}")
                    check(event.error is not None and event.error is not SessionError.NO_ERROR,
                          f"closed without a draft code: {event!r}")
                    check(self.quic.close_args is not None and self.quic.close_args[0] == event.error_code,
                          "SessionTerminated does not name the code the connection closed with")
            elif isinstance(event, ControlMessageReceived):
                self.peer_requests.append(event.message)
            elif isinstance(event, SetupRequested):
                self.setup_pending = True
        check(self.ends <= 1, "the session ended twice")
        if self.session.is_closed:
            check(self.ends == 1 or self.quic.close_args is not None, "the session closed without saying so")
            if self.closed_writes is None:
                self.closed_writes = self.writes()
            else:
                check(self.writes() == self.closed_writes, "the session wrote to the connection after it closed")
        else:
            check(self.ends == 0 and self.quic.close_args is None, "the connection closed but the session is open")

    def feed(self, event: QuicEvent) -> None:
        events = self.session.handle_event(event)
        if self.closed_writes is not None:
            check(not events, "a closed session produced events")
        self.observe(events)


def make(options: int) -> Harness:
    is_client = bool(options & 1)
    kwargs: dict[str, object] = {"deliver_partial_objects": bool(options & 4),
                                 "limits": SMALL_LIMITS if options & 32 else DEFAULT_LIMITS}
    if not is_client and options & 8:
        kwargs["auto_accept"] = False
    if options & 16:
        kwargs["max_auth_token_cache_size"] = 256
    session, quic = recording_session(is_client=is_client, **kwargs)
    harness = Harness(session, quic, is_client)
    harness.observe([])
    if options & 2:  # established: the peer's setup arrived (and, deferred, was accepted)
        harness.feed(StreamDataReceived(server_setup_bytes() if is_client else client_setup_bytes(), False, 0))
        if harness.setup_pending:
            harness.observe(session.accept_setup())
            harness.setup_pending = False
        if session.is_established:
            own_requests(harness)
    return harness


def own_requests(h: Harness) -> None:
    """One request of each kind of our own, so that the peer's answers meet requests in every state."""
    s = h.session
    h.local_requests += [
        s.subscribe(BLOCK_NS, TRACK), s.fetch(BLOCK_NS, b"other", Location(0, 0), Location(0, 9)),
        s.subscribe_namespace(BLOCK_NS[:1]), s.publish_namespace(BLOCK_NS[:2]), s.track_status(BLOCK_NS, TRACK),
        s.publish(BLOCK_NS, b"pub"),
    ]
    h.observe([])


def local_call(h: Harness, cursor: Cursor) -> None:
    """A call the application could make now; LocalError is its answer to a state it may not act in."""
    s = h.session
    choice = cursor.choice(10)
    pick = cursor.u8()
    try:
        if choice == 0 and h.setup_pending:
            h.setup_pending = False
            h.observe(s.accept_setup())
            return
        if choice <= 3 and h.peer_requests:
            answer(h, h.peer_requests[pick % len(h.peer_requests)], accept=choice != 3, cursor=cursor)
        elif choice == 4 and h.streams:
            stream_id = list(h.streams)[pick % len(h.streams)]
            send_object(h, stream_id, cursor)
        elif choice == 5 and h.local_requests:
            rid = h.local_requests[pick % len(h.local_requests)]
            if pick & 1:
                s.fetch_cancel(rid)
            else:
                s.unsubscribe(rid)
        elif choice == 6:
            s.goaway("", now=h.now, timeout=1.0)
        elif choice == 7:
            s.grant_requests(pick % 8)
        elif choice == 8 and h.peer_requests:
            message = h.peer_requests[pick % len(h.peer_requests)]
            if isinstance(message, Subscribe):
                s.send_datagram(message.request_id, cursor.u8(), cursor.u8(), cursor.chunk())
        elif choice == 9 and h.streams:
            stream_id = list(h.streams)[pick % len(h.streams)]
            s.finish_stream(stream_id)
            del h.streams[stream_id]
    except LocalError:
        pass
    h.observe([])


def answer(h: Harness, message: ControlMessage, *, accept: bool, cursor: Cursor) -> None:
    s = h.session
    rid = getattr(message, "request_id", None)
    if rid is None:
        return
    if isinstance(message, Subscribe):
        if accept:
            s.subscribe_ok(rid, largest_location=Location(cursor.u8(), cursor.u8()))
            stream_id = s.open_subgroup(rid, cursor.u8(), cursor.u8() % 3)
            h.streams[stream_id] = (False, 0)
        else:
            s.subscribe_error(rid)
    elif isinstance(message, Fetch):
        if accept:
            s.fetch_ok(rid, Location(cursor.u8(), cursor.u8()), end_of_track=cursor.flag())
            h.streams[s.open_fetch_stream(rid)] = (True, 0)
        else:
            s.fetch_error(rid)
    elif isinstance(message, Publish):
        if accept:
            s.publish_ok(rid)
        else:
            s.publish_error(rid)
    elif isinstance(message, PublishNamespace):
        if accept:
            s.publish_namespace_ok(rid)
        else:
            s.publish_namespace_error(rid)
    elif isinstance(message, SubscribeNamespace):
        if accept:
            s.subscribe_namespace_ok(rid)
        else:
            s.subscribe_namespace_error(rid)
    elif isinstance(message, TrackStatus):
        if accept:
            s.track_status_ok(rid)
        else:
            s.track_status_error(rid)


def send_object(h: Harness, stream_id: int, cursor: Cursor) -> None:
    is_fetch, object_id = h.streams[stream_id]
    payload = cursor.chunk()
    end = cursor.flag()
    if is_fetch:
        h.session.send_fetch_object(stream_id, 0, 0, object_id, payload, end_of_stream=end)
    else:
        h.session.send_object(stream_id, object_id, payload, end_of_stream=end)
    h.streams[stream_id] = (is_fetch, object_id + 1)
    if end:
        del h.streams[stream_id]


def number(cursor: Cursor) -> int:
    raw = cursor.u8()
    return EDGES[(raw - 0xC0) % len(EDGES)] if raw >= 0xC0 else raw % 12


def location(cursor: Cursor) -> Location:
    return Location(number(cursor), number(cursor))


def maybe_location(cursor: Cursor) -> Location | None:
    return location(cursor) if cursor.flag() else None


def structured(cursor: Cursor) -> ControlMessage:
    """A well-formed message of any kind after setup, its fields from the input: what framed random
    payloads rarely are (a valid namespace, a filter with its Locations), so that every handler is reached."""
    kind = cursor.choice(22)
    rid = number(cursor)
    order = (GroupOrder.ASCENDING, GroupOrder.DESCENDING)[cursor.choice(2)]
    if kind >= 8:
        return namespace_or_answer(kind, rid, order, cursor)
    if kind == 0:
        return SubscribeOk(rid, number(cursor), number(cursor), order, maybe_location(cursor))
    if kind == 1:
        return Publish(rid, BLOCK_NS, TRACK, number(cursor), order, maybe_location(cursor), cursor.flag())
    if kind == 2:
        return FetchOk(rid, location(cursor), order, cursor.flag())
    if kind == 3:
        filter_type = tuple(FilterType)[cursor.choice(len(FilterType))]
        ranged = filter_type in (FilterType.ABSOLUTE_START, FilterType.ABSOLUTE_RANGE)
        end_group = number(cursor) if filter_type == FilterType.ABSOLUTE_RANGE else None
        return Subscribe(rid, BLOCK_NS, TRACK, cursor.u8(), order, cursor.flag(), filter_type,
                         location(cursor) if ranged else None, end_group)
    if kind == 4:
        return Fetch.standalone_fetch(rid, BLOCK_NS, TRACK, location(cursor), location(cursor))
    if kind == 5:
        joining = FetchType.ABSOLUTE_JOINING if cursor.flag() else FetchType.RELATIVE_JOINING
        return Fetch(rid, joining, None, JoiningFetch(number(cursor), number(cursor)))
    if kind == 6:
        return PublishDone(rid, number(cursor), number(cursor), "done")
    return SubscribeUpdate(rid, number(cursor), location(cursor), number(cursor) if cursor.flag() else None)


def namespace_or_answer(kind: int, rid: int, order: GroupOrder, cursor: Cursor) -> ControlMessage:
    # Prefixes of the namespace the session's own requests use, so that they match, overlap or not.
    ns = BLOCK_NS[: 1 + cursor.choice(len(BLOCK_NS))]
    code = number(cursor)
    messages: tuple[Callable[[], ControlMessage], ...] = (
        lambda: TrackStatus(rid, ns, TRACK, cursor.u8(), order, cursor.flag()),
        lambda: PublishNamespace(rid, ns), lambda: SubscribeNamespace(rid, ns),
        lambda: PublishOk(rid, cursor.flag(), cursor.u8(), order, FilterType.LARGEST_OBJECT),
        lambda: PublishError(rid, code, "no"), lambda: FetchCancel(rid), lambda: Unsubscribe(rid),
        lambda: PublishNamespaceDone(ns), lambda: PublishNamespaceCancel(ns, code, "gone"),
        lambda: PublishNamespaceOk(rid), lambda: SubscribeNamespaceOk(rid), lambda: SubscribeNamespaceError(rid, code),
        lambda: TrackStatusOk(rid, 0, number(cursor), order, maybe_location(cursor)), lambda: MaxRequestId(code),
    )
    return messages[(kind - 8) % len(messages)]()


def step(h: Harness, op: int, cursor: Cursor) -> None:
    if op == CONTROL:
        h.feed(StreamDataReceived(cursor.chunk(), False, h.control_id))
    elif op == MESSAGE:
        message_type = MESSAGE_TYPES[cursor.choice(len(MESSAGE_TYPES))]
        payload = cursor.chunk()
        h.feed(StreamDataReceived(encode_varint(message_type) + len(payload).to_bytes(2, "big") + payload, False,
                                  h.control_id))
    elif op == STREAM:
        stream_id = h.peer_stream(cursor.choice(4))
        data, fin = cursor.chunk(), cursor.flag()
        if stream_id not in h.finished:  # QUIC delivers nothing on a stream after its FIN or reset
            h.feed(StreamDataReceived(data, fin, stream_id))
            if fin:
                h.finished.add(stream_id)
    elif op == DATAGRAM:
        h.feed(DatagramFrameReceived(cursor.chunk()))
    elif op == RESET:
        which = cursor.choice(5)
        stream_id = h.control_id if which == 4 else h.peer_stream(which)
        if stream_id not in h.finished:
            h.feed(StreamReset(error_code=cursor.u8(), stream_id=stream_id))
            h.finished.add(stream_id)
    elif op == STOP:
        ours = sorted(h.quic.stream_data)
        stream_id = ours[cursor.choice(len(ours))] if ours else h.control_id
        h.feed(StopSendingReceived(error_code=cursor.u8(), stream_id=stream_id))
    elif op == LOCAL:
        local_call(h, cursor)
    elif op == TIMER:
        h.now += cursor.u8() / 64
        h.observe(h.session.handle_timer(h.now))
    elif op == CONTROL_FIN:
        h.feed(StreamDataReceived(b"", True, h.control_id))
    elif op == TERMINATED:
        h.feed(ConnectionTerminated(error_code=cursor.u8(), frame_type=None, reason_phrase="peer left"))
    elif op == STRUCTURED:
        try:
            frame = structured(cursor).encode(DRAFT_14)
        except ValueError:  # fields our own encoder refuses to send (a local rule, not the peer's)
            return
        h.feed(StreamDataReceived(frame, False, h.control_id))


def test_one_input(data: bytes) -> None:
    cursor = Cursor(data)
    h = make(cursor.u8())
    for _ in range(MAX_OPS):
        if not cursor.remaining:
            break
        try:
            step(h, cursor.choice(OPS), cursor)
        except LocalError as exc:  # local calls answer misuse inside local_call; none may escape elsewhere
            raise ContractViolation(f"a local call raised outside the harness's guard: {exc!r}") from exc


# -- seeds ---------------------------------------------------------------------------------------------
def message(w: OpWriter, msg: ControlMessage) -> OpWriter:
    return w.u8(CONTROL).chunk(msg.encode(DRAFT_14))


def seeds() -> list[bytes]:
    subgroup = SubgroupWriter(SubgroupHeader.create(0, 1, 0))
    sub_octets = b"".join(bytes(p) for p in [subgroup.encode_header(), *subgroup.encode_object(0, b"layer0"),
                                             *subgroup.encode_object(1, b"x" * 40)])
    fetch = FetchWriter(FetchHeader(2))
    fetch_octets = b"".join(bytes(p) for p in [fetch.encode_header(), *fetch.encode_object(0, 0, 0, b"abc"),
                                               *fetch.encode_object(0, 0, 1, status=ObjectStatus.END_OF_GROUP)])
    datagram = ObjectDatagram(0, 1, 2, payload=b"dgram", extensions=(KeyValuePair(2, 1),)).encode()
    client = OpWriter().u8(0b11)  # client, established: answers to its own requests, then objects
    message(client, SubscribeOk(0, 0, 0))
    client.u8(STREAM).u8(0).chunk(sub_octets[:5]).u8(0).u8(STREAM).u8(0).chunk(sub_octets[5:]).u8(1)
    message(client, FetchOk(2, Location(0, 9)))
    client.u8(STREAM).u8(1).chunk(fetch_octets).u8(1).u8(DATAGRAM).chunk(datagram)
    message(client, PublishDone(0, 0, 1))
    message(client, MaxRequestId(400))
    message(client, GoAway("moqt://elsewhere.example/"))
    client.u8(TIMER).u8(200)
    server = OpWriter().u8(0b10)  # server, established: the peer's requests, answered locally, objects out
    message(server, Subscribe(0, BLOCK_NS, TRACK))
    message(server, Fetch.standalone_fetch(2, BLOCK_NS, TRACK, Location(0, 0), Location(0, 3)))
    message(server, SubscribeNamespace(4, BLOCK_NS[:1]))
    server.u8(LOCAL).u8(1).u8(0).u8(3).u8(1).u8(2).u8(1)  # SUBSCRIBE_OK + open a subgroup
    server.u8(LOCAL).u8(4).u8(0).chunk(b"payload").u8(0)  # an object on it
    server.u8(LOCAL).u8(2).u8(1).u8(0).u8(5).u8(0)  # FETCH_OK + fetch stream
    server.u8(LOCAL).u8(4).u8(1).chunk(b"fetched").u8(1)
    server.u8(STOP).u8(1).u8(0).u8(LOCAL).u8(6).u8(0).u8(TIMER).u8(255)
    raw_server = OpWriter().u8(0b1000)  # server, deferred setup, before any setup
    token = AuthToken.use_value(0, b"cwt")
    raw_server.u8(CONTROL).chunk(client_setup_bytes(SetupParameters(max_request_id=5, authorization_tokens=(token,))))
    message(raw_server, Subscribe(0, BLOCK_NS, TRACK)).u8(LOCAL).u8(0).u8(0)
    raws: list[bytes] = []
    raw_client = OpWriter().u8(0b10001).u8(CONTROL).chunk(server_setup_bytes()[:3]).u8(CONTROL)
    raw_client.chunk(server_setup_bytes()[3:]).u8(CONTROL_FIN)
    edges = OpWriter().u8(0b11)  # client: answers whose Locations sit at the varint's edges
    edges.u8(STRUCTURED).u8(0).u8(0).u8(0).u8(1).u8(0).u8(1).u8(3).u8(0xC0)  # SUBSCRIBE_OK, Largest 3/max
    edges.u8(STRUCTURED).u8(2).u8(2).u8(0).u8(0xC0).u8(0).u8(1)  # FETCH_OK, End max/0, End of Track
    raws.append(edges.getvalue())
    small = OpWriter().u8(0b100011)
    message(small, SubscribeOk(0, 0, 0)).u8(STREAM).u8(2).chunk(sub_octets).u8(0).u8(RESET).u8(2).u8(3)
    raws.append(small.getvalue())
    return [client.getvalue(), server.getvalue(), raw_server.getvalue(), raw_client.getvalue(), *raws]


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT, max_len=2048, dictionary=VARINT_EDGES)
