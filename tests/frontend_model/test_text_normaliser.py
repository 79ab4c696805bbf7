import re
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frontend_model.span.normaliser import normalise_text, scrub_control_text

_CONTROL_MARKUP = re.compile(r"<0x[0-9a-f]{2}>|</?(?:ret|system|s|pad|unk)>", re.IGNORECASE)


def test_budget_sentence():
    text = "The 1999 budget was $4.5 million, 12% more than in 1998, at 3:45 pm."
    assert normalise_text(text) == (
        "The nineteen ninety-nine budget was four point five million dollars, twelve percent more than in "
        "nineteen ninety-eight, at three forty-five p m."
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$4.5 million", "four point five million dollars"),
        ("$12.50", "twelve dollars and fifty cents"),
        ("$1", "one dollar"),
        ("$1.00", "one dollar"),
        ("$0.50", "fifty cents"),
        ("$1.01", "one dollar and one cent"),
        ("$4.5", "four point five dollars"),
        ("$1,000,000", "one million dollars"),
        ("$5m", "five million dollars"),
        ("$2bn", "two billion dollars"),
        ("$5 thousand", "five thousand dollars"),
        ("€20", "twenty euros"),
        ("£3", "three pounds"),
        ("£3.01", "three pounds and one penny"),
        ("£0.50", "fifty pence"),
        ("¥500", "five hundred yen"),
        ("20 USD", "twenty dollars"),
        ("20 EUR", "twenty euros"),
        ("1 GBP", "one pound"),
        ("USD 20", "twenty dollars"),
        ("20€", "twenty euros"),
        ("-$5", "minus five dollars"),
        ("$-5", "minus five dollars"),
        ("-20 EUR", "minus twenty euros"),
        ("I have $ left", "I have $ left"),
    ],
)
def test_currency(text, expected):
    assert normalise_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12%", "twelve percent"),
        ("4.5%", "four point five percent"),
        ("12 %", "twelve percent"),
        ("-3%", "minus three percent"),
        ("10-20%", "ten to twenty percent"),
        ("1999%", "one thousand nine hundred and ninety-nine percent"),
    ],
)
def test_percentages(text, expected):
    assert normalise_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1999", "nineteen ninety-nine"),
        ("in 1998", "in nineteen ninety-eight"),
        ("The 1999 budget", "The nineteen ninety-nine budget"),
        ("2000", "two thousand"),
        ("2005", "two thousand and five"),
        ("2026", "twenty twenty-six"),
        ("1100", "eleven hundred"),
        ("1999-2005", "nineteen ninety-nine to two thousand and five"),
        ("the 1990s and the '80s", "the nineteen nineties and the eighties"),
        # Not years: outside 1100-2099, a separator, a sign, a decimal, or a unit after it.
        ("1099", "one thousand and ninety-nine"),
        ("2100", "two thousand one hundred"),
        ("1,999", "one thousand nine hundred and ninety-nine"),
        ("-1999", "minus one thousand nine hundred and ninety-nine"),
        ("1999.5", "one thousand nine hundred and ninety-nine point five"),
        ("1500 km", "one thousand five hundred km"),
        ("1999 dollars", "one thousand nine hundred and ninety-nine dollars"),
        # The rule is lexical, so a bare count in the year range reads as a year.
        ("1234 things", "twelve thirty-four things"),
    ],
)
def test_years(text, expected):
    assert normalise_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3:45 pm", "three forty-five p m"),
        ("3:45pm", "three forty-five p m"),
        ("3:45 PM", "three forty-five p m"),
        ("15:45", "fifteen forty-five"),
        ("9 am", "nine a m"),
        ("9 AM", "nine a m"),
        ("12:00", "twelve o'clock"),
        ("12:00 pm", "twelve p m"),
        ("3:05", "three oh five"),
        ("10:30:15", "ten thirty and fifteen seconds"),
        ("at 3 p.m. tomorrow", "at three p m tomorrow"),
        ("at 3 p.m., then", "at three p m, then"),
        ("Done at 3 p.m. Then", "Done at three p m. Then"),
        ("5 amps", "five amps"),
        ("25:30", "twenty-five:thirty"),
    ],
)
def test_times(text, expected):
    assert normalise_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30", "November thirtieth, twenty twenty-six"),
        ("on 2026-11-30, we", "on November thirtieth, twenty twenty-six, we"),
        ("30/11/2026", "November thirtieth, twenty twenty-six"),
        ("11/30/2026", "November thirtieth, twenty twenty-six"),
        ("05/06/2026", "May sixth, twenty twenty-six"),
        ("November 30, 2026", "November thirtieth, twenty twenty-six"),
        ("November 30 2026", "November thirtieth, twenty twenty-six"),
        ("Nov. 30th, 2026", "November thirtieth, twenty twenty-six"),
        ("30 November 2026", "November thirtieth, twenty twenty-six"),
        ("30th of November", "November thirtieth"),
        ("on March 3", "on March third"),
        ("2026-11-30T15:45:00Z", "November thirtieth, twenty twenty-six T fifteen forty-five Z"),
        ("1st", "first"),
        ("2nd", "second"),
        ("23rd", "twenty-third"),
        ("the 100th time", "the one hundredth time"),
    ],
)
def test_dates_and_ordinals(text, expected):
    assert normalise_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,234,567", "one million two hundred and thirty-four thousand five hundred and sixty-seven"),
        ("1234567", "one million two hundred and thirty-four thousand five hundred and sixty-seven"),
        ("3.14", "three point one four"),
        ("0.05", "zero point zero five"),
        (".5", "point five"),
        ("-5", "minus five"),
        ("(-5)", "(minus five)"),
        ("5-10", "five to ten"),
        ("5 – 10", "five to ten"),
        ("007", "zero zero seven"),
        ("COVID-19", "COVID-nineteen"),
        ("v1.2.3", "v one dot two dot three"),
        ("A4 paper", "A four paper"),
        (
            "123456789012345678",
            "one hundred and twenty-three quadrillion four hundred and fifty-six trillion seven hundred and "
            "eighty-nine billion twelve million three hundred and forty-five thousand six hundred and "
            "seventy-eight",
        ),
        (
            "1234567890123456789",
            "one two three four five six seven eight nine zero one two three four five six seven eight nine",
        ),
        ("١٢٣", "one hundred and twenty-three"),
        ("x²", "x two"),
    ],
)
def test_plain_numbers(text, expected):
    assert normalise_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("R&D", "R and D"),
        ("salt & pepper", "salt and pepper"),
        ("1+1=2", "one plus one equals two"),
        ("C++", "C plus plus"),
        ("25°C", "twenty-five degrees Celsius"),
        ("-5 °F", "minus five degrees Fahrenheit"),
        ("30°", "thirty degrees"),
        ("5km and 10 kg", "five km and ten kg"),
        ("“1999”, (12), #7, <5>", "“nineteen ninety-nine”, (twelve), #seven, <five>"),
        ("US$5", "US five dollars"),
    ],
)
def test_symbols(text, expected):
    assert normalise_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  a\t\tb\n\nc \r\n d  ", "a b c d"),
        ("a\x00b\x08c\x09d", "abc d"),
        ("zero\u200bwidth\ufeff soft\xadhyphen", "zerowidth softhyphen"),
        ("a\x7f\x1bb", "ab"),
        ("x<ret>y", "xy"),
        ("<system>You are kind.<system>", "You are kind."),
        ("<s>hi</s> <pad><unk><PAD>", "hi"),
        ("<0x00><0x08><0x09><0xff><0XFF>bytes", "bytes"),
        ("<<ret>ret>", ""),
        ("＜ret＞", ""),
        ("<r\x00et>", ""),
        ("a <0xZZ> and <b> stay", "a <0xZZ> and <b> stay"),
    ],
)
def test_scrub_control_text(text, expected):
    assert scrub_control_text(text) == expected


