"""The picoquic path's ground (issue 19, docs/moqt-picoquic.md): what aiopquic 0.6.1 does, checked in its venv.

aiopquic needs Python >= 3.12, so the checks run in ``.venv-pico`` (built by ``.ci/pico-env`` on first use,
or ``$KVSP_PICO_PYTHON``) as a subprocess over loopback; skipped with one line only when no Python >= 3.12
can be found (a failure instead with ``KVSP_REQUIRE_PICO=1``, as CI should set).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from control.deploy.ports import free_udp_port
from kvsp.pki import RoleSpec, make_dev_pki
from moqt.quic import EndpointConfig, QuicSettings, SessionLike
from moqt.quic.pico import PicoConnection, PicoquicUnsupportedError, pico_connect, pico_serve
from tests.support.pico_venv import pico_python

pytestmark = pytest.mark.loopback

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "tests" / "support" / "pico_probe.py"
SESSION = REPO / "tests" / "support" / "pico_session.py"
API = REPO / "tests" / "support" / "pico_api.py"
AUTH = REPO / "tests" / "support" / "pico_auth.py"
RING = REPO / "tests" / "support" / "pico_ring.py"
MIB = 1 << 20


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_dev_pki(directory, [RoleSpec("server", "https://127.0.0.1:1/server/")])
    return directory


def run_in_pico_venv(script: Path, pki: Path) -> dict[str, object]:
    """Run a tests/support/pico_*.py script in the picoquic venv on a free port; its JSON result."""
    done = subprocess.run([str(pico_python()), str(script), str(pki), str(free_udp_port("0.0.0.0"))], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def facts(pki: Path) -> dict[str, object]:
    return run_in_pico_venv(PROBE, pki)


def test_alpn_is_the_servers_first_choice_among_the_clients_offers(facts: dict[str, object]) -> None:
    assert facts["alpn"] == {"client": "moqt-16", "server": "moqt-16"}


def test_send_stream_data_takes_bytes_only_and_backpressures_all_or_nothing(facts: dict[str, object]) -> None:
    assert facts["memoryview_refused"] is True and facts["bytearray_refused"] is True
    assert facts["over_ring_cap"] == "ValueError"  # one write above stream_ring_cap (4 MiB)
    # Whole writes only, at least the ring's 4 MiB: more when picoquic's thread emptied some in between.
    accepted = facts["accepted_before_buffer_error"]
    assert isinstance(accepted, int) and accepted >= 4 * MIB and accepted % MIB == 0
    assert facts["server_octets"] == facts["client_sent"]  # nothing of a refused write went out


def test_datagrams_and_application_close_codes(facts: dict[str, object]) -> None:
    assert facts["datagram_accepted"] == 100 and facts["server_datagram"] == 100
    assert facts["max_datagram_payload"] == 1200
    closes = facts["client_closes"]
    assert isinstance(closes, list) and closes[:1] == [2]  # the peer's code arrives; its reason does not exist


def test_client_verifies_the_server_chain_against_its_roots(facts: dict[str, object]) -> None:
    assert str(facts["untrusted_server"]).startswith("refused")


def test_an_unchanged_moqt_session_sets_up_over_the_shim(pki: Path) -> None:
    """Both sides' MoqtSession write through PicoQuic and read aiopquic's events as aioquic's: setup at
    the ALPN's draft, then the client's close reaches the server's session with its code."""
    seen = run_in_pico_venv(SESSION, pki)
    assert seen["server"] == ["SessionEstablished", "draft-16", "SessionTerminated", "code=0"]
    assert seen["client"] == ["SessionEstablished", "draft-16", "SessionTerminated", "code=0"]


def test_publisher_and_subscriber_over_picoquic_and_across_back_ends(pki: Path) -> None:
    """moqt.api unchanged over the picoquic back-end: an 8 MiB FETCH (four 2 MiB objects, each beyond
    send_high_water, 1 MiB here, the whole beyond aiopquic's 4 MiB stream ring) arrives byte-exact
    picoquic to picoquic, from a picoquic publisher to an aioquic subscriber, and from an aioquic
    publisher to a picoquic subscriber, each subscriber authenticated by its token alone."""
    seen = run_in_pico_venv(API, pki)
    for pairing in ("pico-on-pico", "aioquic-on-pico", "pico-on-aioquic"):
        result = seen[pairing]
        assert isinstance(result, dict)
        assert result["match"] is True and result["octets"] == 8 * MIB, pairing
        assert result["draft"] == 18  # both ends offer every draft: the newest wins
        assert result["server_saw"] == [["https://sub.test/", "token"]], pairing
        if pairing.endswith("-on-pico"):  # the picoquic publisher waited for picoquic: backpressure engaged
            assert result["drain_waits"][0] > 0, pairing
        if pairing.startswith("pico-"):  # picotls checked chain and host name only: known by the URI dialled
            identity, method = result["client_saw"]
            assert method == "server-name" and str(identity).startswith("moqt://127.0.0.1:"), pairing
            assert str(identity).endswith("/kvsp"), pairing
        else:
            assert result["client_saw"] == ["https://127.0.0.1:1/server/", "certificate"], pairing


