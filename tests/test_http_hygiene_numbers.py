"""`kvsp.numbers`: the one parser for integers read from paths, queries and header fields.

Every input is either accepted as the integer its ASCII digits spell or refused with `ValidationError`
naming the parameter; no other exception (int()'s bare ValueError above all) ever escapes.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsp.errors import ValidationError
from kvsp.numbers import MAX_DIGITS, parse_decimal, parse_decimal_range

REFUSED = [
    "",  # nothing
    "\u00b2",  # superscript two: str.isdigit() says yes, int() raises ValueError
    "1\u00b2",
    "\uff11",  # fullwidth one: int() accepts it
    "\u0663",  # Arabic-Indic three: int() accepts it
    "\u09e7",  # Bengali one
    "+1",  # int() accepts a sign
    "-1",
    " 1",  # int() strips whitespace
    "1 ",
    "1\n",
    "\t1",
    "1_000",  # int() accepts separators
    "0x10",
    "1e3",
    "1.0",
    "١٢",
    "9" * 5000,  # int() raises ValueError past 4,300 digits
    "1" * (MAX_DIGITS + 1),
]


@pytest.mark.parametrize("text", REFUSED)
def test_anything_but_ascii_digits_is_refused_with_the_member_named(text: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_decimal(text, "codec", maximum=2**64)
    assert info.value.member == "codec"


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("7", 7), ("007", 7), ("65535", 65535),
                                             ("9" * MAX_DIGITS, 10**MAX_DIGITS - 1)])
def test_ascii_digits_are_the_integer_they_spell(text: str, value: int) -> None:
    assert parse_decimal(text, "n", maximum=10**MAX_DIGITS) == value


@pytest.mark.parametrize(("text", "ok"), [("0", False), ("1", True), ("65535", True), ("65536", False),
                                          ("99999999999999999999", False)])
def test_bounds_are_inclusive(text: str, ok: bool) -> None:
    if ok:
        assert parse_decimal(text, "codec", minimum=1, maximum=0xFFFF) == int(text)
    else:
        with pytest.raises(ValidationError, match="between 1 and 65535"):
            parse_decimal(text, "codec", minimum=1, maximum=0xFFFF)


def test_bounds_that_are_not_a_non_negative_range_are_a_programming_error() -> None:
    with pytest.raises(ValueError, match="bounds"):
        parse_decimal("1", "n", minimum=-1, maximum=5)
    with pytest.raises(ValueError, match="bounds"):
        parse_decimal("1", "n", minimum=5, maximum=4)


@given(st.text(max_size=30))
def test_any_text_is_accepted_exactly_when_it_is_ascii_digits(text: str) -> None:
    expected = text.isascii() and text.isdigit() and 0 < len(text) <= MAX_DIGITS
    try:
        value = parse_decimal(text, "n", maximum=10**MAX_DIGITS)
    except ValidationError:
        assert not expected
    else:
        assert expected and value == int(text)


@pytest.mark.parametrize(("text", "value"), [("0-1", (0, 1)), ("3-70", (3, 70)), ("010-011", (10, 11))])
def test_a_range_is_two_decimals_with_a_below_b(text: str, value: tuple[int, int]) -> None:
    assert parse_decimal_range(text, "tokens", maximum=100) == value


@pytest.mark.parametrize("text", ["", "5", "5-", "-5", "5-5", "6-5", "\u00b2-3", "1-\uff13", "+1-3", "1-+3",
                                  " 1-3", "1 -3", "1-3-5", "0-101", "1-" + "9" * 5000])
def test_a_bad_range_is_refused_with_the_member_named(text: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_decimal_range(text, "tokens", maximum=100)
    assert info.value.member == "tokens"
