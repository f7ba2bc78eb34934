"""Whose replica record is it? The IS keeps one record per producer at a holder path (issue 14).

Records of blocks published through a relay all name the relay's ``moqt://`` URI, so many producers
share ``replicas/{holder-id of the relay}/{block_key}``.  Each record belongs to its producer (the
namespace's holder-id field, section 4.4): only that producer, or a ``[publish_for]`` delegate of it,
may create, replace or withdraw it (sections 6.1, 9).  Checked on the sans-I/O `ReplicaIndex`, with a
model, and over real mutual TLS, where the identity is the client certificate's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control.deploy.pki import DevPki
from control.index.app import INDEX, STATUS_BOARD
from control.index.status import StatusBoard
from control.index.store import ReplicaIndex
from kvsp.client.http import KvspSession
from kvsp.client.index import IndexClient
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import InstanceStatus, Link, LookupRequest, ReplicaRecord
from kvsp.registry import InstanceState
from kvsp.service.policy import Policy, ScopeGrant
from tests.support.servers import FakeClock, role_config, running
from tests.test_index_http import COMPAT, SCOPE, check_problem, key, make_record

RELAY = "moqt://127.0.0.1:4443/r1"  # the rack relay: also an identity of the deployment (its certificate)
RELAY_ID = role_id(RELAY)


def moqt_record(producer: str, i: int, *, holder: str = RELAY, ttl_ms: int = 600_000) -> ReplicaRecord:
    """``producer``'s replica of block ``i`` served through ``holder`` (decision D3)."""
    namespace = TrackNamespace(COMPAT, SCOPE, role_id(producer), key(i))
    return replace(make_record(holder, i, ttl_ms=ttl_ms), moqt_namespace=namespace)


# -- the sans-I/O index -----------------------------------------------------------------------------
H1, H2 = "https://h1.example/kvsp/", "https://h2.example/kvsp/"


def test_producers_at_one_holder_are_separate_records() -> None:
    ix = ReplicaIndex(ttl_ms_max=600_000)
    assert ix.put(moqt_record(H1, 0), RELAY_ID, 0.0).created
    assert ix.put(moqt_record(H2, 0), RELAY_ID, 0.0).created  # its own record: H1's stays
    assert not ix.put(moqt_record(H2, 0, ttl_ms=5000), RELAY_ID, 1.0).created  # a refresh of H2's own
    assert {r.producer_id for r in ix.records(RELAY_ID, key(0), 1.0)} == {role_id(H1), role_id(H2)}
    assert len(ix.lookup(SCOPE, COMPAT, [key(0)], 1.0)[0]) == 2
    assert ix.get(RELAY_ID, key(0), 1.0, role_id(H1)) == moqt_record(H1, 0)
    assert not ix.delete(RELAY_ID, key(0), 1.0)  # no record of the relay itself as producer
    assert ix.delete(RELAY_ID, key(0), 1.0, role_id(H2))
    assert [r.producer_id for r in ix.records(RELAY_ID, key(0), 1.0)] == [role_id(H1)]
    assert len(ix) == 1 and ix.stats.withdrawn == 1


def test_withdraw_removes_only_the_producers_allowed() -> None:
    ix = ReplicaIndex(ttl_ms_max=600_000)
    for producer in (H1, H2):
        ix.put(moqt_record(producer, 0, ttl_ms=10_000), RELAY_ID, 0.0)
    ix.put(make_record(H1, 0), role_id(H1), 0.0)  # H1's https record: another holder-id
    assert ix.withdraw(RELAY_ID, key(0), 1.0, {role_id(H1)}.__contains__) == 1
    assert [r.producer_id for r in ix.records(RELAY_ID, key(0), 1.0)] == [role_id(H2)]
    assert ix.get(role_id(H1), key(0), 1.0) is not None
    # An expired record of an allowed producer is removed but not counted as withdrawn.
    assert ix.withdraw(RELAY_ID, key(0), 10.0, {role_id(H2)}.__contains__) == 0
    assert ix.records(RELAY_ID, key(0), 0.0) == [] and ix.stats.expired == 1


PRODUCERS = [f"https://p{i}.example/kvsp/" for i in range(3)]
HOLDERS = [RELAY, "moqt://127.0.0.1:4444/r2"]


@given(st.lists(st.tuples(st.sampled_from(["put", "withdraw"]), st.integers(0, 1), st.integers(0, 2),
                          st.integers(0, 1), st.integers(1, 5_000), st.floats(0, 2)), max_size=60))
