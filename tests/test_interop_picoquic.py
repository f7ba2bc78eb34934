"""aiomoqt 0.13.3 against our MOQT endpoints on the picoquic back-end (issue 19, item 4), at every draft.

tests/test_interop.py runs our side on aioquic in the test process; here our side is ``moqt.api``
(``Publisher.listen``, ``Subscriber.connect``, ``Publisher.connect_relay``) with ``QuicSettings(quic=
"picoquic")``, run by interop/pico_side.py in the picoquic venv (aiopquic needs Python >= 3.12), while
aiomoqt runs from the interop venv as in the aioquic suite. Once per draft of ``moqt.profiles.PROFILES``,
aiomoqt pinned to it, our dialling side too, our servers accepting every draft:

* aiomoqt's subscriber FETCHes and SUBSCRIBEs from our picoquic publisher, authenticated by its D3 token
  (a picoquic server never sees a client certificate); without a token, or with a bad one, it is refused
  with the draft's code;
* our picoquic subscriber FETCHes and SUBSCRIBEs from aiomoqt's publisher, and refuses one whose
  certificate chains to another CA;
* both directions through aiomoqt's relay.

Every payload is compared octet for octet with the block computed here (interop/content.py), the draft is
checked on both sides, and our server reports the token's subject. Skipped with one line when either venv
cannot be had, a failure instead with ``KVSP_REQUIRE_PICO=1`` (or ``KVSP_REQUIRE_INTEROP=1``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from interop.content import BlockSpec
from interop.harness import (
    AIOMOQT_VERSION,
    RELAY_READY,
    Aiomoqt,
    Credentials,
    InteropUnavailable,
    PeerMessage,
    aiomoqt_version,
    ensure_interop_python,
    free_udp_port,
)
from interop.pico import PicoSide, ensure_pico_python
from moqt.kinds import MessageKind, RequestError, SessionError
from moqt.profiles import Profile
from tests.test_interop import (
    AIOMOQT_LIVE,
    AIOMOQT_STORED,
    BLOCK,
    INTERVAL,
    NEWEST,
    SCOPE,
    SECRET,
    STORED,
    SUBJECT,
    TEST_BUDGET_S,
    T,
    assert_live,
    assert_ok,
    assert_relay_sessions,
    credentials,
    draft,
    profile,
    relay_sessions,
    token,
    track_ended,
)

__all__ = ["credentials", "draft", "profile"]  # the fixtures of tests/test_interop.py, used here too

PICO = "PicoConnection"  # our side's connection class (moqt/quic/pico/): the settings did choose picoquic
REQUIRE_ENVS = ("KVSP_REQUIRE_PICO", "KVSP_REQUIRE_INTEROP")  # CI: a skip here is a failure


@dataclass(frozen=True, slots=True)
class Peers:
    aiomoqt: Aiomoqt
    kvsp: PicoSide


@pytest.fixture(scope="module")
def peers(credentials: Credentials, tmp_path_factory: pytest.TempPathFactory) -> Peers:
    try:
        pico, interop = ensure_pico_python(), ensure_interop_python()
    except InteropUnavailable as exc:
        required = [name for name in REQUIRE_ENVS if os.environ.get(name)]
        if required:
            pytest.fail(f"{exc} (and ${required[0]} is set)")
        pytest.skip(str(exc))
    assert aiomoqt_version(interop) == AIOMOQT_VERSION, "the interop venv must pin aiomoqt 0.13.3"
    key = tmp_path_factory.mktemp("pico-issuer") / "issuer.pub.pem"
    key.write_bytes(credentials.issuer.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    return Peers(Aiomoqt(interop, credentials), PicoSide(pico, credentials, key))


# -- our side's reports ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Track:
    """One request of our picoquic subscriber, as interop/pico_side.py reported it."""

    mode: str
    reply: str | None
    ended: bool
    error: str | None
    objects: tuple[Mapping[str, object], ...]

    @classmethod
    def decode(cls, item: object) -> Track:
        assert isinstance(item, dict), item
        objects = item.get("objects")
        assert isinstance(objects, list)
        return cls(str(item["mode"]), item.get("reply"), item.get("ended") is True, item.get("error"),
                   tuple(objects))

    def layers(self) -> list[bytes]:
        """The payloads of the Normal objects of group 0, in arrival order (status objects dropped)."""
        assert all(o["group"] == 0 for o in self.objects), self.objects
        return [bytes.fromhex(str(o["payload"])) for o in self.objects if o["status"] == "NORMAL"]

    def object_ids(self) -> list[int]:
        return [int(str(o["object"])) for o in self.objects if o["status"] == "NORMAL"]

    def arrivals(self) -> list[float]:
        return [float(str(o["at"])) for o in self.objects if o["status"] == "NORMAL"]


def tracks_of(result: PeerMessage) -> list[Track]:
    items = result.fields.get("tracks")
    assert isinstance(items, list), result.fields
    return [Track.decode(item) for item in items]


def payloads(block: BlockSpec) -> list[bytes]:
    """The block's layers as computed here, independently of either side."""
    return [block.payload(layer) for layer in range(block.layers)]


