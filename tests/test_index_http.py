"""The Index Service over real mutual TLS on loopback (spec sections 5, 6.1-6.3, 7, 9).

Certificates are made at test time (DevPki) and the clock is a FakeClock, so expiry needs no sleeps.
Every refused request is checked for its status and problem type, and for leaving the index as it was.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from control.deploy.pki import DevPki
from control.index.app import INDEX, STATUS_BOARD
from control.index.settings import IndexSettings
from control.index.status import StatusBoard
from control.index.store import ReplicaIndex
from control.serve import build_app
from kvsp import placement
from kvsp.client.http import KvspSession, TransportError
from kvsp.client.index import IndexClient
from kvsp.errors import ValidationError
from kvsp.identifiers import role_id
from kvsp.pki import RoleSpec, make_dev_pki
from kvsp.problems import PROBLEM_MEDIA_TYPE, ProblemError, ProblemType
from kvsp.records import InstanceStatus, Link, LookupRequest, ReplicaRecord, Residency
from kvsp.registry import InstanceState, Tier
from kvsp.service.policy import Policy, Quotas, ScopeGrant
from tests.support.servers import FakeClock, role_config, running
from tests.support.vectors import APPENDIX_A_COMPAT_ID, APPENDIX_A_SCOPE_ID, VECTORS

SCOPE = bytes.fromhex(APPENDIX_A_SCOPE_ID)
OTHER_SCOPE = bytes.fromhex("00112233445566778899aabbccddeeff")
UNKNOWN_SCOPE = bytes(16)
COMPAT = bytes.fromhex(APPENDIX_A_COMPAT_ID)
JSON_TYPE = "application/kvsp+json"
TTL_MAX_MS = 60_000
KEYS_MAX = 16
BODY_MAX = 16_384
BLOCK_SIZE = 2 << 20
ROLES = ["is", "h1", "h2", "pc", "ii7", "ii9", "delegate"]


def key(i: int) -> bytes:
    return hashlib.sha256(b"key" + i.to_bytes(8, "big")).digest()


def make_record(holder: str, i: int, *, ttl_ms: int = 600_000, scope: bytes = SCOPE) -> ReplicaRecord:
    return ReplicaRecord(block_key=key(i), compat_id=COMPAT, scope_id=scope, holder=holder, codec=1,
                         size=BLOCK_SIZE, digest=hashlib.sha256(key(i)).digest(),
                         residency=(Residency(Tier.HOST, (0, 31)),), ttl_ms=ttl_ms)


def make_policy(pki: DevPki) -> Policy:
    u = pki.uri
    return Policy(
        pc=u("pc"),
        scopes={
            SCOPE: ScopeGrant(lookup=frozenset({u("pc"), u("h1")}), read=frozenset({u("h1")}),
                              store=frozenset({u("h1"), u("h2"), u("delegate")})),
            OTHER_SCOPE: ScopeGrant(lookup=frozenset({u("h2")}), store=frozenset({u("h2")})),
        },
        publish_for={u("delegate"): frozenset({u("h1")})},
        quotas=Quotas(keys_per_lookup=KEYS_MAX, body_limit_octets=BODY_MAX, replica_ttl_ms_max=TTL_MAX_MS),
        instances=frozenset({u("ii7"), u("ii9")}),
    )


@dataclass
class Env:
    pki: DevPki
    clock: FakeClock
    index: ReplicaIndex
    board: StatusBoard
    sessions: dict[str, KvspSession] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return self.pki.uri("is")

    def uri(self, name: str) -> str:
        return self.pki.uri(name)

    def session(self, name: str) -> KvspSession:
        if name not in self.sessions:
            self.sessions[name] = self.pki.session(name)
        return self.sessions[name]

    def client(self, name: str) -> IndexClient:
        return IndexClient(self.session(name), self.base)

    def replica_url(self, holder_id: str, block_key: str) -> str:
        return f"{self.base}replicas/{holder_id}/{block_key}"

    async def raw(self, name: str, method: str, url: str, body: bytes | None = None,
                  content_type: str = JSON_TYPE) -> tuple[int, aiohttp.typedefs.LooseHeaders, bytes]:
        """A request whose answer is checked by the test, not by the client library."""
        headers = {"Content-Type": content_type} if body is not None else {}
        async with self.session(name).http.request(method, url, data=body, headers=headers) as resp:
            data = await resp.read()
            assert resp.headers.get("Cache-Control") == "no-store", (method, url, resp.status)
            return resp.status, resp.headers, data


def check_problem(status: int, headers: aiohttp.typedefs.LooseHeaders, body: bytes, expected: int,
                  kind: ProblemType | None) -> None:
    assert status == expected, body
    assert headers["Content-Type"].startswith(PROBLEM_MEDIA_TYPE)  # type: ignore[index]
    problem = json.loads(body)
    assert problem["status"] == expected
    assert problem["type"] == (kind.uri if kind is not None else "about:blank")


def snapshot(env: Env) -> tuple[object, ...]:
    ix = env.index
    return (len(ix), ix.stats.created, ix.stats.refreshed, ix.stats.withdrawn,
            ix.lookup(SCOPE, COMPAT, [key(0), key(1)], env.clock()))


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    pki = DevPki.make(tmp_path / "pki", ROLES)
    section: dict[str, object] = {"descriptors": [str(VECTORS / "appendix_a_descriptor.json")],
                                  "sweep_interval_s": 0.01}
    config = role_config(pki, "is", ("is",), make_policy(pki), {"is": section})
    clock = FakeClock()
    async with running(config, clock=clock) as app:
        e = Env(pki, clock, app[INDEX], app[STATUS_BOARD])
        try:
            yield e
        finally:
            for s in e.sessions.values():
                await s.close()


# -- happy paths -----------------------------------------------------------------------------------
async def test_publish_lookup_withdraw(env: Env) -> None:
    h1 = env.client("h1")
    for i in range(3):
        stored = await h1.publish(make_record(env.uri("h1"), i))
        assert stored.ttl_ms == TTL_MAX_MS  # capped, and the holder learns the effective TTL
    response = await env.client("pc").lookup(LookupRequest(SCOPE, COMPAT, tuple(key(i) for i in range(5))))
    assert response.matched == 3
    assert [g[0].block_key for g in response.replicas] == [key(0), key(1), key(2)]
    assert response.replicas[0][0] == make_record(env.uri("h1"), 0, ttl_ms=TTL_MAX_MS)
    assert await h1.withdraw(env.uri("h1"), key(1))
    assert not await h1.withdraw(env.uri("h1"), key(1))
    response = await env.client("pc").lookup(LookupRequest(SCOPE, COMPAT, tuple(key(i) for i in range(5))))
    assert response.matched == 1


async def test_publish_answers_201_then_200_with_the_stored_record(env: Env) -> None:
    rec = make_record(env.uri("h1"), 0, ttl_ms=5000)
    url = env.replica_url(role_id(rec.holder), rec.block_key.hex())
    for expected in (201, 200, 200):
        status, headers, body = await env.raw("h1", "PUT", url, rec.to_bytes())
        assert status == expected
        assert headers["Content-Type"] == JSON_TYPE  # type: ignore[index]
        assert ReplicaRecord.from_bytes(body) == rec
    assert len(env.index) == 1


async def test_delegate_publishes_and_withdraws_for_holder(env: Env) -> None:
    delegate = env.client("delegate")
    await delegate.publish(make_record(env.uri("h1"), 0))
    assert len(env.index) == 1
    assert await delegate.withdraw(env.uri("h1"), key(0))


async def test_withdraw_answers_204_without_body(env: Env) -> None:
    await env.client("h1").publish(make_record(env.uri("h1"), 0))
    status, _, body = await env.raw("h1", "DELETE", env.replica_url(role_id(env.uri("h1")), key(0).hex()))
    assert (status, body) == (204, b"")


async def test_lookup_response_media_type_and_no_store(env: Env) -> None:
    request = LookupRequest(SCOPE, COMPAT, (key(0),))
    status, headers, body = await env.raw("pc", "POST", env.base + "lookup", request.to_bytes())
    assert status == 200 and headers["Content-Type"] == JSON_TYPE  # type: ignore[index]
    assert json.loads(body) == {"matched": 0, "replicas": []}


# -- refused input leaves the index unchanged ---------------------------------------------------------
def _record_json(env: Env, **changes: object) -> bytes:
    doc = make_record(env.uri("h1"), 0).to_json()
    doc.update(changes)
    return json.dumps(doc).encode()


H1_ID = "h1-id"  # placeholders resolved per environment
BAD_PUTS: list[tuple[str, str, str, str, Callable[[Env], bytes], str, int, ProblemType | None]] = [
    ("malformed JSON", "h1", H1_ID, "k0", lambda e: b'{"block_key": ', JSON_TYPE, 400, None),
    ("not an object", "h1", H1_ID, "k0", lambda e: b"[1, 2]", JSON_TYPE, 400, None),
    ("wrong type", "h1", H1_ID, "k0", lambda e: _record_json(e, size="big"), JSON_TYPE, 400, None),
    ("missing member", "h1", H1_ID, "k0", lambda e: _record_json(e, digest=None), JSON_TYPE, 400, None),
    ("oversized body", "h1", H1_ID, "k0", lambda e: _record_json(e, pad="x" * BODY_MAX), JSON_TYPE, 413, None),
    ("media type", "h1", H1_ID, "k0", _record_json, "text/plain", 415, None),
    ("uppercase hex in path", "h1", H1_ID, "K0", _record_json, JSON_TYPE, 400, None),
    ("non-hex in path", "h1", H1_ID, "zz", _record_json, JSON_TYPE, 400, None),
    ("bad holder-id", "h1", "abc", "k0", _record_json, JSON_TYPE, 400, None),
    ("path key differs", "h1", H1_ID, "k1", _record_json, JSON_TYPE, 400, None),
    ("path holder differs", "h2", "h2-id", "k0", _record_json, JSON_TYPE, 400, None),
    ("unknown scope", "h1", H1_ID, "k0", lambda e: _record_json(e, scope_id=UNKNOWN_SCOPE.hex()),
     JSON_TYPE, 403, ProblemType.SCOPE_DENIED),
    ("unauthorized scope", "h1", H1_ID, "k0", lambda e: _record_json(e, scope_id=OTHER_SCOPE.hex()),
     JSON_TYPE, 403, ProblemType.SCOPE_DENIED),
    ("publishing for another holder", "h2", H1_ID, "k0", _record_json, JSON_TYPE, 403, None),
    ("instance is not a delegate", "ii7", H1_ID, "k0", _record_json, JSON_TYPE, 403, None),
]


def _path(env: Env, holder: str, block: str) -> str:
    holder_id = {"h1-id": role_id(env.uri("h1")), "h2-id": role_id(env.uri("h2"))}.get(holder, holder)
    block_hex = {"k0": key(0).hex(), "k1": key(1).hex(), "K0": key(0).hex().upper()}.get(block, block)
    return env.replica_url(holder_id, block_hex)


@pytest.mark.parametrize(("name", "client", "holder", "block", "body", "ctype", "status", "kind"), BAD_PUTS,
                         ids=[case[0] for case in BAD_PUTS])
async def test_bad_publish_is_refused_and_changes_nothing(
        env: Env, name: str, client: str, holder: str, block: str, body: Callable[[Env], bytes], ctype: str,
        status: int, kind: ProblemType | None) -> None:
    await env.client("h1").publish(make_record(env.uri("h1"), 1))
    before = snapshot(env)
    answer = await env.raw(client, "PUT", _path(env, holder, block), body(env), ctype)
    check_problem(*answer, status, kind)
    assert snapshot(env) == before


BAD_LOOKUPS: list[tuple[str, str, Callable[[], bytes], int, ProblemType | None]] = [
    ("malformed JSON", "pc", lambda: b"{", 400, None),
    ("wrong type", "pc", lambda: json.dumps({"scope_id": SCOPE.hex(), "compat_id": COMPAT.hex(),
                                             "block_keys": "abc"}).encode(), 400, None),
    ("no keys", "pc", lambda: json.dumps({"scope_id": SCOPE.hex(), "compat_id": COMPAT.hex(),
                                          "block_keys": []}).encode(), 400, None),
    ("too many keys", "pc", lambda: LookupRequest(SCOPE, COMPAT, tuple(key(i) for i in range(KEYS_MAX + 1)))
     .to_bytes(), 400, None),
    ("unauthorized scope", "h2", lambda: LookupRequest(SCOPE, COMPAT, (key(1),)).to_bytes(),
     403, ProblemType.SCOPE_DENIED),
    ("unknown scope", "pc", lambda: LookupRequest(UNKNOWN_SCOPE, COMPAT, (key(1),)).to_bytes(),
     403, ProblemType.SCOPE_DENIED),
    ("oversized body", "pc", lambda: b" " * (BODY_MAX + 1) + b"{}", 413, None),
]


@pytest.mark.parametrize(("name", "client", "body", "status", "kind"), BAD_LOOKUPS,
                         ids=[case[0] for case in BAD_LOOKUPS])
async def test_bad_lookup_is_refused(env: Env, name: str, client: str, body: Callable[[], bytes], status: int,
                                     kind: ProblemType | None) -> None:
    await env.client("h1").publish(make_record(env.uri("h1"), 1))
    before = snapshot(env)
    check_problem(*await env.raw(client, "POST", env.base + "lookup", body()), status, kind)
    assert snapshot(env) == before


async def test_exactly_the_key_quota_is_accepted(env: Env) -> None:
    request = LookupRequest(SCOPE, COMPAT, tuple(key(i) for i in range(KEYS_MAX)))
    assert (await env.client("pc").lookup(request)).matched == 0


async def test_withdraw_by_another_holder_is_forbidden(env: Env) -> None:
    await env.client("h1").publish(make_record(env.uri("h1"), 0))
    before = snapshot(env)
    url = env.replica_url(role_id(env.uri("h1")), key(0).hex())
    check_problem(*await env.raw("h2", "DELETE", url), 403, None)
    # The same answer for a record that does not exist: no probing of other holders' replicas.
    check_problem(*await env.raw("h2", "DELETE", env.replica_url(role_id(env.uri("h1")), key(9).hex())), 403, None)
    assert snapshot(env) == before


async def test_withdraw_unknown_and_bad_path(env: Env) -> None:
    h1_id = role_id(env.uri("h1"))
    check_problem(*await env.raw("h1", "DELETE", env.replica_url(h1_id, key(5).hex())), 404, ProblemType.NOT_FOUND)
    check_problem(*await env.raw("h1", "DELETE", env.replica_url(h1_id, "00ff")), 400, None)
    check_problem(*await env.raw("h1", "DELETE", env.replica_url("x" * 43 + "=", key(5).hex())), 400, None)


async def test_wrong_identity_via_client_raises_problem(env: Env) -> None:
    with pytest.raises(ProblemError) as exc:
        await env.client("h2").publish(make_record(env.uri("h1"), 0))
    assert exc.value.problem.status == 403
    assert len(env.index) == 0


# -- TLS: no certificate, another CA -----------------------------------------------------------------
def _context_without_certificate(pki: DevPki) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    return ctx


def _context_from_other_ca(pki: DevPki, tmp_path: Path) -> ssl.SSLContext:
    """Claims h1's identity with a certificate that a different CA issued."""
    other = tmp_path / "other-ca"
    make_dev_pki(other, [RoleSpec("h1", pki.uri("h1"))])
    ctx = _context_without_certificate(pki)
    ctx.load_cert_chain(other / "h1.pem", other / "h1.key")
    return ctx


