"""OpenTelemetry spans: conversation -> retrieval -> question / llm -> tool, with an in-memory SDK exporter."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from backend_agent.agent import Agent
from backend_agent.context_store import ContextStore
from backend_agent.llm_client import ChatClient, LLMConfig
from backend_agent.tools import build_catalogue
from benchmarks.fakes.fake_openai import fake_openai
from server.session.retrieval import Retrieval, SpanAnswer

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the global provider can be set once per process
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER


class _FreshFinal:
    """Stands in for the streaming ASR: a final utterance has just been heard."""

    awaiting_final = False

    def __init__(self, text: str) -> None:
        import time

        from backend_agent.asr.streaming import Transcript

        self.latest_final = Transcript(text, True, 0.0, 1.0, time.monotonic())

    async def close(self) -> None:
        return None


def test_retrieval_spans_nest_under_the_conversation(spans: InMemorySpanExporter) -> None:
    answers: list[SpanAnswer] = []
    events: list[Any] = []

    async def run() -> None:
        with fake_openai() as (url, script):
            script.mode, script.tool, script.arguments = "tool_call", "arithmetic", {"expression": "12*7"}
            client = ChatClient(LLMConfig(base_url=url, model="fake"))
            agent = Agent(build_catalogue(), client)
            heard = _FreshFinal("What do I get if I multiply a dozen by seven?")  # no built-in intent: the LLM picks
            retrieval = Retrieval("s1", "u1", agent, ContextStore(), heard,  # type: ignore[arg-type]
                                  answers.append, events.append, lambda: 0.0)
            with trace.get_tracer("test").start_as_current_span("conversation"):
                retrieval.trigger()
                for _ in range(200):
                    if answers:
                        break
                    await asyncio.sleep(0.01)
            await retrieval.close()
            await client.aclose()

    asyncio.run(run())
    assert answers and "84" in answers[0].text
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert {"conversation", "retrieval", "question", "llm", "tool"} <= set(by_name)

    def parent(name: str) -> str:
        span = by_name[name]
        assert span.parent is not None
        return next(s.name for s in by_name.values() if s.context.span_id == span.parent.span_id)

    assert parent("retrieval") == "conversation"
    assert parent("question") == parent("llm") == "retrieval"
    assert parent("tool") == "retrieval"
    assert by_name["tool"].attributes["tool"] == "arithmetic"
