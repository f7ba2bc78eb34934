"""Draft-18 Message Parameters: Type-Value pairs whose value encoding each parameter type defines.

Why apart from ``moqt.params``: draft-14 and draft-16 write every parameter as a Key-Value-Pair (even
type: a varint; odd: length and octets), so an unknown one can be skipped; draft-18 ("Encode Message
Parameters as Type-Value pairs", #1462) gives each type its own encoding -- uint8, varint, Location,
length-prefixed or a Track Namespace -- so the receiver must know every type (an unknown one, or one
outside its messages, closes the session). This module reads and writes those raw values in their
wire form; ``moqt.params.RequestParameters`` turns them into its typed fields and back.
"""

from __future__ import annotations

from typing import Final, TypeAlias

from moqt.errors import ProtocolViolation
from moqt.kinds import MessageKind, RequestParameter, SessionError
from moqt.profiles import Profile
from moqt.wire import VI64_MAX, Location, Namespace, Reader, Writer, pull_namespace, push_namespace

_PV: Final = SessionError.PROTOCOL_VIOLATION
_P = RequestParameter

#: A parameter's value as the wire has it: uint8 and varint as ``int``, a Location, octets of a
#: length-prefixed value, or a Track Namespace.
RawValue: TypeAlias = int | Location | bytes | Namespace

UINT8: Final = frozenset({_P.FORWARD, _P.SUBSCRIBER_PRIORITY, _P.GROUP_ORDER})
LOCATION: Final = frozenset({_P.LARGEST_OBJECT})
LENGTH_PREFIXED: Final = frozenset({_P.AUTHORIZATION_TOKEN, _P.SUBSCRIPTION_FILTER})
NAMESPACE: Final = frozenset({_P.TRACK_NAMESPACE_PREFIX})


def push_typed(writer: Writer, items: list[tuple[int, RequestParameter, RawValue]]) -> None:
    """Number of Parameters, then each (code, name, value) by ascending type, its type a delta."""
    writer.push_varint(len(items))
    previous = 0
    for code, kind, value in sorted(items, key=_code_of):
        writer.push_varint(code - previous)
        previous = code
        _push_value(writer, kind, value)


def _code_of(item: tuple[int, RequestParameter, RawValue]) -> int:
    return item[0]


def _push_value(writer: Writer, kind: RequestParameter, value: RawValue) -> None:
    if kind in UINT8 and isinstance(value, int):
        writer.push_uint8(value)
    elif isinstance(value, Location):
        value.encode(writer)
    elif isinstance(value, bytes):
        writer.push_length_prefixed(value)
    elif isinstance(value, tuple):
        push_namespace(writer, value)
    else:
        writer.push_varint(value)


def pull_typed(reader: Reader, message: MessageKind, profile: Profile) -> list[tuple[RequestParameter, RawValue]]:
    """The parameters of ``message`` in wire order; unknown or out-of-scope types close the session."""
    count = reader.pull_varint()
    items: list[tuple[RequestParameter, RawValue]] = []
    previous = 0
    for _ in range(count):
        code = previous + reader.pull_wide()
        if code > VI64_MAX:
            raise ProtocolViolation(_PV, "Message Parameter Type Delta takes the type past 2^64-1")
        previous = code
        kind = profile.request_parameters.name(code)
        if kind is None:
            raise ProtocolViolation(_PV, f"unknown Message Parameter 0x{code:x} in {message.value}")
        if message not in profile.parameter_scope.get(kind, ()) and profile.layout.out_of_scope_parameters_close:
            raise ProtocolViolation(_PV, f"Message Parameter {kind.value} not allowed in {message.value}")
        items.append((kind, _pull_value(reader, kind, profile)))
    return items


def _pull_value(reader: Reader, kind: RequestParameter, profile: Profile) -> RawValue:
    if kind in UINT8:
        return reader.pull_uint8()
    if kind in LOCATION:
        return Location.decode(reader)
    if kind in LENGTH_PREFIXED:
        return bytes(reader.pull_length_prefixed(profile.max_kvp_value_length, kind.value))
    if kind in NAMESPACE:
        return pull_namespace(reader, max_fields=profile.max_namespace_fields,
                              max_length=profile.max_full_track_name_length, min_fields=0,
                              empty_field_closes=profile.layout.empty_namespace_field_closes)
    return reader.pull_varint()
