"""The development conversations have the test set's shape in the recipes' held-out phrasings, and `<ret>` is scored
by a question's place in its conversation."""

from __future__ import annotations

from backend_agent.router import Router
from backend_agent.tools import build_catalogue
from benchmarks.behaviour_scoring import Turn
from benchmarks.behaviour_testset import SetTurn, by_position, routed
from benchmarks.development_conversations import development_conversations
from benchmarks.harness.testset import load_testset
from frontend_model.training.recipes import HELD_OUT_VOICES


def test_each_conversation_asks_a_question_its_follow_up_and_another_the_router_answers_in_turn() -> None:
    router = Router(build_catalogue())
    conversations = development_conversations()
    assert len(conversations) == 8
    for conversation in conversations:
        assert [q.follow_up for q in conversation.questions] == [False, True, False]
        history = ()
        for question in conversation.questions:
            answer = routed(router, question.text, history)
            assert answer is not None, question
            if question.follow_up:
                assert routed(router, question.text, ()) is None, f"{question.text!r} needs no history"
            history += (answer,)


def test_they_are_development_data_apart_from_the_test_set_and_the_same_every_time() -> None:
    conversations = development_conversations()
    assert conversations == development_conversations()
    assert sum(c.voice.name in HELD_OUT_VOICES for c in conversations) == 4
    test_questions = {q.text.lower() for c in load_testset().conversations for q in c.questions}
    assert not test_questions & {q.text.lower() for c in conversations for q in c.questions}


def turn(conversation: str, asked: bool) -> SetTurn:
    said = Turn("q", asked, None, None, "", 0.0, None, None, None)
    return SetTurn(conversation, "v", "time", False, said, False)


def test_recall_by_position_counts_each_conversation_s_first_second_and_third_question_apart() -> None:
    turns = [turn("a", True), turn("a", False), turn("a", False), turn("b", True), turn("b", True), turn("c", True)]
    assert by_position(turns) == [1.0, 0.5, 0.0]
