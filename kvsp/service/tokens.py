"""The keys that sign MOQT AUTHORIZATION_TOKENs (D3), as the holder's MOQT listener and the relay load them."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec


def load_token_key(path: Path) -> ec.EllipticCurvePublicKey:
    """An EC P-256 public key (PEM) that signs AUTHORIZATION_TOKENs (ES256); anything else is refused."""
    key = serialization.load_pem_public_key(path.read_bytes())
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ValueError(f"{path}: token keys are EC P-256 public keys (ES256)")
    return key
