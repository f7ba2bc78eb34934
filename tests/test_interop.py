"""MOQT interop with a third-party stack: aiomoqt 0.13.3 (PyPI) over raw QUIC, at every draft we speak.

Every test runs once per draft in ``moqt.profiles.PROFILES`` (14: ALPN moq-00; 16: moqt-16; 18:
moqt-18), aiomoqt pinned to that draft alone (``--draft N``: its ALPN only) and our client pinned to it
too where we dial (``QuicSettings(drafts=(N,))``); our servers accept every draft, and each test checks
on both sides which draft was agreed. One more test lets aiomoqt offer its default list (newest first)
and checks our server picks our newest draft. kvsp's side is ``MoqtSession`` + ``moqt.quic``
(interop/endpoints.py); aiomoqt's side runs as subprocesses of the interop venv (Python 3.12; the first
interop test builds it with ``.ci/interop-env`` when absent): its client and ``PublishedTrack`` driven
by interop/peers/*.py, and its ``moq-interop-relay``. Both sides compute the block's bytes independently
(interop/content.py) and every receiver checks the layer digests. See interop/README.md for what aiomoqt
does differently.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from interop.content import BlockSpec
from interop.endpoints import (
    INTEROP_SETTINGS,
    BlockPublisher,
    InteropError,
    Subscriber,
    client_config,
    verify_block,
)
from interop.harness import (
    AIOMOQT_VERSION,
    RELAY_READY,
    Aiomoqt,
    Credentials,
    InteropUnavailable,
    PeerProcess,
    PeerReport,
    aiomoqt_version,
    ensure_interop_python,
    free_udp_port,
)
from kvsp.container import replica_digest
from kvsp.identifiers import TrackNamespace, role_id
from moqt import MessageKind, MoqtEvent, ObjectStatus, PublishDoneStatus, RequestError, SessionError
from moqt.messages import FetchOk, SubscribeOk
from moqt.profiles import PROFILES, Profile
from moqt.quic import EndpointConfig, MoqtServer, connect, serve
from moqt.tls import PeerCertificateError

# CI sets this: there a skip of the interop suite is a failure, not a quiet pass.
REQUIRE_ENV = "KVSP_REQUIRE_INTEROP"

DRAFTS = [p.draft for p in PROFILES]  # newest first; a draft joins the suite when it joins PROFILES
BY_DRAFT = {p.draft: p for p in PROFILES}
NEWEST = PROFILES[0]

TEST_BUDGET_S = 45.0  # every test ends (and kills its subprocesses) within this
T = 10.0  # one request's bound
INTERVAL = 0.05  # seconds between layers of a block being produced
SUBJECT = "https://aiomoqt-client.interop.test/"
SCOPE = hashlib.sha256(b"interop scope").digest()[:16]
OTHER_SCOPE = hashlib.sha256(b"another scope").digest()[:16]


def kvsp_block(name: bytes, *, scope: bytes = SCOPE, holder: str = Credentials.KVSP_URI,
               layers: int = 8, k_size: int = 12 << 10, v_size: int = 12 << 10) -> BlockSpec:
    """A block per D3: namespace "kvsp", compat_id, scope_id, producer holder-id, block_key; track "raw"."""
    namespace = TrackNamespace(compat_id=hashlib.sha256(b"interop compat").digest(), scope_id=scope,
                               holder_id=role_id(holder), block_key=hashlib.sha256(name).digest())
    TrackNamespace.from_fields(namespace.fields())  # the profile's own check
    return BlockSpec(namespace.fields(), b"raw", layers, k_size, v_size)


BLOCK = kvsp_block(b"kvsp block")
SECRET = kvsp_block(b"kvsp secret", scope=OTHER_SCOPE)  # its scope is not in the test token
STORED = kvsp_block(b"kvsp stored")  # through the relay: FETCHed without a subscription first
AIOMOQT_STORED = kvsp_block(b"aiomoqt stored", holder=Credentials.AIOMOQT_URI)
AIOMOQT_LIVE = kvsp_block(b"aiomoqt live", holder=Credentials.AIOMOQT_URI)


def record_digest(block: BlockSpec) -> bytes:
    """The replica digest a record would carry: over the layer digests computed from the content."""
    return replica_digest(block.layer_digest(layer) for layer in range(block.layers))


def assert_live(arrivals_s: list[float], layers: int) -> None:
    """Layer l arrived while layer l+1 was still being produced: arrivals spread over the production."""
    assert len(arrivals_s) == layers
    assert arrivals_s == sorted(arrivals_s)
    assert arrivals_s[-1] - arrivals_s[0] >= 0.5 * (layers - 1) * INTERVAL, arrivals_s


def track_ended(profile: Profile) -> int:
    """PUBLISH_DONE TRACK_ENDED's code on the wire at ``profile``'s draft, as aiomoqt reports it."""
    return profile.publish_done.code(PublishDoneStatus.TRACK_ENDED)


# -- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(params=DRAFTS, ids=[f"d{d}" for d in DRAFTS])
def draft(request: pytest.FixtureRequest) -> int:
    """The draft a test runs at: aiomoqt is pinned to it, and so is our side where it dials."""
    value = request.param
    assert isinstance(value, int)
    return value


@pytest.fixture
def profile(draft: int) -> Profile:
    return BY_DRAFT[draft]


@pytest.fixture(scope="module")
def credentials(tmp_path_factory: pytest.TempPathFactory) -> Credentials:
    return Credentials.create(tmp_path_factory.mktemp("interop-pki"))


@pytest.fixture(scope="module")
def aiomoqt(credentials: Credentials) -> Aiomoqt:
    try:
        python = ensure_interop_python()
    except InteropUnavailable as exc:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{exc} (and ${REQUIRE_ENV} is set)")
        pytest.skip(str(exc))
    assert aiomoqt_version(python) == AIOMOQT_VERSION, "the interop venv must pin aiomoqt 0.13.3"
    return Aiomoqt(python, credentials)


@dataclass
class KvspServer:
    server: MoqtServer[MoqtEvent]
    publisher: BlockPublisher

    @property
    def uri(self) -> str:
        return f"moqt://127.0.0.1:{self.server.port}/kvsp"


@pytest.fixture
async def kvsp_server(credentials: Credentials) -> AsyncIterator[KvspServer]:
    """kvsp's publisher as a server: token-authenticated clients, BLOCK and SECRET served."""
    publisher = BlockPublisher([BLOCK, SECRET], interval=INTERVAL, path="/kvsp")
    config = EndpointConfig.from_files(credentials.cert("kvsp"), credentials.key("kvsp"), credentials.ca,
                                       INTEROP_SETTINGS, token_keys=[credentials.issuer.public_key()])
    server = await serve("127.0.0.1", 0, config, publisher.session_factory, on_event=publisher.on_event)
    try:
        yield KvspServer(server, publisher)
    finally:
        await publisher.aclose()
        server.close()
        await asyncio.wait_for(server.wait_closed(), T)


