"""The behaviour bench's held-out questions are ones the built-in router answers, the audible ones are those Whisper
hears right, and its scoring counts span words said in order."""

from __future__ import annotations

import numpy as np

from backend_agent.router import Router
from backend_agent.tools import build_catalogue
from benchmarks.behaviour import audible_questions, held_out_questions, held_out_voice, question_audio
from benchmarks.behaviour_scoring import in_order_recall, words
from frontend_model.frame import SAMPLE_RATE


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


def test_audible_questions_are_held_out_ones_in_order_that_whisper_hears_as_the_router_needs() -> None:
    """What Whisper heard is checked on the synthesis it heard: each synthesis differs (sox dithers), and a question
    on the edge of Whisper's hearing went either way on a second one."""
    heard: dict[str, str] = {}
    audible = audible_questions(3, held_out_voice(), heard=heard)
    held = held_out_questions(30)
    assert len(set(audible)) == 3 and [held.index(q) for q in audible] == sorted(held.index(q) for q in audible)
    assert set(heard) == set(audible)
    router = Router(build_catalogue())
    for question in audible:
        answer = router.answer(heard[question])
        assert answer is not None and answer.tool == router.answer(question).tool, (question, heard[question])


def test_a_development_question_can_be_asked_seconds_into_its_session() -> None:
    _, early_end = question_audio("what is today's date?", held_out_voice(), lead_s=0.5)
    late, late_end = question_audio("what is today's date?", held_out_voice(), lead_s=8.0)
    assert not np.any(late[:8 * SAMPLE_RATE])
    assert np.any(late[8 * SAMPLE_RATE:int(late_end * SAMPLE_RATE)])
    assert abs((late_end - early_end) - 7.5) < 0.05  # the same words (each synthesis dithers a little)
