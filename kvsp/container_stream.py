"""Incremental KV Block Container reader: bytes chunks in, events out (sans-I/O).

Why: the ascending layer order of section 4.3 exists so that a receiver can use layer l while layer
l+1 is still on the wire.  `ContainerReader` is fed whatever chunks the transport delivers (HTTP body
pieces, QUIC stream data) and reports each layer the moment its last octet arrives.  It applies the
same rules as `decode_container`, plus a size limit, and copies each octet once: into a buffer sized
from the header, of which every reported layer is a view.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from kvsp.container import (
    DEFAULT_CODECS,
    DEFAULT_MAX_LAYERS,
    FIXED_HEADER_LENGTH,
    CodecRegistry,
    Container,
    ContainerHeader,
    DecodeRules,
    Geometry,
    LayerView,
    as_octets,
)
from kvsp.errors import ContainerError

if TYPE_CHECKING:
    from kvsp.container import BufferLike

# Default bound on one container (header and data).  The largest blocks of large models are tens of
# MiB; a receiver that knows its geometry should pass the exact size.
DEFAULT_MAX_SIZE: Final = 1 << 30


@dataclass(frozen=True, slots=True)
class HeaderReceived:
    """The header has arrived and passed validation; the receiver can now size its destination."""

    header: ContainerHeader


@dataclass(frozen=True, slots=True, eq=False)
class LayerReady:
    """Every octet of one layer has arrived; ``view`` stays valid for the reader's lifetime and beyond."""

    view: LayerView

    @property
    def layer(self) -> int:
        return self.view.layer

    @property
    def k(self) -> memoryview:
        return self.view.k

    @property
    def v(self) -> memoryview:
        return self.view.v


@dataclass(frozen=True, slots=True)
class EndOfContainer:
    """The container is complete; any further octet is an error."""

    container_length: int


Event = HeaderReceived | LayerReady | EndOfContainer


class _State(enum.Enum):
    HEADER = enum.auto()
    DATA = enum.auto()
    DONE = enum.auto()
    FAILED = enum.auto()


class ContainerReader:
    """Push parser for one container.  `feed` returns the events that the new octets complete.

    After a `ContainerError` the reader is failed and every later call raises again: a stream that
    broke once cannot be resynchronised, and events completed earlier in the failing call are dropped
    with it.  Call `close` at the end of the stream to detect truncation.
    """

    __slots__ = ("_buf", "_emitted", "_ends", "_error", "_filled", "_header", "_need", "_rules", "_staging",
                 "_state")

    def __init__(self, *, geometry: Geometry | None = None, codec_required: int | None = None,
                 max_layers: int = DEFAULT_MAX_LAYERS, max_size: int = DEFAULT_MAX_SIZE,
                 codecs: CodecRegistry | None = None) -> None:
        self._rules = DecodeRules(geometry, codec_required, max_layers, max_size,
                             DEFAULT_CODECS if codecs is None else codecs)
        self._state = _State.HEADER
        self._error: ContainerError | None = None
        self._staging = bytearray()  # header octets until the header is complete
        self._need = FIXED_HEADER_LENGTH  # header octets needed before the next header step
        self._header: ContainerHeader | None = None
        self._buf = memoryview(bytearray())  # the whole container, allocated once from the header
        self._filled = 0
        self._ends: list[int] = []  # offset in _buf just after each layer
        self._emitted = 0  # layers reported so far

    @property
    def header(self) -> ContainerHeader | None:
        return self._header

    @property
    def done(self) -> bool:
        return self._state is _State.DONE

    @property
    def received(self) -> int:
        """Octets consumed so far."""
        return len(self._staging) if self._state is _State.HEADER else self._filled

    @property
    def octets(self) -> memoryview:
        """The container octets received so far, e.g. to check Repr-Digest (section 6.7) at the end."""
        if self._state is _State.HEADER:
            return memoryview(bytes(self._staging))
        return self._buf[: self._filled]

    def feed(self, data: BufferLike) -> list[Event]:
        """Consume ``data`` and return the events it completes, in stream order."""
        self._check_usable()
        chunk = as_octets(data)
        events: list[Event] = []
        try:
            while chunk.nbytes:
                if self._state is _State.HEADER:
                    chunk = self._feed_header(chunk, events)
                else:
                    chunk = self._feed_data(chunk, events)
        except ContainerError as exc:
            self._fail(exc)
            raise
        return events

    def close(self) -> None:
        """Declare the end of the stream; raises `ContainerError` if the container is incomplete."""
        self._check_usable()
        if self._state is not _State.DONE:
            what = "header" if self._header is None else f"of {self._header.container_length} octets"
            exc = ContainerError(f"stream ended after {self.received} octets: container {what} incomplete")
            self._fail(exc)
            raise exc

    def container(self) -> Container:
        """The complete container, as views of the reader's buffer (no copy).  Only after the end."""
        if self._state is not _State.DONE or self._header is None:
            raise ContainerError("the container is not complete")
        return Container(self._header, self._buf[self._header.header_length :])

    def _check_usable(self) -> None:
        if self._state is _State.FAILED:
            raise ContainerError(f"the stream already failed: {self._error}")

    def _fail(self, exc: ContainerError) -> None:
        self._state = _State.FAILED
        self._error = exc

    def _feed_header(self, chunk: memoryview, events: list[Event]) -> memoryview:
        take = self._need - len(self._staging)
        self._staging += chunk[:take]
        if len(self._staging) < self._need:
            return chunk[take:]
        staged = memoryview(bytes(self._staging))
        if self._need == FIXED_HEADER_LENGTH:
            self._need = self._rules.header_length(staged)  # > 20: at least one table entry follows
            return chunk[take:]
        header = self._rules.parse(staged)
        self._start_data(header)
        events.append(HeaderReceived(header))
        self._emit_layers(header, events)
        return chunk[take:]

    def _start_data(self, header: ContainerHeader) -> None:
        try:
            self._buf = memoryview(bytearray(header.container_length))
        except MemoryError as exc:
            raise ContainerError(f"cannot allocate {header.container_length} octets") from exc
        self._buf[: header.header_length] = self._staging
        self._filled = header.header_length
        self._staging = bytearray()
        end = header.header_length
        for k, v in header.lengths:
            end += k + v
            self._ends.append(end)
        self._header = header
        self._state = _State.DATA

    def _feed_data(self, chunk: memoryview, events: list[Event]) -> memoryview:
        room = self._buf.nbytes - self._filled
        if room == 0:
            raise ContainerError(f"{chunk.nbytes} trailing octets after the container")
        n = min(room, chunk.nbytes)
        self._buf[self._filled : self._filled + n] = chunk[:n]
        self._filled += n
        if self._header is not None:
            self._emit_layers(self._header, events)
        return chunk[n:]

    def _emit_layers(self, header: ContainerHeader, events: list[Event]) -> None:
        while self._emitted < len(self._ends) and self._ends[self._emitted] <= self._filled:
            index = self._emitted
            start = self._ends[index - 1] if index else header.header_length
            view = LayerView(header.first_layer + index, self._buf[start : self._ends[index]],
                             header.lengths[index][0])
            self._emitted += 1
            events.append(LayerReady(view))
        if self._filled == self._buf.nbytes and self._state is _State.DATA:
            self._state = _State.DONE
            events.append(EndOfContainer(self._filled))
