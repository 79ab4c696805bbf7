"""Unit conversion for the everyday quantities people ask a voice agent about. Every unit is a factor to
its dimension's base unit (temperature, being affine, is handled apart); aliases cover spoken names,
plurals, British and American spellings and symbols."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from backend_agent.tools.base import Tool, ToolError, ToolResult, required_str
from backend_agent.tools.numbers import format_number, replace_number_words


@dataclass(frozen=True)
class Unit:
    """A unit: its dimension, its factor to the dimension's base unit, and its spoken name (singular,
    plural)."""

    dimension: str
    factor: float
    singular: str
    plural: str


# dimension -> {(singular, plural, aliases...): factor to base}; base units: metre, kilogram, litre,
# kelvin (special), metre per second, second, byte.
_TABLE: dict[str, dict[tuple[str, ...], float]] = {
    "length": {
        ("metre", "metres", "meter", "meters", "m"): 1.0,
        ("kilometre", "kilometres", "kilometer", "kilometers", "km", "kms", "klick"): 1000.0,
        ("centimetre", "centimetres", "centimeter", "centimeters", "cm"): 0.01,
        ("millimetre", "millimetres", "millimeter", "millimeters", "mm"): 0.001,
        ("mile", "miles", "mi"): 1609.344,
        ("yard", "yards", "yd", "yds"): 0.9144,
        ("foot", "feet", "ft"): 0.3048,
        ("inch", "inches", "in"): 0.0254,
        ("nautical mile", "nautical miles", "nmi"): 1852.0,
    },
    "mass": {
        ("kilogram", "kilograms", "kg", "kgs", "kilo", "kilos"): 1.0,
        ("gram", "grams", "g", "gramme", "grammes"): 0.001,
        ("milligram", "milligrams", "mg"): 1e-6,
        ("tonne", "tonnes", "metric ton", "metric tons", "t"): 1000.0,
        ("pound", "pounds", "lb", "lbs"): 0.45359237,
        ("ounce", "ounces", "oz"): 0.028349523125,
        ("stone", "stone", "stones", "st"): 6.35029318,
        ("short ton", "short tons", "ton", "tons"): 907.18474,
    },
    "volume": {
        ("litre", "litres", "liter", "liters", "l"): 1.0,
        ("millilitre", "millilitres", "milliliter", "milliliters", "ml"): 0.001,
        ("centilitre", "centilitres", "centiliter", "centiliters", "cl"): 0.01,
        ("cubic metre", "cubic metres", "cubic meter", "cubic meters", "m3"): 1000.0,
        ("gallon", "gallons", "gal", "us gallon", "us gallons"): 3.785411784,
        ("imperial gallon", "imperial gallons", "uk gallon", "uk gallons"): 4.54609,
        ("quart", "quarts", "qt"): 0.946352946,
        ("pint", "pints", "pt", "us pint", "us pints"): 0.473176473,
        ("imperial pint", "imperial pints", "uk pint", "uk pints"): 0.56826125,
        ("cup", "cups"): 0.2365882365,
        ("fluid ounce", "fluid ounces", "fl oz", "floz"): 0.0295735295625,
        ("tablespoon", "tablespoons", "tbsp"): 0.01478676478125,
        ("teaspoon", "teaspoons", "tsp"): 0.00492892159375,
    },
    "temperature": {
        ("degree celsius", "degrees celsius", "celsius", "centigrade", "c", "°c"): 0.0,
        ("degree fahrenheit", "degrees fahrenheit", "fahrenheit", "f", "°f"): 0.0,
        ("kelvin", "kelvins", "k"): 0.0,
    },
    "speed": {
        ("metre per second", "metres per second", "meter per second", "meters per second", "m/s"): 1.0,
        ("kilometre per hour", "kilometres per hour", "kilometer per hour", "kilometers per hour",
         "km/h", "kmh", "kph"): 1000 / 3600,
        ("mile per hour", "miles per hour", "mph"): 1609.344 / 3600,
        ("knot", "knots", "kn", "kt"): 1852 / 3600,
        ("foot per second", "feet per second", "ft/s", "fps"): 0.3048,
    },
    "time": {
        ("second", "seconds", "s", "sec", "secs"): 1.0,
        ("millisecond", "milliseconds", "ms"): 0.001,
        ("minute", "minutes", "min", "mins"): 60.0,
        ("hour", "hours", "h", "hr", "hrs"): 3600.0,
        ("day", "days"): 86400.0,
        ("week", "weeks", "wk"): 604800.0,
        ("year", "years", "yr", "yrs"): 31557600.0,  # Julian year, 365.25 days
    },
    "data": {
        ("byte", "bytes", "b"): 1.0,
        ("bit", "bits"): 0.125,
        ("kilobyte", "kilobytes", "kb"): 1e3,
        ("megabyte", "megabytes", "mb"): 1e6,
        ("gigabyte", "gigabytes", "gb"): 1e9,
        ("terabyte", "terabytes", "tb"): 1e12,
        ("kibibyte", "kibibytes", "kib"): 2.0**10,
        ("mebibyte", "mebibytes", "mib"): 2.0**20,
        ("gibibyte", "gibibytes", "gib"): 2.0**30,
        ("tebibyte", "tebibytes", "tib"): 2.0**40,
        ("megabit", "megabits", "mbit", "mbits"): 1e6 / 8,
        ("gigabit", "gigabits", "gbit", "gbits"): 1e9 / 8,
    },
}  # fmt: skip


def _key(name: str) -> str:
    key = re.sub(r"\s+", " ", name.strip().lower().rstrip("?.!"))
    return re.sub(r"^(?:a|an|the) |^degrees? (?=c|f|celsius|fahrenheit|centigrade)", "", key)


@cache
def _units() -> dict[str, Unit]:
    units: dict[str, Unit] = {}
    for dimension, entries in _TABLE.items():
        for names, factor in entries.items():
            unit = Unit(dimension, factor, names[0], names[1])
            for name in names:
                units[name] = unit
    return units


def find_unit(name: str) -> Unit | None:
    """The unit a user named, or None."""
    key = _key(name)
    return _units().get(key) or _units().get(key.replace("degree ", "degrees "))


def _to_kelvin(value: float, unit: Unit) -> float:
    return {"kelvin": value, "degree celsius": value + 273.15}.get(
        unit.singular, (value - 32) * 5 / 9 + 273.15
    )


def _from_kelvin(kelvin: float, unit: Unit) -> float:
    return {"kelvin": kelvin, "degree celsius": kelvin - 273.15}.get(
        unit.singular, (kelvin - 273.15) * 9 / 5 + 32
    )


def convert(value: float, source: Unit, target: Unit) -> float:
    """`value` in `source` units, expressed in `target` units."""
    if source.dimension != target.dimension:
        raise ToolError(
            f"cannot convert {source.plural} ({source.dimension}) to {target.plural} ({target.dimension})"
        )
    if source.dimension == "temperature":
        return _from_kelvin(_to_kelvin(value, source), target)
    return value * source.factor / target.factor


def _value(raw: Any) -> float:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw)
    if isinstance(raw, str):
        try:
            return float(replace_number_words(raw.strip().lower()).replace(",", ""))
        except ValueError:
            pass
    raise ToolError(f"'{raw}' is not a number")


def _unit(args: dict[str, Any], key: str) -> Unit:
    name = required_str(args, key)
    unit = find_unit(name)
    if unit is None:
        raise ToolError(f"I don't know the unit '{name}'")
    return unit


def _say(value: float, unit: Unit) -> str:
    return f"{format_number(round(value, 10), significant=6)} {unit.singular if value == 1 else unit.plural}"


def _run(args: dict[str, Any]) -> ToolResult:
    value = _value(args.get("value"))
    source, target = _unit(args, "from_unit"), _unit(args, "to_unit")
    result = convert(value, source, target)
    return ToolResult(text=f"{_say(value, source)} is {_say(result, target)}.", source="unit_conversion")


TOOL = Tool(
    name="unit_conversion",
    description="Convert a quantity between units of length, mass, volume, temperature, speed, time or data.",
    parameters={
        "type": "object",
        "properties": {
            "value": {"type": "number", "description": "the quantity to convert"},
            "from_unit": {"type": "string", "description": "e.g. 'miles', 'kg', 'degrees Fahrenheit'"},
            "to_unit": {"type": "string", "description": "e.g. 'kilometres', 'pounds', 'celsius'"},
        },
        "required": ["value", "from_unit", "to_unit"],
    },
    run=_run,
)
