"""The PC's ``deadline_ms`` query parameter is an ASCII decimal in range or 400 Problem Details, and a
refused request records nothing.  The PC and IS on loopback (`tests.test_pc_http.env`)."""

from __future__ import annotations

import pytest

from tests.test_http_hygiene_roles import BAD_INTEGERS, short_id
from tests.test_pc_http import Env, env  # noqa: F401 - env is the fixture
from tests.test_pc_http_reshard import shard_map

TOO_BIG = str(2**53)  # past the largest I-JSON integer, as deadlines in records are


@pytest.mark.parametrize("value", [*BAD_INTEGERS, "0", TOO_BIG], ids=short_id)
async def test_a_deadline_that_is_not_a_positive_ascii_decimal_is_400(env: Env, value: str) -> None:  # noqa: F811
    status, body = await env.call("ops", "POST", f"maps/m1?deadline_ms={value}", shard_map(1, env.uri("ii1")))
    assert status == 400 and isinstance(body, dict) and "deadline_ms" in str(body["detail"]), (status, body)
    assert (await env.call("ops", "GET", "maps/m1"))[0] == 404  # nothing recorded
    assert (await env.call("ops", "POST", "maps/m1?deadline_ms=0250", shard_map(1, env.uri("ii1"))))[0] == 201
