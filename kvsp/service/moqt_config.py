"""MOQT settings shared by the roles' config sections (holder, instance, relay)."""

from __future__ import annotations

from kvsp.errors import ValidationError
from kvsp.reader import ObjectReader
from moqt.profiles.negotiation import profiles_for


def read_drafts(r: ObjectReader, name: str, section: str) -> tuple[int, ...] | None:
    """``name``: a list of MOQT draft numbers, each one this build speaks (``moqt.profiles.PROFILES``),
    returned newest first (the order offered); None when absent (every draft)."""
    if not r.has(name):
        return None
    drafts = []
    for member, value in r.items(name, max_items=16):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValidationError(member, "must be a MOQT draft number")
        drafts.append(value)
    try:
        return tuple(p.draft for p in profiles_for(drafts))
    except ValueError as exc:
        raise ValidationError(f"{section}.{name}", str(exc)) from exc