@pytest.mark.parametrize("make_context", ["none", "other-ca"])
async def test_handshake_fails_without_a_valid_client_certificate(env: Env, tmp_path: Path,
                                                                  make_context: str) -> None:
    ctx = (_context_without_certificate(env.pki) if make_context == "none"
           else _context_from_other_ca(env.pki, tmp_path))
    async with KvspSession(ctx) as session:
        with pytest.raises(TransportError):
            await IndexClient(session, env.base).publish(make_record(env.uri("h1"), 0))
    assert len(env.index) == 0


# -- expiry with the injected clock -------------------------------------------------------------------
async def test_expiry_follows_the_fake_clock(env: Env) -> None:
    await env.client("h1").publish(make_record(env.uri("h1"), 0, ttl_ms=5000))
    request = LookupRequest(SCOPE, COMPAT, (key(0),))
    env.clock.advance(4.9)
    assert (await env.client("pc").lookup(request)).matched == 1
    env.clock.advance(0.1)
    assert (await env.client("pc").lookup(request)).matched == 0


async def test_background_sweep_removes_expired_records(env: Env) -> None:
    for i in range(10):
        await env.client("h1").publish(make_record(env.uri("h1"), i, ttl_ms=1000))
    env.clock.advance(1.0)
    for _ in range(500):  # the sweep runs every 10 ms of real time
        if len(env.index) == 0:
            break
        await asyncio.sleep(0.01)
    assert len(env.index) == 0 and env.index.stats.expired == 10


