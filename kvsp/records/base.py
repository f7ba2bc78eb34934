"""Shared pieces of the record parsers: the record base class and checks that several records use.

Everything here raises `ValidationError` naming the member path, so record modules stay short and
every record reports errors the same way.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Hashable, Iterable, Sequence
from typing import Final, Self
from urllib.parse import urlsplit

from kvsp.encoding import canonical_json, parse_json
from kvsp.errors import ValidationError
from kvsp.identifiers import check_base_uri
from kvsp.reader import MAX_JSON_INT, ObjectReader, check_pair, check_str

# JCS (RFC 8785) cannot serialise integers beyond IEEE 754 double precision, so an integer we accept
# must stay inside that domain or a parsed record could not be written back out.
MAX_SAFE_INT: Final = MAX_JSON_INT
MAX_UINT32: Final = 2**32 - 1
BLOCK_KEY_OCTETS: Final = 32
COMPAT_ID_OCTETS: Final = 32
SCOPE_ID_OCTETS: Final = 16
DEFAULT_MAX_KEYS: Final = 4096  # default quota on keys per lookup, lease and directive (decision D2)
MAX_URIS: Final = 256  # sources per prefetch block, targets per lookup

HTTPS: Final = frozenset({"https"})
HOLDER_SCHEMES: Final = frozenset({"https", "moqt"})

TokenRange = tuple[int, int]  # half-open [start, end)
LayerRange = tuple[int, int]  # inclusive [first, last]

_URI_CHARS: Final = re.compile(r"[\x21-\x7e]+")
# URIs that passed `check_uri`, with the schemes allowed then (only successes: errors are raised afresh).
_VALID_URIS: Final[set[tuple[str, frozenset[str]]]] = set()
_MAX_VALID_URIS: Final = 4096


class JsonRecord:
    """Base of every KVSP record: JSON and canonical-bytes codecs around one `from_reader`.

    Subclasses are frozen, slotted dataclasses.  Parsing (`from_json`) is the validation boundary:
    records that code builds directly are trusted, records from peers always go through the parser.
    """

    __slots__ = ()

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        """Parse the object that ``r`` reads; errors name members relative to ``r.path``."""
        raise NotImplementedError

    def to_json(self) -> dict[str, object]:
        """The record as decoded JSON (binary identifiers as lowercase hex)."""
        raise NotImplementedError

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Validate decoded JSON; unknown members are ignored (spec section 4.4)."""
        return cls.from_reader(ObjectReader(value))

    @classmethod
    def from_bytes(cls, data: bytes | str) -> Self:
        """Parse JSON text; malformed text is a `ValidationError` like any other bad input."""
        return cls.from_json(parse_json(data))

    def to_bytes(self) -> bytes:
        """Canonical JSON (JCS), so equal records have equal octets."""
        return canonical_json(self.to_json())


class KeyedRecord(JsonRecord):
    """A record whose length grows with a number of block keys, bounded by ``max_keys``.

    ``max_keys`` is the configured quota on keys per request (decision D2); the parser refuses a
    longer array before it decodes its items, so the quota also bounds the work done on bad input.
    """

    __slots__ = ()

    @classmethod
    def from_reader(cls, r: ObjectReader, *, max_keys: int = DEFAULT_MAX_KEYS) -> Self:
        raise NotImplementedError

    @classmethod
    def from_json(cls, value: object, *, max_keys: int = DEFAULT_MAX_KEYS) -> Self:
        return cls.from_reader(ObjectReader(value), max_keys=max_keys)

    @classmethod
    def from_bytes(cls, data: bytes | str, *, max_keys: int = DEFAULT_MAX_KEYS) -> Self:
        return cls.from_json(parse_json(data), max_keys=max_keys)


