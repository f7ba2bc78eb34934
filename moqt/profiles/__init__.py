"""Per-draft MOQT profiles (decision D3): ``Profile`` and one module per draft (``draft14``)."""

from moqt.profiles.base import Profile
from moqt.profiles.draft14 import DRAFT_14

__all__ = ["DRAFT_14", "Profile"]
