"""Compatibility face of the draft profiles for callers not yet moved to ``moqt.profiles``/``moqt.kinds``.

Why it stays: ``moqt.api``, ``control`` and ``interop`` still name draft-14 code points through this
path; they move to the draft-neutral names of ``moqt.kinds`` (and ``moqt.profiles.DRAFT_14`` where a
number is needed) in their own change, after which this module goes. New code must not import it
(``tests/test_moqt_profile.py`` keeps the list of importers from growing). The value names
(GroupOrder, FilterType, FetchType, ObjectStatus, AliasType) are already the draft-neutral ones.
"""

from moqt.kinds import AliasType, FetchType, FilterType, GroupOrder, ObjectStatus
from moqt.profiles.base import Profile
from moqt.profiles.draft14 import (
    DRAFT_14,
    DatagramType,
    DataStreamType,
    FetchErrorCode,
    MessageType,
    PublishDoneCode,
    PublishErrorCode,
    PublishNamespaceErrorCode,
    SessionErrorCode,
    SetupParameterType,
    StreamResetCode,
    SubscribeErrorCode,
    SubscribeNamespaceErrorCode,
    VersionParameterType,
)

__all__ = [
    "DRAFT_14", "AliasType", "DataStreamType", "DatagramType", "FetchErrorCode", "FetchType", "FilterType",
    "GroupOrder", "MessageType", "ObjectStatus", "Profile", "PublishDoneCode", "PublishErrorCode",
    "PublishNamespaceErrorCode", "SessionErrorCode", "SetupParameterType", "StreamResetCode",
    "SubscribeErrorCode", "SubscribeNamespaceErrorCode", "VersionParameterType",
]
