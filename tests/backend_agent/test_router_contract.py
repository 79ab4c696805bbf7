"""The reference router's semantics in the built-in router: the latest unanswered request, the agent's last words,
self-corrections, follow-ups on the answered history, serial chains on the last answer, arguments from the profile,
and how a request ends (outcome)."""

from datetime import UTC, datetime

import pytest

from backend_agent.request import Answered, Request, corrected_utterance
from backend_agent.router import Router
from backend_agent.tools import build_catalogue

NOW = datetime(2026, 11, 30, 12, 15, tzinfo=UTC)
TOKYO = "It is 9:15 PM on Monday, November 30 in Tokyo."
TOKYO_ANSWERED = Answered("What time is it in Tokyo?", "time_in_place", {"place": "tokyo"}, TOKYO)
MILES_ANSWERED = Answered("How many kilometres are in 10 miles?", "unit_conversion",
                          {"value": 10.0, "from_unit": "miles", "to_unit": "kilometres"},
                          "10 miles is 16.0934 kilometres.")


@pytest.fixture(scope="module")
def router() -> Router:
    return Router(build_catalogue(clock=lambda: NOW, default_timezone="Europe/Paris"))


@pytest.mark.parametrize(("request_", "text"), [
    (Request(("What time is it in Tokyo?", "Yes, please.")), TOKYO),
    (Request(("What is 2 plus 2?", "What time is it in Tokyo?")), TOKYO),
], ids=["a reply with no question leaves the earlier one", "the newest question wins"])  # fmt: skip
def test_the_router_answers_the_latest_unanswered_request(router: Router, request_: Request, text: str) -> None:
    routed = router.route(request_)
    assert routed.answer is not None and routed.answer.text == text


@pytest.mark.parametrize("agent_words", [
    "Sure. Shall I check the time in Tokyo for you?", "Okay, let me check what time it is in Tokyo.",
])  # fmt: skip
def test_the_agents_last_words_are_the_request_when_the_user_only_agrees(router: Router, agent_words: str) -> None:
    routed = router.route(Request(("Yes, please.",), agent_words=agent_words))
    assert routed.answer is not None and routed.answer.text == TOKYO


@pytest.mark.parametrize(("utterance", "text"), [
    ("What time is it in Paris? No, I mean in Tokyo.", TOKYO),
    ("What time is it in Paris, I mean Tokyo?", TOKYO),
    ("How many kilometres are in ten miles, sorry, I meant twelve miles?", "12 miles is 19.3121 kilometres."),
    ("What is 12 times 7? No wait, I mean 12 times 8.", "12 times 8 is 96."),
])  # fmt: skip
def test_a_self_correction_replaces_what_it_corrects(router: Router, utterance: str, text: str) -> None:
    routed = router.route(Request.of(utterance))
    assert routed.answer is not None and routed.answer.text == text
    assert "I mean" not in corrected_utterance(utterance) and "sorry" not in corrected_utterance(utterance)


@pytest.mark.parametrize(("utterance", "answered", "text"), [
    ("And in London?", TOKYO_ANSWERED, "It is 12:15 PM on Monday, November 30 in London."),
    ("What about 20 miles?", MILES_ANSWERED, "20 miles is 32.1869 kilometres."),
])  # fmt: skip
def test_a_follow_up_reuses_the_last_answered_request(router: Router, utterance: str, answered: Answered,
                                                       text: str) -> None:
    routed = router.route(Request((utterance,), answered=(answered,)))
    assert routed.answer is not None and routed.answer.text == text


def test_a_request_on_the_last_answer_chains_its_value_into_the_next_tool(router: Router) -> None:
    routed = router.route(Request(("What is that times two?",), answered=(MILES_ANSWERED,)))
    assert routed.answer is not None and routed.answer.tool == "arithmetic"
    assert routed.answer.text == "16.0934 times 2 is 32.1868."
    assert routed.answer.arguments == {"expression": "16.0934 times 2"}


def test_a_place_the_user_left_out_is_filled_from_the_profile(router: Router) -> None:
    routed = router.route(Request(("What time is it?",), location="Lisbon"))
    assert routed.answer is not None and routed.answer.arguments == {"place": "Lisbon"}
    assert routed.answer.text == "It is 12:15 PM on Monday, November 30 in Lisbon."
    named = router.route(Request(("What time is it in Tokyo?",), location="Lisbon"))
    assert named.answer is not None and named.answer.text == TOKYO, "a place the user names wins"


@pytest.mark.parametrize(("question", "outcome", "tool"), [
    ("What time is it in Tokyo?", "tool", "time_in_place"),
    ("What time is it in Atlantis?", "empty", "time_in_place"),
    ("Tell me a joke.", "none", None),
])  # fmt: skip
def test_the_outcome_says_whether_a_tool_answered_found_nothing_or_none_could(
    router: Router, question: str, outcome: str, tool: str | None
) -> None:
    routed = router.route(Request.of(question))
    assert (routed.outcome, routed.tool) == (outcome, tool)
    assert (routed.answer is not None) == (outcome == "tool")
