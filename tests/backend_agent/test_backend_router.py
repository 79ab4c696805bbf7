"""The built-in router answers what the built-in tools can, and says "no span" (None) otherwise."""

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from backend_agent.router import Router, plan
from backend_agent.tools import build_catalogue
from backend_agent.tools.knowledge_base import KnowledgeBase

NOW = datetime(2026, 11, 30, 12, 15, tzinfo=UTC)


@pytest.fixture(scope="module")
def router() -> Router:
    knowledge = KnowledgeBase()
    knowledge.add_document(
        "museum.md",
        "# City Museum\n\nThe City Museum opens at 9 am and closes at 5 pm from Tuesday to Sunday. "
        "It is closed on Mondays.",
    )
    knowledge.add_document("parking.txt", "Parking near the museum costs 3 euros per hour.")
    return Router(build_catalogue(clock=lambda: NOW, default_timezone="Europe/Paris", knowledge=knowledge))


@pytest.mark.parametrize(
    ("question", "tool", "text"),
    [
        ("What time is it in Tokyo?", "time_in_place", "It is 9:15 PM on Monday, November 30 in Tokyo."),
        ("what's the time in new york", "time_in_place", "It is 7:15 AM on Monday, November 30 in New York."),
        ("Hey, what time is it in London right now?", "time_in_place",
         "It is 12:15 PM on Monday, November 30 in London."),
        ("What time is it?", "time_in_place", "It is 1:15 PM on Monday, November 30 in Paris."),
        ("Do you know what time it is now in NYC", "time_in_place",
         "It is 7:15 AM on Monday, November 30 in New York."),
        ("tell me the local time in the UK", "time_in_place",
         "It is 12:15 PM on Monday, November 30 in the United Kingdom."),
        ("What is 12 times 7?", "arithmetic", "12 times 7 is 84."),
        ("whats twelve times seven", "arithmetic", "12 times 7 is 84."),
        ("What's fifteen percent of eighty?", "arithmetic", "15 percent of 80 is 12."),
        ("How many kilometres is 10 miles?", "unit_conversion", "10 miles is 16.0934 kilometres."),
        ("How many feet are in 3 meters?", "unit_conversion", "3 metres is 9.84252 feet."),
        ("Convert 5 feet to cm, please.", "unit_conversion", "5 feet is 152.4 centimetres."),
        ("convert 100 fahrenheit to celsius", "unit_conversion",
         "100 degrees fahrenheit is 37.7778 degrees celsius."),
        ("What day is it today?", "date", "Today is Monday, November 30, 2026 in Paris."),
        ("What's the date tomorrow in Tokyo?", "date", "Tomorrow is Tuesday, December 1, 2026 in Tokyo."),
        ("What day of the week is July 4, 2026?", "date", "July 4, 2026 was a Saturday."),
        ("Workout 66 times 56.", "arithmetic", "66 times 56 is 3696."),
        ("what do you get for 12 plus 7", "arithmetic", "12 plus 7 is 19."),
        ("Can you convert 5 feet to cm?", "unit_conversion", "5 feet is 152.4 centimetres."),
        ("Okay, what day will it be tomorrow?", "date", "Tomorrow is Tuesday, December 1, 2026 in Paris."),
    ],
)  # fmt: skip
def test_answers(router: Router, question: str, tool: str, text: str) -> None:
    answer = router.answer(question)
    assert answer is not None, question
    assert (answer.tool, answer.text) == (tool, text)


