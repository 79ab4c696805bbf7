"""Client-run tools: the call goes out as an event, the answer comes back by call id; late and unknown answers are
refused, and the agent's deadline bounds the wait. A client's tool has a deadline of its own, counted from its call,
which the retrieval waits for past the span deadline."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from backend_agent.agent import Agent
from backend_agent.asr.streaming import Transcript
from backend_agent.context_store import ContextStore
from backend_agent.llm_client import ChatClient, LLMConfig
from benchmarks.fakes.fake_openai import fake_openai
from server.session.client_tools import ClientTools, readable
from server.session.retrieval import Retrieval, RetrievalConfig, SpanAnswer
from server.wire import protocol as p

WEATHER = p.ClientTool(name="get_weather", parameters={"type": "object", "properties": {"place": {"type": "string"}}})


def test_an_answer_by_call_id_is_the_tool_result_and_a_second_one_is_late() -> None:
    async def run() -> None:
        calls: list[p.ServerEvent] = []
        tools = ClientTools(calls.append, lambda: 1.0)
        tools.declare([WEATHER])
        (tool,) = tools.catalogue()
        assert tool.run_async is not None
        pending = asyncio.create_task(tool.run_async({"place": "Paris"}))
        await asyncio.sleep(0)
        (call,) = calls
        assert isinstance(call, p.ToolCall) and call.arguments == '{"place": "Paris"}'
        tools.answer(call.call_id, "Sunny.")
        result = await pending
        assert (result.text, result.source) == ("Sunny.", "client:get_weather")
        with pytest.raises(p.ProtocolError, match="after its deadline") as late:
            tools.answer(call.call_id, "Sunny again.")
        assert late.value.code == "tool_result_late"
        with pytest.raises(p.ProtocolError) as unknown:
            tools.answer("call_never", "x")
        assert unknown.value.code == "unknown_call"

    asyncio.run(run())


@pytest.mark.parametrize(("output", "said"), [
    ('"Sunny and 21 degrees."', "Sunny and 21 degrees."),  # Pipecat's result_callback("Sunny and 21 degrees.")
    ('{"conditions": "sunny", "temperature_c": 21, "wind": null}', "conditions: sunny; temperature_c: 21"),
    ('["rain", "wind"]', "rain, wind"),
    ("21", "21"),
    ("Sunny, {not JSON}.", "Sunny, {not JSON}."),
])
def test_a_json_output_is_said_as_what_it_holds_and_plain_text_as_it_is(output: str, said: str) -> None:
    assert readable(output) == said


def test_the_agent_waits_for_a_client_tool_no_longer_than_its_deadline() -> None:
    with fake_openai() as (url, script):
        script.mode, script.tool, script.arguments = "tool_call", "get_weather", {"place": "Paris"}

        async def run() -> str | None:
            tools = ClientTools(lambda _: None, lambda: 0.0)
            tools.declare([WEATHER])
            llm = ChatClient(LLMConfig(base_url=url, model="fake"))
            try:
                result = await Agent({t.name: t for t in tools.catalogue()}, llm).answer("Weather?", timeout_s=1.0)
            finally:
                await llm.aclose()
            assert result.answer is None
            return result.reason

        assert asyncio.run(run()) == "no answer within 1.00 s"


class HeardQuestion:
    """The ASR's side of a retrieval: the user's question, just heard and final."""

    awaiting_final = False

    def __init__(self, text: str) -> None:
        self.latest_final = Transcript(text, True, 0.0, 1.0, time.monotonic())

    async def close(self) -> None:
        """Nothing runs."""


async def retrieve_with_a_client_tool(url: str, span_deadline_s: float, tool_deadline_s: float,
                                      answer_after_s: float) -> tuple[list[SpanAnswer], list[Any], str | None]:
    """One retrieval whose LLM calls the client's weather tool, answered `answer_after_s` after the call: the
    answers, the events, and the code of the error the client's answer got (None if taken)."""
    answers: list[SpanAnswer] = []
    events: list[Any] = []
    tools = ClientTools(events.append, lambda: 0.0, tool_deadline_s)
    tools.declare([WEATHER])
    llm = ChatClient(LLMConfig(base_url=url, model="fake"))
    retrieval = Retrieval("s1", "u1", Agent({t.name: t for t in tools.catalogue()}, llm), ContextStore(":memory:"),
                          HeardQuestion("What is the weather in Paris?"), answers.append,  # type: ignore[arg-type]
                          events.append, lambda: 0.0, RetrievalConfig(deadline_s=span_deadline_s))
    refused = None
    try:
        assert retrieval.trigger()
        while not any(isinstance(e, p.ToolCall) for e in events):
            await asyncio.sleep(0.005)
        (call,) = [e for e in events if isinstance(e, p.ToolCall)]
        await asyncio.sleep(answer_after_s)
        try:
            tools.answer(call.call_id, "Sunny in Paris.")
        except p.ProtocolError as exc:
            refused = exc.code
        while retrieval.in_flight:
            await asyncio.sleep(0.005)
    finally:
        await retrieval.close()
        await llm.aclose()
    return answers, events, refused


def test_a_client_tool_answering_after_the_span_deadline_but_within_its_own_is_the_answer() -> None:
    with fake_openai() as (url, script):
        script.mode, script.tool, script.arguments = "tool_call", "get_weather", {"place": "Paris"}
        answers, events, refused = asyncio.run(retrieve_with_a_client_tool(url, 0.3, 3.0, answer_after_s=0.8))
    assert refused is None and not [e for e in events if isinstance(e, p.SpanDropped)], events
    (answer,) = answers
    assert answer.text == "Sunny in Paris." and answer.source == "client:get_weather"
    assert answer.waited_until is not None and answer.waited_until - answer.triggered >= 0.8
    assert answer.deadline_from == answer.waited_until, "the span deadline counts from the client's answer"


def test_a_client_tool_answering_after_its_own_deadline_is_dropped_as_late_and_its_answer_refused() -> None:
    with fake_openai() as (url, script):
        script.mode, script.tool, script.arguments = "tool_call", "get_weather", {"place": "Paris"}
        answers, events, refused = asyncio.run(retrieve_with_a_client_tool(url, 0.3, 0.6, answer_after_s=1.0))
    assert not answers and refused == "tool_result_late"
    (dropped,) = [e for e in events if isinstance(e, p.SpanDropped)]
    assert dropped.reason == "late: tool get_weather gave no answer within 0.60 s of its call"
    assert dropped.latency_ms >= 600, "cut off at the span deadline, not the client tool's"