# -- instance status and targets ----------------------------------------------------------------------
def make_status(env: Env, name: str, epoch: int = 3, *, prefill: float = 40_000.0) -> InstanceStatus:
    return InstanceStatus(instance=env.uri(name), epoch=epoch, state=InstanceState.ACTIVE, running=2, queued=1,
                          batch_size=16, kv_utilization=0.4, prefill_tokens_per_s=prefill,
                          decode_tokens_per_s=2000.0, links=(Link(env.uri("h1"), 200_000.0, 12),), ttl_ms=3000)


def status_url(env: Env, name: str) -> str:
    return f"{env.base}instances/{role_id(env.uri(name))}/status"


async def test_targets_estimates_follow_placement(env: Env) -> None:
    status = make_status(env, "ii7")
    code, _headers, body = await env.raw("ii7", "PUT", status_url(env, "ii7"), status.to_bytes())
    assert (code, json.loads(body)) == (200, {"state": "active"})
    for i in range(2):
        await env.client("h1").publish(make_record(env.uri("h1"), i))
    request = LookupRequest(SCOPE, COMPAT, (key(0), key(1), key(2)), (env.uri("ii7"), env.uri("ii9")))
    response = await env.client("pc").lookup(request)
    (estimate,) = response.targets  # ii9 has no status: omitted
    assert estimate.instance == env.uri("ii7")
    # Both blocks come from h1 over one link: rtt once, then 8 * octets / rate each (section 6.4).
    assert estimate.fetch_us == pytest.approx(12 + 2 * 8 * BLOCK_SIZE / 200_000)
    # Appendix A's descriptor is configured: B = 4 tokens, so 2 blocks are 8 tokens of prefill.
    assert estimate.recompute_us == pytest.approx(1e6 * 8 / 40_000)
    assert estimate == placement.target_estimate(status, response.replicas, block_tokens=4, layers=32)


