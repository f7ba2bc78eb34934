"""Decimal integers read from text on the wire: path segments, query parameters, header fields.

The one parser for every such integer.  ``int(text)`` is not a parser for network input: it accepts
any Unicode decimal digit (Arabic-Indic, fullwidth), signs, ``_`` separators and surrounding
whitespace, and raises a bare ``ValueError`` for superscripts that ``str.isdigit`` approves ("²") and
for more than 4,300 digits.  Here an integer is 1 to `MAX_DIGITS` ASCII digits (RFC 9110's
``1*DIGIT``, leading zeros allowed) within the caller's bounds, and every refusal is a
`ValidationError` naming the parameter, which the HTTP adapters answer with 400 Problem Details.
"""

from __future__ import annotations

from typing import Final

from kvsp.errors import ValidationError

# 2**64 has 20 digits: any bound a caller can mean fits, and int() of 20 digits costs nothing.
MAX_DIGITS: Final = 20


def parse_decimal(text: str, member: str, *, minimum: int = 0, maximum: int) -> int:
    """``text`` as a non-negative decimal integer in ``[minimum, maximum]``, else `ValidationError`."""
    if minimum < 0 or maximum < minimum:
        raise ValueError(f"bounds [{minimum}, {maximum}] are not a range of non-negative integers")
    # isdigit() alone also approves superscripts and other scripts' digits; on ASCII text it is [0-9].
    if not 0 < len(text) <= MAX_DIGITS or not text.isascii() or not text.isdigit():
        raise ValidationError(member, f"must be a decimal integer (ASCII digits) between {minimum} and {maximum}")
    value = int(text)
    if not minimum <= value <= maximum:
        raise ValidationError(member, f"must be between {minimum} and {maximum}")
    return value


def parse_decimal_range(text: str, member: str, *, maximum: int) -> tuple[int, int]:
    """``a-b`` with ``a < b``, both decimal integers up to ``maximum``: a half-open range ``[a, b)``."""
    start, sep, end = text.partition("-")
    rule = f"must be a-b with decimal integers a < b <= {maximum} (a half-open range)"
    if not sep:
        raise ValidationError(member, rule)
    try:
        first = parse_decimal(start, member, maximum=maximum)
        last = parse_decimal(end, member, maximum=maximum)
    except ValidationError as exc:
        raise ValidationError(member, rule) from exc
    if first >= last:
        raise ValidationError(member, rule)
    return first, last
