"""Which drafts an endpoint offers or accepts, and which one a handshake chose (ALPN, draft-15 on).

Draft-14 and earlier all used the ALPN ``moq-00`` and negotiated a version in CLIENT_SETUP; from
draft-15 the ALPN ``moqt-NN`` *is* the version. So one QUIC listener serves every draft we speak by
listing every profile's ALPN, and the session's profile follows from the ALPN the handshake agreed:
the session never needs a version of its own in draft-16 and later.
"""

from __future__ import annotations

from collections.abc import Iterable

from moqt.profiles import PROFILES
from moqt.profiles.base import Profile


def profiles_for(drafts: Iterable[int] | None = None) -> tuple[Profile, ...]:
    """The profiles for ``drafts`` (None: every draft this package speaks), newest first.

    Newest first is the order a client offers them in (its TLS ClientHello lists them by
    preference); aioquic's server picks the first of *its own* list the client offers, so a server
    listing newest first lands on the newest draft both speak.
    """
    if drafts is None:
        return PROFILES
    wanted = set(drafts)
    by_draft = {p.draft: p for p in PROFILES}
    unknown = sorted(wanted - by_draft.keys())
    if unknown:
        known = ", ".join(str(d) for d in sorted(by_draft))
        raise ValueError(f"MOQT draft(s) {', '.join(map(str, unknown))} not spoken here (known: {known})")
    if not wanted:
        raise ValueError("at least one MOQT draft is needed")
    return tuple(p for p in PROFILES if p.draft in wanted)


def alpns(profiles: Iterable[Profile]) -> list[str]:
    """The ALPN list for a TLS configuration (one per profile, in order)."""
    return [p.alpn for p in profiles]


def profile_for_alpn(alpn: str | None, profiles: Iterable[Profile] = PROFILES) -> Profile | None:
    """The profile whose ALPN the handshake agreed (None: no ALPN, or one none of ``profiles`` has)."""
    return next((p for p in profiles if p.alpn == alpn), None) if alpn is not None else None
