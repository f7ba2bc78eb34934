"""Interop through kvsp's relay (issue 6): aiomoqt publisher -> our relay -> aiomoqt and kvsp subscribers.

The other direction, our client through aiomoqt's relay, is tests/test_interop.py (d). Needs the
interop venv, built when absent like for tests/test_interop.py.
"""

from __future__ import annotations

import asyncio

from interop.endpoints import verify_block
from interop.harness import Aiomoqt, Credentials
from interop.relay import relay_publisher, start_relay
from moqt.kinds import PublishDoneStatus, SessionError
from moqt.profiles import DRAFT_14
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
    record_digest,
)

__all__ = ["aiomoqt", "credentials"]  # the fixtures of tests/test_interop.py, used here too


async def test_aiomoqt_publisher_and_subscriber_through_our_relay(aiomoqt: Aiomoqt,
                                                                  credentials: Credentials) -> None:
    relay, uri = await start_relay(credentials, [SUBJECT], SCOPE)
    publisher_token = credentials.token(Credentials.AIOMOQT_URI, [SCOPE])  # it owns AIOMOQT_* namespaces
    reader_token = credentials.token(SUBJECT, [SCOPE])
    try:
        async with asyncio.timeout(TEST_BUDGET_S), relay_publisher(
                aiomoqt, [AIOMOQT_STORED], live=[AIOMOQT_LIVE], connect=uri, token=publisher_token,
                interval=INTERVAL) as peer:
            await peer.expect("ready", T)
            live = await aiomoqt.subscriber(uri, AIOMOQT_LIVE, "subscribe", token=reader_token, timeout=T)
            first = await aiomoqt.subscriber(uri, AIOMOQT_STORED, "fetch", token=reader_token, timeout=T)
            second = await aiomoqt.subscriber(uri, AIOMOQT_STORED, "fetch", token=reader_token, timeout=T)
            refused = await aiomoqt.subscriber(uri, AIOMOQT_STORED, "fetch", timeout=T)  # no token
        for report in (live, first, second):
            assert_ok(report)
        assert verify_block(AIOMOQT_LIVE, live.triples()) == record_digest(AIOMOQT_LIVE)
        assert_live([o.recv_us / 1e6 for o in live.layers], AIOMOQT_LIVE.layers)
        assert live.publish_done_status == DRAFT_14.publish_done.code(PublishDoneStatus.TRACK_ENDED)
        for report in (first, second):
            assert verify_block(AIOMOQT_STORED, report.triples()) == record_digest(AIOMOQT_STORED)
        stats = relay.stats
        assert (stats.upstream_fetches, stats.cache_hits, stats.upstream_subscribes) == (1, 1, 1)
        unauthorized = DRAFT_14.session_errors.code(SessionError.UNAUTHORIZED)
        assert not refused.ok and refused.raw.get("close_code") == unauthorized
    finally:
        await relay.close()


async def test_aiomoqt_publisher_may_not_announce_another_producers_namespace(aiomoqt: Aiomoqt,
                                                                              credentials: Credentials) -> None:
    relay, uri = await start_relay(credentials, [SUBJECT], SCOPE)
    impostor = credentials.token(SUBJECT, [SCOPE])  # a reader, not the producer named in the namespace
    try:
        async with asyncio.timeout(TEST_BUDGET_S), relay_publisher(
                aiomoqt, [AIOMOQT_STORED], live=[], connect=uri, token=impostor, interval=INTERVAL) as peer:
            message = await peer.expect("error", T)
        assert "rror" in str(message.fields)
        assert relay.table.under(()) == [] and relay.stats.refused == 1
    finally:
        await relay.close()
