"""`contextspan ask`: what span the agent would inject for a question, so an operator can check LLM and tools."""

from __future__ import annotations

from typing import Any

from backend_agent.context_store import Profile
from frontend_model.span.normaliser import normalise_text
from server.session.backend import Backend
from server.settings import ServerSettings


async def ask(settings: ServerSettings, question: str, timezone: str | None = None) -> dict[str, Any]:
    backend = Backend.create(settings.model_copy(update={"asr": False}))
    try:
        agent = backend.agent_for(Profile(user_id="cli", timezone=timezone))
        result = await agent.answer(question, timeout_s=settings.span_deadline_s)
    finally:
        await backend.aclose()
    answer = result.answer
    return {
        "question": question,
        "span": None if answer is None else {
            "text": answer.text, "normalised": normalise_text(answer.text), "source": answer.source,
            "tool": answer.tool,
        },
        "outcome": result.outcome,
        "reason": result.reason,
        "llm": settings.llm_base_url,
        "timings_ms": {k: round(v, 2) for k, v in result.timings_ms.items()},
    }