async def test_several_targets_each_get_their_own_estimate(env: Env) -> None:
    # One prepared set of blocks is shared by all targets: each answer must still be its own.
    fast, slow = make_status(env, "ii7"), make_status(env, "ii9", prefill=10_000.0)
    slow = InstanceStatus(**{**{f: getattr(slow, f) for f in slow.__dataclass_fields__},
                             "links": (Link(env.uri("h1"), 50_000.0, 40),)})
    for name, status in (("ii7", fast), ("ii9", slow)):
        await env.raw(name, "PUT", status_url(env, name), status.to_bytes())
    for i in range(2):
        await env.client("h1").publish(make_record(env.uri("h1"), i))
    request = LookupRequest(SCOPE, COMPAT, (key(0), key(1)), (env.uri("ii7"), env.uri("ii9")))
    response = await env.client("pc").lookup(request)
    expected = tuple(placement.target_estimate(s, response.replicas, block_tokens=4, layers=32) for s in (fast, slow))
    assert response.targets == expected
    assert expected[0] != expected[1]


async def test_target_status_expires(env: Env) -> None:
    await env.raw("ii7", "PUT", status_url(env, "ii7"), make_status(env, "ii7").to_bytes())
    request = LookupRequest(SCOPE, COMPAT, (key(0),), (env.uri("ii7"),))
    assert len((await env.client("pc").lookup(request)).targets) == 1
    env.clock.advance(3.0)
    assert (await env.client("pc").lookup(request)).targets == ()


