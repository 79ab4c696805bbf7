"""Finding the question inside a final utterance as Whisper writes it: greetings, fillers, thanks, other sentences."""

import pytest

from backend_agent.agent import user_message
from backend_agent.question import best_question, candidates, is_question
from backend_agent.request import Request


@pytest.mark.parametrize(
    ("utterance", "question"),
    [
        ("Hello there, what time is it in Tokyo right now? Thank you.", "what time is it in Tokyo right now?"),
        ("Hi, um, can you tell me what's twelve times seven?", "what's twelve times seven?"),
        ("Thanks. What's 12 times 7?", "What's 12 times 7?"),
        ("Good morning. I'd like to know the time in London.", "the time in London."),
        ("Okay so convert 5 feet to cm, please.", "convert 5 feet to cm"),
        ("Hey there! How many kilometres are in ten miles? That's all.", "How many kilometres are in ten miles?"),
        ("hello there what time is it in tokyo thank you", "what time is it in tokyo"),
        ("What is, uh, twelve times seven?", "What is twelve times seven?"),
        ("I'm flying out tomorrow. What's the date tomorrow in Tokyo? Thanks a lot.",
         "What's the date tomorrow in Tokyo?"),
        ("Quick question, when does the museum open?", "when does the museum open?"),
        ("Excuse me, do you know what day it is today?", "what day it is today?"),
        ("What time is it in the U.S. right now?", "What time is it in the U.S. right now?"),
        ("Sorry, I was wondering, how much is fifteen percent of eighty, if you know.",
         "how much is fifteen percent of eighty"),
        ("What time is it?", "What time is it?"),
        # Whisper joins sentences with commas as often as with full stops.
        ("So I was doing my taxes, what is 200 divided by 4, thanks.", "what is 200 divided by 4"),
        ("Okay, well, how many grams are in two pounds, thank you.", "how many grams are in two pounds"),
        # Only whole filler words go: these start with one.
        ("Well-being programmes, when do they start?", "when do they start?"),
        ("Sofia is lovely. Hiking trails near Sofia?", "Hiking trails near Sofia?"),
    ],
)  # fmt: skip
def test_best_question(utterance: str, question: str) -> None:
    assert best_question(utterance) == question


def test_asking_sentences_come_first_and_the_others_stay_to_try() -> None:
    found = candidates("I'm going to Paris next week. What time is it there? Thank you so much.")
    assert [(c.text, c.asking) for c in found] == [("What time is it there?", True),
                                                  ("I'm going to Paris next week.", False)]


@pytest.mark.parametrize("utterance", ["Thank you.", "Hello there.", "Okay, thanks!", "That's all, goodbye.", "Um.",
                                       "Great, thank you very much.", ""])
def test_pleasantries_leave_nothing(utterance: str) -> None:
    assert candidates(utterance) == []
    assert not is_question(utterance)


@pytest.mark.parametrize(("utterance", "asking"), [
    ("What time is it in Tokyo?", True),
    ("how far is the moon", True),
    ("Hello there, what time is it in Tokyo right now? Thank you.", True),
    ("I went to the shops. Do you know when the museum opens", True),
    ("Tell me a joke.", True),
    ("I like trains.", False),
    ("Hello, this is a test of the server.", False),
])
def test_is_question(utterance: str, asking: bool) -> None:
    assert is_question(utterance) is asking


def test_the_llm_gets_the_bare_question_next_to_what_was_heard() -> None:
    assert user_message(Request.of("What time is it in Tokyo?")) == "What time is it in Tokyo?"
    assert user_message(Request.of(" Hi. What time is it in Tokyo? Thanks. ")) == (
        "Heard (speech recognition): Hi. What time is it in Tokyo? Thanks.\nThe question: What time is it in Tokyo?")
