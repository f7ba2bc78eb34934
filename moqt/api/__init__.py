"""The asyncio publisher/subscriber API over ``moqt.quic`` and ``MoqtSession`` (see docs/moqt.md).

* `Publisher`: accepts sessions, authenticates peers (client certificate, or AUTHORIZATION_TOKEN at
  setup), authorizes each request with an `Authorizer`, serves FETCH from a `TrackSource` and pushes
  `LiveTrack` objects to subscribers; announces namespaces to relays.
* `Subscriber`: ``fetch`` and ``subscribe`` as async iterators of `MoqtObject` (payloads are views).
* Errors carry their MOQT code: `FetchRefused`, `SubscribeRefused`, `NamespaceRefused`,
  `SubscriptionEnded`, `TransferError` (and its `StreamResetError`, `SessionLostError`,
  `MalformedTrackError`, `ReceiveBufferFull`, `TransferStalled`), `SetupRefused`.
* ``moqt.api.memory.MemoryNet`` runs both over an in-memory pair for tests.
* `UpstreamLink`: a session to a relay kept up with backoff (relays' upstreams, holders' rack relay).

The values, errors and decisions without I/O live in ``moqt.tracks`` (import-clean) and are
re-exported here for callers of the asyncio API; sans-I/O code imports them from ``moqt.tracks``.
"""

from moqt.api.endpoint import ControlServing, Endpoint
from moqt.api.live import LiveTrack
from moqt.api.publisher import Publisher, PublisherSettings
from moqt.api.subscriber import ObjectStream, Subscriber, TransferStalled, subscriber_session
from moqt.api.upstream import TokenSource, UpstreamLink, backoff_delay
from moqt.quic.backend import Link
from moqt.tracks import (
    Action,
    Allocator,
    Authorizer,
    FetchRefused,
    MalformedTrackError,
    MemoryTrack,
    MemoryTrackSource,
    MoqtApiError,
    MoqtObject,
    NamespaceRefused,
    ReceiveBufferFull,
    RequestRefused,
    SessionLostError,
    SetupRefused,
    StoredTrack,
    StreamResetError,
    SubscribeRefused,
    SubscriptionEnded,
    TokenRule,
    TrackSource,
    TransferError,
    allow_authenticated,
    token_namespaces,
)

__all__ = [
    "Action",
    "Allocator",
    "Authorizer",
    "ControlServing",
    "Endpoint",
    "FetchRefused",
    "Link",
    "LiveTrack",
    "MalformedTrackError",
    "MemoryTrack",
    "MemoryTrackSource",
    "MoqtApiError",
    "MoqtObject",
    "NamespaceRefused",
    "ObjectStream",
    "Publisher",
    "PublisherSettings",
    "ReceiveBufferFull",
    "RequestRefused",
    "SessionLostError",
    "SetupRefused",
    "StoredTrack",
    "StreamResetError",
    "SubscribeRefused",
    "Subscriber",
    "SubscriptionEnded",
    "TokenRule",
    "TokenSource",
    "TrackSource",
    "TransferError",
    "TransferStalled",
    "UpstreamLink",
    "allow_authenticated",
    "backoff_delay",
    "subscriber_session",
    "token_namespaces",
]
