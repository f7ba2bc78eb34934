"""Per-draft MOQT profiles (decision D3): ``Profile`` and one module per draft (``draft14``, ``draft16``,
``draft18``)."""

from moqt.profiles.base import Profile
from moqt.profiles.draft14 import DRAFT_14
from moqt.profiles.draft16 import DRAFT_16
from moqt.profiles.draft18 import DRAFT_18

#: Every draft this package speaks, newest first (the order a client offers them in). DRAFT_18 joins
#: once its session strategy works.
PROFILES = (DRAFT_18, DRAFT_16, DRAFT_14)

__all__ = ["DRAFT_14", "DRAFT_16", "DRAFT_18", "PROFILES", "Profile"]
