"""The time of day in a named place or timezone, from the timezone database (no network)."""

from __future__ import annotations

from typing import Any

from backend_agent.tools.base import Tool, ToolResult, optional_str
from backend_agent.tools.clock import Clock, local_now, place_for, utc_now


def make_tool(clock: Clock = utc_now, default_timezone: str = "UTC") -> Tool:
    """A `time_in_place` tool reading `clock`; with no place named it answers for `default_timezone`."""

    def run(args: dict[str, Any]) -> ToolResult:
        place = place_for(optional_str(args, "place"), default_timezone)
        now = local_now(clock, place)
        clock_text = f"{now.hour % 12 or 12}:{now.minute:02d} {'AM' if now.hour < 12 else 'PM'}"
        return ToolResult(
            text=f"It is {clock_text} on {now:%A}, {now:%B} {now.day} in {place.spoken}.",
            source=f"zoneinfo:{place.timezone}",
        )

    return Tool(
        name="time_in_place",
        description="The current local time in a city, country or IANA timezone.",
        parameters={
            "type": "object",
            "properties": {
                "place": {"type": "string", "description": "a city, country or timezone, e.g. 'Tokyo'"}
            },
            "required": [],
        },
        run=run,
    )
