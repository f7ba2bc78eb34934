"""control.listener.core without sockets or clocks: each phase's deadline, the body's rate rule, the
send rule, the per-address table, TLS refusal reasons; and the ``[server]`` keys that configure them."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from control.deploy.configs import RoleFile, ServerLimits
from control.frontend.admission import CLIENT, GLOBAL, TENANT, Admission, Caps
from control.listener.core import (
    BODY_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    HEADER_TIMEOUT,
    IDLE_TIMEOUT,
    SEND_TIMEOUT,
    TLS_REFUSAL_LABELS,
    ConnectionClock,
    Io,
    PeerTable,
    Phase,
    Timeouts,
    classify_tls,
)
from kvsp.errors import ValidationError
from kvsp.service.config import LIMIT_KEYS, ListenerLimits, RoleConfig

T = Timeouts(handshake_s=5.0, header_s=10.0, body_s=30.0, body_min_rate=1000.0, idle_s=75.0, send_s=60.0)
BODY_OPEN = Io(body_octets=0, body_complete=False)


def served(now: float = 0.0) -> ConnectionClock:
    clock = ConnectionClock(T, now, tls=True)
    clock.ready(now)
    return clock


def test_a_handshake_that_never_finishes_expires_without_an_answer() -> None:
    clock = ConnectionClock(T, 100.0, tls=True)
    assert clock.phase is Phase.HANDSHAKE and clock.deadline() == 105.0
    assert clock.expired(104.9, Io()) is None
    verdict = clock.expired(105.0, Io())
    assert verdict is not None and verdict.reason == HANDSHAKE_TIMEOUT and not verdict.answer_408


def test_headers_have_a_total_deadline_however_they_trickle() -> None:
    clock = served(0.0)
    for t in range(1, 10):  # one octet a second: progress, but the total counts
        clock.received(float(t))
        assert clock.expired(float(t), Io()) is None
    verdict = clock.expired(10.0, Io())
    assert verdict is not None and verdict.reason == HEADER_TIMEOUT and verdict.answer_408


def test_a_new_connection_that_sends_nothing_gets_no_408() -> None:
    verdict = served(0.0).expired(10.0, Io())
    assert verdict is not None and verdict.reason == HEADER_TIMEOUT and not verdict.answer_408


def test_a_body_without_octets_expires_after_the_body_timeout() -> None:
    clock = served()
    clock.request_started(1.0)
    assert clock.deadline() == 31.0
    assert clock.expired(30.9, BODY_OPEN) is None
    verdict = clock.expired(31.0, BODY_OPEN)
    assert verdict is not None and verdict.reason == BODY_TIMEOUT and verdict.answer_408


def test_a_trickled_body_expires_by_the_rate_rule_though_octets_keep_coming() -> None:
    clock = served()
    clock.request_started(0.0)
    octets = 0
    for t in range(1, 40):  # 10 octets a second against a minimum of 1000: 30 s + 0.39 s of credit at most
        clock.received(float(t))
        octets += 10
        verdict = clock.expired(float(t), Io(octets, False))
        if verdict is not None:
            assert verdict.reason == BODY_TIMEOUT and t == 31
            return
    raise AssertionError("the trickle was never cut")


def test_a_steady_body_above_the_minimum_rate_gets_through() -> None:
    clock = served()
    clock.request_started(0.0)
    for t in range(1, 200):  # 2000 octets a second for 200 s: the credit grows faster than the time
        clock.received(float(t))
        assert clock.expired(float(t), Io(2000 * t, False)) is None
    assert clock.expired(200.0, Io(400_000, True)) is None and clock.phase is Phase.HANDLING
    assert clock.deadline() is None  # the handler works: no deadline of the connection's own


def test_a_stall_after_a_fast_start_is_cut_by_the_gap_rule() -> None:
    clock = served()
    clock.request_started(0.0)
    clock.received(1.0)
    assert clock.expired(1.0, Io(10_000_000, False)) is None  # 10 MB of credit ...
    verdict = clock.expired(31.0, Io(10_000_000, False))  # ... but no octet for 30 s
    assert verdict is not None and verdict.reason == BODY_TIMEOUT


def test_a_body_the_server_holds_back_does_not_count_against_the_client() -> None:
    clock = served()
    clock.request_started(0.0)
    assert clock.expired(29.0, Io(65_536, False, reading=False)) is None  # paused by us: the clock restarts
    assert clock.expired(50.0, Io(65_536, False, reading=False)) is None
    assert clock.deadline() == 80.0


def test_idle_connections_expire_after_the_idle_timeout_without_an_answer() -> None:
    clock = served()
    clock.request_started(1.0)
    clock.request_ended(2.0)
    assert clock.phase is Phase.IDLE and clock.deadline() == 77.0
    verdict = clock.expired(77.0, Io())
    assert verdict is not None and verdict.reason == IDLE_TIMEOUT and not verdict.answer_408


def test_the_next_request_on_a_kept_alive_connection_gets_the_header_timeout() -> None:
    clock = served()
    clock.request_started(1.0)
    clock.request_ended(2.0)
    clock.received(50.0)
    assert clock.phase is Phase.HEADERS and clock.deadline() == 60.0


def test_octets_pipelined_during_a_request_start_the_header_clock_when_it_ends() -> None:
    clock = served()
    clock.request_started(1.0)
    clock.observe(1.0, Io())  # body complete
    clock.received(3.0)
    clock.request_ended(20.0)
    assert clock.phase is Phase.HEADERS and clock.deadline() == 30.0 and clock.request_octets


def test_an_answer_still_draining_keeps_an_idle_connection() -> None:
    clock = served()
    clock.request_started(0.0)
    clock.request_ended(1.0)
    assert clock.expired(76.0, Io(write_buffered=1 << 20)) is None  # the send rule watches it instead
    assert clock.deadline() == 151.0


def test_an_answer_the_client_does_not_take_expires_after_the_send_timeout() -> None:
    clock = served()
    clock.request_started(0.0)
    clock.observe(0.0, Io())  # handling: a long stream
    clock.write_paused(10.0, 1 << 20)
    assert clock.expired(40.0, Io(write_buffered=900_000)) is None  # it drained some: progress
    assert clock.expired(99.0, Io(write_buffered=900_000)) is None
    verdict = clock.expired(100.0, Io(write_buffered=900_000))
    assert verdict is not None and verdict.reason == SEND_TIMEOUT and not verdict.answer_408


def test_resumed_writing_clears_the_send_rule() -> None:
    clock = served()
    clock.request_started(0.0)
    clock.observe(0.0, Io())
    clock.write_paused(1.0, 1000)
    clock.write_resumed()
    assert clock.expired(1000.0, Io()) is None


def test_the_peer_table_caps_each_address_and_frees_slots() -> None:
    table = PeerTable(2)
    assert table.admit("10.0.0.1") and table.admit("10.0.0.1") and not table.admit("10.0.0.1")
    assert table.admit("10.0.0.2") and table.total == 3
    table.release("10.0.0.1")
    assert table.held("10.0.0.1") == 1 and table.admit("10.0.0.1")
    for _ in range(3):
        table.release("10.0.0.2")  # more releases than admissions leave no negative count
    assert table.held("10.0.0.2") == 0
    with pytest.raises(ValueError):
        PeerTable(0)


@pytest.mark.parametrize(("reason", "verify", "label"), [
    ("PEER_DID_NOT_RETURN_A_CERTIFICATE", None, "no_certificate"),
    ("CERTIFICATE_VERIFY_FAILED", "unable to get local issuer certificate", "certificate_rejected"),
    ("UNSUPPORTED_PROTOCOL", None, "protocol_version"),
    ("HTTP_REQUEST", None, "not_tls"),
    ("WRONG_VERSION_NUMBER", None, "not_tls"),
    ("NO_SHARED_CIPHER", None, "no_shared_cipher"),
    ("NO_APPLICATION_PROTOCOL", None, "no_application_protocol"),
    ("TLSV1_ALERT_UNKNOWN_CA", None, "peer_alert"),
    ("SOMETHING_NEW", None, "other"),
    (None, None, "other"),
])
def test_tls_refusals_get_a_label_and_words(reason: str | None, verify: str | None, label: str) -> None:
    refusal = classify_tls(reason, verify, "TLS 1.3")
    assert refusal.label == label and refusal.label in TLS_REFUSAL_LABELS and refusal.reason
    if verify:
        assert verify in refusal.reason
    if label == "protocol_version":
        assert "TLS 1.3" in refusal.reason


# -- the front end's admission ------------------------------------------------------------------------
def test_caps_derive_from_the_global_one() -> None:
    assert Caps.derived(64) == Caps(64, 32, 16)
    assert Caps.derived(1) == Caps(1, 1, 1)
    assert Caps.derived(64, 40, None) == Caps(64, 40, 16)


def test_one_client_cannot_take_another_tenants_slots() -> None:
    admission = Admission(Caps.derived(64))
    refusals = [admission.acquire("public", "10.0.0.1") for _ in range(64)]
    assert refusals[:16] == [None] * 16 and all(r is not None and r.limit == CLIENT for r in refusals[16:])
    assert admission.acquire("acme", "10.0.0.2") is None  # the other tenant still gets in
    assert admission.of_client("10.0.0.1") == 16 and admission.in_flight == 17


def test_a_tenant_is_capped_across_its_clients_and_the_global_cap_stays_behind() -> None:
    admission = Admission(Caps(total=4, per_tenant=3, per_client=2))
    assert [admission.acquire("public", f"10.0.0.{i}") for i in range(3)] == [None] * 3
    refusal = admission.acquire("public", "10.0.0.9")
    assert refusal is not None and refusal.limit == TENANT and "3" in refusal.detail
    assert admission.acquire("acme", "10.0.1.1") is None
    refusal = admission.acquire("beta", "10.0.2.1")
    assert refusal is not None and refusal.limit == GLOBAL
    admission.release("public", "10.0.0.0")
    assert admission.acquire("beta", "10.0.2.1") is None
    for tenant, client in (("public", "10.0.0.1"), ("public", "10.0.0.2"), ("acme", "10.0.1.1"),
                           ("beta", "10.0.2.1")):
        admission.release(tenant, client)
    assert admission.in_flight == 0 and admission.of_tenant("public") == 0


# -- [server] keys ------------------------------------------------------------------------------------
def test_server_limits_round_trip_through_the_role_file(tmp_path: Path) -> None:
    limits = ServerLimits(*range(1001, 1001 + len(LIMIT_KEYS)))
    path = RoleFile(["is"], "https://127.0.0.1:7400/is/", limits=limits).write(tmp_path / "is.toml")
    config = RoleConfig.load(path)
    assert config.server.limits == ListenerLimits(*range(1001, 1001 + len(LIMIT_KEYS)))
    assert set(tomllib.loads(path.read_text())["server"]) == {"base_uri", *LIMIT_KEYS}


def test_server_limits_default_when_absent(tmp_path: Path) -> None:
    config = RoleConfig.load(RoleFile(["is"], "https://127.0.0.1:7400/is/").write(tmp_path / "is.toml"))
    assert config.server.limits == ListenerLimits()
    assert ListenerLimits().header_timeout_ms == 10_000 and ListenerLimits().idle_timeout_ms == 75_000


@pytest.mark.parametrize(("server", "member"), [
    ({"header_timeout": 5}, "server.header_timeout"),
    ({"header_timeout_ms": 0}, "server.header_timeout_ms"),
    ({"idle_timeout_ms": "75s"}, "server.idle_timeout_ms"),
    ({"max_connections_per_client": True}, "server.max_connections_per_client"),
])
def test_bad_server_keys_name_the_member(server: dict[str, object], member: str) -> None:
    doc = {"roles": ["is"], "server": {"base_uri": "https://127.0.0.1:7400/is/", **server}}
    with pytest.raises(ValidationError) as err:
        RoleConfig.from_mapping(doc, Path("."))
    assert member in str(err.value)
