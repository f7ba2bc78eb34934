"""Fuzzing the session: arbitrary octets on the control stream, on data streams and in datagrams end
either with the session still open or in one clean close carrying a Session Termination code of the
draft (never INTERNAL_ERROR, which would mean a bug of ours) and a ``SessionTerminated`` event -- never
an exception escaping ``handle_event``. Like h11's fuzz check: accepted or the remote-protocol error.
Every draft whose control stream is bidirectional (14, 16) runs here; draft-18's request and control
streams are fuzzed in tests/test_moqt_draft18_session.py."""

from __future__ import annotations

from typing import TypeVar

import pytest
from aioquic.quic.events import DatagramFrameReceived, StreamDataReceived
from hypothesis import given, settings
from hypothesis import strategies as st

from moqt import Location, MoqtEvent, MoqtSession, SessionError, SessionTerminated
from moqt.data import FetchHeader, ObjectDatagram, SubgroupHeader
from moqt.messages import (
    Fetch,
    FetchCancel,
    GoAway,
    MaxRequestId,
    RequestsBlocked,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    Unsubscribe,
)
from moqt.profiles import PROFILES, Profile
from moqt.testing import RecordingQuic, established_session, feed_control, recording_session
from moqt.wire import encode_varint

E = TypeVar("E", bound=MoqtEvent)
BLOCK_NS = (b"kvsp", b"5e" * 32, b"6d" * 16, b"h" * 43, b"9c" * 32)


#: The drafts whose setup and control messages travel on one bidirectional stream.
BIDI_CONTROL = pytest.mark.parametrize("profile", [pytest.param(p, id=f"d{p.draft}") for p in PROFILES
                                                   if p.data_framing.control_stream_type is None])


def only(events: list[MoqtEvent], kind: type[E]) -> list[E]:
    return [e for e in events if isinstance(e, kind)]


def assert_clean(session: MoqtSession, quic: RecordingQuic, events: list[MoqtEvent]) -> None:
    """The session either lives on or was closed once, with a draft code, and said so in an event."""
    ends = only(events, SessionTerminated)
    if quic.close_args is None:
        assert not ends and not session.is_closed
        return
    assert len(ends) == 1 and not ends[0].remote
    assert ends[0].error_code == quic.close_args[0]
    assert ends[0].error in set(SessionError) - {SessionError.INTERNAL_ERROR, SessionError.NO_ERROR}
    assert session.is_closed


chunks = st.lists(st.binary(min_size=0, max_size=64), min_size=1, max_size=8)


@BIDI_CONTROL
@settings(max_examples=300)
@given(chunks, st.booleans())
def test_fuzz_control_stream_after_setup(profile: Profile, pieces: list[bytes], fin: bool) -> None:
    session, quic = established_session(is_client=False, profile=profile)
    events: list[MoqtEvent] = []
    for i, piece in enumerate(pieces):
        events += session.handle_event(StreamDataReceived(piece, fin and i == len(pieces) - 1, 0))
    assert_clean(session, quic, events)
    if fin:
        assert session.is_closed


@BIDI_CONTROL
@settings(max_examples=200)
@given(chunks)
def test_fuzz_control_stream_before_setup(profile: Profile, pieces: list[bytes]) -> None:
    for is_client in (True, False):
        session, quic = recording_session(is_client=is_client, profile=profile)
        events: list[MoqtEvent] = []
        for piece in pieces:
            events += session.handle_event(StreamDataReceived(piece, False, 0))
        assert_clean(session, quic, events)


@st.composite
def valid_prefix_then_junk(draw: st.DrawFn, profile: Profile) -> bytes:
    """A well-formed message or two, then arbitrary octets: reaches deeper session states."""
    good = draw(st.lists(st.sampled_from([message.encode(profile) for message in (
        Subscribe(0, BLOCK_NS, b"raw"), MaxRequestId(300), GoAway(""), SubscribeNamespace(0, BLOCK_NS[:1]),
        Fetch.standalone_fetch(0, BLOCK_NS, b"r", Location(0, 0), Location(0, 1)), Unsubscribe(0),
        FetchCancel(0), RequestsBlocked(0))]), max_size=3))
    # a well-framed message of a real type with an arbitrary payload exercises every decoder
    types = sorted(profile.message_types.codes.values())
    framed = draw(st.lists(st.builds(lambda t, p: encode_varint(t) + len(p).to_bytes(2, "big") + p,
                                     st.sampled_from(types), st.binary(max_size=40)), max_size=2))
    return b"".join(good) + b"".join(framed) + draw(st.binary(max_size=32))


@BIDI_CONTROL
@settings(max_examples=300)
@given(data=st.data(), split=st.integers(1, 16))
def test_fuzz_control_messages_in_any_order(profile: Profile, data: st.DataObject, split: int) -> None:
    octets = data.draw(valid_prefix_then_junk(profile))
    session, quic = established_session(is_client=False, profile=profile)
    events: list[MoqtEvent] = []
    for i in range(0, len(octets), split):
        events += feed_control(session, octets[i : i + split])
    assert_clean(session, quic, events)


data_stream_starts = st.one_of(
    st.binary(max_size=48),
    st.builds(lambda t, body: encode_varint(t) + body, st.integers(0, 0x3F),
              st.binary(max_size=48)),
    st.builds(lambda body: SubgroupHeader.create(1, 0).encode() + body, st.binary(max_size=48)),
    st.builds(lambda body: FetchHeader(2).encode() + body, st.binary(max_size=48)))


@BIDI_CONTROL
@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from([3, 7, 11]), data_stream_starts, st.booleans()), max_size=8),
       st.lists(st.binary(max_size=32), max_size=3))
def test_fuzz_data_streams_and_datagrams(profile: Profile, writes: list[tuple[int, bytes, bool]],
                                         datagrams: list[bytes]) -> None:
    session, quic = established_session(is_client=True, profile=profile)
    rid = session.subscribe(BLOCK_NS, b"raw")
    session.fetch(BLOCK_NS, b"raw", Location(0, 0), Location(0, 9))
    events = feed_control(session, SubscribeOk(rid, 1).encode(profile))
    ended: set[int] = set()
    for stream_id, data, fin in writes:
        if stream_id in ended:
            continue  # QUIC delivers nothing after FIN
        events += session.handle_event(StreamDataReceived(data, fin, stream_id))
        if fin:
            ended.add(stream_id)
    for datagram in datagrams:
        events += session.handle_event(DatagramFrameReceived(datagram))
    assert_clean(session, quic, events)


@BIDI_CONTROL
@settings(max_examples=100)
@given(st.binary(max_size=64))
def test_fuzz_datagram_body_with_known_alias(profile: Profile, body: bytes) -> None:
    session, quic = established_session(is_client=True, profile=profile)
    rid = session.subscribe(BLOCK_NS, b"raw")
    feed_control(session, SubscribeOk(rid, 1).encode(profile))
    datagram = ObjectDatagram(1, 0, 0, payload=b"").encode()[:3]  # type 0x04, alias 1, group 0
    assert_clean(session, quic, session.handle_event(DatagramFrameReceived(datagram + body)))