def token(credentials: Credentials, scopes: list[bytes] | None = None) -> bytes:
    return credentials.token(SUBJECT, [SCOPE] if scopes is None else scopes)


def assert_ok(report: PeerReport) -> None:
    assert report.ok, f"aiomoqt subscriber failed at {report.stage}: {report.error} ({report.raw!r:.400})"


# -- (a), (b): aiomoqt subscriber -> kvsp publisher ------------------------------------------------
def assert_agreed(report: PeerReport, server: KvspServer, draft: int) -> None:
    """Both sides name the same draft: aiomoqt's report and our server's count of sessions by draft."""
    assert report.draft == draft, report.raw
    assert server.server.sessions_by_draft == {draft: 1}


async def test_aiomoqt_fetches_stored_block_from_kvsp(aiomoqt: Aiomoqt, credentials: Credentials,
                                                      kvsp_server: KvspServer, draft: int) -> None:
    async with asyncio.timeout(TEST_BUDGET_S):
        report = await aiomoqt.subscriber(kvsp_server.uri, BLOCK, "fetch", draft=draft, token=token(credentials),
                                          timeout=T)
    assert_ok(report)
    assert_agreed(report, kvsp_server, draft)
    assert report.reply == "FetchOk"
    assert report.raw.get("fetch_stream_fin") is True
    assert verify_block(BLOCK, report.triples()) == record_digest(BLOCK)
    assert [o.payload for o in report.layers] == [BLOCK.payload(layer) for layer in range(BLOCK.layers)]
    assert {o.subgroup for o in report.layers} == {0}
    stats = kvsp_server.publisher.stats
    assert (stats.fetches, stats.completed, stats.refusals, stats.setups_rejected) == (1, 1, [], [])
    assert kvsp_server.publisher.identities == [SUBJECT]
    (session,) = kvsp_server.publisher.sessions.values()
    assert session.profile.draft == draft
    (setup,) = kvsp_server.publisher.setups  # aiomoqt's CLIENT_SETUP (draft-18: SETUP) as kvsp decoded it
    assert (setup.path, setup.authority) == ("/kvsp", f"127.0.0.1:{kvsp_server.server.port}")
    assert setup.implementation == f"aiomoqt/{AIOMOQT_VERSION}"  # type 0x07, see interop/README.md
    assert setup.unknown == ()


