"""One open request (either direction) and the filter arithmetic its answers need.

Why the record holds no flags: where a request stands (sent, answered, cancelled before its answer)
is its ``state``, moved only through the table of ``moqt.session.request_state``; the fields here
are what the request asked for and what its data streams have done so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moqt.kinds import FilterType, GroupOrder, MessageKind, SubscribeOptions
from moqt.params import RequestParameters
from moqt.session.request_state import (
    INITIAL,
    UNANSWERED,
    WE_PUBLISH,
    WE_SUBSCRIBE,
    Origin,
    RequestKind,
    RequestState,
    allowed,
    next_state,
)
from moqt.wire import Location, Namespace


@dataclass(slots=True, eq=False)
class Request:
    """One open request, local (we sent it) or remote; removed from the table when it is over."""

    request_id: int
    kind: RequestKind
    local: bool
    namespace: Namespace = ()
    track_name: bytes = b""
    track_alias: int | None = None
    filter_type: FilterType | None = None
    start: Location | None = None
    end_group: int | None = None
    forward: bool = True
    group_order: GroupOrder = GroupOrder.PUBLISHER_DEFAULT
    fetch_start: Location | None = None  # a standalone FETCH's Start, to check FETCH_OK's End against
    open_streams: set[int] = field(default_factory=set)  # publisher: data streams not yet finished
    streams_opened: int = 0  # publisher: PUBLISH_DONE's Stream Count
    streams_seen: int = 0  # subscriber: subgroup streams received
    fetch_stream_done: bool = False
    last_location: Location | None = None  # FETCH: last object received; PUBLISH: its Largest Location
    updates: int | None = None  # REQUEST_UPDATE (draft-16): the Request ID of the request it updates
    options: SubscribeOptions = SubscribeOptions.BOTH  # SUBSCRIBE_NAMESPACE: what it asks for
    state: RequestState = field(init=False)

    def __post_init__(self) -> None:
        self.state = INITIAL[(self.kind, Origin.LOCAL if self.local else Origin.PEER)]

    def step(self, origin: Origin, message: MessageKind) -> RequestState:
        """Move by ``message`` (see the table); raises for a move the draft does not allow."""
        self.state = next_state(self.kind, self.state, origin, message, self.request_id)
        return self.state

    def allows(self, origin: Origin, message: MessageKind) -> bool:
        return allowed(self.kind, self.state, origin, message)

    @property
    def answered(self) -> bool:
        """The request has had its answer (OK or error), whichever side gave it."""
        return self.state.name not in UNANSWERED

    @property
    def cancelled(self) -> bool:
        return self.state.name == "CANCELLED"

    @property
    def we_publish(self) -> bool:
        """True for a subscription whose objects we send (their SUBSCRIBE or our PUBLISH)."""
        return (self.kind, self.state) in WE_PUBLISH

    @property
    def we_subscribe(self) -> bool:
        """True for a subscription whose objects we receive (our SUBSCRIBE or their PUBLISH)."""
        return (self.kind, self.state) in WE_SUBSCRIBE


def namespaces_overlap(a: Namespace, b: Namespace) -> bool:
    """True when one namespace tuple is a prefix of (or equal to) the other."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


#: What a draft-16 REQUEST_UPDATE may change, by the kind of request it updates (tokens always).
_SUBSCRIPTION_UPDATES = frozenset({"delivery_timeout", "subscriber_priority", "subscription_filter", "forward",
                                   "new_group_request"})
_UPDATABLE: dict[RequestKind, frozenset[str]] = {
    RequestKind.SUBSCRIBE: _SUBSCRIPTION_UPDATES, RequestKind.PUBLISH: _SUBSCRIPTION_UPDATES,
    RequestKind.FETCH: frozenset({"subscriber_priority"}),
}
_UPDATE_FIELDS = ("delivery_timeout", "max_cache_duration", "expires", "largest_object", "forward",
                  "subscriber_priority", "subscription_filter", "group_order", "new_group_request")


def update_problem(target: Request, parameters: RequestParameters) -> str | None:
    """Why ``parameters`` cannot update ``target`` ("invalid for the type of request"), or None."""
    allowed = _UPDATABLE.get(target.kind, frozenset())
    wrong = [name for name in _UPDATE_FIELDS if getattr(parameters, name) is not None and name not in allowed]
    if wrong:
        return f"REQUEST_UPDATE of a {target.kind.value} cannot carry {', '.join(wrong)}"
    flt = parameters.subscription_filter
    if flt is not None and flt.end_group is not None and flt.start is not None and flt.end_group < flt.start.group:
        return "REQUEST_UPDATE End Group before its Start"
    return None


def apply_update(target: Request, parameters: RequestParameters) -> None:
    """What the session keeps of an update: the filter and the Forward State (absent: unchanged)."""
    flt = parameters.subscription_filter
    if flt is not None:
        target.filter_type, target.end_group = flt.filter_type, flt.end_group
        target.start = flt.start  # None for the relative filters: the publisher resolves them
    if parameters.forward is not None:
        target.forward = parameters.forward
