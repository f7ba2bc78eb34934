"""Resharding through the PC between real processes (spec section 6.9, the PC's ``POST maps/{map}``).

Three instances hold a 192-token context split in three (version 1); the KV of each range is placed
with the kvsp extension ``PUT shards/{map}`` (the front end plays the prefill worker).  Version 2 moves
tokens 64-96 from ii2 to ii1; every other range stays where it is and must be retained in place.

- ii3, a member that only retains, is frozen with SIGSTOP and never acknowledges: the PC aborts at the
  deadline, version 1 stays authoritative, and the members discard what they fetched (ii1's metrics:
  the fetched octets are counted as discarded, nothing stays staged, what it holds is unchanged; the
  range is not readable at version 2).
- After SIGCONT the same move succeeds: the octets moved are exactly those of the fetched range; the
  retained ranges move 0 octets (ii2 and ii3 move nothing although they retain 32 and 64 tokens), and
  ii1 serves the moved range with the very KV ii2 had.
"""

from __future__ import annotations

import signal
from pathlib import Path

from control.deploy.system import JSON, Settings, System, running_system
from kvsp.container import encode_container
from kvsp.engine import kv_values
from kvsp.records import Shard, ShardMap
from kvsp.registry import Codec
from tests.support.instance import DESCRIPTOR, GEOMETRY

MAP = "c3f8e1"
CONTEXT = tuple(range(5000, 5192))  # 192 tokens
BYTES_PER_TOKEN = 2 * GEOMETRY.layers * GEOMETRY.kv_heads * GEOMETRY.head_dim * 2  # K and V, fp16
DEADLINE_MS = 500


def range_container(start: int, end: int) -> bytes:
    """The documented KV of CONTEXT[start:end] at its positions, as a kvsp-layout-1 container."""
    tokens = CONTEXT[start:end]
    layers = [(kv_values(GEOMETRY, 0, tokens, start, layer).tobytes(), kv_values(GEOMETRY, 1, tokens, start, layer)
               .tobytes()) for layer in range(GEOMETRY.layers)]
    return encode_container(Codec.RAW, 0, end - start, layers, geometry=DESCRIPTOR.geometry())


def shard_map(system: System, version: int, split: list[tuple[int, int, str]]) -> ShardMap:
    return ShardMap(MAP, version, tuple(Shard((a, b), system.uri(n)) for a, b, n in split))


V1 = [(0, 64, "ii1"), (64, 128, "ii2"), (128, 192, "ii3")]
V2 = [(0, 96, "ii1"), (96, 128, "ii2"), (128, 192, "ii3")]


async def put_range(system: System, name: str, start: int, end: int, version: int = 1) -> None:
    url = system.uri(name) + f"shards/{MAP}?tokens={start}-{end}&version={version}"
    async with system.http["fe"].put(url, data=range_container(start, end),
                                     headers={"Content-Type": "application/kvsp-block"}) as resp:
        assert resp.status == 201, await resp.text()


async def get_range(system: System, name: str, start: int, end: int, version: int) -> tuple[int, bytes]:
    url = system.uri(name) + f"shards/{MAP}?tokens={start}-{end}&version={version}"
    async with system.http["fe"].get(url) as resp:
        return resp.status, await resp.read()


async def post_map(system: System, new: ShardMap, *, deadline_ms: int | None = None) -> int:
    query = "" if deadline_ms is None else f"?deadline_ms={deadline_ms}"
    async with system.http["fe"].post(system.uri("pc") + f"maps/{MAP}{query}", data=new.to_bytes(),
                                      headers={"Content-Type": JSON}) as resp:
        assert resp.status in (200, 201, 202), await resp.text()
        return resp.status


async def settled(system: System) -> dict[str, object]:
    """GET maps/{map} once no move is in progress."""
    state: dict[str, object] = {}

    async def done() -> bool:
        async with system.http["fe"].get(system.uri("pc") + f"maps/{MAP}") as resp:
            assert resp.status == 200
            state.update(await resp.json(content_type=None))
        return state["in_progress"] is None
    await system.wait_for(done, "the reshard to end", timeout=20)
    return state