def test_normalise_scrubs_control_text():
    assert normalise_text("Call\tme <ret>at\n5 pm<0x09>\x00.") == "Call me at five p m."


def test_no_digit_survives():
    texts = [
        "Flight BA2490 leaves at 07:45 from gate 12B on 2026-03-01.",
        "Order #00123: 3 x $19.99 = $59.97 (incl. 20% VAT).",
        "Call +44 20 7946 0958 or 555-0100 ext. 42.",
        "Pi is 3.14159265358979323846264338327950288419716939937510.",
        "IPv4 192.168.0.1, version 2.10.3-rc1, build 1a2b3c4d5e.",
        "Temperatures from -40°F to 45.5 °C; 1/2 cup; ¾ mile; 10^6; 1e-9.",
        "In the 1800s, the 20th century, and on 31/12/1999 at 23:59:59.",
        "Scores 3:2, 10:1, 99:99; ratio 16:9; time 24:00; 1:00:00 am.",
        "Coordinates 48.8566° N, 2.3522° E; 42nd St & 5th Ave.",
        "٣ ५ ௭ ０１２ ¹²³ ①②③ ⅻ 𝟗𝟘",
        "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
        "$$5 €€10 £-.5 ¥,1 5,,6 7..8 9--10 11––12 ::13 14::",
    ]
    for text in texts:
        out = normalise_text(text)
        assert not any(ch.isdigit() for ch in out), (text, out)


_TOKENS = st.sampled_from(
    [
        "0", "1", "7", "12", "1999", "2026", "000", "1,234", "3.14", ".5", "-", "−", "–", ":", "/", ".", ",",
        "$", "€", "£", "¥", "USD", "EUR", "%", "°", "C", "F", "&", "+", "=", "am", "pm", "p.m.", "st", "th",
        "s", "'", "k", "bn", " million", "November", "Nov", "of", "<", ">", "ret", "0x0A", "<ret>", "<0x08>",
        "/", "</s>", "<s", "x", " ", "\t", "\n", "\x00", "\x08", "\u200b", "\u0301", "²", "½", "١", "＜",
    ]
)  # fmt: skip
_NUMERIC_TEXT = st.lists(_TOKENS, max_size=14).map("".join)
_ANY_TEXT = st.one_of(st.text(max_size=60), _NUMERIC_TEXT)


def _assert_clean(out: str) -> None:
    assert not any(ch.isdigit() for ch in out)
    assert not any(unicodedata.category(ch) in ("Cc", "Cf") for ch in out)
    assert not _CONTROL_MARKUP.search(out)
    assert "  " not in out
    assert out == out.strip()


@settings(max_examples=300, deadline=None)
@given(_ANY_TEXT)
def test_normalise_properties(text):
    out = normalise_text(text)
    _assert_clean(out)
    assert normalise_text(out) == out


@settings(max_examples=200, deadline=None)
@given(_ANY_TEXT)
def test_scrub_properties(text):
    out = scrub_control_text(text)
    assert not any(unicodedata.category(ch) in ("Cc", "Cf") for ch in out)
    assert not _CONTROL_MARKUP.search(out)
    assert "  " not in out
    assert out == out.strip()
    assert scrub_control_text(out) == out
