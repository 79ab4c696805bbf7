"""Numbers in text, both ways: spoken number words to digits (ASR often writes "twelve"), and results
back to short, readable digits for a span."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction

_UNITS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19,
}  # fmt: skip
_TENS = {
    "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
    "ninety": 90,
}  # fmt: skip
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_WORDS = sorted([*_UNITS, *_TENS, "hundred", *_SCALES], key=len, reverse=True)
_W = r"(?:" + "|".join(_WORDS) + r")"
_DIGIT_WORDS = r"(?:zero|one|two|three|four|five|six|seven|eight|nine)"
_RUN = re.compile(rf"\b{_W}(?:(?:\s+|-)(?:and\s+)?{_W})*(?:\s+point(?:\s+{_DIGIT_WORDS})+)?\b", re.IGNORECASE)


def _integers(words: list[str]) -> list[int]:
    """Read number words into one or more integers, splitting where the sequence stops being one number
    ("twenty one" is 21, "one two" is 1 and 2)."""
    numbers: list[int] = []
    total = current = 0
    last: str | None = None
    for word in words:
        if word in _UNITS or word in _TENS:
            kind = "tens" if word in _TENS else "unit"
            if last in ("unit", "tens") and not (last == "tens" and kind == "unit" and _UNITS[word] < 10):
                numbers.append(total + current)
                total = current = 0
            current += _UNITS.get(word) or _TENS.get(word, 0)
            last = kind
        elif word == "hundred":
            current = max(current, 1) * 100
            last = "scale"
        else:
            total += max(current, 1) * _SCALES[word]
            current = 0
            last = "scale"
    numbers.append(total + current)
    return numbers


def _convert_run(match: re.Match[str]) -> str:
    text = match.group(0).lower()
    whole, _, fraction = text.partition(" point ")
    words = [w for w in re.split(r"[\s-]+", whole) if w and w != "and"]
    numbers = [str(n) for n in _integers(words)]
    if fraction:
        numbers[-1] += "." + "".join(str(_UNITS[w]) for w in fraction.split())
    return " ".join(numbers)


def replace_number_words(text: str) -> str:
    """Replace spoken numbers by digits: "one hundred and five point two" -> "105.2"."""
    return _RUN.sub(_convert_run, text)


def format_number(value: Fraction | float | int, significant: int = 10) -> str:
    """Digits for speaking: exact integers stay exact, other values get at most `significant` digits and
    no trailing zeros."""
    if isinstance(value, Fraction) and value.denominator == 1:
        return str(value.numerator)
    if isinstance(value, int):
        return str(value)
    number = float(value)
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    if number == 0:
        return "0"
    text = format(Decimal(f"{number:.{significant}g}"), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text
