"""The agent's answer to one question: what the session turns into a Context Span."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Answer(BaseModel):
    """One short reference text, where it came from, and which tool produced it."""

    model_config = ConfigDict(frozen=True)

    text: str
    source: str
    tool: str
