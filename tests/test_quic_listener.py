"""The QUIC listeners' refusals (moqt/quic/server.py, moqt/quic/refusal.py): the per-address connection
cap, and certificates refused with the TLS alert as a crypto error, each logged as one INFO line."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from aioquic.tls import AlertDescription
from cryptography import x509

from control.deploy.pki import DevPki
from control.holder.settings import HolderSettings
from kvsp.errors import ValidationError
from kvsp.pki import RoleSpec, make_dev_pki
from kvsp.service.logs import PEER_KEY, RateLimiter, RateLimitFilter
from kvsp.service.policy import Policy
from moqt.quic import ConnectionClosedError, EndpointConfig, MoqtConnection, QuicSettings, connect, serve
from moqt.quic.refusal import address_text, certificate_alert, crypto_error
from relay.app import RelayCollector
from relay.core import RelayStats
from relay.settings import RelaySettings
from tests.support.servers import role_config
from tests.test_quic_keepalive import Quiet

pytestmark = pytest.mark.loopback

T = 20.0
CONNECTION_REFUSED = 0x2


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The deployment CA's dir (with "old", a client certificate that expired) and an unrelated CA's."""
    base = tmp_path_factory.mktemp("pki")
    good, foreign = base / "a", base / "b"
    roles = [RoleSpec("server", "moqt://127.0.0.1:4433/r"), RoleSpec("client", "https://c.test/")]
    make_dev_pki(good, roles)
    make_dev_pki(foreign, roles)  # the same names, another key
    make_dev_pki(good, [RoleSpec("old", "https://old.test/")], now=dt.datetime.now(dt.UTC) - dt.timedelta(days=800))
    return good, foreign


def config(ca_dir: Path, name: str, **quic: Any) -> EndpointConfig:
    return EndpointConfig.from_files(ca_dir / f"{name}.pem", ca_dir / f"{name}.key", ca_dir / "ca.pem",
                                     QuicSettings(**quic))


def peer_lines(caplog: pytest.LogCaptureFixture, key: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, PEER_KEY, None) == key]


async def test_connections_over_the_per_peer_cap_are_refused_at_once(dirs: tuple[Path, Path],
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    good = dirs[0]
    caplog.set_level(logging.INFO, "moqt.quic")
    server = await serve("127.0.0.1", 0, config(good, "server", max_connections_per_client=2), Quiet)
    uri = f"moqt://127.0.0.1:{server.port}/r"
    try:
        first, second = [await connect(uri, config(good, "client"), Quiet) for _ in range(2)]
        start = time.monotonic()
        with pytest.raises(ConnectionClosedError) as refused:
            await connect(uri, config(good, "client", handshake_timeout_s=15.0), Quiet)
        assert time.monotonic() - start < 10  # at once, not at the handshake timeout
        assert refused.value.error_code == CONNECTION_REFUSED and not refused.value.application
        assert server.refused == 1 and len(server.connections) == 2
        (line,) = peer_lines(caplog, "moqt.per-peer-cap")
        assert line.levelno == logging.INFO and "127.0.0.1" in line.getMessage() and not line.exc_info
        first.close()
        await asyncio.wait_for(first.wait_closed(), T)
        async with asyncio.timeout(T):
            while len(server.connections) > 1:  # the server's side ends after its closing period
                await asyncio.sleep(0.02)
        third = await connect(uri, config(good, "client"), Quiet)  # a slot is free again
        for conn in (second, third):
            conn.close()
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), T)


@pytest.mark.parametrize(("client", "alert"), [
    ("foreign", AlertDescription.unknown_ca),
    ("none", AlertDescription.certificate_required),
    ("expired", AlertDescription.certificate_expired),
])
async def test_refused_certificates_get_the_tls_alert_as_crypto_error(
        dirs: tuple[Path, Path], client: str, alert: AlertDescription, caplog: pytest.LogCaptureFixture) -> None:
    good, foreign = dirs
    caplog.set_level(logging.INFO, "moqt.quic")
    server_config = EndpointConfig.from_files(good / "server.pem", good / "server.key", good / "ca.pem",
                                              QuicSettings(), require_certificate=True)
    sessions: list[Quiet] = []

    def factory(conn: MoqtConnection[Any]) -> Quiet:
        sessions.append(Quiet(conn))
        return sessions[-1]

    server = await serve("127.0.0.1", 0, server_config, factory)
    where, name = {"foreign": (foreign, "client"), "none": (None, ""), "expired": (good, "old")}[client]
    cert, key = (where / f"{name}.pem", where / f"{name}.key") if where else (None, None)
    try:
        conn = await connect(f"moqt://127.0.0.1:{server.port}/r", EndpointConfig.from_files(cert, key, good / "ca.pem"),
                             Quiet)
        await asyncio.wait_for(conn.wait_closed(), T)
        event = conn.close_event
        assert event is not None and event.error_code == crypto_error(alert) == 0x100 + alert
        assert event.frame_type is not None  # a transport close, as TLS would have sent an alert
        assert sessions == []  # no session ever saw the refused peer
        (line,) = peer_lines(caplog, "moqt.tls-refused")
        assert line.levelno == logging.INFO and "127.0.0.1" in line.getMessage() and alert.name in line.getMessage()
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), T)


