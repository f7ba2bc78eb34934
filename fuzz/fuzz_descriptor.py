"""Fuzz target ``descriptor``: the Compatibility Descriptor and its ID (kvsp/descriptor.py, section 4.1).

Input: JSON text.  Contract: ``CompatDescriptor.from_bytes`` returns a descriptor or raises
``ValidationError``, nothing else; an accepted descriptor's canonical form is JCS of the document as
received (unknown members kept, nothing renamed), so its ``compat_id`` is SHA-256 of the label and
that JCS text, as another implementation computes it; it parses back to an equal descriptor with the
same ID; and its geometry is usable (``geometry()``, ``block_octets()`` do not raise).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rfc8785

from fuzz.common import ROOT, check, fuzz_main
from kvsp.descriptor import COMPAT_LABEL, CompatDescriptor, check_positional
from kvsp.encoding import parse_json
from kvsp.errors import ValidationError

TARGET = "descriptor"
INSTRUMENT = ("kvsp.descriptor", "kvsp.reader", "kvsp.encoding", "kvsp.registry", "kvsp.errors")
APPENDIX_A = ROOT / "tests" / "vectors" / "appendix_a_descriptor.json"
APPENDIX_A_COMPAT_ID = "5ed5c2f238839655d7c4029e12b7f31caf9e7421f4edb4057feee6dab760ee0f"


def test_one_input(data: bytes) -> None:
    try:
        descriptor = CompatDescriptor.from_bytes(data)
    except ValidationError:
        return
    canonical = descriptor.canonical()
    received: Any = parse_json(data)  # decoded JSON: the reference serialiser's own input type
    check(canonical == rfc8785.dumps(received), "the canonical form is not JCS of the document received")
    check(descriptor.compat_id == hashlib.sha256(COMPAT_LABEL + canonical).digest(), "compat_id is not the hash")
    again = CompatDescriptor.from_bytes(canonical)
    check(again == descriptor and again.compat_id == descriptor.compat_id, "the canonical form parses differently")
    check(check_positional(descriptor.positional) == descriptor.positional, "positional is not canonical")
    descriptor.geometry()
    descriptor.block_octets()


def seeds() -> list[bytes]:
    text = APPENDIX_A.read_bytes().strip()
    base = parse_json(text)
    if not isinstance(base, dict):
        raise ValueError("the Appendix A vector is not a JSON object")
    check(CompatDescriptor.from_bytes(text).compat_id_hex == APPENDIX_A_COMPAT_ID, "Appendix A compat_id")
    variants: list[dict[str, Any]] = [
        {**base, "positional": "rope;theta=500000,scaling=llama3"},
        {**base, "adapters": [base["model_digest"]], "x-extension": {"b": [1, 2.5, "é"], "a": None}},
        {**base, "kv_dtype": "fp8-e4m3", "positional": "none"},
    ]
    return [text, *(rfc8785.dumps(v) for v in variants)]


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT)
