"""A retrieval in flight outlives its replica: it says where it stands as plain data (`Retrieval.unfinished`), and the
retrieval of the replica that resumes the session goes on from there with the deadline it had left. The backend's
LLM, which holds the first replica's answer and gives the second one's at once, is a fake on loopback speaking the
OpenAI wire format."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from backend_agent.agent import Agent
from backend_agent.asr.streaming import Transcript
from backend_agent.context_store import ContextStore
from backend_agent.llm_client import ChatClient, LLMConfig
from backend_agent.tools import build_catalogue
from benchmarks.fakes.fake_openai import fake_openai
from server.session.retrieval import InFlight, Retrieval, RetrievalConfig, SpanAnswer
from server.wire import protocol as p

QUESTION = "Who founded the museum?"  # no built-in tool's intent: the LLM answers it
DEADLINE_S = 5.0


def replica(answers: list[SpanAnswer], events: list[Any], agent: Agent) -> Retrieval:
    """One replica's retrieval for session s1, without speech recognition."""
    return Retrieval("s1", "ada", agent, ContextStore(":memory:"), None, answers.append, events.append, lambda: 0.0,
                     RetrievalConfig(deadline_s=DEADLINE_S))


async def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


def test_a_question_the_backend_had_not_answered_is_asked_again_on_the_next_replica_and_told_once() -> None:
    async def run() -> tuple[InFlight, list[Any], list[SpanAnswer], list[Any], float]:
        with fake_openai() as (url, script):
            script.mode = "hang"  # the first replica's LLM holds the answer
            a_llm, b_llm = ChatClient(LLMConfig(base_url=url, model="fake")), ChatClient(LLMConfig(base_url=url,
                                                                                                   model="fake"))
            a_events: list[Any] = []
            answers: list[SpanAnswer] = []
            b_events: list[Any] = []
            a = replica([], a_events, Agent(build_catalogue(), a_llm))
            b = replica(answers, b_events, Agent(build_catalogue(), b_llm))
            try:
                assert a.ask(QUESTION)
                await until(lambda: script.requests, "the LLM was not asked")
                item = a.unfinished(time.perf_counter())
                assert item is not None
                script.mode = "content"
                resumed = time.perf_counter()
                b.resume(item)
                await until(lambda: answers or b_events, "no outcome on the second replica")
            finally:
                await a.close()
                await b.close()
                await a_llm.aclose()
                await b_llm.aclose()
        return item, a_events, answers, b_events, resumed

    item, a_events, answers, b_events, resumed = asyncio.run(run())
    assert (item.stage, item.trigger, item.question, item.text) == ("asked", "typed", QUESTION, None)
    assert item.deadline_left_s is not None and 0 < item.deadline_left_s < DEADLINE_S
    assert [e.text for e in a_events if isinstance(e, p.Question)] == [QUESTION], "told on the first replica"
    assert b_events == [], "no second question event, nothing dropped"
    (answer,) = answers
    assert (answer.question, answer.trigger, answer.text) == (QUESTION, "typed", "The museum opens at nine.")
    assert abs(answer.triggered - (resumed - item.elapsed_s)) < 0.05, "the latency goes on from the first replica's"
    assert abs(answer.deadline_from - (resumed - (DEADLINE_S - item.deadline_left_s))) < 0.05, \
        "the deadline left counts from the resume"


def test_a_question_the_user_was_still_asking_is_what_was_heard_and_is_told_where_it_is_asked() -> None:
    async def run() -> tuple[InFlight | None, list[SpanAnswer], list[Any]]:
        a = replica([], [], Agent(build_catalogue()))
        a.on_transcript(Transcript("What is twelve times twelve", False, 0.0, 1.0, time.monotonic()))
        assert a.trigger()
        item = a.unfinished(time.perf_counter())  # the `<ret>` came before the question's final
        await a.close()
        assert item is not None
        answers: list[SpanAnswer] = []
        events: list[Any] = []
        b = replica(answers, events, Agent(build_catalogue()))
        b.resume(item)
        await until(lambda: answers, "no answer on the second replica")
        await b.close()
        return item, answers, events

    item, answers, events = asyncio.run(run())
    assert item is not None and (item.stage, item.trigger, item.question) == ("hearing", "ret",
                                                                              "What is twelve times twelve")
    assert [e.text for e in events if isinstance(e, p.Question)] == ["What is twelve times twelve"]
    assert "144" in answers[0].text


def test_an_idle_retrieval_has_nothing_in_flight() -> None:
    async def run() -> InFlight | None:
        retrieval = replica([], [], Agent(build_catalogue()))
        try:
            return retrieval.unfinished(time.perf_counter())
        finally:
            await retrieval.close()

    assert asyncio.run(run()) is None


def test_an_answer_waiting_for_its_frame_keeps_its_deadline_left_and_latency_across_the_hand_over() -> None:
    waiting = SpanAnswer("(tool result) It opens at nine.", "kb", "knowledge_base", "Is it open?", triggered=100.0,
                         timings_ms={"llm_ms": 300.0}, waited_until=100.5, trigger="ret")
    item = InFlight.of_answer(waiting, deadline_s=2.5, now=101.5)
    assert (item.stage, item.elapsed_s, item.deadline_left_s) == ("answered", 1.5, 1.5)
    again = item.answer(deadline_s=2.5, now=500.0)
    assert (again.text, again.source, again.tool, again.question, again.trigger, again.timings_ms) == (
        waiting.text, "kb", "knowledge_base", "Is it open?", "ret", {"llm_ms": 300.0})
    assert again.triggered == 498.5 and again.deadline_from == 499.0, "1.5 s left from the resume at 500"
