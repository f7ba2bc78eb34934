"""The only module that reaches into aioquic's private state: subclass hooks and private reads.

aioquic has no public way to do what the adapter needs here, so this module overrides or reads
aioquic internals, each named below, and nothing else in kvsp does:

* ``QuicConnection._initialize`` (override): ask the client for a certificate
  (``tls.Context._request_client_certificate``).
* ``QuicConnection._parse_transport_parameters`` (override): honour the peer's
  ``max_udp_payload_size`` (``_max_datagram_size``).
* ``QuicConnection._write_stream_frame`` (override, aioquic's body with a 4-octet Length): STREAM
  frames longer than 16383 octets, built from ``QuicStreamSender.get_frame``, ``on_data_delivery``,
  ``next_offset``, ``highest_offset`` and ``QuicPacketBuilder.start_frame``,
  ``remaining_flight_space``, ``quic_logger_frames``.
* ``QuicConnection.__init__`` state: ``_ack_delay``, ``_loss._cc``, ``_configuration``,
  ``_max_datagram_size``; ``_streams`` and ``QuicStreamSender._buffer_start``, ``_buffer_stop``,
  ``_reset_error_code`` (send-buffer size); ``tls.Context._peer_certificate`` and
  ``_peer_certificate_chain`` (the peer's chain); ``_loss.spaces[].ack_eliciting_in_flight``
  (an answer is owed: liveness) and ``_idle_timeout()`` (the negotiated idle timeout: keepalive).

pyproject.toml pins aioquic to the releases where all of these were checked (1.6.0 to 1.7.2), and
tests/test_moqt_quic_hooks.py fails when one of them changes signature, disappears or stops doing
what we rely on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from aioquic.buffer import Buffer, size_uint_var  # type: ignore[attr-defined]  # re-exported without __all__
from aioquic.quic.congestion.base import QuicCongestionControl
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicFrameType, pull_quic_transport_parameters
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.recovery import QuicPacketSpace
from aioquic.quic.stream import QuicStream
from cryptography import x509


def peer_certificate_chain(quic: QuicConnection) -> list[x509.Certificate]:
    """The certificate chain the peer presented (leaf first), or ``[]`` if it presented none.

    aioquic 1.7.2 has no public accessor: ``tls.Context`` keeps the parsed leaf in
    ``_peer_certificate`` and the rest in ``_peer_certificate_chain`` (set by
    ``_set_peer_certificate`` when the Certificate message arrives, before CertificateVerify checks
    possession). This function is the one place that reads them; if a new aioquic renames them, it
    returns ``[]`` and every peer is treated as certificate-less, which fails closed.
    """
    tls = getattr(quic, "tls", None)
    leaf = getattr(tls, "_peer_certificate", None)
    if not isinstance(leaf, x509.Certificate):
        return []
    rest = getattr(tls, "_peer_certificate_chain", [])
    return [leaf, *(c for c in rest if isinstance(c, x509.Certificate))]


def send_buffered(quic: QuicConnection, stream_id: int) -> int:
    """Octets written to ``stream_id`` and not yet acknowledged by the peer (0 for unknown/reset streams).

    aioquic 1.7.2 exposes no public size for a stream's send buffer: ``QuicStreamSender`` keeps the
    unacknowledged bytes in ``_buffer`` between offsets ``_buffer_start`` (advanced as the peer ACKs)
    and ``_buffer_stop``. This is the one place that reads them (and ``QuicConnection._streams``);
    ``moqt/quic/connection.py`` uses it for ``write()``/``drain()`` backpressure.
    """
    stream = quic._streams.get(stream_id)
    if stream is None or stream.sender._reset_error_code is not None:
        return 0
    return stream.sender._buffer_stop - stream.sender._buffer_start


def ack_eliciting_in_flight(quic: QuicConnection) -> bool:
    """Whether ack-eliciting packets we sent are still unacknowledged (in any packet number space).

    aioquic 1.7.2 counts them per space in ``QuicPacketSpace.ack_eliciting_in_flight`` (on
    ``_loss.spaces``) and exposes none of it; moqt/quic/liveness.py needs it to tell "the peer owes
    us an ACK" from "nothing to answer". Unknown state reads as False: no liveness verdict, only the
    idle timeout (fails open to the old behaviour, never closes a live session).
    """
    spaces = getattr(getattr(quic, "_loss", None), "spaces", ())
    return any(getattr(space, "ack_eliciting_in_flight", 0) > 0 for space in spaces)


def negotiated_idle_timeout(quic: QuicConnection) -> float:
    """The idle timeout in force: the smaller of ours and the peer's (RFC 9000 section 10.1), at least
    three probe timeouts -- aioquic's private ``_idle_timeout()``; our configured value without it."""
    method = getattr(quic, "_idle_timeout", None)
    value = method() if callable(method) else None
    return float(value) if isinstance(value, int | float) else float(quic.configuration.idle_timeout)


