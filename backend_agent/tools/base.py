"""The shape every tool shares, so the LLM agent and the built-in router can treat them alike."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


class ToolError(ValueError):
    """A tool could not answer (bad arguments, nothing found, service refused).

    The message is safe to show to the LLM as the tool's output; the router treats it as "no span".
    """


@dataclass(frozen=True)
class ToolResult:
    """One short reference text and where it came from (a file, a timezone, a URL)."""

    text: str
    source: str


@dataclass(frozen=True)
class Tool:
    """A callable the backend may use, described in OpenAI function-calling terms.

    `run_async`, when set, is awaited on the event loop instead of running `run` in a thread: a tool that waits on
    something else (the client that runs it) holds no thread while it waits. `deadline_s`, when set, bounds the tool
    from its call instead of the request's deadline (if that is later): a client's tool (an HTTP call, a database)
    takes longer than a span deadline."""

    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[dict[str, Any]], ToolResult]
    run_async: Callable[[dict[str, Any]], Awaitable[ToolResult]] | None = None
    deadline_s: float | None = None

    def openai_schema(self) -> dict[str, Any]:
        """The entry for the `tools` list of an OpenAI-compatible chat completion request."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def optional_str(args: dict[str, Any], key: str) -> str | None:
    """A string argument, or None when missing or blank (LLMs send both for "not given")."""
    value = args.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise ToolError(f"argument '{key}' must be a string")
    return value.strip()


def required_str(args: dict[str, Any], key: str) -> str:
    """A string argument that must be given."""
    value = optional_str(args, key)
    if value is None:
        raise ToolError(f"missing argument '{key}'")
    return value
