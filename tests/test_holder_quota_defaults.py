"""Quotas that fit the holder (control/holder/quota.py): unset, ``lease_octets_per_client`` is a quarter
of what the holder's tiers hold together (at most 4 GiB); set by the policy it is used as it is, and a
value that lets one client pin the whole holder is a WARNING at startup and a fact of ``GET health``."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from control.deploy.pki import DevPki
from control.holder.app import HOLDER
from control.holder.quota import LEASE_SHARE, SOURCE_DERIVED, SOURCE_POLICY, holder_quotas, storable_block_octets
from control.holder.service import Holder
from kvsp.registry import Tier
from kvsp.service.policy import LEASE_OCTETS_CEILING, Policy, Quotas
from tests.support.holder import block_id, container, descriptor, restricted_policy, write_descriptor
from tests.support.servers import FakeClock, role_config, running

MiB, GiB = 1 << 20, 1 << 30
D = descriptor(layers=4, kv_heads=2, head_dim=8, block_tokens=4)
SIZE = len(container(D, 0))  # every block of D has this container size (what a lease counts)
JSON = {"Content-Type": "application/json"}


# -- the derivation ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("capacities", "quota"), [
    ({Tier.HOST: 64 * MiB, Tier.LOCAL_STORAGE: GiB}, 285_212_672),  # kvsp up's cache holder: 272 MiB
    ({Tier.HOST: GiB}, 256 * MiB),  # the [holder] default: a 1 GiB host tier
    ({Tier.DEVICE: 8 * GiB, Tier.HOST: 8 * GiB}, 4 * GiB),  # a quarter of 16 GiB
    ({Tier.HOST: 64 * GiB, Tier.LOCAL_STORAGE: 1024 * GiB}, LEASE_OCTETS_CEILING),  # capped
])
def test_unset_the_lease_quota_is_a_quarter_of_every_tier(capacities: dict[Tier, int], quota: int) -> None:
    report = holder_quotas(Quotas(), capacities)
    assert (report.lease_octets_per_client, report.lease_quota_source) == (quota, SOURCE_DERIVED)
    assert report.pinnable_octets == sum(capacities.values()) and report.warnings == ()
    assert quota == min(LEASE_OCTETS_CEILING, int(sum(capacities.values()) * LEASE_SHARE))


def test_a_policy_value_is_used_as_it_is_and_warned_about_when_it_pins_everything() -> None:
    kvsp_up = {Tier.HOST: 64 * MiB, Tier.LOCAL_STORAGE: GiB}
    fits = holder_quotas(Quotas(lease_octets_per_client=100 * MiB), kvsp_up)
    assert (fits.lease_octets_per_client, fits.lease_quota_source, fits.warnings) == (100 * MiB, SOURCE_POLICY, ())
    old_default = holder_quotas(Quotas(lease_octets_per_client=4 * GiB), kvsp_up)
    assert old_default.lease_octets_per_client == 4 * GiB
    (warning,) = old_default.warnings
    assert "quotas.lease_octets_per_client = 4294967296" in warning and "1140850688 octets" in warning
    assert "one client can pin the whole holder" in warning


def test_a_block_body_limit_above_what_the_tiers_take_is_warned_about() -> None:
    host = {Tier.HOST: 64 * MiB}
    (warning,) = holder_quotas(Quotas(block_body_limit_octets=128 * MiB), host).warnings
    assert "quotas.block_body_limit_octets = 134217728" in warning and "(67108864 octets)" in warning
    assert holder_quotas(Quotas(), host).warnings == ()  # the default is not the operator's choice
    two = {Tier.HOST: 64 * MiB, Tier.LOCAL_STORAGE: 256 * MiB}
    assert storable_block_octets(two, fast_layers=0) == 256 * MiB
    assert storable_block_octets(two, fast_layers=2) == 320 * MiB  # a split block spans both


def test_the_policy_file_leaves_the_lease_quota_unset_unless_it_names_it() -> None:
    assert Policy.from_toml("").quotas.lease_octets_per_client is None
    assert Policy.from_toml("[quotas]\nlease_octets_per_client = 2048").quotas.lease_octets_per_client == 2048


# -- a served holder -----------------------------------------------------------------------------------
@asynccontextmanager
async def holder(tmp_path: Path, quotas: Quotas | None) -> AsyncIterator[tuple[Holder, aiohttp.ClientSession, str]]:
    pki = DevPki.make(tmp_path / "pki", ["holder", "client", "other"])
    section = {"descriptors": [str(write_descriptor(D, tmp_path / "d.json"))], "host_capacity_octets": 8 * SIZE}
    config = role_config(pki, "holder", ("holder",), restricted_policy(pki, quotas), {"holder": section}, tmp_path)
    async with running(config, clock=FakeClock()) as app, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_ssl("client"))) as http:
        yield app[HOLDER], http, pki.uri("holder")


async def store_and_lease(http: aiohttp.ClientSession, base: str, blocks: int) -> list[int]:
    """Store ``blocks`` blocks, then lease them one by one: the statuses of the leases."""
    keys = []
    for n in range(blocks):
        b = block_id(D, n)
        url = f"{base}blocks/{b.compat_id.hex()}/{b.scope_id.hex()}/{b.block_key.hex()}"
        async with http.put(url, data=container(D, n), headers={"If-None-Match": "*"}) as r:
            assert r.status == 201
        keys.append(b.block_key.hex())
    statuses = []
    for key in keys:
        async with http.post(base + "leases", data=json.dumps({"block_keys": [key], "ttl_ms": 5000}),
                             headers=JSON) as r:
            statuses.append(r.status)
    return statuses


async def health(http: aiohttp.ClientSession, base: str) -> dict[str, object]:
    async with http.get(base + "health") as r:
        facts = (await r.json())["holder"]
        assert isinstance(facts, dict)
        return facts


@pytest.mark.loopback
async def test_a_served_holder_lets_one_client_pin_a_quarter_by_default(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with holder(tmp_path, None) as (served, http, base):
        assert await store_and_lease(http, base, 3) == [201, 201, 429]  # 8 blocks of room: 2 per client
        assert await health(http, base) == {"pinnable_octets": 8 * SIZE, "lease_octets_per_client": 2 * SIZE,
                                            "lease_quota_source": "derived", "quota_warnings": []}
        assert served.leases.octets_per_client == 2 * SIZE
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"lease quota: {2 * SIZE} octets per client (derived; {8 * SIZE} pinnable in all tiers)" in caplog.messages


@pytest.mark.loopback
async def test_a_policy_quota_above_the_capacity_is_a_startup_warning(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with holder(tmp_path, Quotas(lease_octets_per_client=16 * SIZE)) as (_, http, base):
        (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert warning.name == "kvsp.holder.http"
        assert f"quotas.lease_octets_per_client = {16 * SIZE}" in warning.getMessage()
        assert f"capacity of {8 * SIZE} octets" in warning.getMessage()
        assert await store_and_lease(http, base, 3) == [201, 201, 201]
        facts = await health(http, base)
        assert (facts["lease_octets_per_client"], facts["lease_quota_source"]) == (16 * SIZE, "policy")
        assert facts["quota_warnings"] == [warning.getMessage()]
