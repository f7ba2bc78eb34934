"""The MOQT and relay suites' picoquic half (issue 19 item 4), from the main test run.

The main interpreter may lack aiopquic (it exists for Python >= 3.12 only), so here the loopback MOQT and
relay modules run over aioquic alone; `.ci/pico-suites` runs the same modules in the picoquic venv, where
every test that takes the ``quic_backend`` fixture also runs over picoquic. This test runs that script
for the picoquic ids only (the aioquic ones ran here already), so ``python3 -m pytest`` covers both.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.pico_venv import pico_python

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[1]
MIN_PICOQUIC_TESTS = 50  # what the six modules have over picoquic today (about 60): a collapse fails here


def test_the_moqt_and_relay_suites_pass_over_picoquic() -> None:
    pico_python()  # skips (or fails under KVSP_REQUIRE_PICO) where no picoquic venv can be had
    done = subprocess.run(["bash", str(REPO / ".ci" / "pico-suites"), "-k", "picoquic"], cwd=REPO,
                          capture_output=True, text=True, timeout=900, check=False)
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, tail
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed is not None and int(passed.group(1)) >= MIN_PICOQUIC_TESTS, tail
    assert " failed" not in done.stdout and " error" not in done.stdout, tail
