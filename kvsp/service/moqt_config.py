"""MOQT settings shared by the roles: the ``[moqt]`` table of a role configuration, and the drafts key
of the holder, instance and relay sections.

    [moqt]
    quic = "picoquic"                  # the QUIC stack of every MOQT endpoint of this process (default
                                       #   "aioquic"; "picoquic" needs Python >= 3.12 and aiopquic)
    token = "pki/h1.moqt-token"        # the D3 token this process presents when it connects to a MOQT
                                       #   peer; required with picoquic where it connects (a picoquic
                                       #   client has no certificate to present)

On picoquic a listener sees no client certificates, so it needs token keys (``[holder] moqt_token_keys``,
``[relay] token_keys``) and every peer a token; docs/moqt.md "QUIC back-ends" gives the trade-off.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kvsp.errors import ValidationError
from kvsp.reader import ObjectReader
from moqt.auth import MAX_TOKEN_OCTETS
from moqt.backends import check_quic_backend
from moqt.profiles.negotiation import profiles_for

MOQT_KEYS: Final = frozenset({"quic", "token"})


@dataclass(frozen=True, slots=True)
class MoqtConfig:
    """``[moqt]``: the QUIC back-end (``quic``) and the token file (``token``) of this process."""

    quic: str = "aioquic"
    token_file: Path | None = None

    @property
    def picoquic(self) -> bool:
        return self.quic == "picoquic"

    def token(self) -> bytes | None:
        """The token's octets, read now (so a token replaced on disk is used from the next connection)."""
        if self.token_file is None:
            return None
        try:
            with self.token_file.open("rb") as f:
                data = f.read(MAX_TOKEN_OCTETS + 1)
        except OSError as exc:
            raise ValidationError("moqt.token", f"cannot read {self.token_file}: {exc.strerror}") from exc
        if not data or len(data) > MAX_TOKEN_OCTETS:
            raise ValidationError("moqt.token", f"{self.token_file}: a token is 1..{MAX_TOKEN_OCTETS} octets")
        return data

    def check_listener(self, member: str, has_token_keys: bool) -> None:
        """A picoquic listener sees no client certificates: its peers authenticate by token only."""
        if self.picoquic and not has_token_keys:
            raise ValidationError(member, "needed with [moqt] quic = \"picoquic\": a picoquic listener sees no "
                                          "client certificates (peers use tokens)")

    def check_dialler(self, who: str) -> None:
        """A picoquic client has no certificate to present: it needs the role's token."""
        if self.picoquic and self.token_file is None:
            raise ValidationError("moqt.token", f"{who} connects over picoquic, which presents no client "
                                                "certificate: give the token the deployment issued for this role")

    def token_source(self, who: str) -> Callable[[], bytes | None] | None:
        """What a dialling role presents (read at each connect), None without a token (`check_dialler`)."""
        self.check_dialler(who)
        return None if self.token_file is None else self.token


def read_moqt(value: object, base_dir: Path) -> MoqtConfig:
    """Validate the ``[moqt]`` table (absent: aioquic, no token)."""
    if value is None:
        return MoqtConfig()
    if not isinstance(value, Mapping):
        raise ValidationError("moqt", "must be a table")
    for name in value:
        if name not in MOQT_KEYS:
            raise ValidationError(f"moqt.{str(name)[:64]}", f"unknown key; known: {sorted(MOQT_KEYS)}")
    r = ObjectReader(dict(value), "moqt")
    quic = r.optional("quic", lambda n: r.str(n, max_length=32)) or "aioquic"
    try:
        check_quic_backend(quic)
    except ValueError as exc:
        raise ValidationError("moqt.quic", str(exc)) from exc
    token = r.optional("token", lambda n: r.str(n, max_length=4096))
    path = None if token is None else (Path(token) if Path(token).is_absolute() else base_dir / token)
    return MoqtConfig(quic, path)


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