async def test_unreachable_target_has_null_fetch_and_zero_prefill_null_recompute(env: Env) -> None:
    status = make_status(env, "ii7", prefill=0.0)
    status = InstanceStatus(**{**{f: getattr(status, f) for f in status.__dataclass_fields__}, "links": ()})
    await env.raw("ii7", "PUT", status_url(env, "ii7"), status.to_bytes())
    await env.client("h1").publish(make_record(env.uri("h1"), 0))
    response = await env.client("pc").lookup(LookupRequest(SCOPE, COMPAT, (key(0),), (env.uri("ii7"),)))
    (estimate,) = response.targets
    assert estimate.fetch_us is None and estimate.recompute_us is None
    assert math.isinf(placement.fetch_us(status, response.replicas))


async def test_status_from_another_identity_is_rejected(env: Env) -> None:
    status = make_status(env, "ii7")
    check_problem(*await env.raw("h1", "PUT", status_url(env, "ii7"), status.to_bytes()), 403, None)
    check_problem(*await env.raw("ii9", "PUT", status_url(env, "ii7"), status.to_bytes()), 403, None)
    # The record names ii7 but the path names ii9: a mismatch, whoever sends it.
    check_problem(*await env.raw("ii7", "PUT", status_url(env, "ii9"), status.to_bytes()), 400, None)
    check_problem(*await env.raw("ii7", "PUT", status_url(env, "ii7"), b'{"epoch": 1}'), 400, None)
    board = env.board
    assert len(board) == 0 and board.highest_epoch(env.uri("ii7")) is None


