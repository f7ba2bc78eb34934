"""One picoquic connection (through aiopquic) between its network thread and a sans-I/O MOQT session.

The same surface as ``moqt.quic.MoqtConnection`` (``moqt.api.endpoint.Link``: ``drain``, ``close``,
``transmit_soon``, the peer's identity), so ``moqt.api``'s Publisher and Subscriber run over it
unchanged. What differs follows from docs/moqt-picoquic.md:

* picoquic sends from its own thread, woken by every write: ``transmit_soon``/``transmit_now`` only
  re-arm the session's own timer (GOAWAY timeout); there is no datagram or QUIC timer here.
* Backpressure: ``send_buffered`` is what waits in the shim (`moqt.quic.pico.shim`) plus what aiopquic's
  stream ring holds that picoquic has not taken into packets; ``drain`` waits, without polling, on
  aiopquic's per-stream drain event (armed with ``set_tx_data_drain_pending``) until it is at most half
  of ``send_high_water``, as on aioquic.
* Authentication: a picoquic server never sees a client certificate, so every server-side connection
  starts unauthenticated with ``auth_timeout_s`` to present a valid token (`TokenDeadline`, shared with
  aioquic). A client's server check is picotls's (chain to the deployment CA, name = URI host), done in
  the handshake; the server's identity URI is not known, so ``peer_identity`` is the ``moqt://`` URI
  dialled and ``authenticated_by`` is ``"server-name"`` (what a policy of identities never grants).
* Closes carry the MOQT Session Termination code only (picoquic sends no reason): a refusal's reason
  is logged here; an application close is told from a transport close (an idle timeout, a protocol
  error of picoquic's) by the raw ring event (the shim's ``application_close``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeAlias, cast

from aioquic.quic import events as qe
from aioquic.quic.connection import NetworkAddress, QuicConnection

from moqt.kinds import SessionError
from moqt.profiles import DRAFT_14, Profile
from moqt.profiles.negotiation import profile_for_alpn
from moqt.quic.config import EndpointConfig, MoqtUri
from moqt.quic.connection import E, SessionEvents, SessionLike, TimedSession
from moqt.quic.pico.shim import PicoQuic, to_aioquic
from moqt.quic.refusal import address_text

log = logging.getLogger(__name__)

_CLOSE_GRACE_S: Final = 3.0  # our close's ConnectionTerminated should come back at once; else assume it

PicoSessionFactory: TypeAlias = Callable[["PicoConnection[E]"], SessionLike[E]]
PicoEventHandler: TypeAlias = Callable[["PicoConnection[E]", E], None]


class Owner(Protocol):
    """The server or client transport a connection lives on (moqt/quic/pico/server.py, client.py)."""

    def connection_terminated(self, conn: PicoConnection[Any]) -> None: ...


class PicoConnection(SessionEvents[E]):
    """One aiopquic ``QuicConnection``, its session and its peer (see the module docstring).

    ``quic`` is what a session is built on (``MoqtSession(conn.quic, ...)``, as with ``MoqtConnection``):
    the shim, typed as aioquic's connection because it is used as one. The session factory runs at
    HandshakeCompleted, once the agreed ALPN has chosen the draft.
    """

    def __init__(self, quic: Any, config: EndpointConfig, session_factory: PicoSessionFactory[E], owner: Owner, *,
                 uri: MoqtUri | None = None, on_event: PicoEventHandler[E] | None = None) -> None:
        self.pico = quic  # aiopquic's QuicConnection
        self.shim = PicoQuic(quic)
        self.shim.on_close = self._closing
        self.quic = cast(QuicConnection, self.shim)
        self.config, self.uri = config, uri
        self.is_client = uri is not None
        self._loop = asyncio.get_running_loop()
        self._factory, self._on_event, self._owner = session_factory, on_event, owner
        self._timed: TimedSession[E] | None = None
        self.profile: Profile = DRAFT_14  # numbers a close before the handshake chose the draft
        self._drainers: dict[int, asyncio.Event] = {}
        self.drain_waits = 0  # times drain() had to wait for picoquic (tests: backpressure happened)
        self._init_events()
        self._handshaken = False
        self._local_code, self._local_reason = 0, ""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._close_timer: asyncio.TimerHandle | None = None
        self._auth_timer = None
        super().__init__(config.token_keys)

    @property
    def address(self) -> NetworkAddress:
        peer = self.pico.peer_address()
        return cast(NetworkAddress, peer if peer is not None else ("?", 0))

    # -- events, sending -----------------------------------------------------------------------------
    def send_buffered(self, stream_id: int) -> int:
        """Octets of ``stream_id`` written but not yet taken into packets by picoquic."""
        return self.shim.queued(stream_id) + int(self.pico.tx_data_ring_used(stream_id))

    async def drain(self, stream_id: int) -> None:
        """Wait until ``stream_id`` has at most half of ``send_high_water`` octets not yet sent."""
        self._check_open()
        low_water = self.config.settings.send_high_water // 2
        while self.send_buffered(stream_id) > low_water:
            if stream_id in self._drainers:
                raise RuntimeError(f"stream {stream_id} already has a writer waiting in drain()")
            drained = self.pico.get_tx_data_drain_event(stream_id)
            drained.clear()
            self.pico.set_tx_data_drain_pending(stream_id)  # the worker's next pull from the ring sets it
            if self.send_buffered(stream_id) <= low_water:
                break  # the arm stays (a later spurious wake is harmless; clearing could lose the shim's)
            self._drainers[stream_id] = drained
            self.drain_waits += 1
            try:
                await drained.wait()
            finally:
                self._drainers.pop(stream_id, None)
            self._check_open()

    def transmit_soon(self) -> None:
        """picoquic's thread sends what is written; only the session's timer may need re-arming."""
        self._arm_timer()

    def transmit_now(self) -> None:
        self._arm_timer()

    # -- lifecycle -----------------------------------------------------------------------------------
    def close(self, error: SessionError | int = SessionError.NO_ERROR, reason: str = "") -> None:
        """Close with a MOQT Session Termination code (only the code reaches the peer)."""
        if not self.closed:
            self.shim.close(self.profile.session_errors.code(error), reason_phrase=reason)

    def _closing(self, code: int, reason: str) -> None:
        """The shim is closing (for us or for the session): remember why, and bound the wait for the end."""
        if self._close_timer is not None or self.closed:
            return
        self._local_code, self._local_reason = code, reason
        if code:  # the reason never reaches the peer (picoquic sends the code only): say it here
            log.info("MOQT peer %s: closing with 0x%x (%s)", address_text(self.address), code, reason or "-",
                     extra={"kvsp_peer": "moqt.pico-close"})
        self._close_timer = self._loop.call_later(_CLOSE_GRACE_S, self._close_unconfirmed, code, reason)

    # -- driven by aiopquic ----------------------------------------------------------------------------
    def _process_events(self) -> None:
        """Drain this connection's events (a client's eventfd reader, or the server's engine, calls it)."""
        pico = self.pico
        while (raw := pico.next_event()) is not None:
            event = to_aioquic(raw, self.shim)
            if event is None or self.closed:
                continue
            if isinstance(event, qe.HandshakeCompleted):
                self._handshaken = True
                self._handshake_completed()
            elif isinstance(event, qe.ConnectionTerminated) and self._close_timer is not None:
                event = qe.ConnectionTerminated(error_code=self._local_code, frame_type=None,
                                                reason_phrase=self._local_reason)
            self._dispatch(event)
            if isinstance(event, qe.ConnectionTerminated):
                self._terminated(event)
        self._arm_timer()

    def _dispatch(self, event: qe.QuicEvent) -> None:
        if not self._rejected and self._session is not None:
            self._run_session(self._session.handle_event, event)

    def _handshake_completed(self) -> None:
        """Choose the draft, start the token deadline (server), create the session."""
        alpn = self.shim.tls.alpn_negotiated
        profile = profile_for_alpn(alpn, self.config.settings.profiles)
        if profile is None:
            log.info("MOQT peer %s: no MOQT draft agreed (ALPN %r)", address_text(self.address), alpn,
                     extra={"kvsp_peer": "moqt.no-draft"})
            self._reject(ConnectionError(f"no MOQT draft agreed (ALPN {alpn!r})"), SessionError.PROTOCOL_VIOLATION,
                         "no MOQT draft agreed")
            return
        self.profile = profile
        if not self.is_client:  # nothing but a token can authenticate this peer (D3)
            self._start_auth_deadline(self.config.settings.auth_timeout_s)
        elif self.uri is not None:  # picotls checked chain and host name: the server is who we dialled
            self.peer_identity = str(MoqtUri(self.uri.host, self.uri.port, self.uri.path))
            self.authenticated_by = "server-name"
        try:
            self._session = self._factory(self)
        except Exception as exc:
            log.exception("session factory failed; closing the connection")
            self._reject(exc, SessionError.INTERNAL_ERROR, "internal error")
            return
        if all(callable(getattr(self._session, name, None)) for name in ("get_timer", "handle_timer")):
            self._timed = cast(TimedSession[E], self._session)
        if not self._ready.done():
            self._ready.set_result(None)

    def _reject(self, error: BaseException, code: SessionError, reason: str) -> None:
        self._rejected = True
        self._fail_ready(error)
        self.close(code, reason)

    def _arm_timer(self) -> None:
        timed = self._timed
        at = timed.get_timer() if timed is not None and not self.closed else None
        if self._timer is not None and self._timer_at != at:
            self._timer.cancel()
            self._timer = None
        if self._timer is None and at is not None:
            self._timer = self._loop.call_at(at, self._on_timer)
        self._timer_at = at

    def _on_timer(self) -> None:
        now = max(self._loop.time(), self._timer_at or 0.0)  # an early wake-up counts as the deadline
        self._timer = self._timer_at = None
        timed = self._timed
        if timed is not None and not self._rejected and not self.closed:
            due = timed.get_timer()
            if due is not None and now >= due:
                self._run_session(timed.handle_timer, now)
        self._arm_timer()

    def _close_unconfirmed(self, code: int, reason: str) -> None:
        """aiopquic never reported the end of our close: end it here, for the session too."""
        log.debug("MOQT peer %s: close not confirmed by picoquic within %g s", address_text(self.address),
                  _CLOSE_GRACE_S)
        event = qe.ConnectionTerminated(error_code=code, frame_type=None, reason_phrase=reason)
        self._dispatch(event)
        self._terminated(event)

    def _terminated(self, event: qe.ConnectionTerminated) -> None:
        if self.closed:
            return
        if self._close_timer is not None:  # our own close, which aiopquic reports as code 0: keep ours
            event = qe.ConnectionTerminated(error_code=self._local_code, frame_type=None,
                                            reason_phrase=self._local_reason)
        self._close_event = event
        self._closed.set()
        for handle in (self._timer, self._auth_timer, self._close_timer):
            if handle is not None:
                handle.cancel()
        self._timer = self._auth_timer = self._close_timer = None
        self._fail_ready(self._closed_error())
        for drained in self._drainers.values():
            drained.set()  # drain() wakes and raises
        self._wake_event_waiter()
        self._owner.connection_terminated(self)

    def _transport_closing(self) -> bool:
        return bool(self.pico.closed)

    def _closed_by_application(self, event: qe.ConnectionTerminated) -> bool:
        # Before the handshake completed it was picoquic's doing (TLS, ALPN, timeout), not a session's;
        # after it, what the raw close event said (the shim's application_close, as frame_type).
        return self._handshaken and event.frame_type is None
