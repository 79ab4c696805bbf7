"""The time and date tools agree with zoneinfo, computed independently here."""

import re
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from backend_agent.tools import date as date_tool
from backend_agent.tools import time_in_place
from backend_agent.tools.base import ToolError
from backend_agent.tools.date import parse_date
from backend_agent.tools.places import curated_places, database_places, resolve_place

INSTANTS = [
    datetime(2026, 11, 30, 12, 15, tzinfo=UTC),
    datetime(2026, 3, 29, 0, 59, tzinfo=UTC),  # one minute before Europe switches to summer time
    datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
    datetime(2026, 12, 31, 23, 30, tzinfo=UTC),  # new year in the east, not yet in the west
]
CITIES = [
    ("Tokyo", "Asia/Tokyo", "Tokyo"),
    ("new york", "America/New_York", "New York"),
    ("NYC", "America/New_York", "New York"),
    ("LA", "America/Los_Angeles", "Los Angeles"),
    ("London", "Europe/London", "London"),
    ("the UK", "Europe/London", "the United Kingdom"),
    ("Sydney", "Australia/Sydney", "Sydney"),
    ("Kathmandu", "Asia/Kathmandu", "Kathmandu"),
    ("Mumbai", "Asia/Kolkata", "Mumbai"),
    ("sao paulo", "America/Sao_Paulo", "Sao Paulo"),
    ("Asia/Tehran", "Asia/Tehran", "Tehran"),
]


def expected_time_text(instant: datetime, zone: str, spoken: str) -> str:
    local = instant.astimezone(ZoneInfo(zone))
    hour = local.hour % 12 or 12
    meridiem = "AM" if local.hour < 12 else "PM"
    return f"It is {hour}:{local.minute:02d} {meridiem} on {local:%A}, {local:%B} {local.day} in {spoken}."


@pytest.mark.parametrize("instant", INSTANTS)
@pytest.mark.parametrize(("asked", "zone", "spoken"), CITIES)
def test_time_in_city_agrees_with_zoneinfo(instant: datetime, asked: str, zone: str, spoken: str) -> None:
    tool = time_in_place.make_tool(clock=lambda: instant)
    result = tool.run({"place": asked})
    assert result.text == expected_time_text(instant, zone, spoken)
    assert result.source == f"zoneinfo:{zone}"


def test_example_sentence() -> None:
    tool = time_in_place.make_tool(clock=lambda: datetime(2026, 11, 30, 12, 15, tzinfo=UTC))
    assert tool.run({"place": "Tokyo"}).text == "It is 9:15 PM on Monday, November 30 in Tokyo."


def test_real_clock_agrees_with_zoneinfo() -> None:
    before = datetime.now(ZoneInfo("Asia/Tokyo"))
    text = time_in_place.make_tool().run({"place": "Tokyo"}).text
    hour, minute, meridiem = re.match(r"It is (\d+):(\d\d) (AM|PM)", text).groups()
    said = (int(hour) % 12 + (12 if meridiem == "PM" else 0)) * 60 + int(minute)
    now = before.hour * 60 + before.minute
    assert (said - now) % (24 * 60) in (0, 1)


def test_no_place_uses_default_timezone_and_unknown_place_is_an_error() -> None:
    instant = datetime(2026, 11, 30, 12, 15, tzinfo=UTC)
    tool = time_in_place.make_tool(clock=lambda: instant, default_timezone="Europe/Paris")
    assert tool.run({}).text == expected_time_text(instant, "Europe/Paris", "Paris")
    with pytest.raises(ToolError):
        tool.run({"place": "Narnia"})


def test_place_table_is_large_and_valid() -> None:
    assert len(curated_places()) >= 150
    for alias, zone in [("UK", "Europe/London"), ("usa", "America/New_York"), ("PST", "America/Los_Angeles")]:
        assert resolve_place(alias).timezone == zone
    assert resolve_place("Atlantis") is None


@pytest.mark.parametrize("instant", INSTANTS)
@pytest.mark.parametrize("zone", ["Pacific/Auckland", "Pacific/Honolulu", "Europe/Berlin"])
def test_today_is_the_local_date(instant: datetime, zone: str) -> None:
    local = instant.astimezone(ZoneInfo(zone)).date()
    tool = date_tool.make_tool(clock=lambda: instant)
    text = tool.run({"place": zone}).text
    assert text.startswith(f"Today is {local:%A}, {local:%B} {local.day}, {local.year} in ")
    tomorrow = local + timedelta(days=1)
    assert tool.run({"place": zone, "date": "tomorrow"}).text.startswith(f"Tomorrow is {tomorrow:%A}")


def test_weekday_of_a_given_date() -> None:
    tool = date_tool.make_tool(clock=lambda: datetime(2026, 11, 30, 12, tzinfo=UTC))
    assert tool.run({"date": "July 4th, 2026"}).text == "July 4, 2026 was a Saturday."
    assert tool.run({"date": "2027-01-01"}).text == "January 1, 2027 will be a Friday."
    assert tool.run({"date": "30 November 2026"}).text == "November 30, 2026 is a Monday."
    with pytest.raises(ToolError):
        tool.run({"date": "February 30"})
    with pytest.raises(ToolError):
        tool.run({"date": "the day after the party"})


def test_parse_date_forms() -> None:
    today = date(2026, 11, 30)
    assert parse_date("yesterday", today) == date(2026, 11, 29)
    assert parse_date("the 1st of March", today) == date(2026, 3, 1)
    assert parse_date("Sept. 9 1999", today) == date(1999, 9, 9)


def test_every_place_resolves_to_itself_and_the_database_ones_are_none_of_the_curated() -> None:
    for name in (*curated_places(), *database_places()):
        assert resolve_place(name).name == name
    assert len(database_places()) >= 100
    assert not {n.lower() for n in database_places()} & {n.lower() for n in curated_places()}
    assert "Tegucigalpa" in database_places() and "Tokyo" not in database_places()
