"""Shared fixtures: the spec's Appendix A vectors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# CI runs on 2 shared cores: no per-example deadline, and slow generation is not a failure.
settings.register_profile("kvsp", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kvsp")

VECTORS = Path(__file__).parent / "vectors"
# Appendix A, verbatim.
APPENDIX_A_COMPAT_ID = "5ed5c2f238839655d7c4029e12b7f31caf9e7421f4edb4057feee6dab760ee0f"
APPENDIX_A_SCOPE_KEY = bytes(range(32))
APPENDIX_A_TOKENS = [128000, 791, 6460, 374, 264, 1296, 315, 279]
APPENDIX_A_SCOPE_ID = "6d1c6481cd428737da312c089db3832a"
APPENDIX_A_K0 = "9ca9d8b60f37f84726a27deb4cdc0d075714607a131632c2366e30b99fb1163b"
APPENDIX_A_K1 = "653275884ca44f8945fd4c902611c467394b73656e64c78d8522648cb75aefc1"


@pytest.fixture
def appendix_a_text() -> str:
    return (VECTORS / "appendix_a_descriptor.json").read_text().strip()


@pytest.fixture
def appendix_a_json(appendix_a_text: str) -> dict[str, object]:
    value: dict[str, object] = json.loads(appendix_a_text)
    return value
