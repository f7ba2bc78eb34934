"""Tracks, objects and requests as a publisher or subscriber sees them: the sans-I/O half of ``moqt.api``.

Nothing here waits or touches a socket, and importing it loads no asyncio, so the decisions worth
testing one input at a time live here, and sans-I/O cores (``relay.core``, ``kvsp.moqt_binding``)
build on them without pulling in the adapters:

* `objects`: `MoqtObject`, `TrackSource` / `StoredTrack` (and the in-memory `MemoryTrackSource`),
  `Authorizer`, `TokenRule`, `Action`; `TrackPublisher` / `TrackWriter`, what a producer needs of
  the asyncio `Publisher` / `LiveTrack`.
* `errors`: the API's exceptions, each naming the MOQT error that caused it.
* `ranges`: which objects a FETCH or a new subscription covers, and FETCH_OK's End Location.
* `groups`: `GroupLog`, the recent groups of a live track (late subscribers, FETCH of live tracks).
* `assembly`: `ObjectAssembler`, object pieces made whole in the caller's buffers (`Allocator`).
* `completion`: `RequestTracker`, when one of our requests is over and how.

The asyncio side (``moqt.api``: `Publisher`, `Subscriber`, `LiveTrack`) only waits, wakes and moves
octets around these.
"""

from moqt.tracks.assembly import Allocator, ObjectAssembler
from moqt.tracks.completion import NORMAL_END, RequestKind, RequestTracker
from moqt.tracks.errors import (
    FetchRefused,
    MalformedTrackError,
    MoqtApiError,
    NamespaceRefused,
    ReceiveBufferFull,
    RequestRefused,
    SessionLostError,
    SetupRefused,
    StreamResetError,
    SubscribeRefused,
    SubscriptionEnded,
    TransferError,
)
from moqt.tracks.groups import GroupLog, LiveGroup
from moqt.tracks.objects import (
    Action,
    Authorizer,
    MemoryTrack,
    MemoryTrackSource,
    MoqtObject,
    StoredTrack,
    TokenRule,
    TrackPublisher,
    TrackSource,
    TrackWriter,
    allow_authenticated,
    token_namespaces,
    view,
)
from moqt.tracks.ranges import check_fetch, fetch_ok_end, fetch_stop, subscription_start

__all__ = [
    "NORMAL_END",
    "Action",
    "Allocator",
    "Authorizer",
    "FetchRefused",
    "GroupLog",
    "LiveGroup",
    "MalformedTrackError",
    "MemoryTrack",
    "MemoryTrackSource",
    "MoqtApiError",
    "MoqtObject",
    "NamespaceRefused",
    "ObjectAssembler",
    "ReceiveBufferFull",
    "RequestKind",
    "RequestRefused",
    "RequestTracker",
    "SessionLostError",
    "SetupRefused",
    "StoredTrack",
    "StreamResetError",
    "SubscribeRefused",
    "SubscriptionEnded",
    "TokenRule",
    "TrackPublisher",
    "TrackSource",
    "TrackWriter",
    "TransferError",
    "allow_authenticated",
    "check_fetch",
    "fetch_ok_end",
    "fetch_stop",
    "subscription_start",
    "token_namespaces",
    "view",
]