def test_agrees_with_a_model_keyed_by_holder_producer_and_key(
        ops: list[tuple[str, int, int, int, int, float]]) -> None:
    ix = ReplicaIndex(ttl_ms_max=600_000)
    model: dict[tuple[int, int, int], float] = {}  # (holder, producer, key) -> expiry
    now = 0.0
    for op, h, p, k, ttl, step in ops:
        now += step
        holder_id = role_id(HOLDERS[h])
        if op == "put":
            stored = ix.put(moqt_record(PRODUCERS[p], k, holder=HOLDERS[h], ttl_ms=ttl), holder_id, now)
            assert stored.created == (model.get((h, p, k), -1.0) <= now)
            model[(h, p, k)] = now + ttl / 1000
        else:
            live = sum(1 for (mh, mp, mk), exp in model.items() if (mh, mp, mk) == (h, p, k) and exp > now)
            assert ix.withdraw(holder_id, key(k), now, {role_id(PRODUCERS[p])}.__contains__) == live
            model.pop((h, p, k), None)
        for kk in range(2):
            expected = {(mh, mp) for (mh, mp, mk), exp in model.items() if mk == kk and exp > now}
            found = ix.lookup(SCOPE, COMPAT, [key(kk)], now)
            got = {(HOLDERS.index(r.holder), [role_id(x) for x in PRODUCERS].index(r.producer_id))
                   for r in (found[0] if found else ())}
            assert got == expected


# -- over HTTPS with mutual TLS ----------------------------------------------------------------------
ROLES = ["is", "h1", "h2", "h3", "pc", "ii7", "delegate"]


