"""The clock and the place a time question is about, shared by the time and date tools; the clock is
injectable so tests can pin "now"."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from backend_agent.tools.base import ToolError
from backend_agent.tools.places import Place, resolve_place

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The real clock, timezone-aware."""
    return datetime.now(UTC)


def place_for(text: str | None, default_timezone: str) -> Place:
    """The place named in `text`, or the default zone when none is named."""
    place = resolve_place(text if text else default_timezone)
    if place is None:
        raise ToolError(f"I don't know the timezone of '{text}'")
    return place


def local_now(clock: Clock, place: Place) -> datetime:
    """Now, on the wall clock of `place`."""
    return clock().astimezone(ZoneInfo(place.timezone))
