"""A role serves only as the identity its certificate asserts (D1): ``[server] base_uri`` must be a URI
SubjectAltName of ``[tls] cert``, checked before anything listens."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import pytest

from control.deploy.pki import DevPki
from control.serve import serving
from kvsp.service.policy import Policy
from kvsp.service.tls import TlsConfigError
from tests.support.servers import role_config

pytestmark = pytest.mark.loopback


async def test_a_base_uri_the_certificate_does_not_assert_is_refused_before_listening(tmp_path: Path) -> None:
    pki = DevPki.make(tmp_path, ["is", "h1"])
    config = role_config(pki, "is", ("is",), Policy())
    wrong = replace(config, tls=pki.files("h1"))  # h1's certificate, the IS's base URI
    with pytest.raises(TlsConfigError, match=r"is not a URI SubjectAltName of tls\.cert") as refused:
        async with serving(wrong):
            pass
    assert pki.uri("is") in str(refused.value) and pki.uri("h1") in str(refused.value)
    with socket.socket() as probe:  # nothing was left listening
        assert probe.connect_ex(("127.0.0.1", pki.port("is"))) != 0


async def test_the_certificates_own_uri_serves(tmp_path: Path) -> None:
    pki = DevPki.make(tmp_path, ["is"])
    async with serving(role_config(pki, "is", ("is",), Policy())):
        with socket.socket() as probe:  # listening as its certificate's identity
            assert probe.connect_ex(("127.0.0.1", pki.port("is"))) == 0


async def test_a_pc_replica_serves_with_the_policys_pc_certificate_at_its_own_base_uri(tmp_path: Path) -> None:
    """D2/D7: every PC replica presents the one PC identity; only that shared identity is allowed to
    differ from the base URI, and only for a process that serves the PC role."""
    pki = DevPki.make(tmp_path, ["pc", "pc2"])
    policy = Policy(pc=pki.uri("pc"))
    replica = replace(role_config(pki, "pc2", ("pc",), policy), tls=pki.files("pc"))
    async with serving(replica):
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", pki.port("pc2"))) == 0
    not_a_pc = replace(role_config(pki, "pc2", ("is",), policy), tls=pki.files("pc"))
    with pytest.raises(TlsConfigError, match=r"is not a URI SubjectAltName"):
        async with serving(not_a_pc):
            pass
