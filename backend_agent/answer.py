"""The agent's answer to one question: what the session turns into a Context Span."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# How a request ended, for the span contract of the Context Spanning model (reference `runtime/realtime.py`):
# "tool": a tool answered (the span is its text verbatim); "empty": a tool ran and found nothing; "none": nothing
# could answer (the last two become the abstain span where the checkpoint was trained on one); "llm": the LLM's own
# short reference text, which never states a live value (see `backend_agent/live_values.py`); "failed": the LLM,
# a tool or the deadline failed (no span: a failure is not knowledge that nothing answers).
Outcome = Literal["tool", "empty", "none", "llm", "failed"]


class Answer(BaseModel):
    """One short reference text, where it came from, and which tool produced it with which arguments."""

    model_config = ConfigDict(frozen=True)

    text: str
    source: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    outcome: Outcome = "tool"