# -- strings and URIs --------------------------------------------------------------------------
def check_text(value: str, member: str) -> str:
    """Reject lone surrogates: JSON can carry them, but no UTF-8 (and no JCS output) can."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValidationError(member, "must be valid Unicode (no lone surrogates)") from exc
    return value


def read_text(r: ObjectReader, name: str, *, max_length: int = 1024) -> str:
    return check_text(r.str(name, max_length=max_length), r.member(name))


def check_uri(value: object, member: str, schemes: frozenset[str] = HTTPS) -> str:
    """A role base URI; printable ASCII only, since URIs (RFC 3986) are ASCII and are compared as written."""
    text = check_str(value, member)
    if (text, schemes) in _VALID_URIS:  # a few holders and instances recur in every record
        return text
    if not _URI_CHARS.fullmatch(text):
        raise ValidationError(member, "must be a URI of printable ASCII characters")
    check_base_uri(text, member, schemes)
    if len(_VALID_URIS) >= _MAX_VALID_URIS:
        _VALID_URIS.clear()
    _VALID_URIS.add((text, schemes))
    return text


def uri_scheme(uri: str) -> str:
    """The scheme of a URI that `check_uri` accepted, lowercased as `urlsplit` does."""
    return urlsplit(uri).scheme


def read_uri(r: ObjectReader, name: str, schemes: frozenset[str] = HTTPS) -> str:
    return check_uri(r.raw(name), r.member(name), schemes)


def read_uri_list(r: ObjectReader, name: str, schemes: frozenset[str] = HTTPS,
                  *, max_items: int = MAX_URIS) -> tuple[str, ...]:
    """A non-empty array of distinct URIs."""
    uris = tuple(check_uri(v, p, schemes) for p, v in r.items(name, max_items=max_items, nonempty=True))
    check_unique(uris, r.member(name), "must not list a URI twice")
    return uris


def read_uuid(r: ObjectReader, name: str) -> str:
    """A UUID in its canonical lowercase 8-4-4-4-12 form, so one identifier has one spelling."""
    value = r.str(name, max_length=36)
    try:
        canonical = str(uuid.UUID(value))
    except ValueError as exc:
        raise ValidationError(r.member(name), "must be a UUID") from exc
    if canonical != value:
        raise ValidationError(r.member(name), "must be a UUID in lowercase 8-4-4-4-12 form")
    return value


# -- numbers -----------------------------------------------------------------------------------
def read_count(r: ObjectReader, name: str, *, minimum: int = 0) -> int:
    return r.int(name, minimum=minimum, maximum=MAX_SAFE_INT)


def read_positive(r: ObjectReader, name: str) -> int:
    """Durations such as ttl_ms: a zero lifetime or deadline is never useful, so it is rejected."""
    return r.int(name, minimum=1, maximum=MAX_SAFE_INT)


def read_finite(r: ObjectReader, name: str, *, maximum: float = math.inf, positive: bool = False) -> float:
    """A non-negative (or positive) finite number; JSON like 1e400 decodes to infinity and is refused."""
    value = r.number(name, maximum=maximum)
    if positive and value <= 0:
        raise ValidationError(r.member(name), "must be greater than 0")
    return value


# -- lists -------------------------------------------------------------------------------------
def check_list(value: object, member: str, *, max_items: int, nonempty: bool = False) -> list[object]:
    """A JSON array that is not a member of an object (an item of an array of arrays)."""
    if not isinstance(value, list):
        raise ValidationError(member, "must be an array")
    if len(value) > max_items:
        raise ValidationError(member, f"must have at most {max_items} items")
    if nonempty and not value:
        raise ValidationError(member, "must not be empty")
    return value


def check_unique(items: Sequence[Hashable], member: str, rule: str) -> None:
    """Raise at ``member[i]`` for the first item that repeats an earlier one."""
    seen: set[Hashable] = set()
    for i, item in enumerate(items):
        if item in seen:
            raise ValidationError(f"{member}[{i}]", rule)
        seen.add(item)


def read_keys(r: ObjectReader, name: str, *, max_items: int = DEFAULT_MAX_KEYS,
              nonempty: bool = True, unique: bool = False) -> tuple[bytes, ...]:
    """An array of Block Keys (hex32)."""
    keys = read_hex32_list(r, name, max_items=max_items, nonempty=nonempty)
    if unique:
        check_unique(keys, r.member(name), "must not repeat a block key")
    return keys


def read_hex32_list(r: ObjectReader, name: str, *, max_items: int, nonempty: bool) -> tuple[bytes, ...]:
    """An array of hex32, checked as one string when every item is well formed.

    Layer digests are most of a Replica Record; one hex decode of the joined items is about twice as
    fast as one per item.  Any bad item falls back to the per-item parse, which names it.
    """
    items = r.list(name, max_items=max_items, nonempty=nonempty)
    try:  # join and len() raise TypeError on a non-string item, which the per-item parse then names
        joined = "".join(items)  # type: ignore[arg-type]
        data = bytes.fromhex(joined) if set(map(len, items)) == {64} else None  # type: ignore[arg-type]
    except (TypeError, ValueError):
        data = None
    if data is not None and data.hex() == joined:  # lowercase only: fromhex alone takes uppercase and spaces
        return tuple([data[i : i + 32] for i in range(0, len(data), 32)])
    return r.hex_list(name, 32, max_items=max_items, nonempty=nonempty)


def hex_list(items: Iterable[bytes]) -> list[str]:
    return [item.hex() for item in items]


# -- ranges ------------------------------------------------------------------------------------
def check_token_range(value: object, member: str) -> TokenRange:
    """A half-open token range [start, end) with start < end: empty ranges name nothing."""
    start, end = check_pair(value, member, maximum=MAX_SAFE_INT)
    if start >= end:
        raise ValidationError(member, "start must be less than end (half-open, non-empty)")
    return start, end


def check_layer_range(value: object, member: str) -> LayerRange:
    """An inclusive layer range [first, last]; layer numbers fit the container's 32-bit fields."""
    first, last = check_pair(value, member, maximum=MAX_UINT32)
    if first > last:
        raise ValidationError(member, "first layer must not exceed last layer")
    return first, last


