"""One SUBSCRIBE_NAMESPACE the relay accepted, and how a namespace under its prefix is told to it.

Why apart: the telling changed shape between drafts. Draft-14 has no NAMESPACE message: the relay
sends PUBLISH_NAMESPACE for each namespace, a request of its own. Later drafts answer on the
subscription's own stream with NAMESPACE / NAMESPACE_DONE carrying the fields after the prefix, and
only when the Subscribe Options asked for them (NAMESPACE or BOTH; PUBLISH alone asks for PUBLISH of
tracks, which this relay does not push). Which way is read from the session's profile (whether it has
the NAMESPACE message), never from a draft number.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from moqt.api import Endpoint
from moqt.errors import MoqtError
from moqt.kinds import MessageKind, SubscribeOptions
from moqt.wire import Namespace

_WANTS_NAMESPACES = frozenset({SubscribeOptions.NAMESPACE, SubscribeOptions.BOTH})


@dataclass(frozen=True, slots=True, eq=False)
class NamespaceWatch:
    """The peer's accepted SUBSCRIBE_NAMESPACE ``request_id`` for ``prefix`` on ``endpoint``."""

    endpoint: Endpoint
    request_id: int
    prefix: Namespace
    options: SubscribeOptions = SubscribeOptions.BOTH
    told: set[Namespace] = field(default_factory=set)  # NAMESPACE sent, no NAMESPACE_DONE yet

    @property
    def _notices(self) -> bool:
        """Namespaces travel as NAMESPACE / NAMESPACE_DONE on the subscription's stream."""
        return self.endpoint.session.profile.has_message(MessageKind.NAMESPACE)

    def published(self, namespace: Namespace) -> None:
        """``namespace`` (under the prefix) is published: NAMESPACE, or PUBLISH_NAMESPACE in draft-14."""
        session = self.endpoint.session
        with contextlib.suppress(MoqtError):
            if not self._notices:
                session.publish_namespace(namespace)
            elif self.options in _WANTS_NAMESPACES and namespace not in self.told:
                session.namespace(self.request_id, namespace[len(self.prefix):])
                self.told.add(namespace)
            self.endpoint.link.transmit_soon()

    def withdrawn(self, namespace: Namespace) -> None:
        """Nobody publishes ``namespace`` any more: NAMESPACE_DONE where the draft has it.

        Draft-14's PUBLISH_NAMESPACE was the relay's own request; it stays until the session ends, as
        before (a later SUBSCRIBE for it is then refused TRACK_DOES_NOT_EXIST).
        """
        if namespace in self.told:
            self.told.discard(namespace)
            with contextlib.suppress(MoqtError):
                self.endpoint.session.namespace_done(self.request_id, namespace[len(self.prefix):])
                self.endpoint.link.transmit_soon()
