"""kvsp's relay (``relay/``) between aiomoqt peers: the pieces tests/test_interop_relay.py needs.

* `start_relay`: a `relay.server.Relay` in this process, with the interop PKI's ``kvsp`` certificate,
  the token issuer's key (aiomoqt authenticates with AUTHORIZATION_TOKEN, never a certificate) and a
  policy letting the token subjects read the interop scope.
* `relay_publisher`: aiomoqt's publisher announcing to a relay with a token
  (``peers/aiomoqt_relay_publisher.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from interop.content import BlockSpec
from interop.endpoints import INTEROP_SETTINGS
from interop.harness import PEERS, Aiomoqt, Credentials, Draft, PeerProcess
from kvsp.moqt_binding import kvsp_token_rule
from kvsp.service.policy import Policy, ScopeGrant
from moqt.quic import EndpointConfig
from relay.auth import relay_authorizer
from relay.server import Relay
from relay.settings import RelaySettings


async def start_relay(credentials: Credentials, readers: Sequence[str], scope: bytes) -> tuple[Relay, str]:
    """Our relay on a free loopback port; returns it and its ``moqt://`` URI (path ``/relay``)."""
    settings = RelaySettings("127.0.0.1", 0, "moqt://127.0.0.1:1/relay", drain_s=0.5)
    policy = Policy(scopes={scope: ScopeGrant(read=frozenset(readers))})
    relay = Relay(settings, authorize=relay_authorizer(policy), token_rule=kvsp_token_rule)
    config = EndpointConfig.from_files(credentials.cert("kvsp"), credentials.key("kvsp"), credentials.ca,
                                       INTEROP_SETTINGS, token_keys=[credentials.issuer.public_key()])
    port = await relay.listen("127.0.0.1", 0, config)
    return relay, f"moqt://127.0.0.1:{port}/relay"


def relay_publisher(peers: Aiomoqt, blocks: Sequence[BlockSpec], *, draft: Draft, live: Sequence[BlockSpec],
                    connect: str, token: bytes, interval: float) -> PeerProcess:
    """``peers.publisher(..., connect=...)`` that also sends ``token`` in its CLIENT_SETUP."""
    plain = peers.publisher(blocks, draft=draft, live=live, connect=connect, interval=interval)
    script = str(PEERS / "aiomoqt_relay_publisher.py")
    argv = [script if arg.endswith("aiomoqt_publisher.py") else arg for arg in plain.argv]
    return PeerProcess("aiomoqt relay publisher", [*argv, "--token", token.hex()])