@pytest.mark.parametrize(
    ("utterance", "tool", "text"),
    [
        # time in a place
        ("Hello there, what time is it in Tokyo right now? Thank you.", "time_in_place",
         "It is 9:15 PM on Monday, November 30 in Tokyo."),
        ("Hi. Um, what's the time in New York? Thanks.", "time_in_place",
         "It is 7:15 AM on Monday, November 30 in New York."),
        ("Okay, I have a question. What time is it in London at the moment?", "time_in_place",
         "It is 12:15 PM on Monday, November 30 in London."),
        ("I'm calling my sister later. Could you tell me what time it is in Sydney?", "time_in_place",
         "It is 11:15 PM on Monday, November 30 in Sydney."),
        ("Good morning! What time is it? Thank you so much.", "time_in_place",
         "It is 1:15 PM on Monday, November 30 in Paris."),
        # date
        ("Hey, quick question, what day is it today?", "date", "Today is Monday, November 30, 2026 in Paris."),
        ("I'm flying out soon. What's the date tomorrow in Tokyo? Thanks a lot.", "date",
         "Tomorrow is Tuesday, December 1, 2026 in Tokyo."),
        ("Hello. What day of the week is July 4, 2026? Thank you.", "date", "July 4, 2026 was a Saturday."),
        # arithmetic
        ("Hello there, what is twelve times seven? Thank you.", "arithmetic", "12 times 7 is 84."),
        ("Hi, um, can you tell me what's fifteen percent of eighty?", "arithmetic", "15 percent of 80 is 12."),
        ("So I was doing my taxes. What is 250 divided by 4? Thanks.", "arithmetic", "250 divided by 4 is 62.5."),
        ("Okay. What's, uh, nine plus ten?", "arithmetic", "9 plus 10 is 19."),
        ("Um, calculate 38 times 5 for me?", "arithmetic", "38 times 5 is 190."),
        # unit conversion
        ("Hey there! How many kilometres are in ten miles? That's all.", "unit_conversion",
         "10 miles is 16.0934 kilometres."),
        ("Good afternoon, convert 5 feet to cm, please. Thank you.", "unit_conversion",
         "5 feet is 152.4 centimetres."),
        ("I'm baking a cake. How many grams are in two pounds? Cheers.", "unit_conversion",
         "2 pounds is 907.185 grams."),
        ("Hello. Convert 100 fahrenheit to celsius for me.", "unit_conversion",
         "100 degrees fahrenheit is 37.7778 degrees celsius."),
        ("Convert 12 miles into kilometres, please?", "unit_conversion", "12 miles is 19.3121 kilometres."),
    ],
)  # fmt: skip
def test_answers_the_question_inside_a_whole_utterance(router: Router, utterance: str, tool: str, text: str) -> None:
    answer = router.answer(utterance)
    assert answer is not None, utterance
    assert (answer.tool, answer.text) == (tool, text)


@pytest.mark.parametrize(
    "utterance",
    ["Hello there, when does the museum open? Thank you.", "Hi. Quick question. What time does the museum close?",
     "We are visiting tomorrow. Do you know when the museum opens? Thanks."],
)
def test_knowledge_base_inside_a_whole_utterance(router: Router, utterance: str) -> None:
    answer = router.answer(utterance)
    assert answer is not None and (answer.tool, answer.source) == ("knowledge_base", "museum.md")


@pytest.mark.parametrize("utterance", ["Thank you.", "Hello there, thanks!", "Okay. That's all, goodbye."])
def test_pleasantries_get_no_span_even_from_the_knowledge_base(utterance: str) -> None:
    knowledge = KnowledgeBase()
    knowledge.add_document("manners.md", "Say thank you and hello and goodbye: that's all there is to good manners.")
    router = Router(build_catalogue(clock=lambda: NOW, knowledge=knowledge))
    assert router.answer(utterance) is None
    assert router.answer("What is there to good manners?") is not None  # the document is found when asked


def test_time_agrees_with_zoneinfo(router: Router) -> None:
    local = NOW.astimezone(ZoneInfo("Australia/Sydney"))
    answer = router.answer("what is the current time in sydney")
    assert answer.text.startswith(f"It is {local.hour % 12 or 12}:{local.minute:02d} ")
    assert answer.source == "zoneinfo:Australia/Sydney"


@pytest.mark.parametrize(
    "question",
    ["When does the museum open?", "What time does the museum close?", "what day is the museum closed"],
)
def test_knowledge_base_questions(router: Router, question: str) -> None:
    answer = router.answer(question)
    assert answer is not None
    assert (answer.tool, answer.source) == ("knowledge_base", "museum.md")
    assert "opens at 9 am" in answer.text


@pytest.mark.parametrize(
    "question",
    [
        "tell me a joke",
        "",
        "   ",
        "what is 911",
        "What is the capital of France?",
        "what time is it on Mars",
        "What is the time difference between London and Tokyo?",
        "what day is christmas",
        "how many people are in 3 rooms",
    ],
)
def test_no_span(router: Router, question: str) -> None:
    assert router.answer(question) is None


def test_knowledge_base_is_optional() -> None:
    router = Router(build_catalogue(clock=lambda: NOW))
    assert router.answer("When does the museum open?") is None
    assert router.answer("what is 2 plus 2").text == "2 plus 2 is 4."


def test_plan_orders_specific_tools_first() -> None:
    assert [call.tool for call in plan("what time is it in Paris")] == ["time_in_place", "knowledge_base"]
    assert [call.tool for call in plan("tell me a joke")] == ["knowledge_base"]