async def test_aiomoqt_offering_its_default_drafts_gets_our_newest(aiomoqt: Aiomoqt, credentials: Credentials,
                                                                  kvsp_server: KvspServer) -> None:
    """aiomoqt's own offer (22, 20, 18, 16, 14, newest first) against our server (every draft of PROFILES):
    the handshake lands on our newest draft, whatever aiomoqt offers beyond it."""
    async with asyncio.timeout(TEST_BUDGET_S):
        report = await aiomoqt.subscriber(kvsp_server.uri, BLOCK, "fetch", draft="all", token=token(credentials),
                                          timeout=T)
    assert_ok(report)
    assert_agreed(report, kvsp_server, NEWEST.draft)
    assert verify_block(BLOCK, report.triples()) == record_digest(BLOCK)


async def test_aiomoqt_subscribes_to_block_being_produced_by_kvsp(aiomoqt: Aiomoqt, credentials: Credentials,
                                                                  kvsp_server: KvspServer, profile: Profile) -> None:
    async with asyncio.timeout(TEST_BUDGET_S):
        report = await aiomoqt.subscriber(kvsp_server.uri, BLOCK, "subscribe", draft=profile.draft,
                                          token=token(credentials), timeout=T)
    assert_ok(report)
    assert_agreed(report, kvsp_server, profile.draft)
    assert report.reply == "SubscribeOk"
    assert verify_block(BLOCK, report.triples()) == record_digest(BLOCK)
    assert_live([o.recv_us / 1e6 for o in report.layers], BLOCK.layers)
    assert report.publish_done_status == track_ended(profile)
    assert kvsp_server.publisher.stats.subscriptions == 1


# -- (e): kvsp refuses aiomoqt without a valid token -----------------------------------------------
@pytest.mark.parametrize(("case", "error"), [
    ("none", SessionError.UNAUTHORIZED),
    ("rogue-signer", SessionError.UNAUTHORIZED),
    ("malformed", SessionError.MALFORMED_AUTH_TOKEN),
    ("expired", SessionError.EXPIRED_AUTH_TOKEN),
])
async def test_kvsp_refuses_aiomoqt_without_valid_token(aiomoqt: Aiomoqt, credentials: Credentials,
                                                        kvsp_server: KvspServer, case: str,
                                                        error: SessionError, profile: Profile) -> None:
    code = profile.session_errors.code(error)  # on the wire at this draft, as aiomoqt reports it
    tokens = {
        "none": None,
        "rogue-signer": credentials.token(SUBJECT, [SCOPE], key=ec.generate_private_key(ec.SECP256R1())),
        "malformed": b"not a CBOR web token",
        "expired": credentials.token(SUBJECT, [SCOPE], lifetime=60, age=120),
    }
    async with asyncio.timeout(TEST_BUDGET_S):
        report = await aiomoqt.subscriber(kvsp_server.uri, BLOCK, "fetch", draft=profile.draft, token=tokens[case],
                                          timeout=T)
    assert not report.ok and report.stage == "setup", report.raw
    assert report.close_code == code, report.raw
    assert report.objects == ()
    assert report.draft == profile.draft  # agreed by ALPN before the setup was refused
    stats = kvsp_server.publisher.stats
    assert [c for c, _ in stats.setups_rejected] == [code] and stats.fetches == 0
    assert kvsp_server.server.sessions_by_draft == {profile.draft: 1}


