"""An aioquic-shaped connection over aiopquic's ``QuicConnection``, for an unchanged ``MoqtSession``.

Why a shim: the session writes into ``quic`` (``send_stream_data``, ``reset_stream``, ``close`` ...) and
matches aioquic's event classes. aiopquic takes ``bytes`` only and refuses a write its ring cannot hold
(``BufferError``); the session cannot wait, so a refused write waits in a per-stream queue that a task
flushes when aiopquic's drain event fires (no polling), in order, before any later write of that stream:
the stream's drain event when its ring was full, the connection's TX-event-ring event when that was.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from aioquic.quic import events as qe

_CHUNK: Final = 1 << 20  # below aiopquic's stream_ring_cap (4 MiB): one write never exceeds the ring
# aiopquic 0.6.1's RX ring event types (aiopquic/quic/connection.py): both closes become the same
# ConnectionTerminated, so the kind is read from the raw event, the only place that tells them apart.
_EVT_CLOSE: Final = 4
_EVT_APP_CLOSE: Final = 5


@dataclass(slots=True)
class _Tls:
    alpn_negotiated: str | None = None


class PicoQuic:
    """What ``MoqtSession`` calls on its connection, on an aiopquic ``QuicConnection`` (``quic``)."""

    def __init__(self, quic: Any) -> None:
        self._quic = quic
        self.configuration = quic.configuration
        self.tls = _Tls()
        self._queued: dict[int, deque[tuple[bytes, bool]]] = {}
        self._flushers: dict[int, asyncio.Task[None]] = {}
        #: Told of every local close (code, reason), whoever closes: aiopquic reports our own close as code 0.
        self.on_close: Callable[[int, str], None] | None = None
        #: How the connection ended, from the first close event: True application, False transport.
        self.application_close: bool | None = None
        for name in ("_enqueue_raw", "_handle_raw_event"):  # the server's and the client's event entry
            original = getattr(quic, name, None)
            if callable(original):
                setattr(quic, name, self._watching(original))

    def _watching(self, original: Callable[..., None]) -> Callable[..., None]:
        def watched(evt_type: int, *args: Any) -> None:
            if self.application_close is None and evt_type in (_EVT_CLOSE, _EVT_APP_CLOSE):
                self.application_close = evt_type == _EVT_APP_CLOSE
            original(evt_type, *args)

        return watched

    @property
    def closing(self) -> bool:
        return bool(self._quic.closed)

    def queued(self, stream_id: int) -> int:
        """Octets of ``stream_id`` waiting here for room in aiopquic's ring."""
        return sum(len(data) for data, _ in self._queued.get(stream_id, ()))

    def get_next_available_stream_id(self, is_unidirectional: bool = False) -> int:
        return int(self._quic.get_next_available_stream_id(is_unidirectional))

    def send_stream_data(self, stream_id: int, data: bytes | bytearray | memoryview, end_stream: bool = False) -> None:
        view = memoryview(data).cast("B")
        pieces = [bytes(view[i : i + _CHUNK]) for i in range(0, len(view), _CHUNK)] or [b""]
        queue = self._queued.get(stream_id)
        for i, piece in enumerate(pieces):
            fin = end_stream and i == len(pieces) - 1
            if queue is None:
                try:
                    self._quic.send_stream_data(stream_id, piece, fin)
                    continue
                except BufferError:
                    queue = self._queued[stream_id] = deque()
                    self._flushers[stream_id] = asyncio.get_running_loop().create_task(self._flush(stream_id))
            queue.append((piece, fin))

    async def _flush(self, stream_id: int) -> None:
        queue, quic = self._queued[stream_id], self._quic
        drained = quic.get_tx_data_drain_event(stream_id)
        try:
            while queue and not quic.closed:
                piece, fin = queue[0]
                drained.clear()
                try:
                    quic.send_stream_data(stream_id, piece, fin)
                except BufferError:
                    await self._room(stream_id, len(piece), drained)
                    continue
                queue.popleft()
        finally:
            self._queued.pop(stream_id, None)
            self._flushers.pop(stream_id, None)

    async def _room(self, stream_id: int, size: int, drained: asyncio.Event) -> None:
        """Wait for room after a BufferError, which aiopquic raises alike for the connection's TX *event* ring
        and the stream's own ring: told apart by the stream ring's fill. The per-stream drain event never
        fires for the first, so that waits on the transport's ring event (also set when the connection
        closes); the second on the stream's event, armed for the worker's next pull from a non-empty ring."""
        quic = self._quic
        cap = int(getattr(quic.configuration, "stream_ring_cap", _CHUNK))
        used = int(quic.tx_data_ring_used(stream_id))
        transport = quic._transport
        if transport is None:
            return
        if used + size <= cap:
            ring = transport.tx_event_ring_drain_event
            ring.clear()
            if transport.arm_tx_event_ring_drain_pending():
                await ring.wait()
                return
        if used == 0:  # neither ring is full any more: retry on the next loop turn
            await asyncio.sleep(0)
            return
        quic.set_tx_data_drain_pending(stream_id)
        await drained.wait()

    def reset_stream(self, stream_id: int, error_code: int) -> None:
        self._drop(stream_id)
        if not self._quic.closed:
            self._quic.reset_stream(stream_id, error_code)

    def stop_stream(self, stream_id: int, error_code: int) -> None:
        if not self._quic.closed:
            self._quic.stop_stream(stream_id, error_code)

    def send_datagram_frame(self, data: bytes) -> None:
        with contextlib.suppress(ConnectionError):  # a datagram may be lost anyway: none after close
            self._quic.send_datagram_frame(bytes(data))  # 0 = ring full: dropped, as the network may

    def close(self, error_code: int = 0, frame_type: int | None = None, reason_phrase: str = "") -> None:
        """Only the code reaches the peer: picoquic sends neither reason nor frame type."""
        for stream_id in list(self._queued):
            self._drop(stream_id)
        if not self._quic.closed and self.on_close is not None:
            self.on_close(error_code, reason_phrase)
        self._quic.close(error_code)

    def _drop(self, stream_id: int) -> None:
        self._queued.pop(stream_id, None)
        task = self._flushers.pop(stream_id, None)
        if task is not None:
            task.cancel()


def to_aioquic(event: object, shim: PicoQuic) -> qe.QuicEvent | None:
    """aiopquic's event as aioquic's class (what the session matches on); None for the ones it ignores."""
    name = type(event).__name__
    e: Any = event
    if name == "StreamDataReceived":
        return qe.StreamDataReceived(data=e.data, end_stream=e.end_stream, stream_id=e.stream_id)
    if name == "HandshakeCompleted":
        shim.tls.alpn_negotiated = e.alpn_protocol
        return qe.HandshakeCompleted(alpn_protocol=e.alpn_protocol, early_data_accepted=False,
                                     session_resumed=bool(e.session_resumed))
    if name == "StreamReset":
        return qe.StreamReset(error_code=e.error_code, stream_id=e.stream_id)
    if name == "StopSendingReceived":
        return qe.StopSendingReceived(error_code=e.error_code, stream_id=e.stream_id)
    if name == "DatagramFrameReceived":
        return qe.DatagramFrameReceived(data=bytes(e.data))
    if name == "ConnectionTerminated":  # aioquic's frame_type None is an application close, a number a transport's
        transport = shim.application_close is False
        return qe.ConnectionTerminated(error_code=e.error_code, frame_type=0 if transport else None, reason_phrase="")
    return None
