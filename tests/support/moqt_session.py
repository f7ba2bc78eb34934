"""Shared pieces of the MOQT session tests (tests/test_moqt_session*.py): an established in-memory pair
and a subscription on it."""

from __future__ import annotations

from typing import Any

import pytest

from moqt.events import SessionEstablished
from moqt.kinds import SessionError
from moqt.messages import Subscribe, SubscribeOk
from moqt.profiles import DRAFT_14
from moqt.testing import MoqtPair, only
from moqt.testing import received_messages as messages

V14 = DRAFT_14.version
PV = SessionError.PROTOCOL_VIOLATION
wire_code = DRAFT_14.request_error_code  # what draft-14 puts on the wire for a request error
# A KVSP block's Track Namespace (decision D3): "kvsp", compat_id, scope_id, holder-id, block_key.
BLOCK_NS = (b"kvsp", b"5e" * 32, b"6d" * 16, b"h" * 43, b"9c" * 32)


@pytest.fixture
def pair() -> MoqtPair:
    p = MoqtPair(client_options={"path": "/kvsp"}, server_options={"path": "/kvsp"})
    assert only(p.client.take(), SessionEstablished) and only(p.server.take(), SessionEstablished)
    return p


def subscribed(pair: MoqtPair, **subscribe: Any) -> tuple[int, int]:
    """Client subscribes to BLOCK_NS/raw, the server accepts; (request ID, track alias)."""
    rid = pair.client.moqt.subscribe(BLOCK_NS, b"raw", **subscribe)
    pair.pump()
    [sub] = messages(pair.server.take())
    assert isinstance(sub, Subscribe) and sub.request_id == rid
    alias = pair.server.moqt.subscribe_ok(rid)
    pair.pump()
    [ok] = messages(pair.client.take())
    assert isinstance(ok, SubscribeOk) and ok.track_alias == alias
    return rid, alias
