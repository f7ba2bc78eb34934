"""Typed, path-aware reading of decoded JSON objects.

Every record parser reads through `ObjectReader`, so that (a) wrong types, missing members and broken
rules all raise `ValidationError` naming the member's JSON path, (b) unknown members are ignored as
the spec requires, and (c) nothing of type ``dict[str, Any]`` travels past the boundary.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Iterator
from typing import TypeVar

from kvsp.encoding import parse_digest, parse_hex
from kvsp.errors import ValidationError

T = TypeVar("T")

# The I-JSON safe integer range (RFC 7493): every integer we accept can be written back by JCS
# (RFC 8785), which refuses larger ones, and is exact in every peer's JSON library.
MAX_JSON_INT = 2**53 - 1

# ObjectReader's methods are named after the JSON types they read (r.str, r.int, ...), which shadows
# the builtins inside the class body; annotations there name them as builtins.str and so on.


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class ObjectReader:
    """Reads members of one JSON object, naming ``path.member`` in every error."""

    __slots__ = ("_obj", "path")

    def __init__(self, value: builtins.object, path: builtins.str = "") -> None:
        if not isinstance(value, dict):
            raise ValidationError(path or "$", "must be a JSON object")
        self._obj: dict[builtins.str, builtins.object] = value
        self.path = path

    def member(self, name: builtins.str) -> builtins.str:
        return _join(self.path, name)

    def has(self, name: builtins.str) -> builtins.bool:
        return name in self._obj

    def get(self, name: builtins.str) -> builtins.object:
        """The raw member, None when absent: for fast paths that check exact types and else read normally."""
        return self._obj.get(name)

    def raw(self, name: builtins.str) -> builtins.object:
        if name not in self._obj:
            raise ValidationError(self.member(name), "is required")
        return self._obj[name]

    def optional(self, name: builtins.str, read: Callable[[builtins.str], T]) -> T | None:
        """``read(name)`` when the member is present and not null, else None."""
        if self._obj.get(name) is None:
            return None
        return read(name)

    # -- scalars -------------------------------------------------------------------------------
    def str(
        self, name: builtins.str, *, max_length: builtins.int = 4096, nonempty: builtins.bool = True
    ) -> builtins.str:
        value = self.raw(name)
        if not isinstance(value, str):
            raise ValidationError(self.member(name), "must be a string")
        if nonempty and not value:
            raise ValidationError(self.member(name), "must not be empty")
        if len(value) > max_length:
            raise ValidationError(self.member(name), f"must be at most {max_length} characters")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValidationError(self.member(name), "must be valid Unicode (no lone surrogates)") from exc
        return value

    def int(
        self, name: builtins.str, *, minimum: builtins.int = 0, maximum: builtins.int = MAX_JSON_INT
    ) -> builtins.int:
        return check_int(self.raw(name), self.member(name), minimum=minimum, maximum=maximum)

    def number(
        self, name: builtins.str, *, minimum: builtins.float = 0.0, maximum: builtins.float = float("inf")
    ) -> builtins.float:
        value = self.raw(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValidationError(self.member(name), "must be a number")
        try:
            number = float(value)
        except OverflowError:  # an integer literal too long for a float
            number = math.inf
        if not math.isfinite(number):  # JSON such as 1e400 decodes to infinity
            raise ValidationError(self.member(name), "must be a finite number")
        if not minimum <= number <= maximum:
            raise ValidationError(self.member(name), f"must be between {minimum} and {maximum}")
        return number

    def bool(self, name: builtins.str) -> builtins.bool:
        value = self.raw(name)
        if not isinstance(value, bool):
            raise ValidationError(self.member(name), "must be true or false")
        return value

    def hex(self, name: builtins.str, octets: builtins.int) -> bytes:
        return parse_hex(self.str(name, max_length=2 * octets), octets, self.member(name))

    def digest(self, name: builtins.str) -> bytes:
        return parse_digest(self.str(name, max_length=80), self.member(name))

    def choice(self, name: builtins.str, allowed: frozenset[builtins.str]) -> builtins.str:
        value = self.str(name)
        if value not in allowed:
            raise ValidationError(self.member(name), f"must be one of {sorted(allowed)}")
        return value

    # -- containers ----------------------------------------------------------------------------
    def list(
        self, name: builtins.str, *, max_items: builtins.int = 65536, nonempty: builtins.bool = False
    ) -> builtins.list[builtins.object]:
        value = self.raw(name)
        if not isinstance(value, list):
            raise ValidationError(self.member(name), "must be an array")
        if len(value) > max_items:
            raise ValidationError(self.member(name), f"must have at most {max_items} items")
        if nonempty and not value:
            raise ValidationError(self.member(name), "must not be empty")
        return value

    def items(
        self, name: builtins.str, **kw: builtins.int | builtins.bool
    ) -> Iterator[builtins.tuple[builtins.str, builtins.object]]:
        """(path of item, item) for each element of the array member ``name``."""
        base = self.member(name)
        for i, item in enumerate(self.list(name, **kw)):  # type: ignore[arg-type]
            yield f"{base}[{i}]", item

    def objects(self, name: builtins.str, **kw: builtins.int | builtins.bool) -> Iterator[ObjectReader]:
        for path, item in self.items(name, **kw):
            yield ObjectReader(item, path)

    def hex_list(
        self, name: builtins.str, octets: builtins.int, **kw: builtins.int | builtins.bool
    ) -> builtins.tuple[bytes, ...]:
        return tuple(parse_hex(check_str(v, p), octets, p) for p, v in self.items(name, **kw))

    def int_list(
        self,
        name: builtins.str,
        *,
        minimum: builtins.int = 0,
        maximum: builtins.int = MAX_JSON_INT,
        **kw: builtins.int | builtins.bool,
    ) -> builtins.tuple[builtins.int, ...]:
        return tuple(check_int(v, p, minimum=minimum, maximum=maximum) for p, v in self.items(name, **kw))

    def digest_items(self, name: builtins.str, **kw: builtins.int | builtins.bool) -> builtins.tuple[bytes, ...]:
        return tuple(parse_digest(check_str(v, p), p) for p, v in self.items(name, **kw))

    def object(self, name: builtins.str) -> ObjectReader:
        return ObjectReader(self.raw(name), self.member(name))


def check_int(value: object, member: str, *, minimum: int = 0, maximum: int = MAX_JSON_INT) -> int:
    # bool is an int subclass in Python but not a JSON number.
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValidationError(member, "must be an integer")
    if not minimum <= value <= maximum:
        raise ValidationError(member, f"must be between {minimum} and {maximum}")
    return value


def check_str(value: object, member: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(member, "must be a string")
    return value


def check_pair(value: object, member: str, *, maximum: int = MAX_JSON_INT) -> tuple[int, int]:
    """A JSON array of exactly two integers, as used for layer and token ranges."""
    if not isinstance(value, list) or len(value) != 2:
        raise ValidationError(member, "must be an array of two integers")
    return (check_int(value[0], f"{member}[0]", maximum=maximum), check_int(value[1], f"{member}[1]", maximum=maximum))
