"""Dead peers on the data plane with real ``kvsp serve`` relays and holders (issue 17 item 3): a relay
SIGKILLed one layer into a 32 MiB FETCH, publishers SIGSTOPped and SIGKILLed under a SUBSCRIBE, and a
holder's relay session through idle periods longer than the relay's idle timeout.

The processes and scenarios are benchmarks/bench_dataplane_faults.py's (which times them against the
tree before the change); here each asserts the behaviour, with bounds far above the figures measured.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest

from benchmarks.bench_dataplane_faults import World, fallback, reconnects, subscribe_to_vanished
from benchmarks.trees import ROOT


@pytest.fixture
async def world(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[World]:
    names: list[str] = request.param
    made = World(tmp_path, ROOT, names)
    try:
        yield made
    finally:
        made.close()


@pytest.mark.parametrize("world", [["relay-f", "hf"]], indirect=True)
async def test_relay_killed_mid_fetch_falls_back_to_https_with_identical_octets(world: World) -> None:
    world.relay("relay-f")
    world.holder("hf", "relay-f")
    await world.start()
    await world.wait_namespaces("relay-f", 1)
    result = await fallback(world, "relay-f", "hf")
    assert result["identical"] is True
    attempts = cast(list[list[str]], result["attempts"])
    assert [a[:2] for a in attempts] == [["moqt", "transport"], ["https", "loaded"]]
    assert "stalled" in attempts[0][2]
    total = result["total_s"]
    assert isinstance(total, float) and total < 8.0  # the object timeout alone would be 10 s


@pytest.mark.parametrize("world", [["relay-s", "hs", "hx"]], indirect=True)
async def test_subscribe_to_a_frozen_or_killed_publisher_is_answered_with_an_error(world: World) -> None:
    world.relay("relay-s", idle_timeout_s=60.0)  # only the liveness bound can answer in time
    world.holder("hs", "relay-s", index=False)
    world.holder("hx", "relay-s", index=False)
    await world.start()
    await world.wait_namespaces("relay-s", 2)
    for holder, sig in (("hs", signal.SIGSTOP), ("hx", signal.SIGKILL)):
        result = await subscribe_to_vanished(world, "relay-s", holder, sig, cap_s=30.0)
        assert str(result["alive_answer"]).startswith("SUBSCRIBE_ERROR TRACK_DOES_NOT_EXIST")
        assert str(result["dead_answer"]).startswith("SUBSCRIBE_ERROR INTERNAL_ERROR"), result
        dead = result["dead_s"]
        assert isinstance(dead, float) and dead < 20.0
    assert "unresponsive" in world.log("relay-s")  # one line per peer given up


@pytest.mark.parametrize("world", [["relay-k", "hk"]], indirect=True)
async def test_a_holders_relay_session_survives_idle_periods_past_the_idle_timeout(world: World) -> None:
    world.relay("relay-k", idle_timeout_s=1.5)
    world.holder("hk", "relay-k", index=False)
    await world.start()
    await world.wait_namespaces("relay-k", 1)
    start = time.monotonic()
    await asyncio.sleep(5.0)  # more than three idle timeouts without a request
    assert time.monotonic() - start >= 5.0
    assert reconnects(world, "hk") == 0
    stats = await world.relay_stats("relay-k")
    assert stats["publishers"] == 1 and stats["namespaces"] >= 1
