"""Who may act as an instance at the PC, and whose checkpoints it records (spec sections 6.3, 6.8, 9; D2).

Every certificate of the deployment CA authenticates, so authentication alone must not make an identity
an instance: the PC sends an instance the prompts of the sessions it places there.  The policy names the
instances (``instances``); a checkpoint is recorded only from the instance the PC assigned the session
to, at the current epoch, with ``read`` on the session's scope, and only for the session's own scope.

The PC runs over real mutual TLS with the instance doubles of tests/test_pc_http.py.  Two scopes: A (the
PC holds its key) and B (no key: no initial checkpoint).  ``ii1`` reads A, ``ii2`` reads A and B; ``ta``
is a tenant of A (lookup and read on A) and ``ii3`` reads A, but neither is listed as an instance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from control.deploy.pki import DevPki
from control.pc.core import SessionTable
from control.serve import serving
from control.up.layout import INSTANCES as UP_INSTANCES
from control.up.layout import UpOptions, prepare
from kvsp.errors import ValidationError
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import SessionCheckpoint, Shard, ShardMap
from kvsp.service.policy import Policy, ScopeGrant
from tests.support.servers import FakeClock, role_config, running
from tests.support.vectors import APPENDIX_A_SCOPE_KEY, VECTORS
from tests.test_pc_http import SCOPE as SCOPE_A
from tests.test_pc_http import Env, InstanceDouble, checkpoint, problem_type

SCOPE_B = bytes.fromhex("0123456789abcdef0123456789abcdef")
LISTED = ["ii1", "ii2"]
ROLES = ["pc", "fe", "h1", "ops", "ta", "ii3", *LISTED]
SID = "0b7e4c1a-9d3f-4e2a-8c6b-1f5a7d9e3c20"

PolicyOf = Callable[[DevPki], Policy]


def two_scopes(pki: DevPki, instances: tuple[str, ...] = ("ii1", "ii2")) -> Policy:
    u = pki.uri
    return Policy(pc=u("pc"), instances=frozenset(u(n) for n in instances), scopes={
        SCOPE_A: ScopeGrant(lookup=frozenset({u("pc"), u("fe"), u("ta")}),
                            read=frozenset({u("ii1"), u("ii2"), u("ii3"), u("ta"), u("h1")}),
                            store=frozenset({u("ii1"), u("ii2"), u("h1")})),
        SCOPE_B: ScopeGrant(lookup=frozenset({u("pc"), u("fe")}), read=frozenset({u("ii2")}),
                            store=frozenset({u("ii2")}))})


@asynccontextmanager
async def pc_env(tmp_path: Path, policy_of: PolicyOf = two_scopes, **pc: object) -> AsyncIterator[Env]:
    pki = DevPki.make(tmp_path / "pki", ROLES)
    (tmp_path / "scope.key").write_text(APPENDIX_A_SCOPE_KEY.hex())
    descriptor = str(VECTORS / "appendix_a_descriptor.json")
    policy = policy_of(pki)
    sections: dict[str, dict[str, object]] = {
        "pc": {"scope_keys": {SCOPE_A.hex(): str(tmp_path / "scope.key")}, "descriptors": [descriptor],
               "status_check_interval_ms": 5, "call_timeout_ms": 3000, "operators": [pki.uri("ops")], **pc},
        "is": {"descriptors": [descriptor], "sweep_interval_s": 0.05},
    }
    doubles = {n: InstanceDouble(n, pki.uri(n), pki.uri("pc")) for n in LISTED}
    clock = FakeClock()
    async with AsyncExitStack() as stack:
        for name, double in doubles.items():
            await stack.enter_async_context(serving(role_config(pki, name, ("instance",), policy), app=double.app()))
        app = await stack.enter_async_context(
            running(role_config(pki, "pc", ("pc", "is"), policy, sections), clock=clock))
        env = Env(pki, clock, app, doubles)
        try:
            yield env
        finally:
            for s in env.sessions.values():
                await s.close()
    assert all(not d.strangers for d in doubles.values())


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with pc_env(tmp_path) as e:
        yield e


def in_scope(session: str, scope: bytes, generated: tuple[int, ...] = (1, 2), *, epoch: int = 1) -> SessionCheckpoint:
    return dataclasses.replace(checkpoint(session, generated, epoch=epoch), scope_id=scope)


async def put_checkpoint(env: Env, sender: str, session: str, scope: bytes) -> tuple[int, object | None]:
    return await env.call(sender, "PUT", f"sessions/{session}/checkpoint", in_scope(session, scope))


async def placed(env: Env, scope: bytes, instance: str) -> str:
    status, info = await env.generate(scope_id=scope.hex())
    assert status == 200 and isinstance(info, dict) and info["instance"] == env.uri(instance), info
    return str(info["session"])


# -- who is an instance (section 6.3, D2) ------------------------------------------------------------------
@pytest.mark.parametrize("stranger", ["ta", "ii3"])
async def test_an_identity_the_policy_does_not_list_cannot_become_an_instance(env: Env, stranger: str) -> None:
    """A tenant's certificate (or any other of the CA) reporting its own status is refused, so the PC
    never places a session there: the start would hand it another user's prompt."""
    status, body = await env.report(stranger)
    assert status == 403 and isinstance(body, dict) and body["status"] == 403
    assert env.pc.registry.state_of(env.uri(stranger)) is None
    assert await env.report("ii1") == (200, {"state": "active"})
    for _ in range(4):
        await placed(env, SCOPE_A, "ii1")  # every request goes to the one listed instance


