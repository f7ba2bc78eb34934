"""Per-draft session strategies: how the session's draft-neutral messages travel, for behaviour that
changed shape between drafts (the profile's ``shape`` names the strategy; ``shape_for`` builds it).

Why a strategy instead of conditionals: the session (``inbound``, ``outbound``, the request table)
speaks in draft-neutral messages -- SUBSCRIBE_ERROR, FETCH_ERROR, PUBLISH_NAMESPACE_OK, UNSUBSCRIBE,
... -- and each draft's strategy carries them its way: ``ControlShape`` (draft-14) writes each as it
is on the one control stream; ``RequestStreamsShape`` (draft-16) turns the answers into REQUEST_OK /
REQUEST_ERROR and runs SUBSCRIBE_NAMESPACE on a stream of its own; ``RequestStreams18Shape``
(draft-18) opens a unidirectional control stream with SETUP and gives every request a bidirectional
stream of its own, where cancellations are stream resets. On the way in each turns the draft's
messages and stream events back into the neutral ones, so the rest of the session, the api and the
relay see the same messages in every draft.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from moqt.profiles import Profile
from moqt.profiles.base import SessionShape
from moqt.session.shapes.control import ControlShape
from moqt.session.shapes.d16 import RequestStreamsShape
from moqt.session.shapes.d18 import RequestStreams18Shape

if TYPE_CHECKING:
    from moqt.session.state import SessionState

SHAPES: Final[dict[SessionShape, type[ControlShape]]] = {
    SessionShape.DRAFT_14: ControlShape,
    SessionShape.DRAFT_16: RequestStreamsShape,
    SessionShape.DRAFT_18: RequestStreams18Shape,
}


def shape_class(profile: Profile) -> type[ControlShape]:
    """The strategy class a profile names (its ``REQUEST_IDS`` is read before the session exists)."""
    return SHAPES[profile.shape]


def shape_for(core: SessionState) -> ControlShape:
    """The strategy the session's profile names."""
    return shape_class(core.profile)(core)


__all__ = ["SHAPES", "ControlShape", "RequestStreams18Shape", "RequestStreamsShape", "shape_class", "shape_for"]
