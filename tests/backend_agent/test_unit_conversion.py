"""Unit conversions, their aliases and their refusals."""

import pytest

from backend_agent.tools.base import ToolError
from backend_agent.tools.unit_conversion import TOOL, convert, find_unit


@pytest.mark.parametrize(
    ("value", "source", "target", "expected"),
    [
        (10, "miles", "kilometres", 16.09344),
        (1, "km", "m", 1000),
        (12, "inches", "feet", 1),
        (3, "meters", "ft", 9.842519685),
        (1, "nautical mile", "metres", 1852),
        (1, "kg", "lbs", 2.2046226218),
        (16, "ounces", "pound", 1),
        (1, "stone", "kilograms", 6.35029318),
        (1, "gallon", "liters", 3.785411784),
        (1, "litre", "ml", 1000),
        (2, "cups", "fluid ounces", 16),
        (3, "teaspoons", "tablespoon", 1),
        (100, "degrees celsius", "fahrenheit", 212),
        (-40, "F", "C", -40),
        (0, "kelvin", "celsius", -273.15),
        (98.6, "°F", "K", 310.15),
        (100, "km/h", "mph", 62.137119224),
        (10, "knots", "m/s", 5.144444444),
        (90, "minutes", "hours", 1.5),
        (1, "week", "days", 7),
        (1, "GiB", "MiB", 1024),
        (1, "gigabyte", "megabits", 8000),
        (8, "bits", "bytes", 1),
    ],
)
def test_conversions(value: float, source: str, target: str, expected: float) -> None:
    assert convert(value, find_unit(source), find_unit(target)) == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_tool_text_and_spoken_numbers() -> None:
    result = TOOL.run({"value": 10, "from_unit": "miles", "to_unit": "km"})
    assert result.text == "10 miles is 16.0934 kilometres."
    assert TOOL.run({"value": "ten", "from_unit": "Miles", "to_unit": "kilometres"}).text == result.text
    result = TOOL.run({"value": 1, "from_unit": "kilogram", "to_unit": "grams"})
    assert result.text == "1 kilogram is 1000 grams."


@pytest.mark.parametrize(
    "args",
    [
        {"value": 1, "from_unit": "kg", "to_unit": "km"},
        {"value": 1, "from_unit": "parsec", "to_unit": "m"},
        {"value": "lots", "from_unit": "m", "to_unit": "km"},
        {"value": 1, "from_unit": "m"},
    ],
)
def test_refusals(args: dict) -> None:
    with pytest.raises(ToolError):
        TOOL.run(args)
