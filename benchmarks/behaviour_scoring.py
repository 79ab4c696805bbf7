"""Scoring a spoken question turn, shared by the behaviour benches (the development set in `behaviour.py`, the test
set in `behaviour_testset.py`, the long call in `behaviour_long.py`) and `bench copy`: which `<ret>`, span and words
came from a question, and whether the answer was said."""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from backend_agent.tools.numbers import replace_number_words
from benchmarks.harness import StreamResult, stream
from contextspan_client import TryAgain
from frontend_model.span.contract import CONTRACTS
from frontend_model.training.data import reply_to

LEAD_S = 0.5  # silence before the question
ANSWER_S = 4.0  # stream time after the span is injected that the answer gets
NO_RET_S = 5.0  # stream time after the question with no `<ret>`: the model did not ask
# A second `<ret>` while the first is being answered is refused with this reason; the first one's span still comes.
IN_FLIGHT = "a retrieval is already in flight"
FREE_WAIT_S = 10.0  # how long a session waits for the previous one's slot
# An answer counts as said when this share of its words comes in order (what the e2e tests ask of a turn).
SAID_RECALL = 0.6
# An answer counts as said exactly (the "tool answer said") with this share of its words in order and its
# numbers right (`Turn.said_exactly`).
EXACT_RECALL = 0.8
# Flags every behaviour server runs with: the sessions the run needs; the span deadline and question wait are the
# server's defaults (before issue 35 the development set ran with 20 s and 3 s, so that only the model was measured).
SERVER_FLAGS = ("--admission", "fixed")


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower().replace("-", " "))


def numbers(text: str) -> list[str]:
    """The numbers `text` says, spelled or in digits, as digits ("forty-four" -> "44")."""
    return re.findall(r"\d+(?:\.\d+)?", replace_number_words(" ".join(words(text))))


def numbers_right(expected: str, said: str) -> bool:
    """Every number of `expected` said, in order, with no other number between them."""
    want, got = numbers(expected), numbers(said)
    return any(got[i:i + len(want)] == want for i in range(len(got) - len(want) + 1))


def in_order_recall(expected: Sequence[str], said: Sequence[str]) -> float:
    """The share of `expected` words that `said` contains in the same order (longest common subsequence)."""
    if not expected:
        return 0.0
    row = [0] * (len(said) + 1)
    for word in expected:
        previous = 0
        for j, other in enumerate(said, start=1):
            previous, row[j] = row[j], previous + 1 if word == other else max(row[j], row[j - 1])
    return row[-1] / len(expected)


def stream_time(result: StreamResult) -> float:
    return max((e.t for e in result.events if hasattr(e, "t")), default=0.0)


def answered(question_end_s: float, since_s: float = 0.0) -> Callable[[StreamResult], bool]:
    """Done once the span was dropped, or the answer had ANSWER_S of stream time, or no `<ret>` came; only what
    happened from `since_s` (stream time) on counts."""

    def done(result: StreamResult) -> bool:
        now = stream_time(result)
        if any(e.reason != IN_FLIGHT for e in of_type_since(result, "span.dropped", since_s)):
            return True
        spans = of_type_since(result, "span.injected", since_s)
        if spans:
            return now >= spans[0].t + ANSWER_S
        return not of_type_since(result, "retrieval", since_s) and now >= question_end_s + NO_RET_S

    return done


def of_type_since(result: StreamResult, kind: str, since_s: float, until_s: float = math.inf) -> list[Any]:
    return [e for e in result.of_type(kind) if since_s <= e.t < until_s]


@dataclass(frozen=True)
class Turn:
    """One spoken question and what the server and the model made of it."""

    question: str
    asked: bool  # the model emitted `<ret>`
    heard: str | None  # the question the agent was asked (the transcript)
    span: str | None
    said: str  # the agent's text after the span
    recall: float  # the words the span should be answered with, said in order, 0..1
    ret_ms: float | None  # end of question -> `<ret>`
    span_ms: float | None  # `<ret>` -> span injected
    first_word_ms: float | None  # span injected -> the first answer word
    dropped: str | None = None  # why no span went in, when one was dropped

    @property
    def answer(self) -> list[str]:
        return words(self.said)

    @property
    def abstained(self) -> bool:
        """The span was the abstain span: nothing answered what the backend heard."""
        return self.span == CONTRACTS["contextspan"].abstain_text

    @property
    def said_exactly(self) -> bool:
        """The span's answer said: `EXACT_RECALL` of its words in order, and its numbers, all of them, in order."""
        if not self.span:
            return False
        expected = reply_to(self.span, CONTRACTS["contextspan"])
        return self.recall >= EXACT_RECALL and numbers_right(expected, self.said)


def score(question: str, question_end_s: float, result: StreamResult, since_s: float = 0.0,
          until_s: float = math.inf) -> Turn:
    """What the model made of the question: its `<ret>` is the first from `since_s` to `until_s` (stream time); the
    question asked, the span and the words said are what came from that `<ret>` until the next `<ret>` (a slow
    backend answers after the next question has begun)."""
    rets = of_type_since(result, "retrieval", since_s, until_s)
    start = rets[0].t if rets else since_s
    end = next((e.t for e in result.of_type("retrieval") if e.t >= until_s), math.inf) if rets else until_s
    questions = of_type_since(result, "question", start, end)
    spans = of_type_since(result, "span.injected", start, end)
    if not spans:
        dropped = next((f"{e.reason}: {e.text}" for e in of_type_since(result, "span.dropped", start, end)
                        if e.reason != IN_FLIGHT), None)
        return Turn(question, bool(rets), questions[0].text if questions else None, None, "", 0.0,
                    _ms(rets[0].t - question_end_s) if rets else None, None, None, dropped)
    span = spans[0]
    after = [e for e in result.of_type("agent.text") if e.frame >= span.step and e.t < end]
    said = "".join(e.text for e in after)
    first = next((e for e in after if words(e.text)), None)
    expected = reply_to(span.text, CONTRACTS["contextspan"])
    return Turn(question, bool(rets), questions[0].text if questions else None, span.text, said.strip(),
                in_order_recall(words(expected), words(said)), _ms(rets[0].t - question_end_s) if rets else None,
                _ms(span.t - rets[0].t) if rets else None, _ms(first.t - span.t) if first else None)


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 1)


async def stream_when_free(url: str, pcm: np.ndarray, wait_s: float = FREE_WAIT_S, **kwargs: Any) -> StreamResult:
    """`stream`, once the server has a free slot: the previous session's slot is freed just after it closes."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return await stream(url, pcm, **kwargs)
        except TryAgain:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
