"""Shared fixtures (the spec's Appendix A vectors) and the test kinds.

Every test gets exactly one marker, by its module (`kind_of`):

- ``interop``: against the third-party stack (aiomoqt in its own venv): tests/test_interop*.py;
- ``process``: starts child processes (``kvsp serve`` roles, ``kvsp up``, fresh interpreters);
- ``loopback``: opens sockets on loopback in this process (TLS servers, QUIC endpoints);
- ``unit``: everything else: bytes, in-memory peers, fake clocks.  A ``unit`` test that binds or
  connects a socket fails (`_unit_tests_open_no_sockets`): add its module to LOOPBACK_MODULES.

``python3 -m pytest -m unit`` runs the fast ones; ``-m "not process and not interop"`` adds loopback.
"""

from __future__ import annotations

import json
import socket

import pytest
from hypothesis import HealthCheck, settings

from tests.support.vectors import VECTORS

# The QUIC back-end fixture and the aioquic_only marker of the MOQT and relay suites.
pytest_plugins = ["tests.support.backends"]

# CI runs on 2 shared cores: no per-example deadline, and slow generation is not a failure.
settings.register_profile("kvsp", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kvsp")

KINDS = ("unit", "loopback", "process", "interop")
PROCESS_MODULES = frozenset({
    "test_benchmarks", "test_cli", "test_deploy_redis", "test_hf_descriptor", "test_import_clean", "test_instance_hf",
    "test_layers", "test_system_failover", "test_system_prefetch", "test_system_reshard", "test_vllm",
    "test_vllm_example", "test_index_backend", "test_index_redis",
    "test_pc_backend", "test_pc_redis", "test_pc_redis_up", "test_system_pc_failover",
})
LOOPBACK_MODULES = frozenset({
    "test_authz_pc", "test_authz_replicas", "test_authz_replicas_relay", "test_client_doubles", "test_client_e2e",
    "test_client_fetch", "test_client_holder", "test_frontend_http", "test_holder_e2e", "test_holder_http",
    "test_holder_publish", "test_holder_restart", "test_http_hygiene_frontend", "test_http_hygiene_instance",
    "test_http_hygiene_pc", "test_http_hygiene_roles", "test_index_http", "test_instance_http",
    "test_instance_migration", "test_instance_moqt", "test_instance_reshard", "test_moqt_kvsp", "test_moqt_perf_fetch",
    "test_moqt_perf_gso", "test_moqt_pubsub", "test_moqt_quic", "test_pc_http", "test_pc_http_reshard", "test_pki",
    "test_ports", "test_relay", "test_relay_holder", "test_tiers_torch", "test_vllm_units", "test_workload",
})


def kind_of(module: str) -> str:
    """The marker of every test in ``tests/<module>.py``."""
    if module.startswith("test_interop"):
        return "interop"
    if module in PROCESS_MODULES or "processes" in module or module.startswith("test_up_"):
        return "process"
    return "loopback" if module in LOOPBACK_MODULES else "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(k) for k in KINDS):
            item.add_marker(getattr(pytest.mark, kind_of(item.path.stem)))


@pytest.fixture(autouse=True)
def _unit_tests_open_no_sockets(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keeps ``-m unit`` honest: a unit test that binds or connects a socket is misfiled."""
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a unit test opened a socket: add {request.node.path.stem} to LOOPBACK_MODULES "
                             "in tests/conftest.py")

    for name in ("bind", "connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, refuse)




@pytest.fixture
def appendix_a_text() -> str:
    return (VECTORS / "appendix_a_descriptor.json").read_text().strip()


@pytest.fixture
def appendix_a_json(appendix_a_text: str) -> dict[str, object]:
    value: dict[str, object] = json.loads(appendix_a_text)
    return value
