"""The values and interfaces the publisher/subscriber API is built from.

* `MoqtObject`: one object as the API hands it out or takes it in; the payload is a ``memoryview``
  (a view of received octets, of a caller's buffer, or of a stored block), never copied by the API.
* `TrackSource` / `StoredTrack`: where a `Publisher` finds the objects a FETCH asks for. The KVSP
  holder implements it over its block store; `MemoryTrackSource` is the in-memory one for tests.
* `Authorizer`: ``(identity, namespace, action) -> bool``, asked before any FETCH, SUBSCRIBE or
  namespace request is served; `TokenRule` narrows peers that authenticated with a token (D3).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from moqt.auth import TokenClaims
from moqt.data import Extensions
from moqt.kinds import ObjectStatus, PublishDoneStatus
from moqt.wire import Bytes, Location, Namespace


class Action(StrEnum):
    """What a peer asks to do with a namespace, as given to the `Authorizer`."""

    FETCH = "fetch"
    SUBSCRIBE = "subscribe"
    PUBLISH_NAMESPACE = "publish_namespace"


Authorizer = Callable[[str, Namespace, Action], bool]
"""``(peer identity, track namespace, action) -> allowed``; a refusal is answered UNAUTHORIZED."""

TokenRule = Callable[[TokenClaims, Namespace], bool]
"""For a peer authenticated by AUTHORIZATION_TOKEN: whether its token covers the namespace."""


def allow_authenticated(identity: str, namespace: Namespace, action: Action) -> bool:
    """An `Authorizer` that lets every authenticated peer do anything (tests, open deployments)."""
    return True


def token_namespaces(claims: TokenClaims, namespace: Namespace) -> bool:
    """The default `TokenRule`: the namespace starts with one of the token's namespace prefixes."""
    return claims.allows_namespace(namespace)


def view(data: Bytes) -> memoryview:
    """A flat octet view of ``data`` (no copy)."""
    out = data if isinstance(data, memoryview) else memoryview(data)
    return out if out.format == "B" and out.ndim == 1 else out.cast("B")


@dataclass(frozen=True, slots=True)
class MoqtObject:
    """One object: its location, payload (a view) and Extension Headers."""

    group: int
    object_id: int
    payload: memoryview
    extensions: Extensions = ()
    subgroup: int = 0
    status: ObjectStatus = ObjectStatus.NORMAL

    @property
    def location(self) -> Location:
        return Location(self.group, self.object_id)

    def extension(self, kind: int) -> int | bytes | None:
        """The value of the first Extension Header of type ``kind``, if any."""
        return next((e.value for e in self.extensions if e.type == kind), None)


class StoredTrack(Protocol):
    """A track whose objects can be read by location (what FETCH needs)."""

    @property
    def largest(self) -> Location | None:
        """The largest available object, None when there is none yet."""

    @property
    def complete(self) -> bool:
        """No object will be added after ``largest`` (FETCH_OK's End Of Track)."""

    def read(self, start: Location, end: Location) -> AsyncIterator[MoqtObject]:
        """The available objects in ``[start, end)`` in ascending order (``end`` is exclusive)."""


class TrackSource(Protocol):
    """Where a `Publisher` looks tracks up for FETCH."""

    async def lookup(self, namespace: Namespace, track_name: bytes) -> StoredTrack | None:
        """The track, or None when this publisher has no such track."""


@dataclass(slots=True)
class MemoryTrack:
    """A `StoredTrack` held in memory (``objects`` in ascending location order)."""

    objects: list[MoqtObject] = field(default_factory=list)
    complete: bool = True

    @property
    def largest(self) -> Location | None:
        return self.objects[-1].location if self.objects else None

    async def read(self, start: Location, end: Location) -> AsyncIterator[MoqtObject]:
        for obj in self.objects:
            if start <= obj.location < end:
                yield obj


class MemoryTrackSource:
    """A `TrackSource` of tracks put in memory; objects keep views of the caller's buffers."""

    def __init__(self) -> None:
        self.tracks: dict[tuple[Namespace, bytes], MemoryTrack] = {}

    def put(self, namespace: Namespace, track_name: bytes, objects: Sequence[MoqtObject]) -> MemoryTrack:
        track = MemoryTrack(sorted(objects, key=lambda o: o.location))
        self.tracks[(namespace, track_name)] = track
        return track

    async def lookup(self, namespace: Namespace, track_name: bytes) -> StoredTrack | None:
        return self.tracks.get((namespace, track_name))


class TrackWriter(Protocol):
    """A live track as its producer sees it (``moqt.api.LiveTrack``): objects in, never waiting."""

    def publish(self, group: int, object_id: int, payload: Bytes, extensions: Extensions = ()) -> MoqtObject: ...

    def end_group(self) -> None: ...

    def close(self, status: PublishDoneStatus | int | None = None) -> None: ...


class TrackPublisher(Protocol):
    """What a producer needs of a publisher (``moqt.api.Publisher``): a new live track by name.

    Why a protocol: sans-I/O producers (``kvsp.moqt_binding.LiveBlockPublisher``) take the asyncio
    publisher without importing it.
    """

    def track(self, namespace: Namespace, name: bytes, *, extensions_present: bool = False,
              retain_groups: int = 1) -> TrackWriter: ...
