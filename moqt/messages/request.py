"""Draft-16's request-wide messages: REQUEST_OK, REQUEST_ERROR (one answer for every kind of request)
and REQUEST_UPDATE (an update of any request, answered by one of the two).

Why apart from the per-kind answers: the session keeps speaking SUBSCRIBE_ERROR, FETCH_ERROR,
PUBLISH_NAMESPACE_OK, ... (``moqt.kinds``); its draft-16 strategy turns those into these messages
on the way out and back by the Request ID's kind on the way in (``moqt.session.shapes``). These
classes are the wire forms, and what an application sees for an update's answer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Self

from moqt.kinds import MessageKind
from moqt.messages.base import (
    ControlMessage,
    RequestErrorMessage,
    pull_request_id,
    pull_track_extensions,
    push_request_id,
    push_track_extensions,
)
from moqt.params import RequestParameters
from moqt.profiles import DRAFT_14, Profile
from moqt.wire import KeyValuePair, Location, Reader, Writer


@dataclass(frozen=True, slots=True)
class RequestOk(ControlMessage):
    """REQUEST_OK (0x7): Request ID, Parameters; ``largest_location`` is LARGEST_OBJECT (an answer to
    TRACK_STATUS or to a subscription's REQUEST_UPDATE: the publisher's Largest Location).

    Draft-18: no Request ID (the request's stream names it), then Track Properties
    (``track_extensions``): TRACK_STATUS_OK's; the session checks they are empty in the other answers.
    """

    STREAM_ID_FIELD: ClassVar[str | None] = "request_id"
    KIND: ClassVar[MessageKind] = MessageKind.REQUEST_OK
    request_id: int
    largest_location: Location | None = None
    parameters: RequestParameters = field(default_factory=RequestParameters)
    track_extensions: tuple[KeyValuePair, ...] = ()

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        push_request_id(writer, profile, self.request_id)
        dataclasses.replace(self.parameters, largest_object=self.largest_location).encode(writer, profile)
        if profile.layout.request_ok_track_extensions:
            push_track_extensions(writer, profile, self.track_extensions)
        elif self.track_extensions:
            raise ValueError(f"draft-{profile.draft} REQUEST_OK has no Track Properties")

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = pull_request_id(reader, profile)
        params = RequestParameters.decode(reader, cls.KIND, profile)
        extensions: tuple[KeyValuePair, ...] = ()
        if profile.layout.request_ok_track_extensions:
            _, extensions = pull_track_extensions(reader, profile, lift_order=False)
        return cls(request_id, params.largest_object, dataclasses.replace(params, largest_object=None), extensions)


@dataclass(frozen=True, slots=True)
class RequestErrorReply(RequestErrorMessage):
    """REQUEST_ERROR (0x5): Request ID, Error Code, Retry Interval, Error Reason. (Named apart from
    ``moqt.kinds.RequestError``, the error names.)"""

    KIND: ClassVar[MessageKind] = MessageKind.REQUEST_ERROR


@dataclass(frozen=True, slots=True)
class RequestUpdate(ControlMessage):
    """REQUEST_UPDATE (0x2): Request ID, Existing Request ID, Parameters.

    What it changes is its parameters (SUBSCRIPTION_FILTER, FORWARD, SUBSCRIBER_PRIORITY,
    DELIVERY_TIMEOUT, NEW_GROUP_REQUEST, tokens; draft-18 also TRACK_NAMESPACE_PREFIX); one it leaves
    out keeps its value. Draft-18 sends it on the request's own stream, which names the existing
    request: there is no Existing Request ID on the wire.
    """

    STREAM_ID_FIELD: ClassVar[str | None] = "existing_request_id"
    KIND: ClassVar[MessageKind] = MessageKind.REQUEST_UPDATE
    request_id: int
    existing_request_id: int
    parameters: RequestParameters = field(default_factory=RequestParameters)

    def encode_payload(self, writer: Writer, profile: Profile = DRAFT_14) -> None:
        writer.push_varint(self.request_id)
        push_request_id(writer, profile, self.existing_request_id)
        self.parameters.encode(writer, profile)

    @classmethod
    def decode_payload(cls, reader: Reader, profile: Profile = DRAFT_14) -> Self:
        request_id = reader.pull_varint()
        existing = pull_request_id(reader, profile)
        return cls(request_id, existing, RequestParameters.decode(reader, cls.KIND, profile))
