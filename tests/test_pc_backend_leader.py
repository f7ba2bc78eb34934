"""The PC's leadership, without sockets (decision D7): the sans-I/O `Leadership` core fed with lease
outcomes and a clock, the cores' record/restore round trip, `KeyedOrder`, and `PlacementController`'s
reactions on a `MemoryStore`: a write whose outcome is unknown stops granting until a renewal and a
reload, a fenced write steps the PC down, a new leader carries every session and instance on and aborts
the move that was in progress, and a deposed leader's checkpoint acknowledgement never happens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Sequence

import pytest

from control.backend import BackendConfig, RedisConfig
from control.pc.core import InstanceRegistry, ReshardCoordinator, SendAbort, SessionTable
from control.pc.core.durable import InstanceRecord, MapRecord, SessionRecord, Snapshot
from control.pc.core.leadership import Leadership, LeaseTiming, Role
from control.pc.leader import NotLeader
from control.pc.metrics import PcMetrics
from control.pc.service import PlacementController
from control.pc.settings import PcSettings
from control.pc.store import MemoryStore, StoreUnavailable, make_holder
from control.pc.tasks import KeyedOrder
from kvsp.descriptor import CompatDescriptor
from kvsp.problems import ProblemError, ProblemType
from kvsp.records import InstanceStatus, Sampler, SessionCheckpoint, Shard, ShardMap
from kvsp.registry import InstanceState
from kvsp.service.metrics import Metrics
from kvsp.service.policy import Policy, ScopeGrant
from tests.support.servers import FakeClock

II1, II2 = "https://127.0.0.1:7411/ii1/", "https://127.0.0.1:7412/ii2/"
SCOPE = bytes(range(16))
MODEL = CompatDescriptor(model="m", model_digest=bytes(32), tokenizer_digest=bytes(32), layers=2, kv_heads=2,
                         head_dim=4, kv_dtype="fp16", positional="rope", block_tokens=4)
SAMPLER = Sampler("top-p", (("p", 0.9),), 1, 0, False)


def role(of: Leadership | PlacementController) -> Role:
    """The role now (a call, so that the type checker does not narrow it across the awaits below)."""
    return of.role


# -- Leadership --------------------------------------------------------------------------------------------
def test_leadership_grants_only_after_sync_and_until_its_deadline() -> None:
    lead = Leadership(LeaseTiming(1.0))
    assert role(lead) is Role.STANDBY and not lead.may_grant(0.0) and lead.next_wait(0.0) == pytest.approx(0.1)
    lead.granted(7, "https://pc/", sent_at=10.0)
    assert role(lead) is Role.SYNCING and not lead.may_grant(10.1)  # nothing before the state is loaded
    lead.synced()
    assert lead.may_grant(10.5) and not lead.may_grant(11.0)  # the deadline is send time + ttl
    assert lead.next_wait(10.1) == pytest.approx(1 / 3)
    lead.renewed(10.6)
    assert lead.may_grant(11.5) and lead.lapsed(11.6)
    lead.store_failed()
    assert role(lead) is Role.SYNCING and not lead.may_grant(11.0) and lead.next_wait(11.0) == pytest.approx(0.1)
    lead.lost("https://other/")
    assert (role(lead), lead.token, lead.leader) == (Role.STANDBY, None, "https://other/")


def test_a_renewal_never_moves_the_deadline_back() -> None:
    lead = Leadership(LeaseTiming(1.0))
    lead.granted(1, "https://pc/", sent_at=5.0)
    lead.renewed(4.0)  # a slow answer to an older renewal
    assert lead.deadline == 6.0


# -- record / restore ------------------------------------------------------------------------------------
def status(instance: str = II1, epoch: int = 3, ttl_ms: int = 3000) -> InstanceStatus:
    return InstanceStatus(instance, epoch, InstanceState.ACTIVE, 0, 0, 8, 0.0, 1000.0, 100.0, (), ttl_ms)


def checkpoint(session: str, epoch: int, offset: int) -> SessionCheckpoint:
    return SessionCheckpoint(session, epoch, MODEL.compat_id, SCOPE, (), (1, 2), tuple(range(offset)), offset,
                             SAMPLER)


def test_cores_round_trip_through_records() -> None:
    sessions = SessionTable(adopt_unknown=False)
    s = str(uuid.uuid4())
    sessions.open(s, II1, 0.0, checkpoint=checkpoint(s, 1, 0), scope_id=SCOPE, compat_id=MODEL.compat_id)
    sessions.checkpoint(II1, checkpoint(s, 1, 4), 1.0)
    record = sessions.record(s)
    assert record is not None and (record.epoch, record.owner, record.output_offset) == (1, II1, 4)
    again = SessionTable(adopt_unknown=False)
    again.restore(record, 100.0)
    assert again.record(s) == record
    assert again.expire(100.0 + 3599) == [] and again.expire(100.0 + 3600) == [s]  # idle from the takeover

    registry = InstanceRegistry()
    registry.report(status(), 0.0)
    kept = registry.record(II1)
    assert kept == InstanceRecord(status(), InstanceState.ACTIVE)
    taken = InstanceRegistry()
    taken.restore(kept, 50.0, grace_s=1.0)
    assert [x.instance for x in taken.eligible(53.9)] == [II1] and taken.expire(54.0)[0].reason == "expired"


def test_a_move_in_progress_at_takeover_is_aborted() -> None:
    old = ShardMap("m", 4, (Shard((0, 8), II1),))
    new = ShardMap("m", 5, (Shard((0, 4), II1), Shard((4, 8), II2)))
    coordinator = ReshardCoordinator()
    aborts = coordinator.restore(old, new)
    assert sorted(a.instance for a in aborts) == [II1, II2] and all(isinstance(a, SendAbort) for a in aborts)
    assert coordinator.authoritative("m") == old and coordinator.in_progress("m") is None


async def test_keyed_order_runs_one_key_in_order_and_keys_apart() -> None:
    order, log = KeyedOrder(), []
    gate = asyncio.Event()

    async def write(key: str, n: int, wait: bool = False) -> None:
        async with order.hold(key):
            if wait:
                await gate.wait()
            log.append((key, n))

    first = asyncio.ensure_future(write("a", 1, wait=True))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(write("a", n)) for n in (2, 3)] + [asyncio.ensure_future(write("b", 1))]
    await asyncio.sleep(0.01)
    assert log == [("b", 1)]  # another key is not held up
    gate.set()
    await asyncio.gather(first, *rest)
    assert log == [("b", 1), ("a", 1), ("a", 2), ("a", 3)] and len(order) == 0


# -- PlacementController on a store -----------------------------------------------------------------------
class FlakyStore(MemoryStore):
    """A `MemoryStore` that can be made unreachable (every call raises `StoreUnavailable`)."""

    down = False

    def __getattribute__(self, name: str) -> object:
        attr = super().__getattribute__(name)
        if name in ("acquire", "renew", "release", "load", "open_session", "record_checkpoint", "save_session",
                    "drop_sessions", "save_instance", "save_map", "save_directive") and \
                super().__getattribute__("down"):
            async def unreachable(*args: object, **kwargs: object) -> object:
                raise StoreUnavailable(f"{name}: down")
            return unreachable
        return attr


def controller(store: MemoryStore, clock: FakeClock, lease: FakeClock,
               base_uri: str = "https://pc1/") -> PlacementController:
    settings = PcSettings(index=None, descriptors={MODEL.compat_id: MODEL}, lease_ttl_ms=1000,
                          backend=BackendConfig("redis", RedisConfig("redis://127.0.0.1:1/0")))
    policy = Policy(pc="https://pc/", scopes={SCOPE: ScopeGrant(read=frozenset({II1, II2}))},
                    instances=frozenset({II1, II2}))
    return PlacementController(settings, policy, base_uri=base_uri, clock=clock,
                               metrics=PcMetrics.register(Metrics()), store=store, lease_clock=lease)


async def open_session(pc: PlacementController, owner: str = II1) -> str:
    """A session as `place` leaves it, without the network: opened, stored, owned by ``owner``."""
    s = str(uuid.uuid4())
    pc.sessions.open(s, owner, pc.clock(), checkpoint=checkpoint(s, 1, 0), scope_id=SCOPE, compat_id=MODEL.compat_id)
    fence = pc._fence
    assert fence is not None
    record = pc.sessions.record(s)
    assert record is not None
    await pc.store.open_session(fence, dataclasses.replace(record, max_tokens=64))
    return s


async def leading(store: MemoryStore, lease: FakeClock, clock: FakeClock | None = None) -> PlacementController:
    pc = controller(store, clock or FakeClock(), lease)
    await pc._lease_round()
    assert role(pc) is Role.LEADER
    return pc


async def test_a_write_with_an_unknown_outcome_stops_granting_until_renewed_and_reloaded() -> None:
    store, lease = FlakyStore(FakeClock()), FakeClock()
    pc = await leading(store, lease)
    s = await open_session(pc)
    assert await pc.checkpoint(II1, checkpoint(s, 1, 4), 1.0) == {"session": s, "epoch": 1, "output_offset": 4}
    store.down = True
    with pytest.raises(NotLeader):
        await pc.checkpoint(II1, checkpoint(s, 1, 8), 2.0)  # not acknowledged: the store may not have it
    assert role(pc) is Role.SYNCING
    with pytest.raises(NotLeader) as refused:
        pc.require_leader()
    assert refused.value.leader is None  # a 503: not a standby that knows better
    store.down = False
    await pc._lease_round()  # the renewal shows the lease is still ours: reload, then lead
    assert role(pc) is Role.LEADER
    latest = pc.sessions.latest(s)
    assert latest is not None and latest.output_offset == 4  # the store's state, not the unacknowledged 8
    assert pc.metrics.takeovers._value.get() == 2


async def test_an_unreachable_store_past_the_deadline_steps_down() -> None:
    store, lease = FlakyStore(FakeClock()), FakeClock()
    pc = await leading(store, lease)
    store.down = True
    lease.advance(0.5)
    await pc._lease_round()
    assert role(pc) is Role.SYNCING
    lease.advance(0.6)  # past send time + ttl of the last renewal that got through
    await pc._lease_round()
    assert role(pc) is Role.STANDBY and len(pc.sessions) == 0 and pc.metrics.leader._value.get() == 0


async def test_a_deposed_leader_is_fenced_on_its_first_write_and_steps_down() -> None:
    store_clock, lease = FakeClock(), FakeClock()
    store = MemoryStore(store_clock)
    old = await leading(store, lease)
    s = await open_session(old)
    store_clock.advance(2.0)  # the old leader was paused past its lease ...
    new = controller(store, FakeClock(), FakeClock(), "https://pc2/")
    await new._lease_round()  # ... and the other PC took over
    assert role(new) is Role.LEADER and new.sessions.owner_of(s) == II1
    with pytest.raises(NotLeader):  # its own clock did not move (it believes it leads): the store refuses
        await old.checkpoint(II1, checkpoint(s, 1, 4), 1.0)
    assert role(old) is Role.STANDBY and old.metrics.fenced_writes.labels("checkpoint")._value.get() == 1
    assert (await new.checkpoint(II1, checkpoint(s, 1, 4), 1.0))["output_offset"] == 4
    await old._lease_round()
    assert role(old) is Role.STANDBY and old.leadership.leader == "https://pc2/"  # it names the leader now
    with pytest.raises(NotLeader) as misdirected:
        old.require_leader()
    assert misdirected.value.leader == "https://pc2/"  # a 421 naming it


async def test_a_new_leader_carries_sessions_instances_and_maps_on() -> None:
    store = MemoryStore(FakeClock())
    fence = (await store.acquire(make_holder("x", "https://old/"), 1000)).fence
    assert fence is not None
    s = str(uuid.uuid4())
    await store.open_session(fence, SessionRecord(s, 2, II2, checkpoint(s, 2, 6), SCOPE, MODEL.compat_id,
                                                  max_tokens=64, last_owner=II1, moving=False))
    await store.save_instance(fence, InstanceRecord(status(II1, 9), InstanceState.FAILED))
    await store.save_instance(fence, InstanceRecord(status(II2, 4), InstanceState.ACTIVE))
    await store.save_map(fence, MapRecord(ShardMap("m", 1, (Shard((0, 8), II2),)), None, (1, "committed")))
    await store.release(fence)
    pc = await leading(store, FakeClock())
    assert (pc.sessions.epoch_of(s), pc.sessions.owner_of(s)) == (2, II2)
    assert pc.info(s).output_offset == 6 and pc.info(s).instance == II2
    assert pc.registry.state_of(II1) is InstanceState.FAILED and pc.registry.epoch_of(II1) == 9
    assert [x.instance for x in pc.registry.eligible(pc.clock())] == [II2]
    with pytest.raises(ProblemError) as stale:  # the highest epoch seen survived the takeover
        await pc.report_status(status(II1, 8), pc.clock())
    assert stale.value.problem.kind is ProblemType.STALE_EPOCH
    assert pc.map_outcomes["m"].outcome == "committed"
    with pytest.raises(ProblemError) as old_epoch:
        await pc.checkpoint(II1, checkpoint(s, 1, 7), 1.0)
    assert old_epoch.value.problem.kind is ProblemType.STALE_EPOCH


def _names(records: Sequence[SessionRecord]) -> list[str]:
    return [r.session for r in records]


async def test_the_embedded_pc_leads_from_start_up_and_keeps_leading() -> None:
    settings = PcSettings(index=None)
    pc = PlacementController(settings, Policy(), base_uri="https://pc/", clock=FakeClock(),
                             metrics=PcMetrics.register(Metrics()))
    assert pc.embedded and role(pc) is Role.STANDBY
    await pc.start()
    assert role(pc) is Role.LEADER
    pc.require_leader()  # for the life of the process
    snapshot: Snapshot = await pc.store.load()
    assert _names(snapshot.sessions) == []