def test_refusal_lines_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    """The refusal lines carry the kvsp_peer key that kvsp serve's RateLimitFilter limits per key."""
    limiter = RateLimitFilter(RateLimiter(burst=2, interval_s=60.0))
    records = [logging.LogRecord("moqt.quic.server", logging.INFO, __file__, 1, "refused %d", (i,), None)
               for i in range(5)]
    for record in records:
        setattr(record, PEER_KEY, "moqt.per-peer-cap")
    assert [limiter.filter(r) for r in records] == [True, True, False, False, False]


def test_certificate_alerts(dirs: tuple[Path, Path]) -> None:
    good, foreign = dirs
    roots = x509.load_pem_x509_certificates((good / "ca.pem").read_bytes())
    leaf = x509.load_pem_x509_certificate((good / "client.pem").read_bytes())
    stranger = x509.load_pem_x509_certificate((foreign / "client.pem").read_bytes())
    assert certificate_alert([], roots) is AlertDescription.certificate_required
    assert certificate_alert([stranger], roots) is AlertDescription.unknown_ca  # same CA name, other key
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=400)
    assert certificate_alert([leaf], roots, later) is AlertDescription.certificate_expired
    assert certificate_alert([leaf], roots) is AlertDescription.bad_certificate  # chains, rejected otherwise
    assert (address_text(("::1", 4433, 0, 0)), address_text(("127.0.0.1", 1))) == ("[::1]:4433", "127.0.0.1:1")


def test_the_caps_and_timeouts_are_configured_with_defaults(tmp_path: Path) -> None:
    pki = DevPki.make(tmp_path / "pki", ["r", "h"])
    relay: dict[str, object] = {"listen": "127.0.0.1:4443", "uri": "moqt://127.0.0.1:4443/relay"}
    defaults = RelaySettings.from_config(role_config(pki, "r", ("relay",), Policy(), {"relay": relay}))
    assert (defaults.max_connections_per_client, defaults.liveness_timeout_s, defaults.upstream_stall_s,
            defaults.idle_timeout_s) == (256, 2.0, 0.5, 5.0)
    tuned = RelaySettings.from_config(role_config(pki, "r", ("relay",), Policy(), {"relay": {
        **relay, "max_connections_per_client": 4, "liveness_timeout_s": 1.5, "upstream_stall_s": 0.25}}))
    assert tuned.quic.max_connections_per_client == 4 and tuned.quic.liveness_timeout_s == 1.5
    with pytest.raises(ValidationError, match="max_connections_per_client"):
        RelaySettings.from_config(role_config(pki, "r", ("relay",), Policy(), {
            "relay": {**relay, "max_connections_per_client": 0}}))
    model = tmp_path / "model.json"
    model.write_text((Path(__file__).parent / "vectors" / "appendix_a_descriptor.json").read_text())
    holder: dict[str, object] = {"descriptors": [str(model)], "moqt_listen": "127.0.0.1:4433",
                                 "moqt_uri": "moqt://127.0.0.1:4433/h"}
    settings = HolderSettings.from_config(role_config(pki, "h", ("holder",), Policy(), {"holder": holder}))
    assert settings.moqt is not None and settings.moqt.max_connections_per_client == 256
    capped = HolderSettings.from_config(role_config(pki, "h", ("holder",), Policy(), {
        "holder": {**holder, "moqt_max_connections_per_client": 3}}))
    assert capped.moqt is not None and capped.moqt.max_connections_per_client == 3
    with pytest.raises(ValueError, match="max_connections_per_client"):
        QuicSettings(max_connections_per_client=0)


def test_the_relay_exports_its_refused_connections() -> None:
    metrics = {m.name: m for m in RelayCollector(RelayStats(), lambda: 3).collect()}
    assert metrics["kvsp_relay_connections_refused"].samples[0].value == 3
