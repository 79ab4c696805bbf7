"""Normalise backend text before it is tokenised into a Context Span.

Why: SentencePiece splits digits one piece per digit, so "1234567" costs seven frames and reads badly;
every number-like thing is therefore spelled out in English words (`num2words`). And backend text is
data, never control: anything that could tokenise to a control or byte-fallback piece is removed.

Rules, applied in this order to scrubbed text (see `scrub_control_text`):

1. Non-ASCII digits (Arabic-Indic, Devanagari, ...) become ASCII digits.
2. ISO dates `2026-11-30` and slash dates `m/d/yyyy` -> "November thirtieth, twenty twenty-six". Slash
   dates are month-first (US order) unless the first field is above 12 and the second is not, as in
   `30/11/2026`. Impossible dates are left to the number rules.
3. Month-name dates (`November 30, 2026`, `Nov. 30th`, `30 November 2026`, `30th of November`) ->
   "November thirtieth[, twenty twenty-six]". Months must be capitalised.
4. Clock times `h:mm[:ss]` (hour <= 23) and `h am`/`h pm` (hour 1-12): "3:45 pm" -> "three forty-five p m",
   "3:05" -> "three oh five", "12:00" -> "twelve o'clock", "9 AM" -> "nine a m".
5. Money with `$ € £ ¥` or `USD EUR GBP JPY` before or after the amount, optional sign and scale (`million`,
   `k`, `m`, `bn`, ...): "$12.50" -> "twelve dollars and fifty cents", "$4.5 million" -> "four point five
   million dollars", "-$1" -> "minus one dollar".
6. Decades `1990s`, `'90s` -> "nineteen nineties", "nineties".
7. Ordinals `1st`, `23rd` -> "first", "twenty-third".
8. Dotted runs of three or more numbers (versions, addresses) -> "one dot two dot three".
9. Ranges `5-10`, `5 – 10` -> "five to ten".
10. Every other number: optional leading minus -> "minus", thousands separators, decimals read digit by digit
    after "point". Year rule: a bare four-digit integer 1100-2099 (no sign, separator or decimals) is read
    as a year ("nineteen ninety-nine") unless a unit, currency or percent follows it or a letter or digit
    is attached to it. Integers with a leading zero or more than 18 digits are read digit by digit.
11. Symbols: `&` and, `+` plus, `=` equals, `%` percent, `°C`/`°F`/`°` degrees Celsius/Fahrenheit/degrees.

Spelled-out words are set off by a space from an adjacent letter, digit or spoken symbol (`& + = % ° $ € £ ¥`)
so that no two words merge; other neighbours (punctuation, brackets, quotes, hyphens) stay attached.
"""

import re
import unicodedata
from collections.abc import Callable

from num2words import num2words

_MARKUP = re.compile(r"</?(?:ret|system|s|pad|unk|0x[0-9a-f]{2})>", re.IGNORECASE)


def scrub_control_text(text: str) -> str:
    """Remove everything that could reach the tokeniser as a control or byte-fallback piece.

    NFKC first, as SentencePiece normalises that way too (so `＜ret＞` is markup); whitespace runs become one
    space and the ends are stripped; characters of Unicode category C (control, format, surrogate, private
    use, unassigned) are dropped; markup spelling a control token (`<ret>`, `<system>`, `<s>`, `</s>`,
    `<pad>`, `<unk>`, `<0x00>`..`<0xFF>`, any case) is removed. Repeated until stable, because a removal can
    join the halves of new markup (`<<s>s>`) or let NFKC compose across the removed character.
    """
    while True:
        cleaned = unicodedata.normalize("NFKC", text)
        cleaned = "".join(ch for ch in cleaned if ch.isspace() or unicodedata.category(ch)[0] != "C")
        cleaned = " ".join(_MARKUP.sub("", cleaned).split())
        if cleaned == text:
            return cleaned
        text = cleaned


