"""What the API asks a session's profile where drafts answer a request differently (decision D3).

Why one small module: the publisher, the live sender and the relay each meet the same few questions
-- may this fetch stream carry an Object Status, how is an empty FETCH range answered, which code does
a refusal travel with on *this* session -- and a relay asks them of two sessions at different drafts
at once. Every answer is read from the profile's tables and layout flags, never from a draft number,
so a later profile needs no edit here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from moqt.kinds import MessageKind, ObjectStatus, PublishDoneStatus, RequestError
from moqt.profiles import Profile
from moqt.session import MoqtSession
from moqt.wire import Location

#: The documented error closest to one a draft lacks (draft-16 has no NO_OBJECTS, draft-14 no
#: DUPLICATE_SUBSCRIPTION; a namespace and a track that do not exist share one code in draft-16).
CLOSEST: Final[Mapping[RequestError, tuple[RequestError, ...]]] = MappingProxyType({
    RequestError.NO_OBJECTS: (RequestError.INVALID_RANGE,),
    RequestError.UNKNOWN_STATUS_IN_RANGE: (RequestError.INTERNAL_ERROR,),
    RequestError.DUPLICATE_SUBSCRIPTION: (RequestError.INTERNAL_ERROR,),
    RequestError.TRACK_DOES_NOT_EXIST: (RequestError.NAMESPACE_PREFIX_UNKNOWN,),
    RequestError.NAMESPACE_PREFIX_UNKNOWN: (RequestError.TRACK_DOES_NOT_EXIST,),
    RequestError.NAMESPACE_PREFIX_OVERLAP: (RequestError.INTERNAL_ERROR,),
    RequestError.MALFORMED_AUTH_TOKEN: (RequestError.UNAUTHORIZED,),
    RequestError.EXPIRED_AUTH_TOKEN: (RequestError.UNAUTHORIZED,),
    RequestError.MALFORMED_TRACK: (RequestError.INTERNAL_ERROR,),
})


def has_error(profile: Profile, kind: MessageKind, error: RequestError) -> bool:
    """Whether ``kind`` (FETCH_ERROR, SUBSCRIBE_ERROR, ...) can carry ``error`` in this draft."""
    table = profile.request_errors.get(kind)
    return table is not None and error in table.codes


def refusal(profile: Profile, kind: MessageKind, error: RequestError | int, *,
            source: Profile | None = None) -> RequestError | int:
    """The error to refuse with on a session of ``profile``: ``error`` itself when the draft has it,
    else the closest documented one (INTERNAL_ERROR at worst).

    ``error`` may be a bare code a peer sent that its draft (``source``) does not name: it is passed on
    as it is only to a session of that same draft, where it still means what the peer meant.
    """
    if isinstance(error, int):
        return error if source is None or source is profile else RequestError.INTERNAL_ERROR
    for candidate in (error, *CLOSEST.get(error, ()), RequestError.INTERNAL_ERROR):
        if has_error(profile, kind, candidate):
            return candidate
    return RequestError.INTERNAL_ERROR


def done_status(profile: Profile, status: PublishDoneStatus | int | None, *,
                source: Profile | None = None) -> PublishDoneStatus | int | None:
    """A PUBLISH_DONE status to pass on to a session of ``profile``: the same name where the draft has
    it, INTERNAL_ERROR where it does not (draft-14 has no UPDATE_FAILED); a bare code only to the
    draft it came from."""
    if status is None:
        return None
    if isinstance(status, int):
        return status if source is None or source is profile else PublishDoneStatus.INTERNAL_ERROR
    return status if status in profile.publish_done.codes else PublishDoneStatus.INTERNAL_ERROR


def writable_status(profile: Profile, status: ObjectStatus, *, fetch: bool) -> bool:
    """Whether an object of ``status`` can be written on a subgroup (or, ``fetch``, a fetch) stream.

    Fetch objects with Serialization Flags carry no Object Status at all (END_OF_GROUP / END_OF_TRACK
    are told there by FETCH_OK's End Location and the stream's FIN); elsewhere a status the draft has
    no code for (draft-16 has no "does not exist": a gap says it) is left out.
    """
    if status is ObjectStatus.NORMAL:
        return True
    if fetch and profile.data_framing.fetch_serialization_flags:
        return False
    return status in profile.object_statuses.codes


def refuse_fetch(session: MoqtSession, request_id: int, error: RequestError | int, reason: str, *,
                 start: Location, source: Profile | None = None) -> None:
    """Refuse a FETCH, or -- a draft without NO_OBJECTS ("If no Objects exist in the requested range,
    the publisher opens the unidirectional stream, sends the FETCH_HEADER ... and closes the stream
    with a FIN") -- answer FETCH_OK and an empty fetch stream instead.

    The empty answer's End Location is the FETCH's Start Location: it covers nothing, and is not
    "smaller than the Start Location", which the subscriber would have to close the session for.
    """
    profile = session.profile
    if error is RequestError.NO_OBJECTS and not has_error(profile, MessageKind.FETCH_ERROR, error):
        session.fetch_ok(request_id, start)
        session.finish_stream(session.open_fetch_stream(request_id))
        return
    session.fetch_error(request_id, refusal(profile, MessageKind.FETCH_ERROR, error, source=source), reason)


def refuse_subscribe(session: MoqtSession, request_id: int, error: RequestError | int, reason: str, *,
                     source: Profile | None = None) -> None:
    """Refuse a SUBSCRIBE with the closest code this session's draft has."""
    session.subscribe_error(request_id, refusal(session.profile, MessageKind.SUBSCRIBE_ERROR, error, source=source),
                            reason)
