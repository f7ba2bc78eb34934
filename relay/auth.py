"""Who may do what at a relay (decision D3): publishers own their namespaces, readers read their scopes.

* **PUBLISH_NAMESPACE / PUBLISH**: a KVSP namespace (or a prefix of at least its first four fields)
  whose holder-id field is ``role_id`` of the publisher's identity, or of a holder the policy lets it
  publish for (``publish_for``, spec section 6.1). A shorter prefix would claim other producers' blocks.
* **SUBSCRIBE / FETCH**: a KVSP namespace (or a prefix down to its scope field) whose scope the
  identity may read (the policy's ``read`` list), as a holder decides for its own blocks.
* **Peers**: relays named in ``[relay] peers`` forward for their own subscribers and publishers, whom
  they authorized at their edge; they may do anything. ``open_prefixes`` are namespaces any
  authenticated peer may use (non-KVSP tracks, interop).

The relay never holds a Scope Key: payloads are forwarded as received, never decrypted or altered.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvsp.encoding import parse_hex
from kvsp.identifiers import role_id
from kvsp.service.policy import Policy
from moqt.tracks import Action, Authorizer
from moqt.wire import Namespace
from relay.core import is_prefix

KVSP: bytes = b"kvsp"
SCOPE_FIELD = 2
HOLDER_FIELD = 3


def scope_of(namespace: Namespace) -> bytes | None:
    """The scope ID of a KVSP namespace or of a prefix that reaches its scope field."""
    if len(namespace) <= SCOPE_FIELD or namespace[0] != KVSP:
        return None
    try:
        return parse_hex(namespace[SCOPE_FIELD].decode("ascii"), 16, "scope_id")
    except (UnicodeDecodeError, ValueError):
        return None


def holder_of(namespace: Namespace) -> str | None:
    """The producer holder-id field of a KVSP namespace or of a prefix that reaches it."""
    if len(namespace) <= HOLDER_FIELD or namespace[0] != KVSP or scope_of(namespace) is None:
        return None
    try:
        return namespace[HOLDER_FIELD].decode("ascii")
    except UnicodeDecodeError:
        return None


def relay_authorizer(policy: Policy, *, peers: Iterable[str] = (),
                     open_prefixes: Iterable[Namespace] = ()) -> Authorizer:
    """The relay's `Authorizer` (see the module docstring)."""
    trusted = frozenset(peers)
    opened = tuple(open_prefixes)

    def authorize(identity: str, namespace: Namespace, action: Action) -> bool:
        if identity in trusted or any(is_prefix(p, namespace) for p in opened):
            return True
        if action is Action.PUBLISH_NAMESPACE:
            holder = holder_of(namespace)
            if holder is None:
                return False
            owners = {identity, *policy.publish_for.get(identity, frozenset())}
            return any(role_id(uri) == holder for uri in owners)
        scope = scope_of(namespace)
        return scope is not None and policy.may_read(identity, scope)

    return authorize