def assert_whole(track: Track, block: BlockSpec, reply: str) -> None:
    assert (track.reply, track.ended, track.error) == (reply, True, None), track
    assert track.object_ids() == list(range(block.layers))
    assert track.layers() == payloads(block)


def assert_token_session(message: PeerMessage, profile: Profile, sessions: int) -> None:
    """Our picoquic server accepted a session at ``profile``'s draft, authenticated by the test token only."""
    fields = message.fields
    assert fields["accepted"] is True, fields
    assert (fields["identity"], fields["authenticated_by"]) == (SUBJECT, "token")
    assert (fields["draft"], fields["alpn"], fields["transport"]) == (profile.draft, profile.alpn, PICO)
    assert fields["sessions_by_draft"] == {str(profile.draft): sessions}


def requests_seen(*messages: PeerMessage) -> list[tuple[object, object, object]]:
    """What our publisher reported of each request: its type, track name and the session's draft."""
    return [(m.fields["type"], m.fields["track"], m.fields["draft"]) for m in messages]


# -- aiomoqt subscriber -> our picoquic publisher --------------------------------------------------
async def test_aiomoqt_fetches_and_subscribes_from_our_picoquic_publisher(peers: Peers, credentials: Credentials,
                                                                          profile: Profile) -> None:
    draft, port = profile.draft, free_udp_port()  # aiopquic cannot listen on port 0
    uri = f"moqt://127.0.0.1:{port}/kvsp"
    async with asyncio.timeout(TEST_BUDGET_S), peers.kvsp.server(port, [BLOCK, SECRET], live=[AIOMOQT_LIVE],
                                                                interval=INTERVAL) as ours:
        await ours.expect("ready", T)
        fetched = await peers.aiomoqt.subscriber(uri, BLOCK, "fetch", draft=draft, token=token(credentials),
                                                 timeout=T)
        first_session, fetch = await ours.expect("session", T), await ours.expect("request", T)
        live = await peers.aiomoqt.subscriber(uri, AIOMOQT_LIVE, "subscribe", draft=draft,
                                              token=token(credentials), timeout=T)
        second_session, subscribe = await ours.expect("session", T), await ours.expect("request", T)
        outside = await peers.aiomoqt.subscriber(uri, SECRET, "fetch", draft=draft, token=token(credentials),
                                                 timeout=T)  # its scope is not in the token
        third_session, secret = await ours.expect("session", T), await ours.expect("request", T)
        refused = await peers.aiomoqt.subscriber(uri, BLOCK, "fetch", draft=draft, timeout=T)  # no token
        refusal = await ours.expect("session", T)
    for report in (fetched, live):
        assert_ok(report)
        assert report.draft == draft, report.raw
    assert_token_session(first_session, profile, 1)
    assert_token_session(second_session, profile, 2)
    assert_token_session(third_session, profile, 3)
    assert requests_seen(fetch, subscribe, secret) == [("fetch", "raw", draft), ("subscribe", "raw", draft),
                                                       ("fetch", "raw", draft)]
    assert fetched.reply == "FetchOk" and fetched.raw.get("fetch_stream_fin") is True
    assert [o.payload for o in fetched.layers] == payloads(BLOCK)
    assert [o.object for o in fetched.layers] == list(range(BLOCK.layers))
    assert live.reply == "SubscribeOk"
    assert [o.payload for o in live.layers] == payloads(AIOMOQT_LIVE)
    assert_live([o.recv_us / 1e6 for o in live.layers], AIOMOQT_LIVE.layers)
    assert live.publish_done_status == track_ended(profile)
    # D3's per-request check on the token's claims, which a picoquic connection holds as an aioquic one does.
    assert not outside.ok and outside.stage == "request", outside.raw
    assert outside.raw.get("error_code") == profile.request_error_code(MessageKind.FETCH_ERROR,
                                                                       RequestError.UNAUTHORIZED)
    # No certificate can reach a picoquic server: without a token the setup is refused, at this draft.
    assert (refusal.fields["accepted"], refusal.fields["authenticated_by"]) == (False, None)
    assert not refused.ok and refused.stage == "setup" and refused.draft == draft, refused.raw
    assert refused.close_code == profile.session_errors.code(SessionError.UNAUTHORIZED), refused.raw


