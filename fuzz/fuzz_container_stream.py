"""Fuzz target ``container_stream``: the incremental container reader (kvsp/container_stream.py).

Input: one octet of decode rules (as ``fuzz_container``), one octet saying how many split points
follow, the split points, then the container octets, fed to ``ContainerReader`` in those pieces and
closed.  Contract: every ``feed``/``close`` returns events or raises ``ContainerError``, nothing else;
the reader agrees with the one-shot decoder (it accepts exactly the inputs ``decode_container``
accepts within its size limit, with the same header and layers); events come in stream order
(header, each layer once in ascending order, end); and a failed reader stays failed: every later call
raises ``ContainerError`` again and its counters do not move.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.common import ContractViolation, Cursor, OpWriter, check, fuzz_main, split_points
from fuzz.fuzz_container import decode, rules_of
from fuzz.fuzz_container import seeds as container_seeds
from kvsp.container import Container
from kvsp.container_stream import ContainerReader, EndOfContainer, Event, HeaderReceived, LayerReady
from kvsp.errors import ContainerError

TARGET = "container_stream"
INSTRUMENT = ("kvsp.container", "kvsp.container_stream", "kvsp.errors")
# A receiver that knows its sizes passes a bound; this one keeps a fuzz input's allocation small.
MAX_SIZE = 1 << 20


def check_failed_stays_failed(reader: ContainerReader) -> None:
    received, header = reader.received, reader.header
    for call in (lambda: reader.feed(b"\x00"), reader.close, reader.container):
        try:
            call()
        except ContainerError:
            pass
        else:
            raise ContractViolation("a failed ContainerReader accepted a later call")
    check(reader.received == received and reader.header == header, "a refused call changed the reader")


def check_events(events: list[Event], reference: Container) -> None:
    check(isinstance(events[0], HeaderReceived) and events[0].header == reference.header,
          "the first event is not the header")
    layers = [e for e in events if isinstance(e, LayerReady)]
    check([e.layer for e in layers] == [v.layer for v in reference.layers], "layers out of order or repeated")
    check([bytes(e.view.payload) for e in layers] == [bytes(v.payload) for v in reference.layers],
          "streamed layers differ from the decoded ones")
    check(isinstance(events[-1], EndOfContainer) and events[-1].container_length == reference.header.container_length,
          "the last event is not the end")
    check(len(events) == len(layers) + 2, "unexpected events")


def test_one_input(data: bytes) -> None:
    cursor = Cursor(data)
    rules = rules_of(cursor.u8())
    cuts = Cursor(cursor.take(cursor.u8() % 16))
    octets = cursor.rest()
    try:
        reference: Container | None = decode(rules, octets)
    except ContainerError:
        reference = None
    if reference is not None and reference.header.container_length > MAX_SIZE:
        reference = None
    reader = ContainerReader(geometry=rules.geometry, codec_required=rules.codec_required,
                             max_layers=rules.max_layers, max_size=MAX_SIZE)
    events: list[Event] = []
    try:
        for piece in split_points(octets, cuts, max_pieces=16):
            events += reader.feed(piece)
        reader.close()
    except ContainerError:
        check(reference is None, "the reader refused a container that decode_container accepts")
        check_failed_stays_failed(reader)
        return
    if reference is None:
        raise ContractViolation("the reader accepted a container that decode_container refuses")
    check_events(events, reference)
    whole = reader.container()
    check(bytes(reader.octets) == octets and whole.header == reference.header, "reader.container() differs")


def seeds() -> list[bytes]:
    out = []
    for i, seed in enumerate(container_seeds()):
        cuts = bytes([1, 19, 16, 7 + i])
        out.append(OpWriter().u8(seed[0]).chunk(cuts).raw(seed[1:]).getvalue())
    return out


if __name__ == "__main__":
    fuzz_main(test_one_input, INSTRUMENT)
