"""The QUIC back-ends a loopback MOQT test runs over: aioquic always, picoquic where aiopquic imports.

A pytest plugin (``pytest_plugins`` in tests/conftest.py). A test that asks for the `quic_backend`
fixture, itself or through an autouse fixture of its module, runs once per back-end present, with the
back-end first in its id (``[picoquic-d18]``); the fixture also sets `CURRENT`, which the config
builders of the support helpers (tests/support/relay.py's ``endpoint_config``) read, as
``PINNED_DRAFTS`` pins drafts. ``@aioquic_only("why")`` keeps a test that checks aioquic's own
behaviour on aioquic alone, visibly (its id still says ``[aioquic]``).

Why tokens: a picoquic server never sees a client certificate (docs/moqt-picoquic.md), so on picoquic
every client authenticates with a D3 token naming the identity its certificate carries (`token_for`)
and every server trusts `ISSUER` (`token_keys`). On aioquic nothing changes: certificates, no tokens.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from kvsp.identifiers import role_id
from kvsp.service.moqt_config import MoqtConfig
from moqt.auth import issue_token

AIOQUIC: Final = "aioquic"
PICOQUIC: Final = "picoquic"
#: aiopquic has wheels for Python >= 3.12 only: on 3.11 the suites run over aioquic alone.
BACKENDS: Final[tuple[str, ...]] = (AIOQUIC, PICOQUIC) if importlib.util.find_spec("aiopquic") else (AIOQUIC,)
MARKER: Final = "aioquic_only"

#: The back-end of the running test (set by `quic_backend`; aioquic for tests that do not ask).
CURRENT: str = AIOQUIC

#: Signs every test token; trusted by every server the helpers start (one key for the whole run).
ISSUER: Final = ec.generate_private_key(ec.SECP256R1())
TOKEN_LIFETIME_S: Final = 3600


def aioquic_only(reason: str) -> pytest.MarkDecorator:
    """Run this test over aioquic only, for ``reason`` (what picoquic lacks, see docs/moqt-picoquic.md)."""
    return pytest.mark.aioquic_only(reason=reason)


def picoquic() -> bool:
    """Whether the running test is on picoquic."""
    return CURRENT == PICOQUIC


def token_keys() -> tuple[ec.EllipticCurvePublicKey, ...]:
    """What a server trusts for tokens: `ISSUER` on picoquic (its only way to authenticate), none on aioquic."""
    return (ISSUER.public_key(),) if picoquic() else ()


def token_for(subject: str, namespaces: Iterable[Sequence[bytes]] = (), scopes: Iterable[bytes] = ()) -> bytes | None:
    """On picoquic, a token for ``subject`` (the certificate's identity URI) covering ``namespaces`` and
    ``scopes``; on aioquic None (the certificate authenticates)."""
    if not picoquic():
        return None
    now = int(time.time())
    return issue_token(ISSUER, subject, scopes, namespaces, expires_at=now + TOKEN_LIFETIME_S, now=now)


def holder_keys(directory: Path) -> dict[str, object]:
    """The ``[holder]`` keys a holder role needs on the running back-end: on picoquic ``moqt_token_keys``
    naming `ISSUER`'s public key (written into ``directory``), on aioquic none."""
    if not picoquic():
        return {}
    path = directory / "test-issuer.pub.pem"
    path.write_bytes(ISSUER.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
    return {"moqt_token_keys": [str(path)]}


def role_moqt(directory: Path, subject: str) -> MoqtConfig:
    """A role's ``[moqt]`` on the running back-end: on picoquic with a token file for ``subject`` (every KVSP
    namespace: its identity's policy decides), which the role presents where it dials (a holder's relay)."""
    if not picoquic():
        return MoqtConfig()
    token = token_for(subject, namespaces=[(b"kvsp",)])
    assert token is not None
    path = directory / f"{role_id(subject)}.test-token"
    path.write_bytes(token)
    return MoqtConfig(PICOQUIC, path)


def _reason(marker: pytest.Mark) -> str:
    reason = marker.kwargs.get("reason", marker.args[0] if marker.args else "")
    if not reason:
        raise pytest.UsageError("@aioquic_only needs a reason")
    return str(reason)


# -- plugin ---------------------------------------------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(reason): runs over aioquic only (what picoquic lacks)")


@pytest.hookimpl(tryfirst=True)  # before the fixtures' own params: the back-end comes first in the id
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "quic_backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker(MARKER)
    backends = (AIOQUIC,) if marker is not None and _reason(marker) else BACKENDS
    metafunc.parametrize("quic_backend", backends, indirect=True, ids=list(backends))


@pytest.fixture
def quic_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The back-end of this run of the test; the helpers' config builders follow it (`CURRENT`)."""
    backend: Any = getattr(request, "param", AIOQUIC)
    monkeypatch.setattr(f"{__name__}.CURRENT", backend)
    return str(backend)
