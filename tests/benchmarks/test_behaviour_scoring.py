"""The behaviour bench's held-out questions are ones the built-in router answers, and its scoring counts span words
said in order."""

from __future__ import annotations

from backend_agent.router import Router
from backend_agent.tools import build_catalogue
from benchmarks.behaviour import held_out_questions, in_order_recall, words


def test_every_held_out_question_is_answered_by_the_built_in_router() -> None:
    router = Router(build_catalogue())
    questions = held_out_questions(24)
    assert len(set(questions)) == 24
    unanswered = [q for q in questions if router.answer(q) is None]
    assert not unanswered


def test_span_words_count_only_when_said_in_order() -> None:
    span = words("Fifty-three plus seventy-eight is one hundred thirty-one.")
    assert in_order_recall(span, span) == 1.0
    assert in_order_recall(span, words("fifty three plus seventy eight is")) == 6 / 10
    assert in_order_recall(span, list(reversed(span))) == 3 / 10  # "one hundred ... one" only
    assert in_order_recall(span, []) == 0.0