async def test_kvsp_refuses_requests_outside_the_token_scope(aiomoqt: Aiomoqt, credentials: Credentials,
                                                              kvsp_server: KvspServer, profile: Profile) -> None:
    async with asyncio.timeout(TEST_BUDGET_S):
        report = await aiomoqt.subscriber(kvsp_server.uri, SECRET, "fetch", draft=profile.draft,
                                          token=token(credentials), timeout=T)
    assert not report.ok and report.stage == "request", report.raw
    assert_agreed(report, kvsp_server, profile.draft)
    unauthorized = profile.request_error_code(MessageKind.FETCH_ERROR, RequestError.UNAUTHORIZED)
    assert report.raw.get("error_code") == unauthorized
    assert kvsp_server.publisher.stats.refusals == [("fetch", RequestError.UNAUTHORIZED)]


# -- (c): kvsp subscriber -> aiomoqt publisher -----------------------------------------------------
def assert_speaks(sub: Subscriber, profile: Profile) -> None:
    """Our client's handshake agreed ``profile``'s ALPN, and its session speaks that draft."""
    assert (sub.conn.quic.tls.alpn_negotiated, sub.session.profile.draft) == (profile.alpn, profile.draft)


async def test_kvsp_fetches_and_subscribes_from_aiomoqt_publisher(aiomoqt: Aiomoqt, credentials: Credentials,
                                                                   profile: Profile) -> None:
    port = free_udp_port()
    async with asyncio.timeout(TEST_BUDGET_S), aiomoqt.publisher(
            [AIOMOQT_STORED], draft=profile.draft, live=[AIOMOQT_LIVE], listen=port, interval=INTERVAL) as peer:
        await peer.expect("ready", T)
        sub = await Subscriber.connect(f"moqt://127.0.0.1:{port}/", credentials.ca, drafts=(profile.draft,))
        try:
            assert sub.conn.peer_identity == Credentials.AIOMOQT_URI  # our chain check of aiomoqt's cert
            assert_speaks(sub, profile)
            server_setup = sub.session.peer_parameters
            assert server_setup is not None and server_setup.implementation == f"aiomoqt/{AIOMOQT_VERSION}"
            fetched = await sub.fetch(AIOMOQT_STORED, timeout=T)
            theirs = await peer.expect("session", T)  # the draft aiomoqt's session speaks
            live = await sub.subscribe(AIOMOQT_LIVE, timeout=T)
        finally:
            await sub.close()
    assert theirs.fields.get("draft") == profile.draft
    assert isinstance(fetched.reply, FetchOk) and fetched.reply.end_of_track is False
    assert verify_block(AIOMOQT_STORED, fetched.triples()) == record_digest(AIOMOQT_STORED)
    assert isinstance(live.reply, SubscribeOk) and live.reply.largest_location is None
    assert verify_block(AIOMOQT_LIVE, live.triples()) == record_digest(AIOMOQT_LIVE)
    assert_live([o.at for o in live.layers], AIOMOQT_LIVE.layers)
    # aiomoqt ends the group with an End of Group status object (ID = layers), then FIN.
    ended = [(o.object, o.status) for o in live.objects if o.status is not ObjectStatus.NORMAL]
    assert ended == [(AIOMOQT_LIVE.layers, ObjectStatus.END_OF_GROUP)]
    assert live.end_of_group and live.stream_ended
    assert live.publish_done is not None and live.publish_done.status_code == track_ended(profile)
    assert live.publish_done.stream_count == 1