_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_MAX_CARDINAL_DIGITS = 18  # beyond quadrillions the names stop helping a listener; such runs are identifiers


def _digits(digits: str) -> str:
    return " ".join(_DIGIT_WORDS[int(d)] for d in digits)


def _integer(digits: str) -> str:
    """Cardinal words; codes with a leading zero and very long runs are read digit by digit."""
    if (len(digits) > 1 and digits[0] == "0") or len(digits) > _MAX_CARDINAL_DIGITS:
        return _digits(digits)
    return num2words(int(digits)).replace(",", "")  # num2words' commas would read as pauses


def _ordinal(digits: str) -> str:
    if (len(digits) > 1 and digits[0] == "0") or len(digits) > _MAX_CARDINAL_DIGITS:
        return _digits(digits)
    return num2words(int(digits), to="ordinal").replace(",", "")


def _year(year: int) -> str:
    return num2words(year, to="year")


def _amount(integer: str, fraction: str | None) -> str:
    """`integer` may carry thousands separators or be empty (".5"); the fraction is read digit by digit."""
    words = _integer(integer.replace(",", "")) if integer else ""
    if fraction is not None:
        words = f"{words} point {_digits(fraction)}".strip()
    return words


_NOT_A_YEAR = re.compile(
    r" ?(?:[%°$€£¥]|(?:percent|per cent|dollars?|euros?|pounds?|pence|cents?|yen|usd|eur|gbp|jpy"
    r"|[kcm]?m|[km]?g|lbs?|oz|ft|feet|inch(?:es)?|mi|miles?|(?:kilo|centi|milli)?(?:metres?|meters?|grams?)"
    r"|mph|kph|km/h|seconds?|minutes?|hours?|days?|weeks?|months?|years?|times)(?![a-z]))|[^\W_]",
    re.IGNORECASE,
)


def _quantity(integer: str, fraction: str | None, following: str) -> str:
    """An unsigned number, read as a year when it is a bare 1100-2099 integer without a unit after it."""
    if (
        fraction is None
        and len(integer) == 4
        and integer.isdigit()
        and 1100 <= int(integer) <= 2099
        and not _NOT_A_YEAR.match(following)
    ):
        return _year(int(integer))
    return _amount(integer, fraction)


_INT = r"[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+"
_SIGN = r"(?:(?<![\w.,])[-−])?"


def _numeral(name: str) -> str:
    return rf"(?P<{name}>{_INT})(?:\.(?P<{name}_frac>[0-9]+))?"


_MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip
_MONTH_BY_NAME = (
    {name: number for number, name in enumerate(_MONTHS, 1)}
    | {name[:3]: number for number, name in enumerate(_MONTHS, 1)}
    | {"Sept": 9}
)
_MONTH = rf"(?P<month>{'|'.join(sorted(_MONTH_BY_NAME, key=len, reverse=True))})(?:\.(?= [0-9]))?"
_DAY = r"(?P<day>[0-9]{1,2})(?i:st|nd|rd|th)?"
_YEAR = r"(?:,? (?P<year>[0-9]{4}))?"


def _date(month: int, day: int, year: str | None) -> str | None:
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    words = f"{_MONTHS[month - 1]} {num2words(day, to='ordinal')}"
    return f"{words}, {_year(int(year))}" if year else words


def _read_iso_date(m: re.Match[str]) -> str | None:
    return _date(int(m["month"]), int(m["day"]), m["year"])


def _read_slash_date(m: re.Match[str]) -> str | None:
    first, second = int(m["first"]), int(m["second"])
    if first > 12 and second <= 12:
        return _date(second, first, m["year"])
    return _date(first, second, m["year"])


def _read_named_date(m: re.Match[str]) -> str | None:
    return _date(_MONTH_BY_NAME[m["month"]], int(m["day"]), m["year"])


