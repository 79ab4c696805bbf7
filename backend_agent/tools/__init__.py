"""The tool catalogue: what the backend can look up, in one place for both the LLM agent (which sends the
schemas) and the built-in router (which calls tools by name)."""

from __future__ import annotations

from collections.abc import Iterable

from backend_agent.tools import (
    arithmetic,
    date,
    http_adapters,
    knowledge_base,
    time_in_place,
    unit_conversion,
)
from backend_agent.tools.base import Tool, ToolError, ToolResult
from backend_agent.tools.clock import Clock, utc_now
from backend_agent.tools.knowledge_base import KnowledgeBase

__all__ = ["Tool", "ToolError", "ToolResult", "build_catalogue"]


def build_catalogue(
    *,
    clock: Clock = utc_now,
    default_timezone: str = "UTC",
    knowledge: KnowledgeBase | None = None,
    user_id: str | None = None,
    weather_url: str | None = None,
    search_url: str | None = None,
    http_timeout_s: float = 2.0,
    extra_tools: Iterable[Tool] = (),
) -> dict[str, Tool]:
    """The tools for one user, by name. The knowledge base and the HTTP tools are included only when
    configured; `default_timezone` (the user's, when known) answers time questions that name no place.
    `extra_tools` (e.g. from MCP servers) come after the built-ins and never replace one of the same name."""
    tools = [
        time_in_place.make_tool(clock, default_timezone),
        date.make_tool(clock, default_timezone),
        arithmetic.TOOL,
        unit_conversion.TOOL,
    ]
    if knowledge is not None:
        tools.append(knowledge_base.make_tool(knowledge, user_id))
    if weather_url:
        tools.append(http_adapters.make_weather_tool(weather_url, timeout_s=http_timeout_s))
    if search_url:
        tools.append(http_adapters.make_web_search_tool(search_url, timeout_s=http_timeout_s))
    catalogue = {tool.name: tool for tool in tools}
    for tool in extra_tools:
        catalogue.setdefault(tool.name, tool)
    return catalogue
