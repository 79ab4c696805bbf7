"""The agent's contract with an LLM configured (the OpenAI-compatible fake on loopback, real HTTP): the built-in
tools answer their intents before any LLM is asked, live values come only from a tool, tool text is the span
verbatim, serial tool chains, arguments from the profile, and the request's context in the prompt."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from backend_agent.agent import MAX_ANSWER_WORDS, Agent, AgentResult
from backend_agent.llm_client import ChatClient, LLMConfig
from backend_agent.request import Answered, Request
from backend_agent.tools import build_catalogue
from benchmarks.fakes.fake_openai import Script, fake_openai

NOW = datetime(2026, 11, 30, 12, 15, tzinfo=UTC)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Script]]:
    with fake_openai() as served:
        yield served


@pytest.fixture
def llm(server: tuple[str, Script]) -> Iterator[tuple[str, Script]]:
    url, script = server
    script.requests.clear()
    script.queue.clear()
    script.mode = "content"
    yield url, script


def ask(url: str, request: Request, timeout_s: float = 2.0) -> AgentResult:
    async def run() -> AgentResult:
        client = ChatClient(LLMConfig(base_url=url, model="fake"))
        try:
            agent = Agent(build_catalogue(clock=lambda: NOW), client)
            return await agent.answer(request.newest, "", timeout_s, request)
        finally:
            await client.aclose()

    return asyncio.run(run())


@pytest.mark.parametrize(("question", "tool", "text"), [
    ("What time is it in Tokyo?", "time_in_place", "It is 9:15 PM on Monday, November 30 in Tokyo."),
    ("How many kilometers are 98 miles?", "unit_conversion", "98 miles is 157.716 kilometres."),
    ("What is 12 times 7?", "arithmetic", "12 times 7 is 84."),
    ("What day is it tomorrow?", "date", "Tomorrow is Tuesday, December 1, 2026 in UTC."),
])  # fmt: skip
def test_a_built_in_intent_is_answered_by_its_tool_before_any_llm_is_asked(
    llm: tuple[str, Script], question: str, tool: str, text: str
) -> None:
    url, script = llm
    script.content = "The time in Tokyo is 9:30 AM."  # what SmolLM2 said from nothing
    result = ask(url, Request.of(question))
    assert result.answer is not None and (result.answer.tool, result.answer.text) == (tool, text)
    assert result.outcome == "tool" and script.requests == []


@pytest.mark.parametrize(("question", "reply"), [
    ("What's the local time where Mount Fuji is?", "The time there is 9:30 AM."),
    ("What is the weather like in Oslo today?", "It is sunny and 12 degrees in Oslo."),
    ("How much does a Tesla share cost right now?", "A Tesla share costs $245.30."),
    ("How far is Lyon from Paris?", "The user asked how far Lyon is from Paris."),
])  # fmt: skip
def test_an_llm_reply_stating_a_live_value_without_a_tool_becomes_the_abstain_outcome(
    llm: tuple[str, Script], question: str, reply: str
) -> None:
    url, script = llm
    script.content = reply
    result = ask(url, Request.of(question))
    assert result.answer is None and result.outcome == "none", result
    assert len(script.requests) == 1


@pytest.mark.parametrize(("question", "reply"), [
    ("How many legs does a spider have?", "A spider has 8 legs."),
    ("How many times has Brazil won the World Cup?", "Brazil has won the World Cup 5 times."),
])  # fmt: skip
def test_a_number_that_is_a_fact_is_no_live_value(llm: tuple[str, Script], question: str, reply: str) -> None:
    url, script = llm
    script.content = reply
    result = ask(url, Request.of(question))
    assert result.answer is not None and (result.outcome, result.answer.text) == ("llm", reply)


def test_an_llm_fact_without_a_live_value_is_a_short_llm_answer(llm: tuple[str, Script]) -> None:
    url, script = llm
    script.content = "William Shakespeare wrote Hamlet around 1600. " + "It is a long tragedy in five acts. " * 10
    result = ask(url, Request.of("Who wrote Hamlet?"))
    assert result.answer is not None and result.outcome == "llm" and result.answer.tool == "llm"
    assert result.answer.text.startswith("William Shakespeare wrote Hamlet around 1600.")
    assert len(result.answer.text.split()) <= MAX_ANSWER_WORDS


def test_a_serial_tool_chain_feeds_each_result_back_and_the_last_tool_text_is_the_span(
    llm: tuple[str, Script]
) -> None:
    url, script = llm
    script.queue = [{"tool": "arithmetic", "arguments": {"expression": "12*7"}},
                    {"tool": "unit_conversion", "arguments": {"value": 84, "from_unit": "miles",
                                                              "to_unit": "kilometres"}},
                    {"content": "You drive about 135 kilometres a week."}]
    result = ask(url, Request.of("If I drive a dozen miles a day for a week, how far is that in kilometres?"))
    assert result.answer is not None and result.outcome == "tool"
    assert (result.answer.tool, result.answer.text) == ("unit_conversion", "84 miles is 135.185 kilometres.")
    assert result.answer.arguments == {"value": 84, "from_unit": "miles", "to_unit": "kilometres"}
    assert len(script.requests) == 3
    fed = script.requests[1]["messages"][-2:]
    assert fed[0]["tool_calls"][0]["function"]["name"] == "arithmetic"
    assert fed[1] == {"role": "tool", "tool_call_id": fed[0]["tool_calls"][0]["id"], "content": "12 times 7 is 84."}


def test_a_chain_cut_short_by_a_failing_llm_keeps_its_last_tool_result(llm: tuple[str, Script]) -> None:
    url, script = llm
    script.queue = [{"tool": "arithmetic", "arguments": {"expression": "12*7"}}]
    script.mode = "error500"
    result = ask(url, Request.of("What do I get if I multiply a dozen by seven?"))
    assert result.answer is not None and result.answer.text == "12 times 7 is 84."


def test_a_tool_that_finds_nothing_is_the_empty_outcome_with_its_name(llm: tuple[str, Script]) -> None:
    url, script = llm
    script.queue = [{"tool": "time_in_place", "arguments": {"place": "the lost city"}}]
    result = ask(url, Request.of("What's the local time where Atlantis was?"))
    assert result.answer is None and (result.outcome, result.tool) == ("empty", "time_in_place")


def test_arguments_the_llm_left_out_are_filled_from_the_profile(llm: tuple[str, Script]) -> None:
    url, script = llm
    script.queue = [{"tool": "time_in_place", "arguments": {}}, {"content": "done"}]
    result = ask(url, Request(("What's the hour where I live?",), location="Lisbon"))
    assert result.answer is not None and result.answer.arguments == {"place": "Lisbon"}
    assert result.answer.text == "It is 12:15 PM on Monday, November 30 in Lisbon."


def test_the_prompt_carries_the_agents_words_the_answered_history_and_the_corrected_request(
    llm: tuple[str, Script]
) -> None:
    url, script = llm
    script.content = "NO_ANSWER"
    request = Request(("Who painted the Mona Lisa? No, I mean the Night Watch.", "Yes."),
                      agent_words="Shall I look that up?",
                      answered=(Answered("Who wrote Hamlet?", "llm", {}, "William Shakespeare wrote Hamlet."),))
    result = ask(url, request)
    assert result.answer is None and result.outcome == "none"
    prompt = script.requests[0]["messages"][-1]["content"]
    assert "Already answered: Who wrote Hamlet? -> William Shakespeare wrote Hamlet." in prompt
    assert "The assistant just said: Shall I look that up?" in prompt
    assert prompt.endswith("The question: Who painted the Night Watch?")