async def test_kvsp_offering_every_draft_agrees_with_aiomoqt_offering_its_defaults(
        aiomoqt: Aiomoqt, credentials: Credentials) -> None:
    """Neither side pinned: our client offers every draft of PROFILES, aiomoqt's server accepts its default
    list (22..14). aiopquic's ALPN selector (``aiopquic_alpn_select_cb``) takes the server's most preferred
    ALPN the client offered, newest first, so both sessions speak our newest draft, and a FETCH works."""
    port = free_udp_port()
    async with asyncio.timeout(TEST_BUDGET_S), aiomoqt.publisher([AIOMOQT_STORED], draft="all", listen=port) as peer:
        await peer.expect("ready", T)
        sub = await Subscriber.connect(f"moqt://127.0.0.1:{port}/", credentials.ca)
        try:
            agreed = sub.session.profile
            assert_speaks(sub, agreed)
            fetched = await sub.fetch(AIOMOQT_STORED, timeout=T)
            theirs = await peer.expect("session", T)
        finally:
            await sub.close()
    assert agreed is NEWEST and theirs.fields.get("draft") == NEWEST.draft
    assert verify_block(AIOMOQT_STORED, fetched.triples()) == record_digest(AIOMOQT_STORED)


async def test_aiomoqt_publisher_sends_no_publish_done_for_request_id_0(aiomoqt: Aiomoqt, credentials: Credentials,
                                                                       profile: Profile) -> None:
    """Known aiomoqt 0.13.3 bug (interop/README.md): ``PublishedTrack._send_publish_done`` returns early
    ``if not req_id``, so a subscription with Request ID 0 -- a client's first request -- never gets
    PUBLISH_DONE. The objects and the end of the group still arrive."""
    port = free_udp_port()
    async with asyncio.timeout(TEST_BUDGET_S), aiomoqt.publisher(
            [], draft=profile.draft, live=[AIOMOQT_LIVE], listen=port, interval=0.01) as peer:
        await peer.expect("ready", T)
        sub = await Subscriber.connect(f"moqt://127.0.0.1:{port}/", credentials.ca, drafts=(profile.draft,))
        try:
            assert_speaks(sub, profile)
            live = await sub.subscribe(AIOMOQT_LIVE, timeout=T, publish_done_wait=1.0)
        finally:
            await sub.close()
    assert live.request_id == 0
    assert verify_block(AIOMOQT_LIVE, live.triples()) == record_digest(AIOMOQT_LIVE)
    assert live.end_of_group and live.publish_done is None


async def test_kvsp_refuses_aiomoqt_server_certificate_from_another_ca(aiomoqt: Aiomoqt, credentials: Credentials,
                                                                       tmp_path: Path, draft: int) -> None:
    other = Credentials.create(tmp_path / "other")
    port = free_udp_port()
    async with asyncio.timeout(TEST_BUDGET_S), aiomoqt.publisher([AIOMOQT_STORED], draft=draft,
                                                                 listen=port) as peer:
        await peer.expect("ready", T)
        with pytest.raises(PeerCertificateError, match="server certificate"):
            await Subscriber.connect(f"moqt://127.0.0.1:{port}/", other.ca, drafts=(draft,))


# -- (d): through aiomoqt's relay ------------------------------------------------------------------
def relay_sessions(relay: PeerProcess, draft: int) -> None:
    """Count the sessions aiomoqt's relay logs (``relay: session quic d16 from 127.0.0.1:P``) and those
    at ``draft``; :func:`assert_relay_sessions` compares them."""
    relay.watch("relay: session ")
    relay.watch(f" d{draft} from ")


def assert_relay_sessions(relay: PeerProcess, draft: int, count: int) -> None:
    assert (relay.seen("relay: session "), relay.seen(f" d{draft} from ")) == (count, count), relay.diagnostics()


