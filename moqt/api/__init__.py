"""The asyncio publisher/subscriber API over ``moqt.quic`` and ``MoqtSession`` (see docs/moqt.md).

* `Publisher`: accepts sessions, authenticates peers (client certificate, or AUTHORIZATION_TOKEN at
  setup), authorizes each request with an `Authorizer`, serves FETCH from a `TrackSource` and pushes
  `LiveTrack` objects to subscribers; announces namespaces to relays.
* `Subscriber`: ``fetch`` and ``subscribe`` as async iterators of `MoqtObject` (payloads are views).
* Errors carry their MOQT code: `FetchRefused`, `SubscribeRefused`, `NamespaceRefused`,
  `SubscriptionEnded`, `TransferError` (and its `StreamResetError`, `SessionLostError`,
  `MalformedTrackError`, `ReceiveBufferFull`), `SetupRefused`.
* ``moqt.api.memory.MemoryNet`` runs both over an in-memory pair for tests.
"""

from moqt.api._endpoint import ControlServing, Endpoint, Link
from moqt.api._logic import Allocator
from moqt.api.errors import (
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
from moqt.api.live import LiveTrack
from moqt.api.objects import (
    Action,
    Authorizer,
    MemoryTrack,
    MemoryTrackSource,
    MoqtObject,
    StoredTrack,
    TokenRule,
    TrackSource,
    allow_authenticated,
    token_namespaces,
)
from moqt.api.publisher import Publisher, PublisherSettings
from moqt.api.subscriber import ObjectStream, Subscriber, subscriber_session

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
    "TrackSource",
    "TransferError",
    "allow_authenticated",
    "subscriber_session",
    "token_namespaces",
]
