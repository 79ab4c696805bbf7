"""The retrieval loop builds the request the reference router expects from the context store: the user's turns
since the last answer, the agent's words, the answered history; it records the tool's real arguments; a second
`<ret>` with no new utterance answers the old question again; outcomes without text reach the session only when
it asks for abstain spans."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from backend_agent.agent import Agent
from backend_agent.asr.streaming import StreamingASR, Transcript
from backend_agent.context_store import ContextStore
from backend_agent.tools import build_catalogue
from frontend_model.span.contract import ABSTAIN_TEXT, CONTRACTS, SpanContract
from server.session.retrieval import Retrieval, RetrievalConfig, SpanAnswer
from server.wire import protocol as p

NOW = datetime(2026, 11, 30, 12, 15, tzinfo=UTC)
TOKYO = "It is 9:15 PM on Monday, November 30 in Tokyo."


class Session:
    """A retrieval loop on a real StreamingASR whose Whisper hears `recent` in the last seconds."""

    def __init__(self, pool: ThreadPoolExecutor, recent: str, config: RetrievalConfig | None = None) -> None:
        self.answers: list[SpanAnswer] = []
        self.events: list[Any] = []
        self.store = ContextStore(":memory:")
        self.asr = StreamingASR(lambda audio: recent, pool, lambda t: self.retrieval.on_transcript(t))
        self.asr._segmenter.recent_audio = (  # type: ignore[method-assign]
            lambda seconds: np.ones(16000, np.float32) if recent else np.zeros(0, np.float32))
        self.retrieval = Retrieval("s1", "u1", Agent(build_catalogue(clock=lambda: NOW)), self.store, self.asr,
                                   self.answers.append, self.events.append, lambda: 0.0, config)

    def hear(self, text: str) -> None:
        self.asr._emit(Transcript(text, True, 0.0, 1.0, time.monotonic()))

    async def ret(self) -> SpanAnswer | p.SpanDropped:
        done = len(self.answers) + sum(isinstance(e, p.SpanDropped) for e in self.events)
        assert self.retrieval.trigger()
        while len(self.answers) + sum(isinstance(e, p.SpanDropped) for e in self.events) == done:
            await asyncio.sleep(0.005)
        return ([*self.answers, *(e for e in self.events if isinstance(e, p.SpanDropped))])[-1]


@pytest.mark.parametrize("recent", ["What time is it in Tokyo?", ""],
                         ids=["the last seconds heard again", "silence: the last answered question"])
def test_a_second_ret_with_no_new_utterance_answers_the_old_question_again(recent: str) -> None:
    async def run() -> list[SpanAnswer | p.SpanDropped]:
        with ThreadPoolExecutor(1) as pool:
            session = Session(pool, recent)
            session.hear("Hello. What time is it in Tokyo?")
            first = await session.ret()
            second = await session.ret()
            await session.retrieval.close()
        return [first, second]

    first, second = asyncio.run(run())
    assert isinstance(first, SpanAnswer) and isinstance(second, SpanAnswer), second
    assert first.text == second.text == TOKYO
    assert "asr_ms" in second.timings_ms and "asr_ms" not in first.timings_ms


def test_the_store_keeps_the_tools_real_arguments_and_a_follow_up_uses_them() -> None:
    async def run() -> tuple[list[SpanAnswer | p.SpanDropped], ContextStore]:
        with ThreadPoolExecutor(1) as pool:
            session = Session(pool, "")
            session.hear("How many kilometres are in ten miles?")
            first = await session.ret()
            session.retrieval.on_agent_text(" Ten miles is about sixteen kilometres.")
            session.hear("What is that times two?")
            second = await session.ret()
            session.hear("Okay.")
            session.retrieval.on_agent_text(" Shall I check the time in Tokyo for you?")
            third = await session.ret()
            records = session.store.tool_results("s1")
            await session.retrieval.close()
        return [first, second, third], records

    (first, second, third), records = asyncio.run(run())
    assert isinstance(first, SpanAnswer) and first.text == "10 miles is 16.0934 kilometres."
    assert isinstance(second, SpanAnswer) and second.text == "16.0934 times 2 is 32.1868."
    assert isinstance(third, SpanAnswer) and third.text == TOKYO, "the agent's words are the request"
    assert [(r.tool, r.arguments) for r in records] == [
        ("unit_conversion", {"value": 10.0, "from_unit": "miles", "to_unit": "kilometres"}),
        ("arithmetic", {"expression": "16.0934 times 2"}),
        ("time_in_place", {"place": "tokyo"}),
    ]
    assert records[1].question == "What is 16.0934 times two?"


def one_retrieval(heard: str, contract: SpanContract) -> SpanAnswer | p.SpanDropped:
    """What one `<ret>` after the final utterance `heard` comes to, served with `contract`."""
    async def run() -> SpanAnswer | p.SpanDropped:
        with ThreadPoolExecutor(1) as pool:
            session = Session(pool, "", RetrievalConfig(contract=contract))
            session.hear(heard)
            result = await session.ret()
            await session.retrieval.close()
        return result

    return asyncio.run(run())


@pytest.mark.parametrize(("question", "outcome", "tool"), [
    ("What time is it in Atlantis?", "empty", "time_in_place"), ("Tell me a joke.", "none", ""),
])  # fmt: skip
@pytest.mark.parametrize("abstain", [True, False])
def test_outcomes_without_text_reach_the_session_only_for_abstain_spans(question: str, outcome: str, tool: str,
                                                                        abstain: bool) -> None:
    result = one_retrieval(question, CONTRACTS["contextspan"] if abstain else SpanContract())
    if abstain:
        assert isinstance(result, SpanAnswer) and (result.outcome, result.tool, result.text) == (
            outcome, "abstain", ABSTAIN_TEXT)
        assert tool in result.source
    else:
        assert isinstance(result, p.SpanDropped) and result.question == question


@pytest.mark.parametrize(("heard", "said"), [
    ("I had a long day at work today.", False), ("Interesting, I did not know that.", False),
    ("Which they have the weak willow at the tomorrow.", True), ("Please tell me what is finally gonna get us.", True),
])  # fmt: skip
def test_the_abstain_span_answers_an_unanswered_question_and_never_a_statement(heard: str, said: bool) -> None:
    """A `<ret>` in chatter gets no apology: "Sorry, I could not find that." after "I had a long day" is worse than
    nothing. A misheard question still reads as one (its question word), and still gets it."""
    result = one_retrieval(heard, CONTRACTS["contextspan"])
    if said:
        assert isinstance(result, SpanAnswer) and (result.tool, result.text) == ("abstain", ABSTAIN_TEXT)
    else:
        assert isinstance(result, p.SpanDropped) and result.reason.startswith("nothing asked")
        assert result.question == heard