HANDSHAKE_DATAGRAM_SIZE: Final = 16000
"""Largest datagram during the handshake (see :class:`HookedQuicConnection`)."""
_MAX_UDP_PAYLOAD: Final = 65527  # RFC 9000 section 18.2: the largest max_udp_payload_size
_STREAM_LENGTH_FIELD: Final = 4
"""Octets of a STREAM frame's Length varint when we write it: 4 (values up to 2**30 - 1), where
aioquic 1.7.2 always writes 2 (``push_uint16(len | 0x4000)``, at most 16383)."""


_CAPPED: dict[tuple[type[QuicCongestionControl], int], type[QuicCongestionControl]] = {}


def capped_congestion_control(base: type[QuicCongestionControl], cap: int) -> type[QuicCongestionControl]:
    """``base`` (aioquic's reno or cubic) whose congestion window never exceeds ``cap`` octets.

    aioquic's slow start grows the window without bound while nothing is lost (it has no app-limited
    check), so after a few blocks the sender bursts whole blocks at once. On loopback a burst larger
    than the receiver's socket buffer (about 7.8 MiB of 64 KiB datagrams with a 4 MiB SO_RCVBUF) drops
    datagrams, and a loss takes cubic down and out of slow start (seen after 8 concurrent 2 MiB
    fetches: a 2.5 MB window, ssthresh 131 kB). Keeping the window within the receiver's buffer avoids
    the loss; pacing follows the capped window. No throughput gain was measured on the project's
    machine, so ``QuicSettings.max_flight_bytes`` is off by default (docs/moqt-performance.md).
    """
    key = (base, cap)
    capped = _CAPPED.get(key)
    if capped is None:

        def get(self: Any) -> int:
            return int(self._capped_window)

        def set_(self: Any, value: int) -> None:
            self._capped_window = min(value, cap)

        capped = _CAPPED[key] = type(f"Capped{base.__name__}", (base,),
                                     {"congestion_window": property(get, set_), "__doc__": base.__doc__})
    return capped


