"""What the agent says about an answer it has not got: found nothing (a Context Spanning model then reads the abstain
span) or failed (no span), and whether an answer is a tool's output verbatim. Fake OpenAI-compatible server on
loopback (real HTTP, real wire format) and the built-in router."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from backend_agent.agent import Agent, AgentResult
from backend_agent.llm_client import ChatClient, LLMConfig
from backend_agent.tools import build_catalogue
from benchmarks.fakes.fake_openai import Script, fake_openai


@pytest.fixture(scope="module")
def llm_server() -> Iterator[tuple[str, Script]]:
    with fake_openai() as server:
        yield server


def ask(url: str | None, question: str) -> AgentResult:
    async def run() -> AgentResult:
        client = ChatClient(LLMConfig(base_url=url, model="fake")) if url else None
        try:
            return await Agent(build_catalogue(), client).answer(question, "", 2.0)
        finally:
            if client is not None:
                await client.aclose()

    return asyncio.run(run())


def test_a_question_no_built_in_tool_answers_found_nothing() -> None:
    result = ask(None, "Who wrote the novel about the white whale?")
    assert result.answer is None and result.outcome in ("empty", "none")


def test_a_built_in_tool_answer_is_a_tool_result() -> None:
    result = ask(None, "What is twelve times seven?")
    assert result.answer is not None and result.answer.tool == "arithmetic" and result.answer.outcome == "tool"


def test_an_llm_that_does_not_know_found_nothing(llm_server: tuple[str, Script]) -> None:
    url, script = llm_server
    script.mode, script.content = "content", "NO_ANSWER"
    result = ask(url, "Who wrote the novel about the white whale?")
    assert result.answer is None and result.outcome in ("empty", "none")


def test_a_tool_that_ran_and_found_nothing_found_nothing(llm_server: tuple[str, Script]) -> None:
    url, script = llm_server
    script.mode, script.tool, script.arguments = "tool_call", "time_in_place", {"place": "Atlantis"}
    result = ask(url, "What time is it in Atlantis?")
    assert result.answer is None and result.outcome in ("empty", "none") and "could not answer" in (result.reason or "")


def test_an_llm_answer_in_its_own_words_is_not_a_tool_result(llm_server: tuple[str, Script]) -> None:
    url, script = llm_server
    script.mode, script.content = "content", "Herman Melville wrote Moby-Dick."
    result = ask(url, "Who wrote Moby-Dick?")
    assert result.answer is not None and result.answer.tool == "llm" and result.answer.outcome == "llm"


@pytest.mark.parametrize("mode", ["error500", "garbage"])
def test_a_failing_llm_is_a_failure_not_found_nothing(llm_server: tuple[str, Script], mode: str) -> None:
    url, script = llm_server
    script.mode = mode
    result = ask(url, "Who wrote Moby-Dick?")
    assert result.answer is None and result.outcome == "failed"