def test_picoquic_server_authenticates_by_token_only_and_times_goaway(pki: Path) -> None:
    """A picoquic server sees no client certificate: a client that never sets up is closed UNAUTHORIZED at
    auth_timeout_s (1 s here, an application close), one that goes quiet after setup ends at picoquic's
    idle timeout (a transport close), a third connection from one address over a cap of two is closed,
    one without a token is refused at setup, a client trusting another CA
    fails in the handshake, one with a token is served. The
    served one, sent GOAWAY with a 0.5 s timeout it ignores, is closed GOAWAY_TIMEOUT by the session timer
    the connection arms."""
    seen = run_in_pico_venv(AUTH, pki)
    silent = seen["silent"]
    assert isinstance(silent, dict) and silent["code"] == silent["unauthorized"]
    assert 0.9 <= silent["closed_after_s"] < 2.0
    assert silent["application"] is True  # the server's UNAUTHORIZED: an application close (raw APP_CLOSE)
    idle = seen["idle"]  # picoquic's idle timeout after setup: a transport close, told from the raw CLOSE
    assert isinstance(idle, dict) and idle["application"] is False and 0.8 <= idle["after_s"] < 3.0
    # max_connections_per_client 2: the third connection from one address is closed at once and counted
    assert seen["capped"] == {"outcomes": ["served", "served", "ConnectionClosedError"], "refused": 1}
    assert seen["tokenless"] == "SessionError.UNAUTHORIZED"
    assert seen["untrusted"] == {"application": False}  # picotls ended the handshake: a transport close
    assert seen["token"] == [1000]
    identities = seen["identity"]
    assert isinstance(identities, list) and "https://sub.test/" in identities
    goaway = seen["goaway"]
    assert isinstance(goaway, dict) and goaway["received"] is True
    assert goaway["closed_with"] == "SessionError.GOAWAY_TIMEOUT" and 0.4 <= goaway["after_s"] < 1.5


def test_the_shim_waits_out_a_full_tx_event_ring(pki: Path) -> None:
    """aiopquic's BufferError for a full TX *event* ring fires no per-stream drain event: the shim waits on
    the connection's ring event instead, so every queued write still goes out (waiting on the stream's
    event, 2000 streams of 1000 octets left most of them queued for good)."""
    seen = run_in_pico_venv(RING, pki)
    assert seen["received"] == seen["written"]
    assert isinstance(seen["queued"], int) and seen["queued"] > 0  # the ring did fill: the path ran


def _config(pki: Path, *, require_certificate: bool = False) -> EndpointConfig:
    keys = [ec.generate_private_key(ec.SECP256R1()).public_key()]
    return EndpointConfig.from_files(pki / "server.pem", pki / "server.key", pki / "ca.pem", token_keys=keys,
                                     require_certificate=require_certificate)


def never(conn: PicoConnection[object]) -> SessionLike[object]:
    raise AssertionError("refused before any connection exists")


async def test_settings_picoquic_cannot_honour_are_refused_at_start(pki: Path) -> None:
    with pytest.raises(PicoquicUnsupportedError, match="require_certificate"):
        await pico_serve("127.0.0.1", 4433, _config(pki, require_certificate=True), never)
    with pytest.raises(PicoquicUnsupportedError, match="expected_identity"):
        await pico_connect("moqt://127.0.0.1:4433/x", _config(pki), never,
                           expected_identity="https://127.0.0.1:1/server/")


def test_the_quic_option_names_a_back_end_and_picoquic_needs_python_3_12() -> None:
    with pytest.raises(ValueError, match="the QUIC back-ends are aioquic, picoquic"):
        QuicSettings(quic="msquic")
    if sys.version_info >= (3, 12):
        assert QuicSettings(quic="picoquic").quic == "picoquic"
    else:
        with pytest.raises(ValueError, match=r"needs Python >= 3\.12 .*use aioquic"):
            QuicSettings(quic="picoquic")


@pytest.mark.skipif(importlib.util.find_spec("aiopquic") is not None, reason="aiopquic is installed here")
async def test_without_aiopquic_the_back_end_says_so_in_one_error(pki: Path) -> None:
    with pytest.raises(PicoquicUnsupportedError, match=r"aiopquic==0\.6\.1 \(Python >= 3\.12\)"):
        await pico_connect("moqt://127.0.0.1:4433/x", _config(pki), never)
