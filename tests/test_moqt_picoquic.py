"""The picoquic path's ground (issue 19, docs/moqt-picoquic.md): what aiopquic 0.6.1 does, checked in its venv.

aiopquic needs Python >= 3.12, so the checks run in ``.venv-pico`` (built by ``.ci/pico-env`` on first use,
or ``$KVSP_PICO_PYTHON``) as a subprocess over loopback; skipped with one line only when no Python >= 3.12
can be found (a failure instead with ``KVSP_REQUIRE_PICO=1``, as CI should set).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from control.deploy.ports import free_udp_port
from kvsp.pki import RoleSpec, make_dev_pki

pytestmark = pytest.mark.loopback

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "tests" / "support" / "pico_probe.py"
SESSION = REPO / "tests" / "support" / "pico_session.py"
MIB = 1 << 20


def pico_python() -> Path:
    """The picoquic venv's interpreter (built once by .ci/pico-env); skip when no 3.12+ exists here."""
    configured = os.environ.get("KVSP_PICO_PYTHON")
    if configured:
        return Path(configured)
    done = subprocess.run(["bash", str(REPO / ".ci" / "pico-env")], cwd=REPO, capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        why = lines[-1] if lines else f"exit status {done.returncode}"
        if "no Python >= 3.12" in why and not os.environ.get("KVSP_REQUIRE_PICO"):
            pytest.skip(f"picoquic path needs Python >= 3.12: {why}")
        pytest.fail(f".ci/pico-env failed: {why}")
    return Path(done.stdout.strip().splitlines()[-1])


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
    assert facts["accepted_before_buffer_error"] == 4 * MIB
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