async def test_our_picoquic_publisher_refuses_bad_tokens_with_the_drafts_codes(peers: Peers, credentials: Credentials,
                                                                              profile: Profile) -> None:
    """Only the Session Termination code crosses picoquic (no reason phrase): aiomoqt must read the draft's
    code for a token signed by an untrusted key, one that is not a CWT, and an expired one."""
    cases = [
        (credentials.token(SUBJECT, [SCOPE], key=ec.generate_private_key(ec.SECP256R1())), SessionError.UNAUTHORIZED),
        (b"not a CBOR web token", SessionError.MALFORMED_AUTH_TOKEN),
        (credentials.token(SUBJECT, [SCOPE], lifetime=60, age=120), SessionError.EXPIRED_AUTH_TOKEN),
    ]
    port = free_udp_port()
    uri = f"moqt://127.0.0.1:{port}/kvsp"
    async with asyncio.timeout(TEST_BUDGET_S), peers.kvsp.server(port, [BLOCK]) as ours:
        await ours.expect("ready", T)
        outcomes = []
        for bad, error in cases:
            report = await peers.aiomoqt.subscriber(uri, BLOCK, "fetch", draft=profile.draft, token=bad, timeout=T)
            outcomes.append((report, error, await ours.expect("session", T)))
    for report, error, seen in outcomes:
        assert not report.ok and report.stage == "setup" and report.draft == profile.draft, report.raw
        assert report.close_code == profile.session_errors.code(error), (error, report.raw)
        assert (seen.fields["accepted"], seen.fields["identity"]) == (False, None), seen.fields


# -- our picoquic subscriber -> aiomoqt publisher --------------------------------------------------
def assert_our_client(fields: Mapping[str, object], profile: Profile, uri: str) -> None:
    """Our picoquic client agreed ``profile``'s ALPN. It cannot learn the server's identity URI (aiopquic
    exposes no peer certificate): picotls checked the chain and host name, so the peer is the URI dialled,
    authenticated by server name, never by certificate."""
    assert (fields["draft"], fields["alpn"], fields["transport"]) == (profile.draft, profile.alpn, PICO), fields
    assert (fields["peer_identity"], fields["authenticated_by"]) == (uri, "server-name"), fields


async def test_our_picoquic_subscriber_fetches_and_subscribes_from_aiomoqt_publisher(
        peers: Peers, credentials: Credentials, profile: Profile, tmp_path: Path) -> None:
    port = free_udp_port()
    uri = f"moqt://127.0.0.1:{port}/"
    other = PicoSide(peers.kvsp.python, Credentials.create(tmp_path / "other"), peers.kvsp.token_key)
    async with asyncio.timeout(TEST_BUDGET_S), peers.aiomoqt.publisher(
            [AIOMOQT_STORED], draft=profile.draft, live=[AIOMOQT_LIVE], listen=port, interval=INTERVAL) as theirs:
        await theirs.expect("ready", T)
        async with peers.kvsp.subscriber(uri, [AIOMOQT_STORED], live=[AIOMOQT_LIVE],
                                         drafts=[profile.draft]) as ours:
            result = await ours.expect("result", 3 * T)
        session = await theirs.expect("session", T)
        async with other.subscriber(uri, [AIOMOQT_STORED], drafts=[profile.draft]) as untrusting:
            refused = await untrusting.expect("error", 2 * T)  # picotls refuses the chain: the handshake fails
    assert session.fields["draft"] == profile.draft
    assert_our_client(result.fields, profile, uri)
    assert result.fields["implementation"] == f"aiomoqt/{AIOMOQT_VERSION}"
    fetched, live = tracks_of(result)
    assert_whole(fetched, AIOMOQT_STORED, "FetchOk")
    assert_whole(live, AIOMOQT_LIVE, "SubscribeOk")
    assert_live(live.arrivals(), AIOMOQT_LIVE.layers)
    assert "ConnectionClosedError" in str(refused.fields["error"]), refused.fields


async def test_open_offers_agree_on_our_newest_draft_over_picoquic(peers: Peers, credentials: Credentials) -> None:
    """Nobody pinned. aiomoqt's client offers its default list (22..14) to our picoquic server (every draft of
    PROFILES), and our picoquic client offers PROFILES to aiomoqt's server accepting its default list: both
    servers' selectors (ours via picoquic's, aiomoqt's via aiopquic's: server preference, newest first)
    land on our newest draft."""
    ours_port, theirs_port = free_udp_port(), free_udp_port()
    uri, their_uri = f"moqt://127.0.0.1:{ours_port}/kvsp", f"moqt://127.0.0.1:{theirs_port}/"
    async with asyncio.timeout(TEST_BUDGET_S), peers.kvsp.server(ours_port, [BLOCK]) as ours, \
            peers.aiomoqt.publisher([AIOMOQT_STORED], draft="all", listen=theirs_port) as theirs:
        await ours.expect("ready", T)
        await theirs.expect("ready", T)
        report = await peers.aiomoqt.subscriber(uri, BLOCK, "fetch", draft="all", token=token(credentials), timeout=T)
        session = await ours.expect("session", T)
        async with peers.kvsp.subscriber(their_uri, [AIOMOQT_STORED]) as client:
            result = await client.expect("result", 2 * T)
        their_session = await theirs.expect("session", T)
    assert_ok(report)
    assert report.draft == NEWEST.draft
    assert_token_session(session, NEWEST, 1)
    assert [o.payload for o in report.layers] == payloads(BLOCK)
    assert_our_client(result.fields, NEWEST, their_uri)
    assert their_session.fields["draft"] == NEWEST.draft
    (fetched,) = tracks_of(result)
    assert_whole(fetched, AIOMOQT_STORED, "FetchOk")