def _read_clock(m: re.Match[str]) -> str | None:
    hour, minute, second, meridiem = int(m["hour"]), m["minute"], m["second"], m["meridiem"]
    words = _integer(str(hour))
    if minute is None:
        if meridiem is None or not 1 <= hour <= 12:
            return None
    else:
        if hour > 23 or int(minute) > 59 or (second is not None and int(second) > 59):
            return None
        minutes = int(minute)
        if 0 < minutes < 10:
            words += f" oh {_DIGIT_WORDS[minutes]}"
        elif minutes:
            words += f" {_integer(minute)}"
        elif not meridiem:
            words += " o'clock"
        if second is not None and int(second):
            words += f" and {_integer(str(int(second)))} second{'s' if int(second) > 1 else ''}"
    return f"{words} {meridiem.lower()} m" if meridiem else words


_CURRENCIES = {  # symbol -> singular, plural, minor singular, minor plural
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", None, None),
}
_CODES = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥"}
_SCALES = {"k": "thousand", "m": "million", "mn": "million", "b": "billion", "bn": "billion",
           "t": "trillion", "tn": "trillion"}  # fmt: skip
_SCALE = r"(?P<scale> ?(?:thousand|million|billion|trillion)|(?:[kKmMbBtT]|mn|bn|tn))(?![A-Za-z])"
_CURRENCY_SYMBOL = r"[$€£¥]"
_CURRENCY_CODE = r"\b(?:USD|EUR|GBP|JPY)\b"


def _read_money(m: re.Match[str]) -> str:
    one, many, minor_one, minor_many = _CURRENCIES[_CODES.get(m["currency"], m["currency"])]
    integer = m["amount"].replace(",", "").lstrip("0") or "0"
    fraction = m["amount_frac"]
    sign = "minus " if "-" in m[0] or "−" in m[0] else ""  # only a sign can put a minus in a money match
    if m["scale"]:
        scale = m["scale"].strip()
        return f"{sign}{_amount(integer, fraction)} {_SCALES.get(scale.lower(), scale)} {many}"
    if fraction is not None and len(fraction) == 2 and minor_one:
        minor = int(fraction)  # `integer` stays a string: int() refuses more than 4300 digits
        parts = [f"{_integer(integer)} {one if integer == '1' else many}"] if integer != "0" or not minor else []
        if minor:
            parts.append(f"{_integer(str(minor))} {minor_one if minor == 1 else minor_many}")
        return sign + " and ".join(parts)
    return f"{sign}{_amount(integer, fraction)} {one if integer == '1' and fraction is None else many}"


def _read_decade(m: re.Match[str]) -> str:
    if m["century"]:
        year = int(m["century"])
        words = _year(year) if 1100 <= year <= 2099 else _integer(m["century"])
    else:
        words = _integer(m["short"])
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def _read_ordinal(m: re.Match[str]) -> str:
    return _ordinal(m["number"].replace(",", ""))


def _read_dotted(m: re.Match[str]) -> str:
    return " dot ".join(_integer(part) for part in m[0].split("."))


def _read_range(m: re.Match[str]) -> str:
    following = m.string[m.end() :]
    high = _quantity(m["high"], m["high_frac"], following)
    if m["sign"]:
        return f"minus {_amount(m['low'], m['low_frac'])} to {high}"
    return f"{_quantity(m['low'], m['low_frac'], following)} to {high}"


def _read_number(m: re.Match[str]) -> str:
    integer, fraction = m["number"] or "", m["number_frac"] or m["bare_frac"]
    if m["sign"]:
        return f"minus {_amount(integer, fraction)}"
    return _quantity(integer, fraction, m.string[m.end() :])


_SYMBOLS = {"&": "and", "+": "plus", "=": "equals", "%": "percent", "°": "degrees",
            "C": "degrees Celsius", "F": "degrees Fahrenheit"}  # fmt: skip


def _read_symbol(m: re.Match[str]) -> str:
    return _SYMBOLS[m["unit"] or m[0]]


_Reader = Callable[[re.Match[str]], str | None]

