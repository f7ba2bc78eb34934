"""The client test doubles themselves (tests/support/client_doubles.py): distinct containers, mutual TLS."""

from __future__ import annotations

import ssl

import aiohttp
import pytest

from kvsp.container import decode_container
from tests.support.client_doubles import (
    COMPAT,
    LAYERS,
    SCOPE,
    Doubles,
    client_pki_fixture,
    doubles_fixture,
    key_of,
    make_container,
    make_record,
    publish,
)

__all__ = ["client_pki_fixture", "doubles_fixture"]  # the fixtures the tests below use


def test_made_containers_differ_per_block_and_layer() -> None:
    a, b = decode_container(make_container(0)), decode_container(make_container(1))
    assert len({v.digest() for v in a.layers} | {v.digest() for v in b.layers}) == 2 * LAYERS
    record = make_record("https://h.example/", key_of(0), make_container(0))
    assert record.verify_digest_chain()
    assert record.size == len(make_container(0))


async def test_holder_double_requires_a_client_certificate(doubles: Doubles) -> None:
    publish(doubles, 0, "h1")
    ctx = ssl.create_default_context(cafile=str(doubles.pki.files("client").ca))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    url = f"{doubles['h1'].uri}blocks/{COMPAT.hex()}/{SCOPE.hex()}/{key_of(0).hex()}"
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientError):
            async with http.get(url, ssl=ctx) as resp:
                await resp.read()