def first_overlap(ranges: Sequence[tuple[int, int]], *, inclusive: bool) -> int | None:
    """Index (in ``ranges``) of a range that overlaps another one, or None.

    Sorting makes this O(n log n); the index reported is the later-starting range of the first
    overlapping pair, which is one the sender has to change.
    """
    order = sorted(range(len(ranges)), key=lambda i: ranges[i])
    end_of_previous: int | None = None
    for i in order:
        start, end = ranges[i]
        if end_of_previous is not None and (start <= end_of_previous if inclusive else start < end_of_previous):
            return i
        end_of_previous = end if end_of_previous is None else max(end_of_previous, end)
    return None


def merge_ranges(ranges: Iterable[TokenRange]) -> tuple[TokenRange, ...]:
    """Sort half-open ranges and join the ones that touch or overlap."""
    merged: list[TokenRange] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return tuple(merged)


def intersect_ranges(a: Sequence[TokenRange], b: Sequence[TokenRange]) -> tuple[TokenRange, ...]:
    """Intersection of two sets of half-open ranges, merged."""
    return merge_ranges(
        (max(s1, s2), min(e1, e2)) for s1, e1 in a for s2, e2 in b if max(s1, s2) < min(e1, e2)
    )


def subtract_ranges(a: Sequence[TokenRange], b: Sequence[TokenRange]) -> tuple[TokenRange, ...]:
    """The parts of ``a`` not covered by ``b``, merged."""
    out: list[TokenRange] = []
    cuts = merge_ranges(b)
    for start, end in merge_ranges(a):
        cursor = start
        for cut_start, cut_end in cuts:
            if cut_end <= cursor or cut_start >= end:
                continue
            if cut_start > cursor:
                out.append((cursor, cut_start))
            cursor = max(cursor, cut_end)
        if cursor < end:
            out.append((cursor, end))
    return merge_ranges(out)