_RULES: tuple[tuple[re.Pattern[str], _Reader], ...] = (
    (
        re.compile(r"(?<![\w.])(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})(?![0-9])"),
        _read_iso_date,
    ),
    (
        re.compile(r"(?<![\w./])(?P<first>[0-9]{1,2})/(?P<second>[0-9]{1,2})/(?P<year>[0-9]{4})(?![0-9/])"),
        _read_slash_date,
    ),
    (re.compile(rf"(?<!\w){_MONTH} {_DAY}{_YEAR}(?!\w|[:.,][0-9])"), _read_named_date),
    (re.compile(rf"(?<![\w.,]){_DAY} (?:of )?{_MONTH}{_YEAR}(?!\w)"), _read_named_date),
    (
        re.compile(
            r"(?<![0-9:.,])(?P<hour>[0-9]{1,2})(?::(?P<minute>[0-9]{2})(?::(?P<second>[0-9]{2}))?)?(?![0-9])"
            r"(?: ?(?P<meridiem>[AaPp])(?:\. ?)?[Mm](?:\.(?= ?[a-z,;:!?)]))?(?![A-Za-z]))?"
        ),
        _read_clock,
    ),
    (
        re.compile(
            rf"{_SIGN}(?P<currency>{_CURRENCY_SYMBOL}|{_CURRENCY_CODE}) ?[-−]?"
            rf"{_numeral('amount')}(?:{_SCALE})?"
        ),
        _read_money,
    ),
    (
        re.compile(
            rf"{_SIGN}(?<![0-9.,]){_numeral('amount')}(?:{_SCALE})? ?"
            rf"(?P<currency>{_CURRENCY_SYMBOL}|{_CURRENCY_CODE})"
        ),
        _read_money,
    ),
    (re.compile(r"(?<![\w.,])(?:(?P<century>[0-9]{3}0)|'?(?P<short>[1-9]0))s(?!\w)"), _read_decade),
    (re.compile(rf"(?<![\w.,])(?P<number>{_INT})(?i:st|nd|rd|th)(?!\w)"), _read_ordinal),
    (re.compile(r"(?<![0-9.])[0-9]+(?:\.[0-9]+){2,}"), _read_dotted),
    (
        re.compile(rf"(?P<sign>{_SIGN})(?<![0-9.,]){_numeral('low')}(?:-| ?– ?){_numeral('high')}"),
        _read_range,
    ),
    (
        re.compile(rf"(?P<sign>{_SIGN})(?:{_numeral('number')}|(?<![\w.])\.(?P<bare_frac>[0-9]+))"),
        _read_number,
    ),
    (re.compile(r"°(?: ?(?P<unit>[CF])(?![A-Za-z]))?|[&+=%]"), _read_symbol),
)

_SPOKEN_SYMBOLS = frozenset("&+=%°$€£¥")


def _apply(pattern: re.Pattern[str], read: _Reader, text: str) -> str:
    """Substitute a rule's words, spaced from adjacent letters, digits and spoken symbols so none merge."""

    def spaced(index: int) -> str:
        merges = 0 <= index < len(text) and (text[index].isalnum() or text[index] in _SPOKEN_SYMBOLS)
        return " " if merges else ""

    def substitute(m: re.Match[str]) -> str:
        words = read(m)
        if words is None:
            return m[0]
        return f"{spaced(m.start() - 1)}{words}{spaced(m.end())}"

    return pattern.sub(substitute, text)


def normalise_text(text: str) -> str:
    """Turn backend text into speakable, control-free text: numbers, dates, times, money, symbols in words.

    The result has no digits and is stable: normalising it again changes nothing.
    """
    text = scrub_control_text(text)
    text = "".join(str(unicodedata.digit(ch)) if ch.isdigit() else ch for ch in text)
    for pattern, read in _RULES:
        text = _apply(pattern, read, text)
    return scrub_control_text(text)  # rejoins the padded spaces and re-normalises across the inserted words
