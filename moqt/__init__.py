"""MOQT (Media over QUIC Transport) for kvsp: wire codecs and a sans-I/O session, draft-14 and draft-16
by profile (``DRAFT_14``, ``DRAFT_16``; docs/moqt-drafts.md lists what differs and where it lives).

The session sits on an aioquic ``QuicConnection`` the way ``H3Connection`` does: feed it every QUIC
event with ``handle_event`` and act on the returned MOQT events; its methods write to the connection.
See docs/architecture.md and decision D3 (/work/shared/design/decisions.md).

Why the session names load lazily: the session needs aioquic, the codecs do not, and importing any
``moqt.*`` module runs this file first; so ``import moqt.wire`` stays free of aioquic (D9).
"""

import importlib
from typing import TYPE_CHECKING, Any

from moqt.data import (
    DataStreamParser,
    FetchHeader,
    FetchWriter,
    ObjectDatagram,
    ObjectHeader,
    PayloadChunk,
    StreamFinished,
    SubgroupHeader,
    SubgroupWriter,
)
from moqt.errors import (
    GoingAwayError,
    LocalError,
    MoqtError,
    NeedMoreData,
    ProtocolViolation,
    RequestsBlockedError,
    SessionClosedError,
    StreamClosedError,
)
from moqt.events import (
    ControlMessageReceived,
    DataStreamEnded,
    DataStreamReset,
    DataStreamStopped,
    MalformedTrack,
    MoqtEvent,
    ObjectChunkReceived,
    ObjectReceived,
    ObjectSource,
    SessionEstablished,
    SessionTerminated,
    SetupRequested,
)
from moqt.kinds import (
    AliasType,
    FetchType,
    FilterType,
    GroupOrder,
    MessageKind,
    ObjectStatus,
    PublishDoneStatus,
    RequestError,
    SessionError,
    StreamReset,
    SubgroupIdMode,
)
from moqt.params import AuthToken, RequestParameters, ResolvedToken, SetupParameters
from moqt.profiles import DRAFT_14, DRAFT_16, PROFILES, Profile
from moqt.wire import KeyValuePair, Location, Namespace

__all__ = [
    "DRAFT_14",
    "DRAFT_16",
    "PROFILES",
    "AliasType",
    "AuthToken",
    "ControlMessageReceived",
    "DataStreamEnded",
    "DataStreamParser",
    "DataStreamReset",
    "DataStreamStopped",
    "FetchHeader",
    "FetchType",
    "FetchWriter",
    "FilterType",
    "GoingAwayError",
    "GroupOrder",
    "KeyValuePair",
    "LocalError",
    "Location",
    "MalformedTrack",
    "MessageKind",
    "MoqtError",
    "MoqtEvent",
    "MoqtSession",
    "Namespace",
    "NeedMoreData",
    "ObjectChunkReceived",
    "ObjectDatagram",
    "ObjectHeader",
    "ObjectReceived",
    "ObjectSource",
    "ObjectStatus",
    "PayloadChunk",
    "Profile",
    "ProtocolViolation",
    "PublishDoneStatus",
    "RequestError",
    "RequestParameters",
    "RequestsBlockedError",
    "ResolvedToken",
    "Role",
    "SessionClosedError",
    "SessionError",
    "SessionEstablished",
    "SessionLimits",
    "SessionTerminated",
    "SetupParameters",
    "SetupRequested",
    "StreamClosedError",
    "StreamFinished",
    "StreamReset",
    "SubgroupHeader",
    "SubgroupIdMode",
    "SubgroupWriter",
]

if TYPE_CHECKING:
    from moqt.session import MoqtSession, Role, SessionLimits

_SESSION_NAMES = frozenset({"MoqtSession", "Role", "SessionLimits"})


def __getattr__(name: str) -> Any:
    if name in _SESSION_NAMES:
        value = getattr(importlib.import_module("moqt.session"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'moqt' has no attribute {name!r}")