async def test_kvsp_subscriber_through_aiomoqt_relay_from_aiomoqt_publisher(aiomoqt: Aiomoqt,
                                                                           credentials: Credentials,
                                                                           profile: Profile) -> None:
    port = free_udp_port()
    relay_uri = f"moqt://127.0.0.1:{port}/"
    async with asyncio.timeout(TEST_BUDGET_S), aiomoqt.relay(port, draft=profile.draft) as relay:
        relay_sessions(relay, profile.draft)
        await relay.wait_for_line(RELAY_READY, T)
        async with aiomoqt.publisher([AIOMOQT_STORED], draft=profile.draft, live=[AIOMOQT_LIVE],
                                     connect=relay_uri, interval=INTERVAL) as peer:
            ready = await peer.expect("ready", T)
            sub = await Subscriber.connect(relay_uri, credentials.ca, drafts=(profile.draft,))
            try:
                assert_speaks(sub, profile)
                live = await sub.subscribe(AIOMOQT_LIVE, timeout=T)
                fetched = await sub.fetch(AIOMOQT_STORED, timeout=T)
            finally:
                await sub.close()
        assert_relay_sessions(relay, profile.draft, 2)  # the publisher's and ours
    assert ready.fields.get("draft") == profile.draft
    assert verify_block(AIOMOQT_LIVE, live.triples()) == record_digest(AIOMOQT_LIVE)
    assert_live([o.at for o in live.layers], AIOMOQT_LIVE.layers)
    assert live.publish_done is not None and live.publish_done.status_code == track_ended(profile)
    assert verify_block(AIOMOQT_STORED, fetched.triples()) == record_digest(AIOMOQT_STORED)


async def test_aiomoqt_subscriber_through_aiomoqt_relay_from_kvsp_publisher(aiomoqt: Aiomoqt,
                                                                           credentials: Credentials,
                                                                           profile: Profile) -> None:
    """kvsp announces its namespaces to the relay; aiomoqt SUBSCRIBEs and FETCHes through it."""
    port = free_udp_port()
    relay_uri = f"moqt://127.0.0.1:{port}/"
    publisher = BlockPublisher([BLOCK, STORED], interval=INTERVAL)
    draft = profile.draft
    async with asyncio.timeout(TEST_BUDGET_S), aiomoqt.relay(port, draft=draft) as relay:
        relay_sessions(relay, draft)
        await relay.wait_for_line(RELAY_READY, T)
        conn = await connect(relay_uri, client_config(credentials.ca, drafts=(draft,)), publisher.session_factory,
                             on_event=publisher.on_event)
        try:
            await publisher.wait_announced(T)
            assert conn.peer_identity == Credentials.AIOMOQT_URI
            (session,) = publisher.sessions.values()
            assert (conn.quic.tls.alpn_negotiated, session.profile.draft) == (profile.alpn, draft)
            live = await aiomoqt.subscriber(relay_uri, BLOCK, "subscribe", draft=draft, timeout=T)
            upstream = await aiomoqt.subscriber(relay_uri, STORED, "fetch", draft=draft, timeout=T)
            fetches_after_upstream = publisher.stats.fetches
            again = await aiomoqt.subscriber(relay_uri, BLOCK, "fetch", draft=draft, timeout=T)
        finally:
            await publisher.aclose()
            conn.close()
            await asyncio.wait_for(conn.wait_closed(), T)
        assert_relay_sessions(relay, draft, 4)  # ours and the three subscribers'
    for report in (live, upstream, again):
        assert_ok(report)
        assert report.draft == draft
    assert verify_block(BLOCK, live.triples()) == record_digest(BLOCK)
    assert_live([o.recv_us / 1e6 for o in live.layers], BLOCK.layers)
    assert live.publish_done_status == track_ended(profile)
    # A block nobody subscribed to: the relay FETCHes it from us (upstream).
    assert verify_block(STORED, upstream.triples()) == record_digest(STORED)
    assert fetches_after_upstream == 1
    # The block it relayed live: its cache serves FETCH only while the upstream subscription is live,
    # and ours ended with PUBLISH_DONE, so this FETCH reaches us too (interop/README.md).
    assert verify_block(BLOCK, again.triples()) == record_digest(BLOCK)
    assert (publisher.stats.fetches, publisher.stats.subscriptions) == (2, 1)


def test_verify_block_rejects_a_corrupted_layer() -> None:
    """The receiver-side check the interop tests rely on fails closed (no aiomoqt needed)."""
    triples = [(0, layer, BLOCK.payload(layer)) for layer in range(BLOCK.layers)]
    assert verify_block(BLOCK, triples) == record_digest(BLOCK)
    bad = list(triples)
    bad[3] = (0, 3, bytes(len(bad[3][2])))
    with pytest.raises(InteropError, match="layer 3"):
        verify_block(BLOCK, bad)
    with pytest.raises(InteropError, match="in order"):
        verify_block(BLOCK, triples[::-1])
