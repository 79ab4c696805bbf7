"""Today's date in a place, and the weekday of a given date ("what day is July 4, 2026?")."""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Any

from backend_agent.tools.base import Tool, ToolError, ToolResult, optional_str
from backend_agent.tools.clock import Clock, local_now, place_for, utc_now

_MONTHS = {
    name: number
    for number, names in enumerate(
        [("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",),
         ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"),
         ("october", "oct"), ("november", "nov"), ("december", "dec")],
        start=1,
    )
    for name in names
}  # fmt: skip
_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?:,?\s*(?P<year>\d{4}))?"
_FORMS = [
    re.compile(r"^(?P<year>\d{4})-(?P<month>\d{1,2})-(?P<day>\d{1,2})$"),
    re.compile(rf"^{_MONTH}\s+(?:the\s+)?{_DAY}{_YEAR}$"),
    re.compile(rf"^(?:the\s+)?{_DAY}\s+(?:of\s+)?{_MONTH}{_YEAR}$"),
]
_RELATIVE = {"today": 0, "tomorrow": 1, "yesterday": -1}


def parse_date(text: str, today: date) -> date:
    """Read a date as people say it: "today", "tomorrow", "2026-07-04", "July 4th, 2026", "4 July"; a
    missing year is this year."""
    cleaned = re.sub(r"\s+", " ", text.strip().lower().rstrip("?.!"))
    if cleaned in _RELATIVE:
        return today + timedelta(days=_RELATIVE[cleaned])
    for form in _FORMS:
        match = form.match(cleaned)
        if match:
            month = match["month"]
            try:
                return date(
                    int(match["year"] or today.year),
                    int(month) if month.isdigit() else _MONTHS[month],
                    int(match["day"]),
                )
            except ValueError as error:
                raise ToolError(f"'{text}' is not a valid date") from error
    raise ToolError(f"I can't read '{text}' as a date")


def _spoken(day: date) -> str:
    return f"{day:%A}, {day:%B} {day.day}, {day.year}"


def make_tool(clock: Clock = utc_now, default_timezone: str = "UTC") -> Tool:
    """A `date` tool reading `clock`; "today" is the local day in the place (or `default_timezone`)."""

    def run(args: dict[str, Any]) -> ToolResult:
        place = place_for(optional_str(args, "place"), default_timezone)
        today = local_now(clock, place).date()
        asked = optional_str(args, "date") or "today"
        day = parse_date(asked, today)
        relative = asked.strip().lower().rstrip("?.!")
        if relative in _RELATIVE:
            text = f"{relative.capitalize()} is {_spoken(day)} in {place.spoken}."
        else:
            verb = "is" if day == today else "was" if day < today else "will be"
            text = f"{day:%B} {day.day}, {day.year} {verb} a {day:%A}."
        return ToolResult(text=text, source=f"calendar:{place.timezone}")

    return Tool(
        name="date",
        description="Today's date and weekday in a place or timezone, or the weekday of a given date.",
        parameters={
            "type": "object",
            "properties": {
                "place": {"type": "string", "description": "a city, country or timezone, e.g. 'Paris'"},
                "date": {
                    "type": "string",
                    "description": "'today', 'tomorrow', 'yesterday', '2026-07-04' or 'July 4, 2026'",
                },
            },
            "required": [],
        },
        run=run,
    )