async def samples(system: System, name: str) -> dict[str, float]:
    keys = ("moved", "retained", "discarded")
    m = await system.metrics(name)
    out = {k: m[f"kvsp_instance_reshard_bytes_{k}_total"] for k in keys}
    out["held"] = m["kvsp_instance_shard_bytes_held"]
    out["staged"] = m["kvsp_instance_shard_bytes_staged"]
    return out


async def test_reshard_aborts_without_an_acknowledgement_then_commits_moving_only_fetched_ranges(
        tmp_path: Path) -> None:
    settings = Settings(per_instance={"ii3": {"status_ttl_ms": 15_000}},  # frozen, but not failed by expiry
                        operators=("fe",), shard_writers=("fe",))
    async with running_system(tmp_path, settings, instances=("ii1", "ii2", "ii3")) as system:
        for start, end, name in V1:
            await put_range(system, name, start, end)
        assert await post_map(system, shard_map(system, 1, V1)) == 201  # recorded: nothing to move
        before = {n: await samples(system, n) for n in ("ii1", "ii2", "ii3")}
        assert before["ii1"]["held"] == 64 * BYTES_PER_TOKEN

        # -- a member never acknowledges: abort at the deadline, nothing leaked ----------------------
        system.signal("ii3", signal.SIGSTOP)
        assert await post_map(system, shard_map(system, 2, V2), deadline_ms=DEADLINE_MS) == 202
        state = await settled(system)
        assert state["last"] == {"version": 2, "outcome": "aborted"}
        assert state["map"] == shard_map(system, 1, V1).to_json()
        fetched = 32 * BYTES_PER_TOKEN

        async def discarded() -> bool:
            return (await samples(system, "ii1"))["discarded"] == fetched
        await system.wait_for(discarded, "ii1 to discard the range it fetched")
        ii1, ii2 = await samples(system, "ii1"), await samples(system, "ii2")
        assert ii1["moved"] - before["ii1"]["moved"] == fetched  # it did fetch, then threw it away
        assert ii1["staged"] == 0 and ii1["held"] == before["ii1"]["held"]
        assert ii2["held"] == before["ii2"]["held"] and ii2["staged"] == 0 and ii2["discarded"] == 0
        assert (await get_range(system, "ii1", 64, 96, 2))[0] == 409  # version 2 never came into force
        assert await get_range(system, "ii2", 64, 96, 1) == (200, range_container(64, 96))
        pc = await system.metrics("pc")
        assert pc['kvsp_pc_reshards_total{outcome="aborted"}'] == 1

        # -- the same move with every member answering: commit; retained ranges move nothing --------
        system.signal("ii3", signal.SIGCONT)
        await system.wait_active(("ii1", "ii2", "ii3"))
        mid = {n: await samples(system, n) for n in ("ii1", "ii2", "ii3")}
        assert await post_map(system, shard_map(system, 2, V2), deadline_ms=DEADLINE_MS) == 202
        state = await settled(system)
        assert state["last"] == {"version": 2, "outcome": "committed"}
        assert state["map"] == shard_map(system, 2, V2).to_json()

        async def committed() -> bool:
            return (await samples(system, "ii3"))["retained"] > mid["ii3"]["retained"]
        await system.wait_for(committed, "every member to apply the commit")
        after = {n: await samples(system, n) for n in ("ii1", "ii2", "ii3")}
        moved = {n: after[n]["moved"] - mid[n]["moved"] for n in after}
        retained = {n: after[n]["retained"] - mid[n]["retained"] for n in after}
        assert moved == {"ii1": fetched, "ii2": 0, "ii3": 0}
        assert retained == {"ii1": 64 * BYTES_PER_TOKEN, "ii2": 32 * BYTES_PER_TOKEN, "ii3": 64 * BYTES_PER_TOKEN}
        assert after["ii1"]["held"] == 96 * BYTES_PER_TOKEN and after["ii2"]["held"] == 32 * BYTES_PER_TOKEN
        assert all(after[n]["staged"] == 0 for n in after)
        assert await get_range(system, "ii1", 0, 96, 2) == (200, range_container(0, 96))
        assert (await get_range(system, "ii2", 64, 96, 2))[0] == 409  # released by ii2
        pc = await system.metrics("pc")
        assert pc['kvsp_pc_reshards_total{outcome="committed"}'] == 1
