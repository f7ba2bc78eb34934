"""Typed, path-aware reading of decoded JSON objects.

Every record parser reads through `ObjectReader`, so that (a) wrong types, missing members and broken
rules all raise `ValidationError` naming the member's JSON path, (b) unknown members are ignored as
the spec requires, and (c) nothing of type ``dict[str, Any]`` travels past the boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from kvsp.encoding import parse_digest, parse_hex
from kvsp.errors import ValidationError

T = TypeVar("T")

# The I-JSON safe integer range (RFC 7493): every integer we accept can be written back by JCS
# (RFC 8785), which refuses larger ones, and is exact in every peer's JSON library.
MAX_JSON_INT = 2**53 - 1


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class ObjectReader:
    """Reads members of one JSON object, naming ``path.member`` in every error."""

    __slots__ = ("_obj", "path")

    def __init__(self, value: object, path: str = "") -> None:
        if not isinstance(value, dict):
            raise ValidationError(path or "$", "must be a JSON object")
        self._obj: dict[str, object] = value
        self.path = path

    def member(self, name: str) -> str:
        return _join(self.path, name)

    def has(self, name: str) -> bool:
        return name in self._obj

    def raw(self, name: str) -> object:
        if name not in self._obj:
            raise ValidationError(self.member(name), "is required")
        return self._obj[name]

    def optional(self, name: str, read: Callable[[str], T]) -> T | None:
        """``read(name)`` when the member is present and not null, else None."""
        if self._obj.get(name) is None:
            return None
        return read(name)

    # -- scalars -------------------------------------------------------------------------------
    def str(self, name: str, *, max_length: int = 4096, nonempty: bool = True) -> str:
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

    def int(self, name: str, *, minimum: int = 0, maximum: int = MAX_JSON_INT) -> int:
        return check_int(self.raw(name), self.member(name), minimum=minimum, maximum=maximum)

    def number(self, name: str, *, minimum: float = 0.0, maximum: float = float("inf")) -> float:
        value = self.raw(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValidationError(self.member(name), "must be a number")
        if not minimum <= value <= maximum:
            raise ValidationError(self.member(name), f"must be between {minimum} and {maximum}")
        return float(value)

    def bool(self, name: str) -> bool:
        value = self.raw(name)
        if not isinstance(value, bool):
            raise ValidationError(self.member(name), "must be true or false")
        return value

    def hex(self, name: str, octets: int) -> bytes:
        return parse_hex(self.str(name, max_length=2 * octets), octets, self.member(name))

    def digest(self, name: str) -> bytes:
        return parse_digest(self.str(name, max_length=80), self.member(name))

    def choice(self, name: str, allowed: frozenset[str]) -> str:
        value = self.str(name)
        if value not in allowed:
            raise ValidationError(self.member(name), f"must be one of {sorted(allowed)}")
        return value

    # -- containers ----------------------------------------------------------------------------
    def list(self, name: str, *, max_items: int = 65536, nonempty: bool = False) -> list[object]:
        value = self.raw(name)
        if not isinstance(value, list):
            raise ValidationError(self.member(name), "must be an array")
        if len(value) > max_items:
            raise ValidationError(self.member(name), f"must have at most {max_items} items")
        if nonempty and not value:
            raise ValidationError(self.member(name), "must not be empty")
        return value

    def items(self, name: str, **kw: int | bool) -> Iterator[tuple[str, object]]:
        """(path of item, item) for each element of the array member ``name``."""
        base = self.member(name)
        for i, item in enumerate(self.list(name, **kw)):  # type: ignore[arg-type]
            yield f"{base}[{i}]", item

    def objects(self, name: str, **kw: int | bool) -> Iterator[ObjectReader]:
        for path, item in self.items(name, **kw):
            yield ObjectReader(item, path)

    def hex_list(self, name: str, octets: int, **kw: int | bool) -> tuple[bytes, ...]:
        return tuple(parse_hex(check_str(v, p), octets, p) for p, v in self.items(name, **kw))

    def int_list(self, name: str, *, minimum: int = 0, maximum: int = MAX_JSON_INT,
                 **kw: int | bool) -> tuple[int, ...]:
        return tuple(check_int(v, p, minimum=minimum, maximum=maximum) for p, v in self.items(name, **kw))

    def digest_items(self, name: str, **kw: int | bool) -> tuple[bytes, ...]:
        return tuple(parse_digest(check_str(v, p), p) for p, v in self.items(name, **kw))

    def object(self, name: str) -> ObjectReader:
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
    return (check_int(value[0], f"{member}[0]", maximum=maximum),
            check_int(value[1], f"{member}[1]", maximum=maximum))
