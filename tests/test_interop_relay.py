"""Interop through kvsp's relay (issue 6): aiomoqt publisher -> our relay -> aiomoqt subscribers.

Once per draft in ``moqt.profiles.PROFILES``: every aiomoqt peer pinned to it, our relay accepting
every draft (its default); both sides' view of the draft agreed is checked (aiomoqt's reports, the
relay's ``sessions_by_draft``). The other direction, our client through aiomoqt's relay, is
tests/test_interop.py (d). Needs the interop venv, built when absent like for tests/test_interop.py.
"""

from __future__ import annotations

import asyncio

from interop.endpoints import verify_block
from interop.harness import Aiomoqt, Credentials
from interop.relay import relay_publisher, start_relay
from moqt.kinds import MessageKind, RequestError, SessionError
from moqt.profiles import Profile
from tests.test_interop import (
    AIOMOQT_LIVE,
    AIOMOQT_STORED,
    INTERVAL,
    SCOPE,
    SUBJECT,
    TEST_BUDGET_S,
    T,
    aiomoqt,
    assert_live,
    assert_ok,
    credentials,
    draft,
    profile,
    record_digest,
    track_ended,
)

__all__ = ["aiomoqt", "credentials", "draft", "profile"]  # the fixtures of tests/test_interop.py, used here too


async def test_aiomoqt_publisher_and_subscriber_through_our_relay(aiomoqt: Aiomoqt, credentials: Credentials,
                                                                  profile: Profile) -> None:
    draft = profile.draft
    relay, uri = await start_relay(credentials, [SUBJECT], SCOPE)
    publisher_token = credentials.token(Credentials.AIOMOQT_URI, [SCOPE])  # it owns AIOMOQT_* namespaces
    reader_token = credentials.token(SUBJECT, [SCOPE])
    try:
        async with asyncio.timeout(TEST_BUDGET_S), relay_publisher(
                aiomoqt, [AIOMOQT_STORED], draft=draft, live=[AIOMOQT_LIVE], connect=uri, token=publisher_token,
                interval=INTERVAL) as peer:
            ready = await peer.expect("ready", T)
            live = await aiomoqt.subscriber(uri, AIOMOQT_LIVE, "subscribe", draft=draft, token=reader_token,
                                            timeout=T)
            first = await aiomoqt.subscriber(uri, AIOMOQT_STORED, "fetch", draft=draft, token=reader_token,
                                             timeout=T)
            second = await aiomoqt.subscriber(uri, AIOMOQT_STORED, "fetch", draft=draft, token=reader_token,
                                              timeout=T)
            refused = await aiomoqt.subscriber(uri, AIOMOQT_STORED, "fetch", draft=draft, timeout=T)  # no token
        assert ready.fields.get("draft") == draft
        for report in (live, first, second, refused):
            assert report.draft == draft, report.raw
        assert relay.server is not None and relay.server.sessions_by_draft == {draft: 5}
        for report in (live, first, second):
            assert_ok(report)
        assert verify_block(AIOMOQT_LIVE, live.triples()) == record_digest(AIOMOQT_LIVE)
        assert_live([o.recv_us / 1e6 for o in live.layers], AIOMOQT_LIVE.layers)
        assert live.publish_done_status == track_ended(profile)
        for report in (first, second):
            assert verify_block(AIOMOQT_STORED, report.triples()) == record_digest(AIOMOQT_STORED)
        stats = relay.stats
        assert (stats.upstream_fetches, stats.cache_hits, stats.upstream_subscribes) == (1, 1, 1)
        unauthorized = profile.session_errors.code(SessionError.UNAUTHORIZED)
        assert not refused.ok and refused.raw.get("close_code") == unauthorized
    finally:
        await relay.close()


async def test_aiomoqt_publisher_may_not_announce_another_producers_namespace(aiomoqt: Aiomoqt,
                                                                              credentials: Credentials,
                                                                              profile: Profile) -> None:
    draft = profile.draft
    relay, uri = await start_relay(credentials, [SUBJECT], SCOPE)
    impostor = credentials.token(SUBJECT, [SCOPE])  # a reader, not the producer named in the namespace
    try:
        async with asyncio.timeout(TEST_BUDGET_S), relay_publisher(
                aiomoqt, [AIOMOQT_STORED], draft=draft, live=[], connect=uri, token=impostor,
                interval=INTERVAL) as peer:
            message = await peer.expect("error", T)
        # aiomoqt's publish() raises on our PUBLISH_NAMESPACE_ERROR (d16 on: REQUEST_ERROR) UNAUTHORIZED.
        unauthorized = profile.request_error_code(MessageKind.PUBLISH_NAMESPACE_ERROR, RequestError.UNAUTHORIZED)
        assert f"MOQTRequestError: request error: code={unauthorized} " in str(message.fields.get("error"))
        assert relay.table.under(()) == [] and relay.stats.refused == 1
        assert relay.server is not None and relay.server.sessions_by_draft == {draft: 1}
    finally:
        await relay.close()