class HookedQuicConnection(QuicConnection):
    """The ``QuicConnection`` used by the adapter (moqt/quic/), with three hooks aioquic lacks.

    * ``on_write`` runs whenever something is queued for sending or the connection is closed (by the
      session or the application), so the adapter can schedule a transmit; it is set right after
      construction, before any write.
    * ``request_client_certificate`` (servers) makes the TLS stack send a CertificateRequest. aioquic
      creates its ``tls.Context`` in ``_initialize`` when the first Initial arrives and handles the
      ClientHello in the same call, so the flag must be set right there; overriding ``_initialize``
      is the only hook in between. The request is not a demand: a client without a certificate
      answers with an empty Certificate, and the adapter then waits for AUTHORIZATION_TOKEN (D3).
    * STREAM frames longer than 16383 octets (:meth:`_write_stream_frame`), so a packet may be as large
      as the path allows (64 KiB on loopback) instead of ~16 KiB: aioquic's cost is per packet, so this
      is its main throughput lever (docs/moqt-performance.md).  Every QUIC receiver parses a varint
      of any length, so stock peers read these frames as they read aioquic's.

    Options: ``ack_delay_s`` (aioquic's fixed 1 ms otherwise) and ``max_flight_bytes``, a cap on the
    congestion window (:func:`capped_congestion_control`).
    """

    on_write: Callable[[], None]
    request_client_certificate = False
    closing = False  # close() was called: nothing more can be sent
    _peer_payload_limit = _MAX_UDP_PAYLOAD
    _data_datagram_size = 0  # the configured size, used once the handshake is over (0: not limited)

    def __init__(self, *args: Any, ack_delay_s: float | None = None, max_flight_bytes: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if ack_delay_s is not None:  # how long after the first unacknowledged packet aioquic sends an ACK
            self._ack_delay = ack_delay_s
        if max_flight_bytes is not None:
            cc = self._loss._cc
            self._loss._cc = capped_congestion_control(type(cc), max_flight_bytes)(
                max_datagram_size=self._configuration.max_datagram_size)
        # Handshake packets have long headers, whose Length aioquic writes in 14 bits, and CRYPTO frames
        # written by aioquic: keep them within HANDSHAKE_DATAGRAM_SIZE; congestion control and pacing
        # are sized for the configured (data) size from the start.
        if self._max_datagram_size > HANDSHAKE_DATAGRAM_SIZE:
            self._data_datagram_size = self._max_datagram_size
            self._max_datagram_size = HANDSHAKE_DATAGRAM_SIZE

    def handshake_done(self) -> None:
        """The handshake is over: send packets of the configured size (within the peer's limit)."""
        if self._data_datagram_size:
            self._max_datagram_size = min(self._data_datagram_size, self._peer_payload_limit)
            self._data_datagram_size = 0

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        if self.request_client_certificate:
            if not hasattr(self.tls, "_request_client_certificate"):
                raise RuntimeError("this aioquic cannot request client certificates; kvsp needs 1.7.x")
            self.tls._request_client_certificate = True

    def _parse_transport_parameters(self, data: bytes, from_session_ticket: bool = False) -> None:
        # aioquic validates the peer's max_udp_payload_size but never sends smaller packets for it:
        # a peer advertising 1440 (picoquic, so aiomoqt) silently drops our 16000-octet loopback
        # packets after the handshake.  Honour the limit (RFC 9000 section 18.2).
        super()._parse_transport_parameters(data, from_session_ticket)
        limit = pull_quic_transport_parameters(Buffer(data=data)).max_udp_payload_size
        if limit is not None:
            self._peer_payload_limit = limit
            self._max_datagram_size = min(self._max_datagram_size, limit)

    def send_stream_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        super().send_stream_data(stream_id, data, end_stream)
        self.on_write()

    def _write_stream_frame(self, builder: QuicPacketBuilder, space: QuicPacketSpace, stream: QuicStream,
                            max_offset: int) -> int:
        # aioquic's version with one change: the Length field is a 4-octet varint (RFC 9000 section 16)
        # instead of a 2-octet one, so one frame can fill a packet of up to 2**30 octets.
        sender, stream_id = stream.sender, stream.stream_id
        assert stream_id is not None  # only the crypto streams, not written here, have none
        overhead = (1 + size_uint_var(stream_id) + _STREAM_LENGTH_FIELD
                    + (size_uint_var(sender.next_offset) if sender.next_offset else 0))
        previous_highest = sender.highest_offset
        frame = sender.get_frame(builder.remaining_flight_space - overhead, max_offset)
        if frame is None:
            return 0
        frame_type = QuicFrameType.STREAM_BASE | 2 | (4 if frame.offset else 0) | (1 if frame.fin else 0)
        buf = builder.start_frame(frame_type, capacity=overhead, handler=sender.on_data_delivery,
                                  handler_args=(frame.offset, frame.offset + len(frame.data), frame.fin))
        buf.push_uint_var(stream_id)
        if frame.offset:
            buf.push_uint_var(frame.offset)
        buf.push_uint32(len(frame.data) | 0x80000000)
        buf.push_bytes(frame.data)
        if self._quic_logger is not None and builder.quic_logger_frames is not None:
            builder.quic_logger_frames.append(self._quic_logger.encode_stream_frame(frame, stream_id=stream_id))
        return sender.highest_offset - previous_highest

    def reset_stream(self, stream_id: int, error_code: int) -> None:
        super().reset_stream(stream_id, error_code)
        self.on_write()

    def stop_stream(self, stream_id: int, error_code: int) -> None:
        super().stop_stream(stream_id, error_code)
        self.on_write()

    def send_datagram_frame(self, data: bytes) -> None:
        super().send_datagram_frame(data)
        self.on_write()

    def send_ping(self, uid: int) -> None:
        super().send_ping(uid)
        self.on_write()

    def close(self, error_code: int = 0, frame_type: int | None = None, reason_phrase: str = "") -> None:
        super().close(error_code, frame_type, reason_phrase)
        self.closing = True
        self.on_write()