@dataclass
class Env:
    pki: DevPki
    index: ReplicaIndex
    board: StatusBoard
    sessions: dict[str, KvspSession] = field(default_factory=dict)

    def uri(self, name: str) -> str:
        return self.pki.uri(name)

    def session(self, name: str) -> KvspSession:
        if name not in self.sessions:
            self.sessions[name] = self.pki.session(name)
        return self.sessions[name]

    def client(self, name: str) -> IndexClient:
        return IndexClient(self.session(name), self.uri("is"))

    def url(self, i: int, holder_id: str = RELAY_ID, query: str = "") -> str:
        return f"{self.uri('is')}replicas/{holder_id}/{key(i).hex()}{query}"

    async def raw(self, name: str, method: str, url: str,
                  body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        headers = {"Content-Type": "application/kvsp+json"} if body is not None else {}
        async with self.session(name).http.request(method, url, data=body, headers=headers) as resp:
            return resp.status, dict(resp.headers), await resp.read()

    async def producers(self, i: int) -> list[str]:
        """Producer holder-ids of the moqt records of block ``i`` that a lookup returns."""
        answer = await self.client("pc").lookup(LookupRequest(SCOPE, COMPAT, (key(i),)))
        group = answer.replicas[0] if answer.matched else ()
        return sorted(r.producer_id for r in group if r.holder == RELAY)

    def ids(self, *names: str) -> list[str]:
        return sorted(role_id(self.uri(n)) for n in names)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    pki = DevPki.make(tmp_path / "pki", ROLES)
    pki.add("r1", RELAY)
    u = pki.uri
    policy = Policy(
        pc=u("pc"),
        scopes={SCOPE: ScopeGrant(lookup=frozenset({u("pc")}),
                                  store=frozenset({u(n) for n in ("h1", "h2", "h3", "delegate", "r1")}))},
        publish_for={u("delegate"): frozenset({u("h1")})},
        instances=frozenset({u("ii7")}),
    )
    async with running(role_config(pki, "is", ("is",), policy, {"is": {}}), clock=FakeClock()) as app:
        e = Env(pki, app[INDEX], app[STATUS_BOARD])
        try:
            yield e
        finally:
            for s in e.sessions.values():
                await s.close()


async def test_another_producer_neither_displaces_nor_withdraws_a_record(env: Env) -> None:
    """The reproduction of issue 14: h2 PUTs and DELETEs at the path of h1's record behind relay r1."""
    await env.client("h1").publish(moqt_record(env.uri("h1"), 0))
    status, _, body = await env.raw("h2", "PUT", env.url(0), moqt_record(env.uri("h2"), 0).to_bytes())
    assert status == 201, body  # h2's own record beside h1's, not a refresh of h1's
    assert await env.producers(0) == env.ids("h1", "h2")
    assert (await env.raw("h2", "DELETE", env.url(0)))[0] == 204
    assert await env.producers(0) == env.ids("h1")
    # Nothing of h2's is left there; naming h1 as the producer does not help.
    check_problem(*await env.raw("h2", "DELETE", env.url(0)), 403, None)
    check_problem(*await env.raw("h2", "DELETE", env.url(0, query=f"?producer={role_id(env.uri('h1'))}")),
                  403, None)
    check_problem(*await env.raw("h2", "DELETE", env.url(0, query=f"?producer={role_id(env.uri('h2'))}")),
                  404, ProblemType.NOT_FOUND)
    assert await env.producers(0) == env.ids("h1")


async def test_a_record_naming_another_producer_is_refused(env: Env) -> None:
    before = len(env.index)
    for who in ("h2", "r1"):  # another holder, and the relay whose URI the record names
        check_problem(*await env.raw(who, "PUT", env.url(0), moqt_record(env.uri("h1"), 0).to_bytes()), 403, None)
    assert len(env.index) == before == 0


async def test_the_relay_identity_does_not_withdraw_producers_records(env: Env) -> None:
    await env.client("h1").publish(moqt_record(env.uri("h1"), 0))
    # r1 is the holder of the path but not the producer: it has no record of its own there.
    check_problem(*await env.raw("r1", "DELETE", env.url(0)), 404, ProblemType.NOT_FOUND)
    assert await env.producers(0) == env.ids("h1")


async def test_two_producers_through_one_relay_coexist(env: Env) -> None:
    h1, h2 = env.client("h1"), env.client("h2")
    for _ in range(2):  # publish, then refresh: neither replaces the other
        await h1.publish(moqt_record(env.uri("h1"), 0))
        await h2.publish(moqt_record(env.uri("h2"), 0))
        assert await env.producers(0) == env.ids("h1", "h2")
    assert env.index.stats.created == 2 and env.index.stats.refreshed == 2
    assert await h1.withdraw(RELAY, key(0), producer=role_id(env.uri("h1")))
    assert not await h1.withdraw(RELAY, key(0), producer=role_id(env.uri("h1")))
    assert await env.producers(0) == env.ids("h2")


async def test_a_delegate_withdraws_only_for_the_producers_it_acts_for(env: Env) -> None:
    await env.client("h1").publish(moqt_record(env.uri("h1"), 0))
    await env.client("h2").publish(moqt_record(env.uri("h2"), 0))
    await env.client("delegate").publish(moqt_record(env.uri("h1"), 0))  # a refresh of h1's record
    assert await env.producers(0) == env.ids("h1", "h2")
    assert (await env.raw("delegate", "DELETE", env.url(0)))[0] == 204
    assert await env.producers(0) == env.ids("h2")
    check_problem(*await env.raw("delegate", "DELETE", env.url(0, query=f"?producer={role_id(env.uri('h2'))}")),
                  403, None)
    assert await env.producers(0) == env.ids("h2")


async def test_withdraw_answers_do_not_depend_on_others_records(env: Env) -> None:
    await env.client("h1").publish(moqt_record(env.uri("h1"), 0))
    await env.client("h1").publish(make_record(env.uri("h1"), 0))
    h1_https = role_id(env.uri("h1"))
    for i in (0, 9):  # a block with records of h1, and one without any
        for url in (env.url(i), env.url(i, h1_https)):
            check_problem(*await env.raw("h3", "DELETE", url), 403, None)
    assert len(env.index) == 2


async def test_a_malformed_producer_is_refused(env: Env) -> None:
    await env.client("h1").publish(moqt_record(env.uri("h1"), 0))
    check_problem(*await env.raw("h1", "DELETE", env.url(0, query="?producer=abc")), 400, None)
    assert len(env.index) == 1


async def test_https_records_keep_their_rules(env: Env) -> None:
    """An https record's producer is its holder: h2 may not publish it, the delegate may withdraw it."""
    with pytest.raises(ProblemError) as exc:
        await env.client("h2").publish(make_record(env.uri("h1"), 0))
    assert exc.value.problem.status == 403
    await env.client("h1").publish(make_record(env.uri("h1"), 0))
    check_problem(*await env.raw("h2", "DELETE", env.url(0, role_id(env.uri("h1")))), 403, None)
    assert await env.client("delegate").withdraw(env.uri("h1"), key(0))
    assert len(env.index) == 0


async def test_only_listed_instances_report_status(env: Env) -> None:
    """h1 reporting its own status is still not an instance (D2): lookups must not estimate for it."""
    def status(name: str) -> tuple[str, bytes]:
        record = InstanceStatus(instance=env.uri(name), epoch=1, state=InstanceState.ACTIVE, running=0, queued=0,
                                batch_size=8, kv_utilization=0.0, prefill_tokens_per_s=1000.0,
                                decode_tokens_per_s=100.0, links=(Link(env.uri("h1"), 1000.0, 10),), ttl_ms=3000)
        return f"{env.uri('is')}instances/{role_id(env.uri(name))}/status", record.to_bytes()

    check_problem(*await env.raw("h1", "PUT", *status("h1")), 403, None)
    assert len(env.board) == 0
    code, _, body = await env.raw("ii7", "PUT", *status("ii7"))
    assert (code, json.loads(body)) == (200, {"state": "active"})
    assert len(env.board) == 1
