"""The agent's answer to one question: what the session turns into a Context Span."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Answer(BaseModel):
    """One short reference text, where it came from, and which tool produced it.

    `tool_result`: the text is a tool's output verbatim (a Context Spanning span reads it behind `(tool result) `);
    False for an LLM's own words.
    """

    model_config = ConfigDict(frozen=True)

    text: str
    source: str
    tool: str
    tool_result: bool = True