# -- through aiomoqt's relay -----------------------------------------------------------------------
async def test_our_picoquic_subscriber_through_aiomoqt_relay_from_aiomoqt_publisher(peers: Peers,
                                                                                   profile: Profile) -> None:
    draft, port = profile.draft, free_udp_port()
    relay_uri = f"moqt://127.0.0.1:{port}/"
    async with asyncio.timeout(TEST_BUDGET_S), peers.aiomoqt.relay(port, draft=draft) as relay:
        relay_sessions(relay, draft)
        await relay.wait_for_line(RELAY_READY, T)
        async with peers.aiomoqt.publisher([AIOMOQT_STORED], draft=draft, live=[AIOMOQT_LIVE], connect=relay_uri,
                                           interval=INTERVAL) as theirs:
            ready = await theirs.expect("ready", T)
            async with peers.kvsp.subscriber(relay_uri, [AIOMOQT_STORED], live=[AIOMOQT_LIVE],
                                             drafts=[draft]) as ours:
                result = await ours.expect("result", 3 * T)
        assert_relay_sessions(relay, draft, 2)  # the publisher's and ours
    assert ready.fields.get("draft") == draft
    assert_our_client(result.fields, profile, relay_uri)
    fetched, live = tracks_of(result)
    assert_whole(fetched, AIOMOQT_STORED, "FetchOk")  # not in the relay's cache: forwarded upstream
    assert_whole(live, AIOMOQT_LIVE, "SubscribeOk")
    assert_live(live.arrivals(), AIOMOQT_LIVE.layers)


async def test_aiomoqt_subscriber_through_aiomoqt_relay_from_our_picoquic_publisher(peers: Peers,
                                                                                   profile: Profile) -> None:
    """Our picoquic Publisher announces to the relay (``connect_relay``); aiomoqt SUBSCRIBEs and FETCHes
    through it, so the relay's upstream requests reach our publisher over picoquic."""
    draft, port = profile.draft, free_udp_port()
    relay_uri = f"moqt://127.0.0.1:{port}/"
    async with asyncio.timeout(TEST_BUDGET_S), peers.aiomoqt.relay(port, draft=draft) as relay:
        relay_sessions(relay, draft)
        await relay.wait_for_line(RELAY_READY, T)
        async with peers.kvsp.relay_publisher(relay_uri, [STORED], live=[BLOCK], drafts=[draft],
                                              interval=INTERVAL) as ours:
            ready = await ours.expect("ready", T)
            live = await peers.aiomoqt.subscriber(relay_uri, BLOCK, "subscribe", draft=draft, timeout=T)
            upstream = await peers.aiomoqt.subscriber(relay_uri, STORED, "fetch", draft=draft, timeout=T)
            seen = [await ours.expect("request", T) for _ in range(2)]
        assert_relay_sessions(relay, draft, 3)  # ours and the two subscribers'
    assert_our_client(ready.fields, profile, relay_uri)
    assert requests_seen(*seen) == [("subscribe", "raw", draft), ("fetch", "raw", draft)]
    for report in (live, upstream):
        assert_ok(report)
        assert report.draft == draft
    assert [o.payload for o in live.layers] == payloads(BLOCK)
    assert_live([o.recv_us / 1e6 for o in live.layers], BLOCK.layers)
    assert live.publish_done_status == track_ended(profile)
    assert [o.payload for o in upstream.layers] == payloads(STORED)


def test_payload_comparison_fails_on_one_wrong_octet() -> None:
    """The comparison every test above relies on sees a single flipped octet (no venv needed)."""
    good = {"group": 0, "object": 0, "status": "NORMAL", "at": 0.0}
    block = BlockSpec(BLOCK.namespace, BLOCK.track, 1, 8, 8)
    right = bytearray(block.payload(0))
    track = Track("fetch", "FetchOk", True, None, ({**good, "payload": right.hex()},))
    assert_whole(track, block, "FetchOk")
    right[5] ^= 1
    wrong = Track("fetch", "FetchOk", True, None, ({**good, "payload": right.hex()},))
    with pytest.raises(AssertionError):
        assert_whole(wrong, block, "FetchOk")