async def test_a_policy_without_instances_admits_none(tmp_path: Path) -> None:
    async with pc_env(tmp_path, lambda pki: dataclasses.replace(two_scopes(pki), instances=frozenset())) as env:
        status, _ = await env.report("ii1")
        assert status == 403 and len(env.pc.registry) == 0


async def test_the_pc_config_narrows_the_policy_and_cannot_widen_it(env: Env) -> None:
    env.pc.settings = dataclasses.replace(env.pc.settings, instances=frozenset({env.uri("ii1"), env.uri("ii3")}))
    assert (await env.report("ii1"))[0] == 200
    assert (await env.report("ii2"))[0] == 403  # listed by the policy, left out by [pc] instances
    assert (await env.report("ii3"))[0] == 403  # named by [pc] instances only


# -- whose checkpoints (section 6.8, section 9) --------------------------------------------------------------
@pytest.mark.parametrize("scope", [SCOPE_A, SCOPE_B], ids=["A", "B"])
async def test_a_checkpoint_never_creates_a_session(env: Env, scope: bytes) -> None:
    """Not even from a live instance with the scope's grant: only the PC opens sessions."""
    await env.report("ii2")
    for sender in ("ii2", "ta", "fe"):
        status, body = await put_checkpoint(env, sender, SID, scope)
        assert status == 403 and isinstance(body, dict) and body["status"] == 403, (sender, body)
    assert env.pc.sessions.epoch_of(SID) is None


async def test_only_the_assigned_instance_records_a_checkpoint(env: Env) -> None:
    await env.report("ii1", prefill=40_000.0)
    await env.report("ii2")
    session = await placed(env, SCOPE_A, "ii1")
    for sender in ("ii2", "ta", "ii3"):  # a listed instance it was not assigned to, and two strangers
        assert (await put_checkpoint(env, sender, session, SCOPE_A))[0] == 403, sender
    assert await put_checkpoint(env, "ii1", session, SCOPE_A) == (
        200, {"session": session, "epoch": 1, "output_offset": 2})


async def test_a_checkpoint_needs_read_on_the_scope_it_names(env: Env) -> None:
    await env.report("ii1")
    session = await placed(env, SCOPE_A, "ii1")
    status, body = await put_checkpoint(env, "ii1", session, SCOPE_B)  # ii1 may not read B
    assert status == 403 and problem_type(body) == ProblemType.SCOPE_DENIED.uri


async def test_a_checkpoint_cannot_move_a_session_into_another_scope(env: Env) -> None:
    """Scope B has no key at the PC, so there is no initial checkpoint to compare with: the session's
    scope itself binds the first checkpoint."""
    await env.report("ii2")
    session = await placed(env, SCOPE_B, "ii2")
    status, body = await put_checkpoint(env, "ii2", session, SCOPE_A)  # ii2 reads A too
    assert status == 409 and problem_type(body) == ProblemType.INCOMPATIBLE.uri
    assert (await put_checkpoint(env, "ii2", session, SCOPE_B))[0] == 200


def test_a_session_is_bound_to_the_scope_and_compat_it_was_opened_with() -> None:
    table = SessionTable()
    base = in_scope(SID, SCOPE_A)
    table.open(SID, "https://ii1.example/", 0.0, scope_id=SCOPE_B, compat_id=base.compat_id)
    with pytest.raises(ProblemError) as info:
        table.checkpoint("https://ii1.example/", base, 1.0)
    assert info.value.problem.kind is ProblemType.INCOMPATIBLE
    with pytest.raises(ValueError, match="scope_id"):
        SessionTable().open(SID, "https://ii1.example/", 0.0, checkpoint=base, scope_id=SCOPE_B)


# -- shard maps (section 6.9) ----------------------------------------------------------------------------
async def test_shard_map_members_must_be_instances(env: Env) -> None:
    def shard_map(*members: str) -> ShardMap:
        return ShardMap("m1", 1, tuple(Shard((i * 8, i * 8 + 8), env.uri(m)) for i, m in enumerate(members)))

    status, body = await env.call("ops", "POST", "maps/m1", shard_map("ii1", "ta"))
    assert status == 400 and isinstance(body, dict), body
    assert (await env.call("ops", "POST", "maps/m1", shard_map("ii1", "ii2")))[0] == 201


# -- the policy file and what kvsp up writes ---------------------------------------------------------------
def test_policy_instances_are_listed_identities_only() -> None:
    assert Policy.from_toml("").instances == frozenset()
    policy = Policy.from_toml('instances = ["https://ii1.example/"]')
    assert policy.is_instance("https://ii1.example/") and not policy.is_instance("https://ii2.example/")
    with pytest.raises(ValidationError):
        Policy.from_toml('instances = ["*"]')


def test_kvsp_up_lists_exactly_its_instances(tmp_path: Path) -> None:
    deployment = prepare(tmp_path, UpOptions(model="test", relay=False))
    for phase, suffix in (("main", ""), ("baseline", "-b")):
        policy = Policy.load(tmp_path / phase / "policy.toml")
        assert policy.instances == {deployment.uris[n + suffix] for n in UP_INSTANCES}
        assert not policy.is_instance(deployment.uris["fe" + suffix])