async def test_lower_epoch_is_discarded(env: Env) -> None:
    await env.raw("ii7", "PUT", status_url(env, "ii7"), make_status(env, "ii7", epoch=5).to_bytes())
    stale = make_status(env, "ii7", epoch=4, prefill=1.0)
    check_problem(*await env.raw("ii7", "PUT", status_url(env, "ii7"), stale.to_bytes()), 409,
                  ProblemType.STALE_EPOCH)
    current = env.board.get(env.uri("ii7"), env.clock())
    assert current is not None and current.epoch == 5 and current.prefill_tokens_per_s == 40_000.0


# -- combined with the PC, metrics, settings -----------------------------------------------------------
async def test_status_route_belongs_to_the_pc_when_combined(tmp_path: Path) -> None:
    pki = DevPki.make(tmp_path / "pki", ["is", "ii7"])
    config = role_config(pki, "is", ("is", "pc"), Policy())
    app = build_app(config, clock=FakeClock(), roles=("is",))  # the PC module is set up elsewhere
    async with running(config, app=app), pki.session("ii7") as session:
        url = f"{pki.uri('is')}instances/{role_id(pki.uri('ii7'))}/status"
        async with session.http.put(url, data=b"{}", headers={"Content-Type": JSON_TYPE}) as resp:
            assert resp.status in (404, 405)
    assert STATUS_BOARD in app  # created for the PC to share


async def test_metrics_report_hit_ratio_inputs(env: Env) -> None:
    await env.client("h1").publish(make_record(env.uri("h1"), 0))
    await env.client("pc").lookup(LookupRequest(SCOPE, COMPAT, (key(0), key(1), key(2))))
    await env.raw("h2", "POST", env.base + "lookup", LookupRequest(SCOPE, COMPAT, (key(0),)).to_bytes())
    async with env.session("pc").http.get(env.base + "metrics") as resp:
        text = await resp.text()
    for line in ("kvsp_is_lookups_total 1.0", "kvsp_is_lookup_keys_requested_total 3.0",
                 "kvsp_is_lookup_keys_matched_total 1.0", "kvsp_is_replicas 1.0",
                 'kvsp_is_publishes_total{result="created"} 1.0', "kvsp_is_expirations_total 0.0",
                 'kvsp_is_scope_denials_total{operation="lookup"} 1.0'):
        assert line in text, line


def test_settings_validation(tmp_path: Path) -> None:
    shape = IndexSettings.from_section({"descriptors": ["appendix_a_descriptor.json"]}, VECTORS).shape(COMPAT)
    assert shape is not None and (shape.block_tokens, shape.layers) == (4, 32)
    assert IndexSettings.from_section({}).shape(COMPAT) is None
    assert IndexSettings.from_section({"block_tokens": 16}).shape(bytes(32)) == IndexSettings.from_section(
        {"block_tokens": 16}).shape(bytes(32))
    for bad in ({"sweep_interval_s": 0}, {"max_replicas": -1}, {"block_tokens": True}, {"nope": 1},
                {"descriptors": "x"}, {"descriptors": ["missing.json"]}):
        with pytest.raises(ValidationError):
            IndexSettings.from_section(bad, tmp_path)


async def test_health_reports_the_roles_served(env: Env) -> None:
    code, _headers, body = await env.raw("pc", "GET", env.base + "health")
    facts = json.loads(body)
    assert code == 200 and facts["status"] == "ok" and facts["roles"] == ["is"]
    assert facts["uptime_s"] >= 0
